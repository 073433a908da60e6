"""Token authentication (DESIGN §4.8): bookies with auth_enabled serve only clients presenting a
valid signed JWT, on gRPC and on the TCP add/read port; everyone else gets UnauthorizedAccessError
and nothing is written or read."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from bookie_helpers import KEY, body
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from ledger_client import ClientConfig, DigestType, LedgerClient, errors
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol import bookkeeper_pb2_grpc as pb_grpc
from ledger_client.protocol.tcp_framing import ADD_HELLO, ADD_HELLO_AUTH, frame, read_frames
from ledger_client.transport import BookieClient
from ledger_client.transport.credentials import Credentials
from spark_bookie.local.sandbox import Sandbox
from spark_bookie.server.auth import mint_token

pytestmark = pytest.mark.integration

SECRET = b"a-shared-secret-of-the-cluster-0123456789"
PW = b"pw"


def _secure_cluster(cluster_factory, tmp_path: Path, bookies: int = 2):
    secret = tmp_path / "token-secret"
    secret.write_bytes(SECRET + b"\n")
    return cluster_factory(bookies, auth_enabled=True, auth_token_secret_path=str(secret))


@pytest.fixture(scope="module")
def sb(zk_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """Two bookies with token authentication on (SECRET), for the module's tests that write and
    read ledgers of their own; a test that needs other bookies starts its own."""
    root = tmp_path_factory.mktemp("secure")
    secret = root / "token-secret"
    secret.write_bytes(SECRET + b"\n")
    s = Sandbox(root / "cluster", 2, zk_connect=f"{zk_server}/t-{uuid.uuid4().hex[:12]}/ledgers",
                bookie_settings={"zk_session_timeout_ms": 4000, "gc_interval_ms": 3_600_000,
                                 "auth_enabled": True, "auth_token_secret_path": str(secret)})
    s.start()
    try:
        yield s
    finally:
        s.stop()


def _client(sb, token: str | None, **cfg) -> LedgerClient:
    return LedgerClient(sb.connect_string, config=ClientConfig(auth_token=token, operation_timeout_ms=20_000, **cfg))


def _good() -> str:
    return mint_token(SECRET, "writer-1", "client", ttl_s=600)


def _bad_tokens() -> dict[str, str | None]:
    return {
        "none": None,
        "expired": mint_token(SECRET, "writer-1", "client", ttl_s=-5),
        "forged": mint_token(b"not-the-secret-of-this-cluster-0123456", "writer-1", "admin", ttl_s=600),
        "garbage": "eyJhbGciOiJIUzI1NiJ9.not-a-token.at-all",
        "unknown role": _raw({"sub": "x", "role": "root", "exp": int(time.time()) + 600}),
    }


def _raw(claims: dict) -> str:
    import jwt
    return jwt.encode(claims, SECRET, algorithm="HS256")


def _service() -> str:
    """The cluster's own identity, which the tenant checks let read any ledger (DESIGN §4.9)."""
    return mint_token(SECRET, "bookie-service", "service", ttl_s=600)


def _entries_on_bookies(sb, ledger_id: int) -> list[int]:
    """Entries 0..4 of `ledger_id` any bookie holds, asked as the service identity."""
    found = []
    for b in sb.bookies:
        with BookieClient(b.bookie_id, credentials=Credentials(auth_token=_service())) as c:
            for eid in range(5):
                if c.read(ledger_id, eid).status == pb.EOK:
                    found.append(eid)
    return found


@pytest.mark.parametrize("transport", ["tcp", "grpc"])
def test_a_client_with_a_valid_token_writes_and_reads(sb, transport):
    with _client(sb, _good(), bookie_add_transport=transport, bookie_read_transport=transport) as c:
        w = c.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2,
                            digest_type=DigestType.CRC32C, password=PW)
        for i in range(20):
            w.append(b"entry-%d" % i)
        w.close()
        r = c.open_ledger(w.ledger_id, password=PW)
        assert [e.data for e in r.read(0, 19)] == [b"entry-%d" % i for i in range(20)]
        assert r.read_arrow(0, 19).column("payload").to_pylist() == [b"entry-%d" % i for i in range(20)]


@pytest.mark.parametrize("transport", ["tcp", "grpc"])
def test_clients_without_a_valid_token_write_nothing(sb, transport):
    for what, token in _bad_tokens().items():
        with _client(sb, token, bookie_add_transport=transport) as c:
            w = c.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2,
                                digest_type=DigestType.CRC32C, password=PW)
            with pytest.raises(errors.UnauthorizedAccessError):
                w.append(b"must not land")
            lid = w.ledger_id
        assert _entries_on_bookies(sb, lid) == [], what


@pytest.mark.parametrize("transport", ["tcp", "grpc"])
def test_clients_without_a_valid_token_read_nothing_and_fence_nothing(sb, transport):
    with _client(sb, _good()) as good:
        w = good.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2,
                               digest_type=DigestType.CRC32C, password=PW)
        for i in range(5):
            w.append(b"secret-%d" % i)
        for token in _bad_tokens().values():
            with _client(sb, token, bookie_read_transport=transport) as bad:
                with pytest.raises(errors.UnauthorizedAccessError):   # refused at open, or by the bookies
                    bad.open_ledger(w.ledger_id, password=PW, recovery=False).read_unconfirmed(0, 4)
                with pytest.raises(errors.UnauthorizedAccessError):
                    bad.open_ledger(w.ledger_id, password=PW, recovery=True)
        w.append(b"still the writer")   # nobody fenced the ledger
        w.close()
        assert good.ledger_metadata(w.ledger_id).last_entry_id == 5


def test_raw_connections_without_a_token_are_answered_eua(cluster_factory, tmp_path):
    """The wire itself: a v1 hello (no token) and a v2 hello with a forged token get EUA for every
    add, the bookie stores none of them; the same bytes with a good token are stored."""
    sb = _secure_cluster(cluster_factory, tmp_path, bookies=1)
    bid = sb.bookies[0].bookie_id
    with BookieClient(bid, credentials=Credentials(auth_token=_good())) as c:
        port = c.info().add_port
    with grpc.insecure_channel(bid) as ch:   # gRPC without a token: UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.BookieStub(ch).GetBookieInfo(pb.BookieInfoRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    forged = mint_token(b"0123456789-wrong-secret-0123456789", "x", "admin")
    hellos = {"v1": ADD_HELLO + frame(bid.encode()),
              "forged": ADD_HELLO_AUTH + frame(bid.encode()) + frame(forged.encode()),
              "good": ADD_HELLO_AUTH + frame(bid.encode()) + frame(_service().encode())}
    for n, (what, hello) in enumerate(hellos.items()):
        lid = 100 + n
        batch = pb.AddBatch(ledger_adds=[pb.LedgerAdds(ledger_id=lid, master_key=KEY, entry_ids=[0],
                                                       request_ids=[7], bodies=[body(lid, 0)])])
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
            s.sendall(hello + frame(batch.SerializeToString()))
            resp = pb.AddBatchResponse.FromString(next(read_frames(s, 1 << 20)))
        if what == "good":
            assert list(resp.ok_request_ids) == [7]
        else:
            assert not resp.ok_request_ids and [r.status for r in resp.responses] == [pb.EUA], what
            assert _entries_on_bookies(sb, lid) == [], what


def test_rs256_public_key_on_the_bookie_and_a_rotated_token_file(cluster_factory, tmp_path):
    """RS256: the bookie holds only the public key. The client's token file is re-read when it
    changes: an expired token is refused, the rotated one is taken by a new client, no restart."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = tmp_path / "issuer.pub.pem"
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    sb = cluster_factory(1, auth_enabled=True, auth_token_public_key_path=str(public))
    token_file = tmp_path / "token"
    token_file.write_text(mint_token(private, "svc", "client", ttl_s=-1, algorithm="RS256"))
    cfg = ClientConfig(auth_token_file=str(token_file), operation_timeout_ms=20_000)
    with LedgerClient(sb.connect_string, config=cfg) as c:
        w = c.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, password=PW)
        with pytest.raises(errors.UnauthorizedAccessError):
            w.append(b"x")
    token_file.write_text(mint_token(private, "svc", "client", ttl_s=600, algorithm="RS256") + "\n")
    with LedgerClient(sb.connect_string, config=cfg) as c:
        w = c.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, password=PW)
        assert w.append(b"x") == 0
        w.close()
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = mint_token(other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()), "svc", "admin", algorithm="RS256")
    with _client(sb, forged) as bad:
        w = bad.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, password=PW)
        with pytest.raises(errors.UnauthorizedAccessError):
            w.append(b"y")


def _wait_until(t_s: float) -> None:
    while time.time() < t_s:
        time.sleep(min(0.2, max(0.0, t_s - time.time())))


@pytest.mark.parametrize("transport", ["tcp", "grpc"])
def test_an_open_connection_is_served_only_while_its_token_is_valid(sb, tmp_path, transport):
    """A TCP connection (or gRPC add stream) does not outlive its token: a client whose token file
    rotates sends the new token on its open connections and goes on past the old one's expiry (no bookie replaced); a
    client whose token is not renewed is refused once it expires (UnauthorizedAccessError, not a
    dead bookie), and the bookies hold nothing it wrote after."""
    token_file = tmp_path / "rotating-token"
    token_file.write_text(mint_token(SECRET, "rotating", "client", ttl_s=4))
    first_expiry_s = time.time() + 4
    ways = {"bookie_add_transport": transport, "bookie_read_transport": transport}
    rotating = LedgerClient(sb.connect_string, config=ClientConfig(auth_token_file=str(token_file),
                                                                   operation_timeout_ms=20_000, **ways))
    fixed = _client(sb, mint_token(SECRET, "fixed", "client", ttl_s=4), **ways)
    with rotating, fixed:
        writers, readers = {}, {}
        for name, c in (("rotating", rotating), ("fixed", fixed)):   # connections open, tokens valid
            w = writers[name] = c.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2,
                                                password=PW)
            assert [w.append(b"entry-%d" % i) for i in range(2)] == [0, 1]
            readers[name] = c.open_ledger(w.ledger_id, password=PW, recovery=False)
            assert [e.data for e in readers[name].read(0, 0)] == [b"entry-0"]
        token_file.write_text(mint_token(SECRET, "rotating", "client", ttl_s=600))
        _wait_until(first_expiry_s + 1.5)        # both first tokens are past their exp (whole seconds)

        w = writers["rotating"]
        assert [w.append(b"entry-%d" % i) for i in range(2, 6)] == [2, 3, 4, 5]
        assert len(rotating.ledger_metadata(w.ledger_id).ensembles) == 1   # no bookie was replaced
        assert [e.data for e in readers["rotating"].read_unconfirmed(0, 1)] == [b"entry-0", b"entry-1"]

        with pytest.raises(errors.UnauthorizedAccessError, match="expired"):
            writers["fixed"].append(b"too late")
        with pytest.raises(errors.UnauthorizedAccessError):
            readers["fixed"].read_unconfirmed(0, 1)
        lid = writers["fixed"].ledger_id
    assert sorted(_entries_on_bookies(sb, lid)) == [0, 0, 1, 1]   # two copies of 0 and 1, nothing after
