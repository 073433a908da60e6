"""`spark-bookie replicate`: copy streams to another cluster, and see how far behind they are
(DESIGN §4.12; jobs/replicate.py does the work).

    spark-bookie replicate --from ZK_A --to ZK_B --streams "payments/*" --checkpoint DIR \\
        [--from-client-conf A.toml] [--to-client-conf B.toml] [--master URL] [--metrics-port N]
    spark-bookie replicate status --checkpoint DIR [--json]

The first runs until SIGTERM or SIGINT (the query stops between batches) or until the query fails
(exit 1 with its error); restarted on the same checkpoint it goes on where it stopped. The second
reads both clusters now, and the running replicator's ``status.json`` for the lag in seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from spark_bookie.cli.common import fail

if TYPE_CHECKING:
    from jobs.replication_config import ReplicationConfig
    from jobs.replication_monitor import StreamState

STATUS_FRESH_PASSES = 3   # status.json older than this many monitor passes: the replicator is not running


def add_replicate_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", choices=("status",), help="`status`: how far each stream is behind")
    p.add_argument("--from", dest="from_zk", default=None, metavar="ZK_A", help="the source cluster's ZooKeeper")
    p.add_argument("--to", dest="to_zk", default=None, metavar="ZK_B", help="the target cluster's ZooKeeper")
    p.add_argument("--streams", default=None, metavar="GLOB",
                   help='source streams, NAMESPACE/STREAM globs, comma-separated ("payments/*")')
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="the replication's checkpoint directory (restart on the same one to go on)")
    p.add_argument("--from-client-conf", default=None, metavar="TOML",
                   help="the source cluster's client config (TLS, token, ZooKeeper credentials)")
    p.add_argument("--to-client-conf", default=None, metavar="TOML",
                   help="the target cluster's client config (a role with produce on the target namespaces)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--trigger-interval-ms", type=int, default=500, help="a micro-batch at most this often")
    p.add_argument("--max-records-per-trigger", type=int, default=1_000_000)
    p.add_argument("--metrics-port", type=int, default=9_250,
                   help="serve /metrics (replication_lag_records, replication_lag_seconds) here; 0: any free "
                        "port (printed), -1: none")
    p.add_argument("--json", action="store_true", help="status: print JSON")


def run_replicate(args: argparse.Namespace) -> int:
    from ledger_client import errors

    try:
        if args.action == "status":
            return _status(args)
        return _run(args)
    except errors.LedgerError as e:
        return fail(f"replicate: {e}")


def _run(args: argparse.Namespace) -> int:
    from jobs.replicate import run
    from jobs.replication_config import ReplicationConfig
    from ledger_client import errors

    missing = [f"--{n}" for n in ("from", "to", "streams") if getattr(args, {"from": "from_zk", "to": "to_zk"}
                                                                    .get(n, n)) is None]
    if missing:
        return fail(f"replicate needs {', '.join(missing)} (or `replicate status --checkpoint DIR`)")
    cfg = ReplicationConfig(args.from_zk, args.to_zk, args.streams, args.checkpoint, args.from_client_conf,
                            args.to_client_conf, master=args.master, trigger_interval_ms=args.trigger_interval_ms,
                            max_records_per_trigger=args.max_records_per_trigger, metrics_port=args.metrics_port)

    def ready(port: int | None) -> None:
        where = f", metrics on http://127.0.0.1:{port}/metrics" if port is not None else ""
        print(f"replicating {cfg.streams} from {cfg.from_zk} to {cfg.to_zk}{where}", flush=True)

    try:
        return run(cfg, ready)
    except errors.LedgerError:
        raise
    except Exception as e:   # the query failed (a StreamingQueryException), or Spark could not start
        from jobs.replicate import error_line

        print(f"spark-bookie: error: replicate: the query stopped: {error_line(e)}", file=sys.stderr)
        return 1


def _status(args: argparse.Namespace) -> int:
    from jobs.replication_config import STATUS_FILE, saved_config
    from jobs.replication_monitor import matching_streams, observe

    cfg = saved_config(args.checkpoint, from_client_conf=args.from_client_conf, to_client_conf=args.to_client_conf)
    running = _running(cfg)
    source, target = cfg.source(), cfg.target()
    try:
        states = [observe(cfg, source, target, ns, name) for ns, name in matching_streams(cfg, source)]
    finally:
        source.close()
        target.close()
    rows = [_with_seconds(s, running) for s in states]
    if args.json:
        print(json.dumps({"from": cfg.from_zk, "to": cfg.to_zk, "streams": cfg.streams,
                          "running": running is not None, "states": rows}, indent=2))
        return 0
    print(f"replication {cfg.streams}: {cfg.from_zk} -> {cfg.to_zk} "
          f"({'running' if running is not None else f'not running: no fresh {STATUS_FILE}'})")
    print(f"{'STREAM':<32} {'REPLICATED THROUGH':>18} {'SOURCE LAST':>14} {'LAG RECORDS':>12} {'LAG S':>8}  STATE")
    for r in rows:
        lag_s = "-" if r["lag_seconds"] is None else f"{r['lag_seconds']:.1f}"
        print(f"{r['stream']:<32} {r['replicated_through'] or '-':>18} {r['source_last'] or '-':>14} "
              f"{r['lag_records']:>12} {lag_s:>8}  {_state(r)}")
    return 0


def _running(cfg: ReplicationConfig) -> dict[str, Any] | None:
    """The running replicator's last status.json (None: absent or stale)."""
    from jobs.replication_config import STATUS_FILE

    try:
        doc = json.loads((cfg.dir / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    age_ms = time.time() * 1000 - int(doc.get("updated_ms", 0))
    return doc if age_ms <= STATUS_FRESH_PASSES * cfg.monitor_interval_ms + 2_000 else None


def _with_seconds(state: StreamState, running: dict[str, Any] | None) -> dict[str, Any]:
    from dataclasses import asdict

    row = asdict(state)
    seen = (running or {}).get("streams", {}).get(state.stream)
    row["lag_seconds"] = 0.0 if state.lag_records == 0 else (seen or {}).get("lag_seconds")
    return row


def _state(r: dict[str, Any]) -> str:
    words = []
    if r["replica_ended"]:
        words.append("ended")
    elif r["source_ended"]:
        words.append("source ended")
    if r["source_truncated_before"]:
        words.append(f"source truncated before {r['source_truncated_before']}")
    if r["replica_truncated_before"]:
        words.append(f"replica truncated before {r['replica_truncated_before']}")
    return ", ".join(words) or ("caught up" if r["lag_records"] == 0 else "copying")
