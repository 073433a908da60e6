"""Socket helpers both ends of the TCP port need (the client's connections and the bookie's)."""

from __future__ import annotations

import socket


def shutdown(sock: socket.socket | None) -> None:
    """Wake a reader in recv and a sender in sendall on `sock`; a socket already shut is fine."""
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
