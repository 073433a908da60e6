"""Compact closed ledgers into a Delta table (DESIGN §4.4).

    spark-submit jobs/compact_to_delta.py --zk Z --table PATH [--ledgers 1,2] [--partition-by ledger_id|date]
                                          [--delete-after-commit] [--password PW] [--engine spark|local]
                                          [--client-conf PATH]

    spark-submit jobs/compact_to_delta.py --zk Z --stream ns/s[,ns/*] --table PATH [--tier] [--engine spark|local]

Every closed ledger (or the listed ones) not yet in the table is copied into it, all in one Delta
commit; open ledgers are skipped; running it again adds nothing that is already there (see
``jobs/delta_compaction.py`` for how a crash between writing and committing stays harmless).
With ``--engine spark`` (the default) executors read the ledgers and write the parquet files and
the driver commits; ``--engine local`` does everything in this process with delta-rs, no Spark
session (small runs). ``--delete-after-commit`` deletes a ledger only once a fresh snapshot of the
committed table records it. Prints one JSON line summarizing the run; exit 0 on success, 2 on bad
input, 1 when the run failed (nothing of it was committed).

With ``--stream`` it copies streams' sealed segments instead (``jobs/stream_tiering.py``): into one
Delta table with the stream columns, once per segment; ``--tier`` then marks them tiered in the
streams' metadata (readers read them from the table from then on) and deletes their ledgers.

On a secured cluster (docs/security.md), ``--client-conf PATH`` (default
``$SPARK_BOOKIE_CLIENT_CONF``) is the client TOML (zk_auth, token, TLS) of the driver and of every
executor task: a path each executor can read. Without it such a cluster refuses the run (exit 1,
ZooKeeper's NoAuth as UnauthorizedAccessError).

Importable: ``main(argv, spark=None)`` runs the same thing (tests, notebooks); pass a session to
reuse it.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from jobs.connect import CLIENT_CONF_ENV, client_conf_path, client_config
from jobs.delta_compaction import (
    PARTITION_COLUMN,
    CompactionConfig,
    CompactionResult,
    compact,
    parse_ledger_ids,
)
from jobs.errors import BadArgumentError, CompactionError
from jobs.progress import COMPACTION_STEPS, TIERING_STEPS, StepProgress
from jobs.stream_tiering import TieringConfig, TieringResult, tier_streams
from ledger_client.errors import IncorrectParameterError, LedgerError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compact_to_delta", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--zk", default=os.environ.get("SPARK_BOOKIE_ZK", "127.0.0.1:2181"),
                   help="ZooKeeper connect string host:port[,host:port][/root] (default: $SPARK_BOOKIE_ZK)")
    p.add_argument("--table", required=True, help="path of the Delta table (created if absent)")
    p.add_argument("--ledgers", default=None, help="comma-separated ledger ids (default: every closed ledger)")
    p.add_argument("--partition-by", choices=sorted(PARTITION_COLUMN), default="ledger_id",
                   help="partition column: ledger_id, or date (ctime_date, the ledger's UTC creation day)")
    p.add_argument("--delete-after-commit", action="store_true",
                   help="delete compacted ledgers once the table's committed snapshot records them")
    p.add_argument("--password", default="", help="the ledgers' password (UTF-8); others are skipped")
    p.add_argument("--engine", choices=("spark", "local"), default="spark",
                   help="spark: executors write the files; local: this process does (no Spark)")
    p.add_argument("--entries-per-read", type=int, default=10_000, help="entries per read_arrow batch")
    p.add_argument("--tasks-max", type=int, default=64, help="Spark tasks that read ledgers (at most)")
    p.add_argument("--stream", default=None,
                   help="streams to copy instead of ledgers: ns/name items, comma-separated, globs allowed (ns/*)")
    p.add_argument("--tier", action="store_true",
                   help="with --stream: mark the copied segments tiered and delete their ledgers")
    p.add_argument("--client-conf", default=None, metavar="PATH",
                   help="client TOML of a secured cluster ([client]: zk_auth, auth_token(_file), tls_*), readable "
                        f"on every executor (default: ${CLIENT_CONF_ENV})")
    return p


def config_from_args(args: argparse.Namespace) -> CompactionConfig:
    return CompactionConfig(
        zk=args.zk, table_path=args.table,
        ledgers=None if args.ledgers is None else parse_ledger_ids(args.ledgers),
        partition_by=args.partition_by, delete_after_commit=args.delete_after_commit,
        password=args.password.encode(), entries_per_read=args.entries_per_read, tasks_max=args.tasks_max,
        client_conf=args.client_conf)


def run(argv: Sequence[str] | None = None, spark: Any = None,
        progress: StepProgress | None = None) -> CompactionResult | TieringResult:
    """Parse ``argv`` and compact; raises CompactionError (BadArgumentError for bad input).

    With ``--engine spark`` and no ``spark`` given, uses the active session (spark-submit's) or
    builds one, and stops a session it built itself.
    """
    args = build_parser().parse_args(argv)
    if args.tier and args.stream is None:
        raise BadArgumentError("--tier needs --stream (ledgers are compacted, streams are tiered)")
    args.client_conf = checked_client_conf(args.client_conf)
    work: Callable[[Any], CompactionResult | TieringResult]
    hook = progress.step if progress is not None else None
    if args.stream is not None:
        tcfg = tiering_config_from_args(args)
        work = functools.partial(tier_streams, tcfg, hook=hook)
    else:
        work = functools.partial(compact, config_from_args(args), hook=hook)
    if args.engine == "local":
        return work(None)
    if spark is not None:
        return work(spark)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    session = active or SparkSession.builder.appName("compact_to_delta").getOrCreate()
    try:
        return work(session)
    finally:
        if active is None:
            session.stop()


def checked_client_conf(given: str | None) -> str | None:
    """The absolute path of --client-conf (else $SPARK_BOOKIE_CLIENT_CONF), read once here so that a
    missing or bad file is a BadArgumentError before any work, not a failure in every task."""
    path = client_conf_path(given)
    try:
        client_config(path)
    except IncorrectParameterError as e:
        raise BadArgumentError(f"--client-conf: {e}") from e
    return path


def tiering_config_from_args(args: argparse.Namespace) -> TieringConfig:
    if args.ledgers is not None:
        raise BadArgumentError("--ledgers and --stream do not go together")
    try:
        return TieringConfig(zk=args.zk, table_path=args.table, streams=args.stream, tier=args.tier,
                             tasks_max=args.tasks_max, client_conf=args.client_conf)
    except IncorrectParameterError as e:
        raise BadArgumentError(str(e)) from e


def main(argv: Sequence[str] | None = None, spark: Any = None) -> int:
    args = build_parser().parse_args(argv)
    if args.stream is not None:
        progress = StepProgress("tiering", TIERING_STEPS if args.tier else TIERING_STEPS[:2])
    else:
        progress = StepProgress("compaction", COMPACTION_STEPS if args.delete_after_commit else COMPACTION_STEPS[:3])
    try:
        result = run(argv, spark, progress)
    except BadArgumentError as e:
        print(f"compact_to_delta: {e}", file=sys.stderr)
        return 2
    except (CompactionError, LedgerError) as e:
        print(f"compact_to_delta: {e}", file=sys.stderr)
        return 1
    finally:
        progress.close()
    print(json.dumps(result.summary()))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    sys.exit(main())
