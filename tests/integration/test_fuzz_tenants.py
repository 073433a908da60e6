"""Seeded cross-tenant fuzzing of both bookie ports (DESIGN §4.8, §4.9, invariant 11).

A role holding a valid token and no grant (``intruder``) sends a few hundred random requests
straight to the bookies, past every check of the client: reads, range and listed reads (with
bodies, or ids only: which entries a bookie holds), long polls, fences with the right and a wrong
master key, adds with the right key (normal and recovery), explicit LAC writes and reads; on the
gRPC port, on the TCP port through the client's transport, and as hand-built TCP frames (some
carrying a forged token to rotate to). Targets: the segment
ledgers of other tenants' streams, private ledgers of other roles, and guessed ids (0..200, huge,
negative). Every answer must be EUA, ENOLEDGER, EBADREQ or a clean gRPC refusal, never EOK, never
a hang; afterwards both bookies are alive, registered and serving, the victims' writers were not
fenced, every record reads back, and no bookie holds an entry the intruder sent.

Replay a failure with SPARK_BOOKIE_SEED=<the printed seed>.
"""

from __future__ import annotations

import random
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from ledger_client import ClientConfig, LedgerClient, errors
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import Digester, DigestType, master_key
from ledger_client.protocol.tcp_framing import ADD_HELLO_AUTH, READ_HELLO_AUTH, add_batch_frame, frame, read_frames
from ledger_client.transport import BookieClient, StreamLimits
from ledger_client.transport.credentials import Credentials
from spark_bookie.server.auth import mint_token

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SECRET = b"the-cross-tenant-fuzz-cluster-secret-0123456789"
FORGED_SECRET = b"not-the-cluster-secret-but-long-enough-0123456"
ROLES = {"root": "admin", "acme-admin": "client", "globex-admin": "client", "billing": "client", "ops": "client",
         "intruder": "client", "svc": "service"}
PASSWORDS = {"payments": "payments-pw", "ops": "ops-pw"}
PRIVATE_PASSWORD = b"private-pw"
REQUESTS = 600
WRITE_EVERY = 40                      # a victim's writer appends a record every this many requests
ANSWERS = {pb.EUA, pb.ENOLEDGER, pb.EBADREQ}
CLEAN_GRPC = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT,
              grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION}
ANSWER_TIMEOUT_S = 20.0
DIGEST = Digester(DigestType.CRC32C, b"")
HUGE = (1 << 63) - 1


def plus(entry_id: int, n: int) -> int:
    """``entry_id + n`` kept an int64 (a protobuf field refuses more)."""
    return min(entry_id + n, HUGE)


def token(role: str, secret: bytes = SECRET, claim: str | None = None) -> str:
    return mint_token(secret, role, claim or ROLES[role], ttl_s=3600)


def client(sb: Any, role: str) -> LedgerClient:
    return LedgerClient(sb.connect_string, config=ClientConfig(auth_token=token(role), operation_timeout_ms=15_000))


@dataclass
class Victims:
    """Other roles' data, with the writers kept open through the fuzzing."""

    sb: Any
    clients: list[LedgerClient]
    writers: dict[str, Any]                                 # "ns/stream" -> its open StreamWriter
    records: dict[str, list[bytes]] = field(default_factory=dict)   # "ns/stream" -> every acknowledged payload
    keys: dict[int, bytes] = field(default_factory=dict)    # known ledger id -> its right master key
    private: Any = None                                     # billing's open ledger outside namespaces
    private_entries: list[bytes] = field(default_factory=list)
    closed_private: tuple[int, list[bytes]] = (0, [])       # ops's closed ledger outside namespaces

    def write(self, stream: str, payload: bytes) -> None:
        self.writers[stream].write(payload)
        self.records[stream].append(payload)

    def refresh_keys(self) -> None:
        """Every ledger of the victims' streams (segments roll while the fuzzing goes on)."""
        with client(self.sb, "root") as c:
            for stream in self.writers:
                ns, name = stream.split("/")
                for s in c.namespace(ns).stream_info(name).segments:
                    if s.ledger_id is not None:
                        self.keys[s.ledger_id] = master_key(PASSWORDS[ns].encode())


@pytest.fixture(scope="module")
def victims(zk_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Victims]:
    """Two bookies checking tokens and grants. Tenant acme's namespace payments (billing: produce
    and consume) and tenant globex's namespace ops (role ops) each hold a stream of several
    segments whose writer stays open; billing holds an open ledger outside namespaces, ops a closed one."""
    from spark_bookie.local.sandbox import Sandbox

    root = Path(tmp_path_factory.mktemp("fuzz-tenants"))
    secret = root / "secret"
    secret.write_bytes(SECRET)
    sb = Sandbox(root / "cluster", 2, zk_connect=f"{zk_server}/t-{uuid.uuid4().hex[:12]}/ledgers",
                 bookie_settings={"zk_session_timeout_ms": 4000, "gc_interval_ms": 3_600_000, "auth_enabled": True,
                                  "auth_token_secret_path": str(secret)})
    sb.start()
    opened: list[LedgerClient] = []
    try:
        with client(sb, "root") as c:
            c.create_tenant("acme", admin_roles=["acme-admin"])
            c.create_tenant("globex", admin_roles=["globex-admin"])
        for admin, ns, tenant, role in (("acme-admin", "payments", "acme", "billing"),
                                        ("globex-admin", "ops", "globex", "ops")):
            with client(sb, admin) as c:
                c.create_namespace(ns, tenant=tenant, ensemble_size=2, write_quorum_size=2, ack_quorum_size=2,
                                   password=PASSWORDS[ns], segment_rolling_bytes=600, output_buffer_bytes=100) \
                    .grant_permission(role, ["produce", "consume"])
        v = Victims(sb, opened, {})
        for role, stream in (("billing", "payments/orders"), ("ops", "ops/events")):
            c = client(sb, role)
            opened.append(c)
            ns, name = stream.split("/")
            v.writers[stream] = c.namespace(ns).open_writer(name)
            v.records[stream] = []
            for i in range(60):
                v.write(stream, b"%s-before-%03d" % (name.encode(), i))
        billing, ops = opened
        v.private = billing.create_ledger(2, 2, 2, password=PRIVATE_PASSWORD)
        for i in range(10):
            v.private_entries.append(b"billing-private-%d" % i)
            v.private.append(v.private_entries[-1])
        w = ops.create_ledger(2, 2, 2, password=PRIVATE_PASSWORD)
        for i in range(5):
            w.append(b"ops-private-%d" % i)
        w.close()
        v.closed_private = (w.ledger_id, [b"ops-private-%d" % i for i in range(5)])
        v.keys[v.private.ledger_id] = v.keys[w.ledger_id] = master_key(PRIVATE_PASSWORD)
        v.refresh_keys()
        yield v
    finally:
        for c in opened:
            c.close()
        sb.stop()


# ------------------------------------------------------------------------- the intruder's requests


class Intruder:
    """Random requests of the ungranted role on every bookie, both ports; what it sent, and what it got."""

    def __init__(self, rng: random.Random, v: Victims) -> None:
        self.rng, self.v = rng, v
        self.bookies = [b.bookie_id for b in v.sb.bookies]
        creds = Credentials(auth_token=token("intruder"))
        forged = Credentials(auth_token=token("intruder", FORGED_SECRET, "admin"))   # a superuser, signed wrongly
        self.clients: dict[tuple[str, str], BookieClient] = {}
        for bid in self.bookies:
            self.clients[bid, "tcp"] = BookieClient(bid, credentials=creds, read_transport="tcp",
                                                    timeout_ms=int(ANSWER_TIMEOUT_S * 1000))
            self.clients[bid, "grpc"] = BookieClient(bid, credentials=creds, read_transport="grpc",
                                                     limits=StreamLimits(add_transport="grpc"),
                                                     timeout_ms=int(ANSWER_TIMEOUT_S * 1000))
            self.clients[bid, "forged"] = BookieClient(bid, credentials=forged, read_transport="tcp",
                                                       timeout_ms=int(ANSWER_TIMEOUT_S * 1000))
        self.tcp_port: dict[str, int] = {}
        for bid in self.bookies:   # anyone with a valid token may ask where the TCP port is
            with BookieClient(bid, credentials=creds) as c:
                self.tcp_port[bid] = c.info().add_port
        self.sent: dict[tuple[int, int], bytes] = {}   # (ledger, entry) -> a body the intruder added
        self.outcomes: Counter[str] = Counter()

    def close(self) -> None:
        for c in self.clients.values():
            c.close()

    # -- what to aim at ------------------------------------------------------------------------
    def ledger(self) -> tuple[int, bytes]:
        """A ledger id and a master key: the right key when the ledger is known."""
        r, rng = self.rng.random(), self.rng
        if r < 0.5:
            lid = rng.choice(sorted(self.v.keys))
        elif r < 0.8:
            lid = rng.randrange(0, 201)
        elif r < 0.9:
            lid = rng.choice([HUGE, 1 << 62, rng.randrange(1 << 40, HUGE)])
        else:
            lid = rng.choice([-1, -2, -rng.randrange(3, HUGE)])
        return lid, self.v.keys.get(lid, master_key(PASSWORDS["payments"].encode()))

    def entry(self) -> int:
        rng = self.rng
        return rng.choice([0, 1, rng.randrange(0, 40), rng.randrange(40, 400), 10_000 + rng.randrange(1000),
                           -1, HUGE])

    def body(self, lid: int, eid: int) -> bytes:
        payload = b"INTRUDER %d/%d %d" % (lid, eid, self.rng.randrange(1 << 30))
        body = DIGEST.frame(lid, eid, eid - 1 if eid > 0 else -1, 100 * (abs(eid) % 1000 + 1), payload)
        if 0 <= lid and 0 <= eid:
            self.sent[lid, eid] = body
        return body

    # -- answers -------------------------------------------------------------------------------
    def answered(self, what: str, status: int, detail: str = "") -> None:
        name = pb.StatusCode.Name(status) if status in pb.StatusCode.values() else str(status)
        assert status in ANSWERS, f"{what}: answered {name} ({detail!r})"
        self.outcomes[f"{what.split('(')[0].split(' on ')[0]} {name}"] += 1

    def call(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()``'s answer; a gRPC refusal is a clean answer too, anything else fails the test."""
        try:
            return fn()
        except (errors.LedgerError, grpc.RpcError) as e:
            rpc = e if isinstance(e, grpc.RpcError) else e.__cause__
            if isinstance(rpc, grpc.RpcError) and rpc.code() in CLEAN_GRPC:
                self.outcomes[f"{what.split('(')[0]} grpc {rpc.code().name}"] += 1
                return None
            raise AssertionError(f"{what}: {type(e).__name__}: {e}") from e

    # -- one random request --------------------------------------------------------------------
    def one(self) -> None:
        rng = self.rng
        bid = rng.choice(self.bookies)
        kind = rng.choices(["tcp", "grpc", "forged", "raw"], weights=[40, 40, 5, 15])[0]
        if kind == "raw":
            return self.raw(bid)
        c = self.clients[bid, kind]
        lid, key = self.ledger()
        eid = self.entry()
        op = rng.choice(["read", "read_range", "listed", "long_poll", "poll_range", "fence", "add", "write_lac",
                         "read_lac"])
        what = f"{op}({kind} {bid} ledger {lid} entry {eid})"
        resp: Any
        if op == "read":
            resp = self.call(what, lambda: c.read(lid, eid))
        elif op == "read_range":
            resp = self.call(what, lambda: c.read_range(lid, eid, plus(eid, rng.randrange(0, 50))))
        elif op == "listed":
            ids = sorted(rng.sample(range(0, 300), rng.randrange(1, 8)))
            if rng.random() < 0.2:
                ids.reverse()   # not ascending: a bad request
            listed = c.held_entries_future if rng.random() < 0.5 else c.read_entries_future   # ids only, or bodies
            resp = self.call(what, lambda: listed(lid, ids).result(timeout=ANSWER_TIMEOUT_S))
        elif op == "long_poll":
            resp = self.call(what, lambda: c.read(lid, max(eid, 0), previous_lac=rng.choice([-1, 0, 5, eid]),
                                                  long_poll_timeout_ms=300, piggyback=rng.random() < 0.5))
        elif op == "poll_range":
            resp = self.call(what, lambda: c.poll_range_future(lid, max(eid, 0), plus(max(eid, 0), 20),
                                                               rng.choice([-1, 0, 5]), 300)
                             .result(timeout=ANSWER_TIMEOUT_S))
        elif op == "fence":
            k = key if rng.random() < 0.5 else rng.randbytes(20)
            resp = self.call(what, lambda: c.read(lid, rng.choice([-1, eid]), fence=True, master_key=k))
        elif op == "add":
            recovery = rng.random() < 0.3
            b = self.body(lid, eid)
            resp = self.call(what, lambda: c.add(lid, eid, key, b, recovery=recovery).result(timeout=ANSWER_TIMEOUT_S))
        elif op == "write_lac":
            lac = rng.choice([eid, 1 << 40, HUGE])
            resp = self.call(what, lambda: c.write_lac(lid, lac, key, DIGEST.frame_lac(lid, lac)))
        else:
            resp = self.call(what, lambda: c.read_lac(lid))
        if resp is not None:
            self.answered(what, resp.status, resp.detail)
            assert not getattr(resp, "body", b"") and not getattr(resp, "bodies", []), what
            assert not getattr(resp, "lac_body", b"") and not getattr(resp, "last_entry_body", b""), what

    def raw(self, bid: str) -> None:
        """Hand-built frames on a TCP connection of its own: a few adds or reads, sometimes with a
        forged superuser token to rotate to."""
        rng = self.rng
        adds = rng.random() < 0.5
        hello = (ADD_HELLO_AUTH if adds else READ_HELLO_AUTH) + frame(bid.encode()) + frame(token("intruder").encode())
        frames: list[bytes] = []
        pending: set[int] = set()
        for _ in range(rng.randrange(1, 4)):
            lid, key = self.ledger()
            rid = rng.randrange(1, 1 << 60)
            pending.add(rid)
            rotated = token("intruder", FORGED_SECRET, "admin") if rng.random() < 0.2 else None
            if adds:
                eid = self.entry()
                flag = pb.RECOVERY_ADD if rng.random() < 0.3 else pb.ADD_NONE
                frames.append(add_batch_frame([(lid, flag, key, [eid], [rid], [self.body(lid, eid)])], rotated))
            else:
                first = self.entry()
                req = pb.ReadRangeRequest(ledger_id=lid, first_entry_id=first, request_id=rid, auth_token=rotated or "",
                                          last_entry_id=plus(first, rng.randrange(50)))
                r = rng.random()
                if r < 0.3:
                    req.entry_ids.extend(sorted(rng.sample(range(0, 300), rng.randrange(1, 6))))
                    req.ids_only = rng.random() < 0.5
                elif r < 0.5:
                    req.wait_for_lac, req.previous_lac, req.timeout_ms = True, rng.choice([-1, 0, 7]), 300
                frames.append(frame(req.SerializeToString()))
        what = f"raw {'add' if adds else 'read'} on {bid}"
        with socket.create_connection(("127.0.0.1", self.tcp_port[bid]), timeout=ANSWER_TIMEOUT_S) as s:
            s.sendall(hello + b"".join(frames))
            answers = read_frames(s, 64 << 20)
            while pending:
                try:
                    data = next(answers)
                except StopIteration:
                    raise AssertionError(f"{what}: the bookie closed the connection with {len(pending)} "
                                         "requests unanswered") from None
                if adds:
                    resp = pb.AddBatchResponse.FromString(data)
                    assert not resp.ok_request_ids, f"{what}: adds {list(resp.ok_request_ids)} acknowledged"
                    for r in resp.responses:
                        self.answered(what, r.status, r.detail)
                        pending.discard(r.request_id)
                else:
                    rr = pb.ReadRangeResponse.FromString(data)
                    self.answered(what, rr.status, rr.detail)
                    assert not rr.bodies, what
                    pending.discard(rr.request_id)


# ------------------------------------------------------------------------- the test


def entries_held(sb: Any, sent: dict[tuple[int, int], bytes]) -> list[tuple[str, int, int]]:
    """The intruder's entries that some bookie holds, asked as the service identity."""
    held = []
    for b in sb.bookies:
        with BookieClient(b.bookie_id, credentials=Credentials(auth_token=token("svc"))) as c:
            for (lid, eid), body in sent.items():
                r = c.read(lid, eid)
                if r.status == pb.EOK and r.body == body:
                    held.append((b.bookie_id, lid, eid))
    return held


def test_random_requests_of_an_ungranted_role_on_both_ports_are_refused_and_change_nothing(victims, seed):
    v = victims
    rng = random.Random(seed)
    intruder = Intruder(rng, v)
    t0 = time.monotonic()
    try:
        for i in range(REQUESTS):
            intruder.one()
            if i % WRITE_EVERY == WRITE_EVERY - 1:   # the victims go on writing meanwhile
                stream = rng.choice(sorted(v.writers))
                v.write(stream, b"%s-during-%03d" % (stream.encode(), i))
                if rng.random() < 0.5:
                    v.private_entries.append(b"billing-private-%d" % len(v.private_entries))
                    v.private.append(v.private_entries[-1])
                v.refresh_keys()
    finally:
        intruder.close()
    print(f"{REQUESTS} requests in {time.monotonic() - t0:.1f}s; {len(intruder.sent)} entries offered; "
          f"answers: {dict(sorted(intruder.outcomes.items()))}")
    assert sum(intruder.outcomes.values()) >= REQUESTS   # every request got an answer

    # Both bookies alive, registered and serving a granted role; no victim was fenced.
    assert all(b.alive for b in v.sb.bookies)
    with client(v.sb, "svc") as c:
        assert set(c.registry.writable_ids()) == {b.bookie_id for b in v.sb.bookies}
    for stream in sorted(v.writers):
        v.write(stream, b"after the intruder")
        v.writers[stream].close()
    v.private_entries.append(b"billing-private after the intruder")
    v.private.append(v.private_entries[-1])
    v.private.close()

    # Every record and entry of the victims reads back, as a superuser; none of the intruder's is held.
    with client(v.sb, "root") as c:
        for stream, expected in v.records.items():
            ns, name = stream.split("/")
            got: list[bytes] = []
            with c.namespace(ns).open_reader(name) as r:
                while len(got) < len(expected):
                    batch = r.read_batch(max_records=100_000, timeout_ms=5_000)
                    if not batch:
                        break
                    got += [x.payload for x in batch]
            assert got == expected, stream
        for lid, expected in ((v.private.ledger_id, v.private_entries), v.closed_private):
            h = c.open_ledger(lid, PRIVATE_PASSWORD, recovery=False)
            assert [e.data for e in h.read(0, h.last_add_confirmed)] == expected, lid
    assert entries_held(v.sb, intruder.sent) == []
