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
