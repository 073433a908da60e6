"""Framing of the bookie's TCP connections (see spark_bookie.server.tcp_listener).

The client opens the connection with a hello, ADD_HELLO or READ_HELLO, and one frame holding the
id of the bookie it means to reach (a bookie whose port was picked by the OS may have restarted
on another port, and another bookie may hold the old one now): a bookie closes a connection meant
for someone else. Then both sides send frames: a 4-byte big-endian length and that many bytes of
one protobuf message. On an add connection: AddBatch to the bookie, AddBatchResponse back. On a
read connection: ReadRangeRequest, each answered by one ReadRangeResponse carrying its
request_id, in any order. The hello names the kind and the framing's version, so a client of
another framing, or something that is not a client at all, is turned away instead of being misread.

Version 2 of the hello (ADD_HELLO_AUTH, READ_HELLO_AUTH) adds a second frame after the bookie id:
the client's auth token (UTF-8, maybe empty; docs/security.md). A bookie that requires tokens
answers every request of a connection whose token it refuses with EUA, and serves none of them;
it also stops serving the connection when the token expires, unless a newer token came with a
request (AddBatch.auth_token, ReadRangeRequest.auth_token: a client whose token rotated).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator, Sequence

from . import bookkeeper_pb2 as pb

ADD_HELLO = b"SBADD\x00\x00\x01"
READ_HELLO = b"SBREAD\x00\x01"  # as long as ADD_HELLO: the bookie tells them apart by their bytes
ADD_HELLO_AUTH = b"SBADD\x00\x00\x02"  # version 2: a token frame follows the bookie id
READ_HELLO_AUTH = b"SBREAD\x00\x02"
HELLOS = {ADD_HELLO: (False, False), READ_HELLO: (True, False), ADD_HELLO_AUTH: (False, True),
          READ_HELLO_AUTH: (True, True)}
"""Each hello: (a read connection?, a token frame follows?)."""
LENGTH = 4
_LEN = struct.Struct(">I")


class FrameError(Exception):
    """The peer sent something that is not a frame of this protocol."""


def frame(body: bytes) -> bytes:
    return _LEN.pack(len(body)) + body


def next_frame(buf: bytearray, pos: int, bytes_max: int) -> tuple[bytes, int] | None:
    """The body of the frame starting at `buf[pos]` and the position after it, or None while the
    frame is incomplete. FrameError for a length over `bytes_max`, known as soon as the length is
    in (the client's reader and the bookie's listener both split their bytes with this)."""
    if len(buf) - pos < LENGTH:
        return None
    (n,) = _LEN.unpack_from(buf, pos)
    if n > bytes_max:
        raise FrameError(f"frame of {n} bytes is over the limit of {bytes_max}")
    end = pos + LENGTH + n
    if len(buf) < end:
        return None
    with memoryview(buf) as view:  # one copy (a bytearray slice, then bytes(), made two)
        return bytes(view[pos + LENGTH:end]), end


def read_frames(sock: socket.socket, bytes_max: int, chunk_bytes: int = 1 << 16) -> Iterator[bytes]:
    """The bodies of the frames arriving on `sock`, until the peer closes it (then the iterator
    ends; OSError when the connection breaks). FrameError for a length over `bytes_max`."""
    buf = bytearray()
    pos = 0
    while True:
        data = sock.recv(chunk_bytes)
        if not data:
            if len(buf) > pos:
                raise FrameError(f"connection closed inside a frame ({len(buf) - pos} bytes left over)")
            return
        if pos:
            del buf[:pos]
            pos = 0
        buf += data
        while (got := next_frame(buf, pos, bytes_max)) is not None:
            body, pos = got
            yield body


# ---- adds, encoded by hand

# An AddBatch of packed LedgerAdds, byte for byte what frame(pb.AddBatch(...).SerializeToString())
# gives (fields in number order, ids packed), built so that each entry body is copied once: into
# the joined frame. Building the protobuf object copied every body into it, serializing copied it
# again and framing a third time, and on the sending thread, where the bodies are not in cache,
# that was over half of its CPU per add (~2 us of ~3.6 per entry and bookie, saturated).
_GROUP_TAG = b"\x12"  # AddBatch.ledger_adds = 2, length-delimited
_TOKEN_TAG = b"\x1a"  # AddBatch.auth_token = 3, length-delimited
_BODY_TAG = 0x32      # LedgerAdds.bodies = 6, length-delimited
_body_prefixes: dict[int, bytes] = {}

AddColumns = tuple[int, int, bytes, list[int], list[int], list[bytes]]
"""One ledger's adds of a batch: (ledger id, flag, master key, entry ids, request ids, bodies)."""
Lac = tuple[int, bytes, bytes]
"""An explicit LAC announced in a batch (pb.LedgerAdds.lac_body): (ledger id, master key, framed LAC)."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _body_prefix(size: int) -> bytes:
    p = _body_prefixes.get(size)
    if p is None:
        p = bytes((_BODY_TAG,)) + _varint(size)
        if len(_body_prefixes) < 4096:  # entry sizes repeat; a bound in case they do not
            _body_prefixes[size] = p
    return p


def add_batch_frame(groups: list[AddColumns], auth_token: str | None = None, lacs: Sequence[Lac] = ()) -> bytes:
    """The framed AddBatch of `groups` (see above) and of the LACs `lacs` announces, with
    `auth_token` when the connection's token rotated (AddBatch.auth_token)."""
    parts: list[bytes] = [b""]
    total = 0
    prefix = _body_prefix
    for lid, flag, key, eids, rids, bodies in groups:
        head = pb.LedgerAdds(ledger_id=lid, flag=flag, master_key=key, entry_ids=eids,  # type: ignore[arg-type]
                             request_ids=rids).SerializeToString()
        sub = [head]
        size = len(head)
        for body in bodies:
            p = prefix(len(body))
            sub.append(p)
            sub.append(body)
            size += len(p) + len(body)
        group_head = _GROUP_TAG + _varint(size)
        parts.append(group_head)
        parts.extend(sub)
        total += len(group_head) + size
    for lid, key, body in lacs:
        msg = pb.LedgerAdds(ledger_id=lid, master_key=key, lac_body=body).SerializeToString()
        head = _GROUP_TAG + _varint(len(msg))
        parts += (head, msg)
        total += len(head) + len(msg)
    if auth_token:
        raw = auth_token.encode()
        tail = _TOKEN_TAG + _varint(len(raw)) + raw
        parts.append(tail)
        total += len(tail)
    parts[0] = _LEN.pack(total)
    return b"".join(parts)
