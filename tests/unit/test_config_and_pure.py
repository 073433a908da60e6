"""Pure pieces of the bookie: config validation, disk hysteresis, cookies, framing, LAC tracking."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger_client.protocol.framing import (
    Digester,
    DigestError,
    DigestType,
    FramingError,
    master_key,
    parse_header,
)
from spark_bookie.errors import ConfigError, CookieError
from spark_bookie.server.config import BookieConfig, load_config
from spark_bookie.server.cookie import Cookie, verify_or_create
from spark_bookie.server.disk import DiskState
from spark_bookie.server.lac import LacTracker

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def test_conf_file_documents_every_key_with_its_default():
    documented = tomllib.loads((ROOT / "conf" / "bookie.toml").read_text())["bookie"]
    fields = {f.name for f in dataclasses.fields(BookieConfig)} - {"extra"}
    assert set(documented) == fields
    defaults = BookieConfig()
    for k, v in documented.items():
        if k not in ("journal_dirs", "ledger_dirs"):
            assert getattr(defaults, k) == v, k


@pytest.mark.parametrize("overrides, words", [
    ({"compression": "zstd"}, "compression"),
    ({"port": 0}, "port"),
    ({"disk_usage_lwm": 0.99}, "disk_usage_lwm"),
    ({"entry_size_bytes_max": 1 << 30}, "grpc_message_bytes_max"),
    ({"bogus_key": 1}, "bogus_key"),
    ({"flush_interval_ms": -1}, "flush_interval_ms"),
])
def test_invalid_config_is_refused_with_the_key_named(overrides, words):
    with pytest.raises(ConfigError, match=words):
        load_config(journal_dirs=["/j"], ledger_dirs=["/l"], **overrides)


def test_missing_dirs_and_bad_file(tmp_path):
    with pytest.raises(ConfigError, match="journal_dirs"):
        load_config(ledger_dirs=["/l"])
    bad = tmp_path / "bad.toml"
    bad.write_text("[bookie\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")


def test_disk_state_has_hysteresis():
    s = DiskState(threshold=0.9, lwm=0.8)
    assert not s.update(0.85) and not s.read_only
    assert s.update(0.9) and s.read_only
    assert not s.update(0.85) and s.read_only  # between the marks: stays read-only
    assert s.update(0.79) and not s.read_only


def test_disk_state_counts_the_reserves_in_bytes():
    """A small disk fills from under the threshold to 100% in one flush: what decides is the
    headroom left once the write cache is flushed, against the reserves (twice them to return)."""
    s = DiskState(threshold=0.95, lwm=0.90, reserve_bytes=12 << 20)
    assert not s.update(0.5, 40 << 20) and not s.read_only
    assert s.update(0.5, (12 << 20) - 1) and s.read_only          # far below the threshold, yet full
    assert not s.update(0.5, 20 << 20) and s.read_only            # above the reserve, below twice it
    assert s.update(0.5, 24 << 20) and not s.read_only
    assert s.update(0.96, 100 << 20) and s.read_only               # the fraction still counts
    assert s.update(0.5, None) and not s.read_only                 # no byte count: the fraction decides


def test_disk_monitor_refuses_an_add_its_flush_could_not_take_and_turns_read_only():
    from spark_bookie.server.disk import DiskMonitor, LedgerDiskRoom

    cache = {"bytes": 0}
    flushed = {"bytes": 0}
    changes: list[bool] = []
    free = {"bytes": 40 << 20}
    room = LedgerDiskRoom(("/",), 12 << 20, lambda: cache["bytes"], lambda: flushed["bytes"])
    mon = DiskMonitor(["/"], DiskState(0.95, 0.90, 12 << 20), 60_000, changes.append,
                      measure=lambda _d: (0.5, free["bytes"], 64 << 20), room=room)
    import spark_bookie.server.disk as disk_mod

    orig = disk_mod.free_bytes
    disk_mod.free_bytes = lambda _dirs: free["bytes"]
    try:
        mon.check_once()
        assert mon.has_room(1 << 20)
        cache["bytes"] = 27 << 20                  # 27 MiB waiting: 13 MiB headroom, 1 MiB above the reserve
        assert mon.has_room((1 << 20) - 1) and not mon.has_room((1 << 20) + 1)
        mon.check_once()                           # what check_soon asked for: read-only now
        assert changes == [True] and mon.read_only and not mon.has_room(1)
        flushed["bytes"] = cache["bytes"]          # a flush moved it to disk: free shrank, cache emptied
        free["bytes"] -= cache["bytes"]
        cache["bytes"] = 0
        mon.check_once()
        assert mon.read_only                       # 13 MiB headroom: above the reserve, not twice it
        free["bytes"] += 20 << 20                  # someone freed space
        mon.check_once()
        assert changes == [True, False] and mon.has_room(1 << 20)
    finally:
        disk_mod.free_bytes = orig


class _Cookies:
    def __init__(self) -> None:
        self.data: dict[str, tuple[bytes, int]] = {}

    def read_cookie(self, bookie_id):
        return self.data.get(bookie_id)

    def write_cookie(self, bookie_id, data, version):
        cur = self.data.get(bookie_id)
        assert (cur is None) == (version is None)
        self.data[bookie_id] = (data, 0 if cur is None else cur[1] + 1)
        return self.data[bookie_id][1]


def test_cookie_lifecycle(tmp_path):
    j, lg = str(tmp_path / "j"), str(tmp_path / "l")
    store = _Cookies()
    me = Cookie("h:1", (j,), (lg,), "inst")
    assert verify_or_create(store, me) is True
    assert verify_or_create(store, me) is False
    with pytest.raises(CookieError, match="swapped"):
        verify_or_create(store, Cookie("h:1", (lg,), (j,), "inst"))
    with pytest.raises(CookieError, match="port"):
        verify_or_create(store, Cookie("h:2", (j,), (lg,), "inst"))
    with pytest.raises(CookieError, match="another cluster"):
        verify_or_create(store, Cookie("h:1", (j,), (lg,), "other"))
    (Path(j) / "current" / "VERSION").unlink()
    with pytest.raises(CookieError, match="no cookie"):
        verify_or_create(store, me)


def test_cookie_round_trip():
    c = Cookie("10.0.0.1:3181", ("/a", "/b"), ("/c",), "abc")
    assert Cookie.decode(c.encode(), "x") == c
    with pytest.raises(CookieError, match="unreadable"):
        Cookie.decode(b"\xff\xfe", "x")


@given(st.sampled_from(list(DigestType)), st.integers(0, 2**63 - 1), st.integers(0, 2**40),
       st.binary(max_size=2000), st.binary(max_size=16))
def test_framing_round_trip(dtype, lid, eid, data, pw):
    d = Digester(dtype, pw)
    framed = d.frame(lid, eid, eid - 1, len(data), data)
    assert parse_header(framed) == (lid, eid, eid - 1, len(data))
    assert d.unframe(framed, lid, eid) == (eid - 1, len(data), data)
    assert d.unframe_lac(d.frame_lac(lid, eid), lid) == eid


@pytest.mark.parametrize("dtype", [DigestType.CRC32, DigestType.CRC32C, DigestType.HMAC])
def test_digest_catches_every_flipped_byte(dtype):
    d = Digester(dtype, b"pw")
    framed = d.frame(1, 2, 1, 5, b"hello")
    for i in range(len(framed)):
        bad = bytearray(framed)
        bad[i] ^= 0x01
        with pytest.raises(FramingError):
            d.unframe(bytes(bad), 1, 2)
    with pytest.raises(DigestError):
        framed = Digester(DigestType.HMAC, b"pw").frame(1, 2, 1, 1, b"x")
        Digester(DigestType.HMAC, b"other").unframe(framed, 1, 2)


def test_master_key_is_bookkeepers():
    import hashlib

    assert master_key(b"pw") == hashlib.sha1(b"ledgerpw").digest() and len(master_key(b"")) == 20


def test_lac_tracker_long_poll():
    async def run():
        t = LacTracker(lambda lid: 3)
        assert await t.wait_past(1, 2, 1.0) == 3           # already past
        assert await t.wait_past(1, 3, 0.05) == 3          # times out unchanged
        waiter = asyncio.ensure_future(t.wait_past(1, 3, 5.0))
        await asyncio.sleep(0.01)
        t.advance(1, 2)                                    # never backwards
        assert t.get(1) == 3 and not waiter.done()
        t.advance(1, 7)
        assert await waiter == 7
        assert t.waiting() == 0

    asyncio.run(run())


def test_client_conf_file_documents_every_key_with_its_default():
    from ledger_client import ClientConfig

    text = (ROOT / "conf" / "client.toml").read_text()
    documented = tomllib.loads(text)["client"]
    fields = {f.name for f in dataclasses.fields(ClientConfig)}
    unset = {"placement_seed", "zk_auth", "zk_member_auth", "auth_token", "auth_token_file", "tls_ca_path",
             "tls_cert_path", "tls_key_path"}   # None by default: documented commented out
    assert set(documented) | unset == fields
    for key in unset:
        assert f"# {key} =" in text, key
    assert ClientConfig(**documented) == ClientConfig()


def test_free_port_never_hands_out_a_port_twice() -> None:
    """A sandbox asks for every bookie's port before any binds: the same port twice gave two
    bookies one id (the second refused to start over the first's cookie)."""
    from spark_bookie.local.zookeeper import free_port, free_port_range

    ports = [free_port() for _ in range(2000)]
    base = free_port_range(5)
    assert len(set(ports)) == len(ports)
    assert not set(range(base, base + 5)) & set(ports)


def test_free_port_keeps_to_its_slice_when_harnesses_run_side_by_side(monkeypatch) -> None:
    """Two test workers each pick from their own part of the port range, as do the processes they
    start (the slice is in the environment); a malformed slice means the whole range."""
    from spark_bookie.local import zookeeper as z

    low, top = 10_000, z._ephemeral_floor() - 1
    monkeypatch.setenv(z.PORT_SLICE_ENV, "1/2")
    half = low + (top - low) // 2
    assert all(half <= z.free_port() < top for _ in range(200))
    monkeypatch.setenv(z.PORT_SLICE_ENV, "0/2")
    assert all(low <= z.free_port() < half for _ in range(200))
    for bad in ("2/2", "x", "1/0", ""):
        monkeypatch.setenv(z.PORT_SLICE_ENV, bad)
        assert z._port_slice(low, top) == (low, top)


def test_lac_advanced_from_another_thread_wakes_a_long_poll_on_the_loop():
    """Adds on the TCP port are answered from the journal thread, which advances the LAC there."""
    async def run():
        t = LacTracker(lambda lid: -1, asyncio.get_running_loop())
        waiter = asyncio.ensure_future(t.wait_past(5, -1, 5.0))
        await asyncio.sleep(0.01)
        thread = threading.Thread(target=t.advance, args=(5, 0))
        thread.start()
        thread.join()
        assert await asyncio.wait_for(waiter, 2.0) == 0
        assert t.waiting() == 0 and t.get(5) == 0

    asyncio.run(run())


def test_steal_share_is_the_hypervisors_part_of_the_host_cpu_time_between_two_readings():
    from spark_bookie.bench.host import cpu_times, steal_share

    # user nice system idle iowait irq softirq steal guest guest_nice (guest time is inside user)
    before = [100, 0, 50, 800, 10, 0, 5, 35, 7, 0]
    after = [160, 0, 70, 860, 10, 0, 10, 65, 9, 0]
    assert steal_share(before, after) == 30 / 175
    assert steal_share(before, before) == 0.0
    now = cpu_times()
    assert len(now) >= 8 and 0.0 <= steal_share(now, cpu_times()) <= 1.0
