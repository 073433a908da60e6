"""The pure planning of Delta compaction: what gets compacted, skipped, deleted, and how it is laid out."""

from __future__ import annotations

import datetime as dt
import json
import random

import pytest

from jobs.delta_compaction import (
    CompactionConfig,
    LedgerInfo,
    app_id,
    assign_tasks,
    ctime_date,
    data_schema,
    deletable_ledgers,
    entry_ranges,
    file_stats,
    parse_ledger_ids,
    partition_dir,
    partition_values,
    plan_compaction,
)
from jobs.errors import BadArgumentError

pytestmark = pytest.mark.unit


def closed(lid: int, last: int = 9, ctime_ms: int = 0, password_ok: bool = True) -> LedgerInfo:
    return LedgerInfo(lid, True, last, ctime_ms, password_ok)


def test_plan_compacts_closed_uncommitted_and_says_why_for_the_rest() -> None:
    infos = [closed(5), LedgerInfo(3, False, -1, 0), closed(1), closed(2), closed(7, password_ok=False),
             closed(4, last=-1)]
    plan = plan_compaction(infos, committed={2}, missing=[9, 9])
    assert [i.ledger_id for i in plan.to_compact] == [1, 4, 5]   # the empty closed ledger 4 is "done" too
    assert plan.already_compacted == (2,)
    assert plan.not_closed == (3,)
    assert plan.wrong_password == (7,)
    assert plan.missing == (9,)


def test_a_committed_ledger_is_never_planned_again() -> None:
    infos = [closed(i) for i in range(10)]
    first = plan_compaction(infos, committed=set())
    second = plan_compaction(infos, committed={i.ledger_id for i in first.to_compact})
    assert second.to_compact == ()
    assert second.already_compacted == tuple(range(10))


def test_an_open_ledger_is_skipped_even_if_somehow_committed() -> None:
    plan = plan_compaction([LedgerInfo(1, False, -1, 0)], committed={1})
    assert plan.to_compact == () and plan.not_closed == (1,)


def test_delete_only_what_the_table_records() -> None:
    assert deletable_ledgers([1, 2, 3, 4], committed_after={2, 4, 8}) == [2, 4]
    assert deletable_ledgers([], committed_after={1}) == []


@pytest.mark.parametrize("last,step,want", [
    (-1, 10, []),
    (0, 10, [(0, 0)]),
    (9, 10, [(0, 9)]),
    (10, 10, [(0, 9), (10, 10)]),
    (24, 7, [(0, 6), (7, 13), (14, 20), (21, 24)]),
])
def test_entry_ranges_cover_every_entry_once(last: int, step: int, want: list[tuple[int, int]]) -> None:
    assert entry_ranges(last, step) == want


def test_entry_ranges_rejects_a_zero_step() -> None:
    with pytest.raises(BadArgumentError):
        entry_ranges(5, 0)


def test_assign_tasks_uses_each_ledger_once_and_balances(seed: int) -> None:
    rnd = random.Random(seed)
    infos = [closed(i, last=rnd.randrange(-1, 5000)) for i in range(40)]
    groups = assign_tasks(infos, 6)
    assert len(groups) == 6
    assert sorted(i.ledger_id for g in groups for i in g) == list(range(40))
    loads = [sum(max(1, i.entries) for i in g) for g in groups]
    biggest = max(max(1, i.entries) for i in infos)
    assert max(loads) - min(loads) <= biggest    # greedy LPT bound


def test_assign_tasks_never_makes_empty_tasks() -> None:
    assert [len(g) for g in assign_tasks([closed(1), closed(2)], 64)] == [1, 1]
    assert assign_tasks([], 4) == []


def test_partitioning_by_ledger_or_by_utc_day() -> None:
    info = closed(42, ctime_ms=int(dt.datetime(2024, 3, 1, 23, 59, tzinfo=dt.UTC).timestamp() * 1000))
    assert partition_values("ledger_id", info) == {"ledger_id": "42"}
    assert partition_values("ctime_date", info) == {"ctime_date": "2024-03-01"}
    assert partition_dir({"ctime_date": "2024-03-01"}) == "ctime_date=2024-03-01"
    assert ctime_date(0) == dt.date(1970, 1, 1)
    with pytest.raises(BadArgumentError):
        partition_values("payload", info)


def test_data_files_leave_out_the_partition_column() -> None:
    assert data_schema("ledger_id").names == ["entry_id", "payload", "ctime_date"]
    assert data_schema("ctime_date").names == ["ledger_id", "entry_id", "payload"]


def test_file_stats_are_delta_json_without_partition_columns() -> None:
    stats = json.loads(file_stats(5, 3, 0, 4, dt.date(2024, 1, 2), "ledger_id"))
    assert stats["numRecords"] == 5
    assert stats["minValues"] == {"entry_id": 0, "ctime_date": "2024-01-02"}
    assert stats["maxValues"] == {"entry_id": 4, "ctime_date": "2024-01-02"}
    assert set(stats["nullCount"]) == {"entry_id", "payload", "ctime_date"}


def test_app_ids_are_distinct_per_ledger() -> None:
    assert len({app_id(i) for i in range(1000)}) == 1000


def test_parse_ledger_ids() -> None:
    assert parse_ledger_ids("3, 1,2,,3") == (1, 2, 3)
    for bad in ("", "a", "1,-2", " , "):
        with pytest.raises(BadArgumentError):
            parse_ledger_ids(bad)


def test_config_rejects_bad_input() -> None:
    with pytest.raises(BadArgumentError):
        CompactionConfig("zk", "/t", partition_by="hour")  # type: ignore[arg-type]
    with pytest.raises(BadArgumentError):
        CompactionConfig("zk", "/t", entries_per_read=0)
    with pytest.raises(BadArgumentError):
        CompactionConfig("zk", "")
    with pytest.raises(BadArgumentError):
        CompactionConfig("zk", "s3://bucket/table")
    assert CompactionConfig("zk", "/t", partition_by="date").partition_column == "ctime_date"
