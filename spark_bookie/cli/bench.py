"""`spark-bookie bench ...`: each benchmark module adds its own sub-command."""

from __future__ import annotations

import argparse

from spark_bookie.bench.append import add_append_parser
from spark_bookie.bench.bookie import add_bookie_parser
from spark_bookie.bench.recovery import add_recovery_parser
from spark_bookie.bench.replicate import add_replicate_parser
from spark_bookie.bench.scale import add_scale_parser
from spark_bookie.bench.scan import add_scan_parser
from spark_bookie.bench.spark_stream import add_spark_stream_parser
from spark_bookie.bench.stream import add_stream_parser
from spark_bookie.bench.tenants import add_tenants_parser


def add_bench_parser(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bench", required=True)
    for add in (add_bookie_parser, add_append_parser, add_recovery_parser, add_scan_parser, add_stream_parser,
                add_spark_stream_parser, add_tenants_parser, add_replicate_parser, add_scale_parser):
        add(sub)


def run_bench(args: argparse.Namespace) -> int:
    result: int = args.func_bench(args)
    return result
