"""Metadata-store failures as the client's errors: the one mapping, for ledger and stream calls.

Callers catch ``ledger_client.errors``, never the store's (metadata/errors.py,
metadata/streams/store.py): every call to the store runs inside ``metadata_errors``. What a
missing or an existing node means depends on the call (a missing ledger, an existing stream), so
the call says it; everything else means the same everywhere. A bad name is not the store's to
report: the stream layer checks names before it calls (stream/meta.py, InvalidNameError).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from metadata import (
    BadVersionError,
    MetadataAccessDeniedError,
    MetadataError,
    MetadataUnavailableError,
    NodeExistsError,
    NoNodeError,
)
from metadata.streams import NamespaceGoneError, StreamGoneError, StreamLockTimeoutError, SubscriptionGoneError
from metadata.tenancy import TenantGoneError

from . import errors

# The store's error -> the client's, with what the message says before the store's own words.
# The first match wins: subclasses come before their bases (NamespaceGoneError is a StreamGoneError).
MAPPING: tuple[tuple[type[MetadataError], type[errors.LedgerError], str], ...] = (
    (NamespaceGoneError, errors.NoSuchNamespaceError, ""),
    (TenantGoneError, errors.NoSuchTenantError, ""),
    (StreamGoneError, errors.NoSuchStreamError, ""),
    (SubscriptionGoneError, errors.NoSuchSubscriptionError, ""),
    (StreamLockTimeoutError, errors.StreamLockedError, ""),
    (BadVersionError, errors.MetadataVersionError, "metadata changed concurrently"),
    (MetadataUnavailableError, errors.MetadataServiceError, "ZooKeeper unavailable"),
    (MetadataAccessDeniedError, errors.UnauthorizedAccessError, ""),
)


def client_error(e: MetadataError, what: str, *, missing_ledger: bool = False,
                 exists: type[errors.LedgerError] | None = None) -> errors.LedgerError:
    """The client error the store's ``e`` is, in the operation ``what`` describes.

    ``missing_ledger``: a missing node is the ledger asked for (NoSuchLedgerError); otherwise it is
    the cluster's own layout, not initialised. ``exists``: what an existing node is here (a
    namespace or stream being created); otherwise a metadata service error."""
    if isinstance(e, NoNodeError):
        if missing_ledger:
            return errors.NoSuchLedgerError(f"{what}: no such ledger ({e})")
        return errors.MetadataServiceError(f"{what}: {e} (run `spark-bookie init` first?)")
    if isinstance(e, NodeExistsError):
        return (exists or errors.MetadataServiceError)(f"{what}: {e}")
    for store_error, error, says in MAPPING:
        if isinstance(e, store_error):
            return error(f"{what}: {says} ({e})" if says else f"{what}: {e}")
    return errors.MetadataServiceError(f"{what}: {e}")


@contextmanager
def metadata_errors(what: str, *, missing_ledger: bool = False,
                    exists: type[errors.LedgerError] | None = None, denied: str | None = None) -> Iterator[None]:
    """Run a store call; its failure comes out as ``client_error`` says, the store's chained.
    ``denied``: what a refusal by ZooKeeper's ACLs means here (with tenants: which role lacks which
    permission on what), said instead of ZooKeeper's own words."""
    try:
        yield
    except MetadataAccessDeniedError as e:
        if denied is None:
            raise client_error(e, what, missing_ledger=missing_ledger, exists=exists) from e
        raise errors.UnauthorizedAccessError(f"{denied} (ZooKeeper refused to {what})") from e
    except MetadataError as e:
        raise client_error(e, what, missing_ledger=missing_ledger, exists=exists) from e
