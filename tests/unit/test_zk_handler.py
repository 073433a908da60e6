"""poll_select keeps select's contract on real sockets (kazoo's connection thread relies on it)."""

from __future__ import annotations

import socket

import pytest

from metadata.zk.handler import poll_select

pytestmark = pytest.mark.unit


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_nothing_to_read_times_out_empty(pair):
    a, _b = pair
    assert poll_select([a], [], [], 0.01) == ([], [], [])


def test_readable_once_the_peer_wrote(pair):
    a, b = pair
    b.sendall(b"x")
    r, w, x = poll_select([a, b], [], [], 1.0)
    assert r == [a] and w == [] and x == []


def test_writable_and_readable_together_keep_the_callers_objects(pair):
    a, b = pair
    b.sendall(b"x")
    r, w, _ = poll_select([a], [a, b], [], 1.0)
    assert r == [a] and set(map(id, w)) == {id(a), id(b)}


def test_closed_peer_reads_as_readable(pair):
    a, b = pair
    b.close()
    r, _, _ = poll_select([a], [], [], 1.0)
    assert r == [a] and a.recv(1) == b""


def test_bad_arguments_are_refused(pair):
    a, _b = pair
    with pytest.raises(ValueError):
        poll_select([a], [], [], -1)
    with pytest.raises(ValueError):
        poll_select([-1], [], [], 0)


def test_a_reused_descriptor_number_is_polled_afresh():
    """Pollers are cached by descriptor numbers: a connection closed and reopened on the same
    number (kazoo reconnecting) must see the new socket's state, not the old one's."""
    a, b = socket.socketpair()
    fd = a.fileno()
    b.sendall(b"x")
    assert poll_select([a], [], [], 1.0)[0] == [a]
    a.close()
    b.close()
    c, d = socket.socketpair()
    try:
        if d.fileno() == fd:   # the kernel hands out the lowest free number again
            c, d = d, c
        assert c.fileno() == fd
        assert poll_select([c], [], [], 0.01)[0] == []   # the old socket's pending byte is gone
        d.sendall(b"y")
        assert poll_select([c], [], [], 1.0)[0] == [c]
    finally:
        c.close()
        d.close()


def test_threads_poll_the_same_descriptors_at_once(pair):
    """A poll object must not be polled by two threads at once; each thread has its own."""
    import threading

    a, b = pair
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            poll_select([a], [], [], 0.3)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=wait) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_decrypted_bytes_waiting_in_a_tls_socket_count_as_readable(tmp_path):
    """Two responses in one TLS record: once the first is read the second sits decrypted in the SSL
    object and the socket itself has nothing, so only ``pending()`` tells that it is readable
    (without that, kazoo's loop waited for the next bytes on the wire, up to its ping interval)."""
    import ssl
    import threading

    from spark_bookie.local.certs import CertificateAuthority

    ca = CertificateAuthority()
    server = ca.issue_files(tmp_path, "server", ("127.0.0.1",))
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(server.cert_path, server.key_path)
    client_ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    a, b = socket.socketpair()
    served = threading.Event()

    def serve() -> None:
        with server_ctx.wrap_socket(b, server_side=True) as tls:
            tls.sendall(b"first" + b"second")   # one write, one record
            served.wait(5)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client_ctx.wrap_socket(a, server_hostname="127.0.0.1") as tls:
            assert poll_select([tls], [], [], 5.0)[0] == [tls]
            assert tls.recv(5) == b"first"
            assert tls.pending() == len(b"second")
            assert poll_select([tls], [], [], 0.5)[0] == [tls]
            assert tls.recv(6) == b"second"
            assert poll_select([tls], [], [], 0.05)[0] == []
    finally:
        served.set()
        thread.join()
