"""kazoo's threading handler with a cheaper ``select``.

Why: kazoo's connection thread calls ``handler.select`` once per request written and twice per
response read (header, then body), and the stock handler builds, registers and closes a new epoll
selector object each time. In a replication worker taking a few thousand ZooKeeper requests a
second that was a quarter of the process's CPU (profiled during ``spark-bookie bench recovery``).
A ``select.poll`` object (one per descriptor set, reused) does the same job with a C call; unlike
``select.select`` it has no FD_SETSIZE limit, which is why kazoo moved away from ``select`` in the
first place.

On a TLS session a response can already sit decrypted in the SSL object while its socket has
nothing left to read; kazoo checks for that inside one read but its main loop only selects, so
:func:`poll_select` reports a socket with such bytes ``pending()`` readable at once.
"""

from __future__ import annotations

import select
import threading
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler

_READ = select.POLLIN | select.POLLPRI
_WRITE = select.POLLOUT
#: events that make a descriptor readable for select's purposes (a read then reports the condition)
_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR | select.POLLNVAL
_WRITABLE = select.POLLOUT | select.POLLHUP | select.POLLERR


_local = threading.local()
_POLLERS_MAX = 8   # kazoo selects on at most three distinct descriptor sets per connection


def _fd(obj: Any) -> int:
    return obj if isinstance(obj, int) else int(obj.fileno())


def _pending(obj: Any) -> bool:
    """Whether ``obj`` (an SSL socket) holds decrypted bytes not yet read."""
    pending = getattr(obj, "pending", None)
    return pending is not None and pending() > 0


def _poller(rfds: tuple[int, ...], wfds: tuple[int, ...]) -> Any:
    """A poll object registered for these descriptors, kept per thread: poll() takes the
    descriptor numbers afresh on every call, so reusing one costs nothing in correctness (a
    closed descriptor reports POLLNVAL, i.e. readable, and the caller's read then fails) and
    saves building and registering one per call (kazoo's connection thread selects ~3 times per
    request). Per thread because a poll object must not be polled by two threads at once."""
    pollers: dict[tuple[tuple[int, ...], tuple[int, ...]], Any] | None = getattr(_local, "pollers", None)
    if pollers is None:
        pollers = _local.pollers = {}
    key = (rfds, wfds)
    poller = pollers.get(key)
    if poller is None:
        if any(fd < 0 for fd in rfds + wfds):
            raise ValueError(f"invalid file descriptor in {rfds + wfds}")
        masks: dict[int, int] = {}
        for fd in rfds:
            masks[fd] = masks.get(fd, 0) | _READ
        for fd in wfds:
            masks[fd] = masks.get(fd, 0) | _WRITE
        poller = select.poll()
        for fd, mask in masks.items():
            poller.register(fd, mask)
        if len(pollers) >= _POLLERS_MAX:
            pollers.clear()
        pollers[key] = poller
    return poller


def poll_select(rlist: list[Any], wlist: list[Any], xlist: list[Any],
                timeout: float | None = None) -> tuple[list[Any], list[Any], list[Any]]:
    """``select.select``'s contract (as kazoo uses it: sockets in, ready ones out, ``xlist``
    ignored exactly as kazoo's own selector-based version ignores it), implemented with poll."""
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must be non-negative")
    decrypted = [o for o in rlist if _pending(o)]
    if decrypted:   # TLS: read before waiting, or that response waits for the next bytes on the wire
        return decrypted, [], []
    rfds = tuple(_fd(o) for o in rlist)
    wfds = tuple(_fd(o) for o in wlist)
    events = _poller(rfds, wfds).poll(None if timeout is None else timeout * 1000)
    if not events:
        return [], [], []
    ready = dict(events)
    readable = [o for o, fd in zip(rlist, rfds, strict=True) if ready.get(fd, 0) & _READABLE]
    writable = [o for o, fd in zip(wlist, wfds, strict=True) if ready.get(fd, 0) & _WRITABLE]
    return readable, writable, []


class PollingHandler(SequentialThreadingHandler):
    """kazoo's default handler, selecting with :func:`poll_select`."""

    def select(self, *args: Any, **kwargs: Any) -> tuple[list[Any], list[Any], list[Any]]:
        return poll_select(*args, **kwargs)
