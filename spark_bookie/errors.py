"""Every exception the bookie raises on purpose. Each maps to a wire status code (bookkeeper.proto)."""

from __future__ import annotations

from ledger_client.protocol import bookkeeper_pb2 as pb


class BookieError(Exception):
    """Base of the bookie's errors; `status` is the wire StatusCode sent to the client."""

    status: pb.StatusCode = pb.EIO


class ConfigError(BookieError):
    """The configuration is invalid (unknown key, bad value)."""


class StartupError(BookieError):
    """The bookie refuses to start: bad directory, port in use, cookie mismatch, ZooKeeper down."""


class CookieError(StartupError):
    """Directories or ZooKeeper disagree about this bookie's identity (BookKeeper's InvalidCookie)."""


class NoLedgerError(BookieError):
    status = pb.ENOLEDGER


class NoEntryError(BookieError):
    status = pb.ENOENTRY


class BadRequestError(BookieError):
    status = pb.EBADREQ


class UnauthorizedError(BookieError):
    status = pb.EUA


class FencedError(BookieError):
    status = pb.EFENCED


class ReadOnlyError(BookieError):
    status = pb.EREADONLY


class TooManyRequestsError(BookieError):
    status = pb.ETOOMANYREQUESTS


class StorageIOError(BookieError):
    """A disk read or write failed, or stored bytes failed their checksum."""

    status = pb.EIO


class DiskFullError(StorageIOError):
    """A flush would eat into the space reserved for the index: refused, nothing moved (the
    entries stay in the write cache and the journal)."""


class CorruptDataError(StorageIOError):
    """Stored bytes do not match their checksum."""


class ShellError(Exception):
    """A failure the shell detects itself (e.g. simpletest read back different bytes)."""


class SlotBusyError(StartupError):
    """Another live process holds this host's directory of a Spark-hosted bookie slot."""
