"""kazoo's threading handler with a cheaper ``select``.

Why: kazoo's connection thread calls ``handler.select`` once per request written and twice per
response read (header, then body), and the stock handler builds, registers and closes a new epoll
selector object each time. In a replication worker taking a few thousand ZooKeeper requests a
second that was a quarter of the process's CPU (profiled during ``spark-bookie bench recovery``).
One ``select.poll`` object per call does the same job with a couple of C calls; unlike
``select.select`` it has no FD_SETSIZE limit, which is why kazoo moved away from ``select`` in the
first place.
"""

from __future__ import annotations

import select
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler

_READ = select.POLLIN | select.POLLPRI
_WRITE = select.POLLOUT
#: events that make a descriptor readable for select's purposes (a read then reports the condition)
_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR | select.POLLNVAL


def _fd(obj: Any) -> int:
    fd = obj if isinstance(obj, int) else int(obj.fileno())
    if fd < 0:
        raise ValueError(f"invalid file descriptor {fd}")
    return fd


def poll_select(rlist: list[Any], wlist: list[Any], xlist: list[Any],
                timeout: float | None = None) -> tuple[list[Any], list[Any], list[Any]]:
    """``select.select``'s contract (as kazoo uses it: sockets in, ready ones out, ``xlist``
    ignored exactly as kazoo's own selector-based version ignores it), implemented with poll."""
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must be non-negative")
    poller = select.poll()
    masks: dict[int, int] = {}
    for obj in rlist:
        fd = _fd(obj)
        masks[fd] = masks.get(fd, 0) | _READ
    for obj in wlist:
        fd = _fd(obj)
        masks[fd] = masks.get(fd, 0) | _WRITE
    for fd, mask in masks.items():
        poller.register(fd, mask)
    ready = dict(poller.poll(None if timeout is None else timeout * 1000))
    readable = [o for o in rlist if ready.get(_fd(o), 0) & _READABLE]
    writable = [o for o in wlist if ready.get(_fd(o), 0) & (_WRITE | select.POLLHUP | select.POLLERR)]
    return readable, writable, []


class PollingHandler(SequentialThreadingHandler):
    """kazoo's default handler, selecting with :func:`poll_select`."""

    def select(self, *args: Any, **kwargs: Any) -> tuple[list[Any], list[Any], list[Any]]:
        return poll_select(*args, **kwargs)
