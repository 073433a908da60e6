"""TLS on the bookie's gRPC port (DESIGN §4.8): certificates checked against a CA and the host name
on the client, client certificates (mTLS) on the bookie, certificates rotated on disk picked up
without a restart; a client that fails any of it is refused with a typed error and writes nothing."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from ledger_client import ClientConfig, DigestType, LedgerClient, errors
from spark_bookie.local.certs import CertificateAuthority
from spark_bookie.server.auth import mint_token

pytestmark = pytest.mark.integration

SECRET = b"tls-cluster-token-secret-0123456789abcdef"
PW = b"pw"


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca, rogue = CertificateAuthority("cluster CA"), CertificateAuthority("rogue CA")
    d = tmp_path / "pki"
    bookie = ca.issue_files(d, "bookie", ("127.0.0.1", "localhost"))
    client = ca.issue_files(d, "client", client=True)
    rogue_client = rogue.issue_files(d, "rogue-client", client=True)
    (d / "secret").write_bytes(SECRET)
    return {"ca": ca.write_cert(d / "ca.pem"), "rogue_ca": rogue.write_cert(d / "rogue-ca.pem"),
            "bookie": bookie.cert_path, "bookie_key": bookie.key_path, "client": client.cert_path,
            "client_key": client.key_path, "rogue_client": rogue_client.cert_path,
            "rogue_client_key": rogue_client.key_path, "secret": d / "secret"}


def _tls_cluster(cluster_factory, pki, bookies: int = 2, **settings: object):
    return cluster_factory(bookies, tls_enabled=True, tls_certificate_path=str(pki["bookie"]),
                           tls_key_path=str(pki["bookie_key"]), auth_enabled=True,
                           auth_token_secret_path=str(pki["secret"]), **settings)


def _config(**values: object) -> ClientConfig:
    values.setdefault("auth_token", mint_token(SECRET, "app", "client", ttl_s=600))
    return ClientConfig(operation_timeout_ms=15_000, add_timeout_ms=5_000, read_timeout_ms=5_000, **values)


def _good(pki) -> ClientConfig:
    return _config(tls_ca_path=str(pki["ca"]), tls_cert_path=str(pki["client"]), tls_key_path=str(pki["client_key"]))


def _write(zk: str, cfg: ClientConfig, ensemble: int = 2) -> int:
    with LedgerClient(zk, config=cfg) as c:
        w = c.create_ledger(ensemble_size=ensemble, write_quorum_size=ensemble, ack_quorum_size=ensemble,
                            digest_type=DigestType.CRC32C, password=PW)
        for i in range(10):
            w.append(b"tls-%d" % i)
        w.close()
        return w.ledger_id


def _refused(zk: str, cfg: ClientConfig, good: ClientConfig, ensemble: int = 2) -> errors.LedgerError:
    """Writing with `cfg` fails with a typed error, and the bookies hold nothing of that ledger."""
    with LedgerClient(zk, config=cfg) as c:
        w = c.create_ledger(ensemble_size=ensemble, write_quorum_size=ensemble, ack_quorum_size=ensemble,
                            digest_type=DigestType.CRC32C, password=PW)
        with pytest.raises(errors.LedgerError) as info:
            w.append(b"must not land")
        lid = w.ledger_id
    service = dataclasses.replace(good, auth_token=mint_token(SECRET, "svc", "service", ttl_s=600))
    with LedgerClient(zk, config=service) as c:   # a ledger made without a token is no role's: the service reads it
        r = c.open_ledger(lid, password=PW, recovery=True)
        assert r.last_add_confirmed == -1
    return info.value


def test_mtls_with_token_writes_and_reads_and_everyone_else_is_refused(cluster_factory, pki):
    sb = _tls_cluster(cluster_factory, pki, tls_trust_store_path=str(pki["ca"]), tls_client_authentication=True)
    zk, good = sb.connect_string, _good(pki)
    lid = _write(zk, good)
    with LedgerClient(zk, config=good) as c:
        r = c.open_ledger(lid, password=PW)
        assert [e.data for e in r.read(0, 9)] == [b"tls-%d" % i for i in range(10)]
        assert r.read_arrow(0, 9).num_rows == 10
    refusals = {
        "no TLS": _config(),
        "no client certificate": _config(tls_ca_path=str(pki["ca"])),
        "client certificate of another CA": _config(tls_ca_path=str(pki["ca"]), tls_cert_path=str(pki["rogue_client"]),
                                                    tls_key_path=str(pki["rogue_client_key"])),
        "bookie not trusted": _config(tls_ca_path=str(pki["rogue_ca"]), tls_cert_path=str(pki["client"]),
                                      tls_key_path=str(pki["client_key"])),
    }
    for what, cfg in refusals.items():   # refused, and told so: not "not enough bookies"
        err = _refused(zk, cfg, good)
        print(what, "->", type(err).__name__, err)
        assert isinstance(err, errors.UnauthorizedAccessError), (what, err)
        with LedgerClient(zk, config=cfg) as c, pytest.raises(errors.UnauthorizedAccessError):
            c.open_ledger(lid, password=PW, recovery=False).read(0, 9)   # nor read
    no_token = _config(auth_token=None, tls_ca_path=str(pki["ca"]), tls_cert_path=str(pki["client"]),
                       tls_key_path=str(pki["client_key"]))
    assert isinstance(_refused(zk, no_token, good), errors.UnauthorizedAccessError)
    for transport in ("grpc", "tcp"):   # both ways in carry TLS; the default (tcp) was used above
        lid = _write(zk, dataclasses.replace(good, bookie_add_transport=transport, bookie_read_transport=transport))
        with LedgerClient(zk, config=good) as c:
            assert c.open_ledger(lid, password=PW).read_arrow(0, 9).num_rows == 10
    _plaintext_on_the_add_port_is_not_served(sb, good)


def _plaintext_on_the_add_port_is_not_served(sb, good: ClientConfig) -> None:
    """A plain hello and add on the TLS add port: no answer, the connection closed, nothing stored."""
    import socket

    from bookie_helpers import KEY, body

    from ledger_client.protocol import bookkeeper_pb2 as pb
    from ledger_client.protocol.tcp_framing import ADD_HELLO, frame
    from ledger_client.transport import BookieClient
    from ledger_client.transport.credentials import credentials_of

    bid = sb.bookies[0].bookie_id
    with BookieClient(bid, credentials=credentials_of(good)) as c:
        port = c.info().add_port
        batch = pb.AddBatch(ledger_adds=[pb.LedgerAdds(ledger_id=999, master_key=KEY, entry_ids=[0],
                                                       request_ids=[1], bodies=[body(999, 0)])])
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
            s.sendall(ADD_HELLO + frame(bid.encode()) + frame(batch.SerializeToString()))
            got = b""
            try:
                while data := s.recv(1 << 16):
                    got += data
            except ConnectionResetError:
                pass
            assert got == b"" or got[0] == 0x15, got   # nothing, or a TLS alert record: never an answer
        assert c.read(999, 0).status != pb.EOK


def test_rotated_certificate_is_used_without_restart_and_host_names_are_checked(cluster_factory, pki, tmp_path):
    sb = _tls_cluster(cluster_factory, pki, bookies=1, tls_cert_files_refresh_duration_s=1)
    zk = sb.connect_string
    old = _config(tls_ca_path=str(pki["ca"]))
    _write(zk, old, ensemble=1)

    new_ca = CertificateAuthority("next year's CA")
    new = _config(tls_ca_path=str(new_ca.write_cert(tmp_path / "new-ca.pem")))
    cert, key = new_ca.issue("bookie", ("other-host.example",))   # valid, but for another host
    pki["bookie_key"].write_bytes(key)
    pki["bookie"].write_bytes(cert)
    _wait_refused(zk, old)                         # the old CA no longer vouches for what the bookie shows
    with pytest.raises(errors.UnauthorizedAccessError, match="not trusted"):
        _write(zk, new, ensemble=1)                # trusted CA, wrong host name: refused
    cert, key = new_ca.issue("bookie", ("127.0.0.1",))
    pki["bookie_key"].write_bytes(key)
    pki["bookie"].write_bytes(cert)
    deadline = time.monotonic() + 60
    while True:
        try:
            lid = _write(zk, new, ensemble=1)      # picked up without a restart
            break
        except errors.LedgerError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    assert sb.bookies[0].alive
    with LedgerClient(zk, config=new) as c:
        assert [e.data for e in c.open_ledger(lid, password=PW).read(0, 9)] == [b"tls-%d" % i for i in range(10)]


def _wait_refused(zk: str, cfg: ClientConfig, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _write(zk, cfg, ensemble=1)
        except errors.LedgerError:
            return
        assert time.monotonic() < deadline, "the bookie kept its old certificate"
        time.sleep(0.5)


def test_admin_api_over_https_needs_a_token_and_the_admin_role_for_changes(cluster_factory, pki):
    """The HTTP admin port: TLS with the bookie's certificate, GETs need a valid token, gc and
    ledger delete the admin role (401 without a token, 403 with a client one), health stays open,
    and server_config does not show the ZooKeeper credentials."""
    import json
    import ssl
    import urllib.error
    import urllib.request

    from spark_bookie.local.zookeeper import free_port

    port = free_port()
    sb = _tls_cluster(cluster_factory, pki, bookies=1, http_port=port)
    base = f"https://127.0.0.1:{port}"
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    admin, client = mint_token(SECRET, "ops", "admin"), mint_token(SECRET, "app", "client")

    def call(path: str, method: str = "GET", token: str | None = None) -> tuple[int, str]:
        req = urllib.request.Request(base + path, method=method, headers={"Authorization": f"Bearer {token}"}
                                     if token else {})
        try:
            with urllib.request.urlopen(req, timeout=30, context=ctx) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    assert call("/heartbeat")[0] == 200 and call("/metrics")[0] == 200
    assert call("/api/v1/bookie/info")[0] == 401
    assert call("/api/v1/bookie/info", token=mint_token(b"another-secret-0123456789abcdef-xyz", "x", "admin"))[0] == 401
    status, body = call("/api/v1/config/server_config", token=client)
    assert status == 200 and str(json.loads(body)["tls_enabled"]).lower() == "true"
    assert call("/api/v1/bookie/gc", "PUT", token=client)[0] == 403
    assert call("/api/v1/bookie/gc", "PUT", token=admin)[0] == 200
    lid = _write(sb.connect_string, _config(tls_ca_path=str(pki["ca"])), ensemble=1)
    assert call(f"/api/v1/ledger/delete?ledger_id={lid}", "DELETE", token=client)[0] == 403
    assert call(f"/api/v1/ledger/delete?ledger_id={lid}", "DELETE", token=admin)[0] == 200
    import http.client

    with pytest.raises((urllib.error.URLError, http.client.HTTPException, OSError)):   # plain HTTP: no answer
        urllib.request.urlopen(f"http://127.0.0.1:{port}/heartbeat", timeout=10)
