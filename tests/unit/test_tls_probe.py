"""The TLS refusal probe (ledger_client/transport/tls_probe.py): a server that refuses our TLS is
named as a refusal, one that accepts or cannot be reached is not (a dead bookie stays a dead
bookie), and a bookie's verdict is asked for once per PROBE_TTL_S however many calls fail."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ledger_client.transport import tls_probe
from ledger_client.transport.tls_probe import RefusalCache, tls_refusal
from spark_bookie.local.certs import CertificateAuthority

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pki")
    ca, rogue = CertificateAuthority("probe CA"), CertificateAuthority("rogue CA")
    server = ca.issue_files(d, "server", ("127.0.0.1",))
    client = ca.issue_files(d, "client", client=True)
    return {"ca": ca.write_cert(d / "ca.pem"), "rogue_ca": rogue.write_cert(d / "rogue.pem"),
            "cert": server.cert_path, "key": server.key_path, "client": client.cert_path,
            "client_key": client.key_path}


@contextmanager
def _serve(handle) -> Iterator[int]:
    """A listener on 127.0.0.1 whose connections `handle(conn)` serves, one thread each."""
    lsock = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield lsock.getsockname()[1]
    finally:
        stop.set()
        lsock.close()


def _tls_server(pki: dict[str, Path], require_client_cert: bool):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki["cert"], pki["key"])
    ctx.set_alpn_protocols(["h2"])
    if require_client_cert:
        ctx.load_verify_locations(pki["ca"])
        ctx.verify_mode = ssl.CERT_REQUIRED

    def handle(conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            with ctx.wrap_socket(conn, server_side=True) as tls:
                if tls.recv(24):
                    tls.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")   # an HTTP/2 SETTINGS frame
        except OSError:
            conn.close()

    return handle


def _client(pki: dict[str, Path], ca: str = "ca", cert: bool = True) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=pki[ca])
    if cert:
        ctx.load_cert_chain(pki["client"], pki["client_key"])
    ctx.set_alpn_protocols(["h2"])
    return ctx


def test_a_server_that_takes_our_tls_is_not_a_refusal(pki):
    with _serve(_tls_server(pki, require_client_cert=True)) as port:
        assert tls_refusal("127.0.0.1", port, _client(pki)) is None


def test_each_way_tls_can_be_refused_is_named(pki):
    with _serve(_tls_server(pki, require_client_cert=True)) as port:
        no_cert = tls_refusal("127.0.0.1", port, _client(pki, cert=False))
        assert no_cert is not None and "certificate" in no_cert
        untrusted = tls_refusal("127.0.0.1", port, _client(pki, ca="rogue_ca"))
        assert untrusted is not None and "not trusted" in untrusted
        plaintext = tls_refusal("127.0.0.1", port, None)
        assert plaintext is not None and "requires TLS" in plaintext


def test_a_dead_or_plain_port_is_not_a_refusal(pki):
    spare = socket.create_server(("127.0.0.1", 0))
    port = spare.getsockname()[1]
    spare.close()   # nobody listens there now: a bookie down
    assert tls_refusal("127.0.0.1", port, _client(pki)) is None
    assert tls_refusal("127.0.0.1", port, None) is None

    def hang_up(conn: socket.socket) -> None:
        conn.close()

    with _serve(hang_up) as plain:   # accepts, then closes: a plaintext client has nothing to learn
        assert tls_refusal("127.0.0.1", plain, None) is None
        assert tls_refusal("127.0.0.1", plain, _client(pki)) is None


def test_the_verdict_is_asked_once_per_ttl(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(tls_probe.time, "monotonic", lambda: now[0])
    calls: list[int] = []

    def probe() -> str | None:
        calls.append(1)
        return "refused"

    cache = RefusalCache()
    assert [cache.get(probe) for _ in range(5)] == ["refused"] * 5
    assert len(calls) == 1
    now[0] += tls_probe.PROBE_TTL_S
    cache.get(probe)
    assert len(calls) == 2
