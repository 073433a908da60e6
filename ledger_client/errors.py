"""Every error the client raises: subclasses of LedgerError with BookKeeper's client codes (`.code`)."""

from __future__ import annotations


class LedgerError(Exception):
    code: int = -1

    def __init__(self, message: str = "") -> None:
        super().__init__(message or type(self).__name__)


class ReadError(LedgerError):
    code = -1


class BookieUnavailableError(LedgerError):
    """A bookie could not be reached (BookieHandleNotAvailableException)."""

    code = -8


class DigestMismatchError(LedgerError):
    code = -5


class NotEnoughBookiesError(LedgerError):
    code = -6


class NoSuchLedgerError(LedgerError):
    code = -7


class MetadataServiceError(LedgerError):
    """ZooKeeper is unreachable or failed (ZKException)."""

    code = -9


class LedgerClosedError(LedgerError):
    code = -11


class WriteError(LedgerError):
    code = -12


class NoSuchEntryError(LedgerError):
    code = -13


class IncorrectParameterError(LedgerError, ValueError):
    code = -14


class MetadataVersionError(LedgerError):
    code = -17


class LedgerTimeoutError(LedgerError, TimeoutError):
    code = -23


class LedgerFencedError(LedgerError):
    code = -101


class UnauthorizedAccessError(LedgerError):
    code = -102


class WriteOnReadOnlyBookieError(LedgerError):
    code = -104


class TooManyRequestsError(LedgerError):
    code = -105


class BadRequestError(LedgerError):
    """The bookie rejected the request as malformed (EBADREQ): a bug or oversized input, not a fault."""

    code = -14
