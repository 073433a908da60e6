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


class InvalidNameError(IncorrectParameterError):
    """A namespace, stream or subscription name is not ``[A-Za-z0-9._-]+`` (or is ``.``, ``..``,
    or over 255 characters). Raised by the client's own check before any metadata call, so
    callers tell a bad name from a metadata failure by type. An IncorrectParameterError, as bad
    names always were."""


class BadRequestError(LedgerError):
    """The bookie rejected the request as malformed (EBADREQ): a bug or oversized input, not a fault."""

    code = -14


# ---------------------------------------------------------------------- streams (DESIGN §4.5)
# Codes of the project's own (-2xx: BookKeeper's client codes stop above -200); DistributedLog's
# exception names where it has one.

class StreamError(LedgerError):
    """Base of the stream layer's own errors."""

    code = -200


class InvalidStreamNameError(StreamError, InvalidNameError):
    """A namespace or stream name is not [A-Za-z0-9._-]+ (DistributedLog's InvalidStreamNameException)."""

    code = -201


class NoSuchNamespaceError(StreamError):
    code = -202


class NamespaceExistsError(StreamError):
    code = -203


class NamespaceNotEmptyError(StreamError):
    """Deleting a namespace that still has streams, without force=True."""

    code = -204


class NoSuchStreamError(StreamError):
    """DistributedLog's LogNotFoundException."""

    code = -205


class StreamExistsError(StreamError):
    """DistributedLog's LogExistsException."""

    code = -206


class StreamLockedError(StreamError, LedgerTimeoutError):
    """Another live writer held the stream for the whole lock_timeout_ms (DistributedLog's
    LockingException / OwnershipAcquireFailedException)."""

    code = -207


class TransactionIdOutOfOrderError(StreamError, IncorrectParameterError):
    """A txid below the stream's last one (DistributedLog's TransactionIdOutOfOrderException)."""

    code = -208


class EndOfStreamError(StreamError):
    """The stream was marked ended: no more writes, and readers stop (DistributedLog's EndOfStreamException)."""

    code = -209


class RecordTooLargeError(StreamError, IncorrectParameterError):
    """A record over record_size_bytes_max (DistributedLog's LogRecordTooLongException)."""

    code = -210


class StreamClosedError(StreamError):
    """The writer or reader was closed (or failed earlier: the cause is chained)."""

    code = -211


class CorruptRecordSetError(StreamError, ReadError):
    """A ledger entry of a stream is not a record set this code can read."""

    code = -212


class StreamFencedError(LedgerFencedError, StreamClosedError):
    """Another writer took the stream over and fenced this writer's segment: the record in flight
    then, and every write, flush or truncation after it, fail with this. A LedgerFencedError (its
    code too) so that a leader catching that learns it lost the log on any later write; also a
    StreamClosedError, which the writer is."""

    code = LedgerFencedError.code


class TenantError(LedgerError):
    """Base of the tenant errors (DESIGN §4.9)."""

    code = -220


class NoSuchTenantError(TenantError):
    """The tenant does not exist (Pulsar's 404 on a tenant)."""

    code = -221


class TenantExistsError(TenantError):
    """Creating a tenant that exists (Pulsar's 409)."""

    code = -222


class TenantNotEmptyError(TenantError):
    """Deleting a tenant that still owns namespaces."""

    code = -223


# ---------------------------------------------------------------------- isolation (DESIGN §4.10)

class QuotaExceededError(StreamError):
    """The namespace holds its ``storage_quota_bytes`` on bookies: the write was refused and nothing
    of it was written. Not a failure of the writer: writes succeed again by themselves once
    retention, truncation or tiering bring the namespace back under its quota (Pulsar's
    ProducerBlockedQuotaExceededError)."""

    code = -230


# ---------------------------------------------------------------------- subscriptions (DESIGN §4.11)

class NoSuchSubscriptionError(StreamError):
    """The subscription does not exist: never created, or deleted (a reader committing to a
    subscription deleted under it gets this too; it reads on, unrecorded)."""

    code = -231


class PositionPastEndError(StreamError, IncorrectParameterError):
    """A subscription position after the stream's last record (committing or resetting to a record
    that was never written)."""

    code = -232
