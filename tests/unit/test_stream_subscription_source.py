"""The ledger source's option subscription without Spark or bookies (jobs/stream_subscription.py):
the position committed for a microbatch's end offset, the option's checks, and the commit hook
(only streams whose end moved, failures kept for the next batch, deleted streams dropped)."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from jobs.options import StreamSourceOptions
from jobs.stream_subscription import commit_subscription, consumed_through
from ledger_client import DLSN, errors
from ledger_client.stream import records
from metadata.streams import SegmentMeta, SegmentState, StreamMeta, StreamView

pytestmark = pytest.mark.unit

SEALED, OPEN = SegmentState.SEALED, SegmentState.IN_PROGRESS


def seg(seq: int, state: SegmentState = SEALED, records: int = 6, last_entry: int = 5, last_slot: int = 0):
    return SegmentMeta(seq, 10 + seq, state, 0, 5, last_entry, last_slot, records, 600)


def view(*segs: SegmentMeta) -> StreamView:
    return StreamView(StreamMeta(next_sequence=max((s.sequence for s in segs), default=0) + 1), 7,
                      {s.sequence: (s, 2) for s in segs})


def test_the_position_is_the_last_record_before_the_end():
    # the segment in progress: entries 0-4 hold records, 5 an idle control record (older writers')
    entries = {e: records.encode([1] * (e + 1), [b"x"] * (e + 1), 0) for e in range(5)}
    entries[5] = records.encode([], [], 15)
    ns = FakeNamespace({"a": view(seg(1), seg(2, last_entry=7, last_slot=3), seg(3, records=0), seg(4, OPEN))},
                       [], entries)
    # inside an entry: the slot before; at a segment's start: slot -1 of entry 0 (nothing of it)
    assert consumed_through(ns, "a", DLSN(4, 3, 2)) == (4, 3, 1)
    assert consumed_through(ns, "a", DLSN(4, 0, 0)) == (4, 0, -1)
    assert consumed_through(ns, "a", DLSN(5, 0, 0)) == (5, 0, -1)
    assert ns.reads == []
    # a sealed segment: its last record from metadata, or slot -1 when records follow
    assert consumed_through(ns, "a", DLSN(2, 8, 0)) == (2, 7, 3)
    assert consumed_through(ns, "a", DLSN(2, 7, 0)) == (2, 7, -1)
    assert consumed_through(ns, "a", DLSN(3, 1, 0)) == (3, 0, -1)       # an empty one
    assert consumed_through(ns, "a", DLSN(9, 2, 0)) == (9, 2, -1)       # gone: the stream is past it
    assert ns.reads == []
    # the segment in progress: read back over the control record, in one range read
    assert consumed_through(ns, "a", DLSN(4, 6, 0)) == (4, 4, 4)
    assert consumed_through(ns, "a", DLSN(4, 3, 0)) == (4, 2, 2)
    assert ns.reads == [(0, 5), (0, 2)]


def test_the_option_is_checked_and_travels_with_the_options():
    o = StreamSourceOptions.parse({"zk": "z", "streams": "pay/*", "Subscription": " etl-1 "}, env={})
    assert o.subscription == "etl-1" and pickle.loads(pickle.dumps(o)) == o
    assert StreamSourceOptions.parse({"zk": "z", "streams": "pay/*"}, env={}).subscription is None
    for bad in ("", "a/b", "..", "x" * 256, "a b"):
        with pytest.raises(errors.InvalidNameError, match="option subscription"):
            StreamSourceOptions.parse({"zk": "z", "streams": "pay/*", "subscription": bad}, env={})


class FakeHandle:
    def __init__(self, entries: dict[int, bytes], reads: list) -> None:
        self.entries, self.reads = entries, reads
        self.last_add_confirmed = -1

    def read_last_add_confirmed(self) -> int:
        self.last_add_confirmed = max(self.entries)
        return self.last_add_confirmed

    def read(self, first: int, last: int) -> list[SimpleNamespace]:
        assert last <= self.last_add_confirmed
        self.reads.append((first, last))
        return [SimpleNamespace(entry_id=e, data=self.entries[e]) for e in range(first, last + 1)]


class FakeNamespace:
    def __init__(self, views: dict[str, StreamView], log: list, entries: dict[int, bytes] | None = None) -> None:
        self.views, self.log = views, log
        self.failing = False
        self.reads: list[tuple[int, int]] = []
        self.name = "pay"
        self.settings = SimpleNamespace(ledger_password=b"")
        self.client = SimpleNamespace(open_ledger=lambda lid, pw, recovery: FakeHandle(entries or {}, self.reads))

    def view(self, name: str) -> StreamView:
        if name not in self.views:
            raise errors.NoSuchStreamError(name)
        return self.views[name]

    def commit_subscription(self, stream: str, name: str, dlsn: DLSN) -> None:
        if self.failing:
            raise errors.MetadataServiceError("ZooKeeper away")
        if stream not in self.views:
            raise errors.NoSuchStreamError(stream)
        self.log.append((stream, name, tuple(dlsn)))


class FakeClient:
    def __init__(self, ns: FakeNamespace) -> None:
        self.ns = ns

    def namespace(self, name: str) -> FakeNamespace:
        if name != "pay":
            raise errors.NoSuchNamespaceError(name)
        return self.ns


def test_commits_only_what_moved_and_retries_failures():
    log: list = []
    ns = FakeNamespace({"a": view(seg(1), seg(2, OPEN)), "b": view(seg(1))}, log)
    client = FakeClient(ns)
    committed: dict[str, DLSN] = {}
    ends = {"pay/a": DLSN(1, 3, 0), "pay/b": DLSN(2, 0, 0)}
    assert commit_subscription(client, "etl", ends, committed) == 2  # type: ignore[arg-type]
    assert log == [("a", "etl", (1, 3, -1)), ("b", "etl", (2, 0, -1))]
    assert commit_subscription(client, "etl", ends, committed) == 0  # type: ignore[arg-type]
    ns.failing = True
    ends["pay/a"] = DLSN(1, 9, 0)
    assert commit_subscription(client, "etl", ends, committed) == 0  # type: ignore[arg-type]
    ns.failing = False
    del ns.views["b"]
    ends["pay/gone"] = DLSN(1, 1, 0)
    assert commit_subscription(client, "etl", ends, committed) == 1  # type: ignore[arg-type]
    assert log[-1] == ("a", "etl", (1, 5, 0)) and len(log) == 3   # segment 1's last record
    assert set(committed) == {"pay/a", "pay/b"}   # b unchanged since its commit; gone never committed
