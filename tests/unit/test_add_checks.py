"""The bookie's per-add loop (accept_bodies, with check_body's rules inlined for speed) accepts
exactly the adds check_body accepts, with the same piggybacked LAC, and answers each rejected one
with check_body's error."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import HEADER, HEADER_BYTES
from spark_bookie.errors import BookieError
from spark_bookie.server.adds import AddGroup, accept_bodies, check_body

pytestmark = pytest.mark.unit

SIZE_MAX = 256


@st.composite
def adds(draw: st.DrawFn, lid: int) -> tuple[int, bytes]:
    """An add as a client, a buggy client or a hostile one might send it."""
    eid = draw(st.integers(-3, 50))
    kind = draw(st.sampled_from(["good", "other_entry", "other_ledger", "short", "long", "junk"]))
    lac = draw(st.integers(-1, 40))
    payload = draw(st.binary(max_size=SIZE_MAX - HEADER_BYTES))
    if kind == "short":
        return eid, draw(st.binary(max_size=HEADER_BYTES - 1))
    if kind == "junk":
        return eid, draw(st.binary(min_size=HEADER_BYTES, max_size=SIZE_MAX + 8))
    hlid = lid + 1 if kind == "other_ledger" else lid
    heid = eid + 1 if kind == "other_entry" else eid
    body = HEADER.pack(hlid, heid, lac, len(payload)) + payload
    if kind == "long":
        body += b"x" * (SIZE_MAX + 1 - len(body))
    return eid, body


@settings(max_examples=300, deadline=None)
@given(lid=st.integers(0, 1 << 40), data=st.data())
def test_fast_and_slow_checks_agree(lid: int, data: st.DataObject) -> None:
    group = data.draw(st.lists(adds(lid), max_size=12))
    g = AddGroup(lid, 0, b"k" * 20, [e for e, _ in group],
                 list(range(len(group))), [b for _, b in group])
    records: list = []
    ok_ids: list[int] = []
    failures: list[pb.AddResponse] = []
    entries, top = accept_bodies(g, SIZE_MAX, records, ok_ids, failures)

    want_ok, want_fail, want_top = [], {}, -2
    for rid, (eid, body) in enumerate(group):
        try:
            lac = check_body(lid, eid, body, SIZE_MAX)
        except BookieError as e:
            want_fail[rid] = (e.status, str(e))
            continue
        want_ok.append(rid)
        want_top = max(want_top, lac)
    assert ok_ids == want_ok and top == want_top
    assert entries == [group[r] for r in want_ok]
    assert [(r.ledger_id, r.entry_id, r.payload) for r in records] == [(lid, *group[r]) for r in want_ok]
    assert {f.request_id: (f.status, f.detail) for f in failures} == want_fail
