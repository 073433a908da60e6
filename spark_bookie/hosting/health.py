"""The Spark-hosted cluster's health as the driver logs it and `spark-bookie cluster status` prints it."""

from __future__ import annotations

import logging
import time
from typing import Any

from metadata import MetadataError, MetadataStore
from spark_bookie.hosting.slots import SERVING, read_slot_statuses

log = logging.getLogger(__name__)

UNREGISTERED = "unregistered"  # the slot's status says serving, but its bookie is not in ZooKeeper


def _underreplication_view(store: MetadataStore) -> tuple[int | None, str | None]:
    """(number of under-replicated ledgers, current auditor); None where it cannot be read."""
    try:
        return len(store.underreplication.list_underreplicated()), store.underreplication.current_auditor()
    except MetadataError as e:  # health reporting must never take the driver down
        log.debug("under-replication view unavailable: %s", e)
        return None, None


def cluster_health(store: MetadataStore, name: str, wanted: int, *, is_auditor: bool | None = None,
                   resubmits: int = 0) -> dict[str, Any]:
    """The cluster as the driver sees it (also what `spark-bookie cluster status` prints).

    A slot's status node is written by its task and outlives it: a slot whose host died whole still
    said "serving" until Spark noticed the lost executor (up to a minute: the master's worker
    timeout), seen when a worker host was killed in the multi-host deployment test. So a serving
    slot counts only while its bookie is registered; otherwise its state reads "unregistered"."""
    slots = read_slot_statuses(store, name)
    ur, auditor = _underreplication_view(store)
    writable, readonly = store.cluster.list_bookies(), store.cluster.list_bookies(readonly=True)
    registered = set(writable) | set(readonly)

    def state(s: dict[str, Any]) -> Any:
        if s.get("state") == SERVING and s.get("bookie_id") not in registered:
            return UNREGISTERED
        return s.get("state")

    return {
        "time_ms": int(time.time() * 1000),
        "bookies_wanted": wanted,
        "slots_serving": sum(1 for s in slots.values() if state(s) == SERVING),
        "slots": {str(k): {"state": state(s), "bookie_id": s.get("bookie_id"), "error": s.get("error", ""),
                           "http_port": s.get("http_port", 0)}
                  for k, s in sorted(slots.items())},
        "writable": writable,
        "readonly": readonly,
        "under_replicated": ur,
        "auditor": auditor,
        "driver_is_auditor": is_auditor,
        "resubmits": resubmits,
    }


def health_line(h: dict[str, Any]) -> str:
    failed = {k: s["error"] for k, s in h["slots"].items() if s.get("error")}
    ur = "?" if h.get("under_replicated") is None else h["under_replicated"]
    line = (f"{h['slots_serving']}/{h['bookies_wanted']} slots serving; bookies {len(h['writable'])} writable, "
            f"{len(h['readonly'])} read-only; under-replicated ledgers {ur}; auditor {h.get('auditor')} "
            f"(the driver: {h.get('driver_is_auditor')}); job resubmits {h.get('resubmits', 0)}")
    if failed:
        line += "; failing slots: " + "; ".join(f"{k}: {v}" for k, v in failed.items())
    return line


