"""Errors of the metadata store.

Callers (bookie, client, auditor) must never see kazoo's exceptions: every backend translates its
failures into these, so the same ``except`` clauses work against ZooKeeper and the in-memory twin.
"""

from __future__ import annotations


class MetadataError(Exception):
    """Base of every metadata-store failure."""


class InvalidConnectStringError(MetadataError, ValueError):
    """A connect string (``host:port[,host:port][/root]`` or ``zk://...``) could not be parsed."""


class MetadataUnavailableError(MetadataError):
    """ZooKeeper could not be reached, or did not answer before the operation's deadline.

    The outcome of a write that fails this way is unknown (it may or may not have been applied):
    callers re-read before retrying a non-idempotent change.
    """


class MetadataAccessDeniedError(MetadataError):
    """ZooKeeper refused the request: the node's ACL does not grant this session's credentials
    (``zk_auth``) the permission (ZooKeeper's NoAuth)."""


class NodeExistsError(MetadataError):
    """The node to create already exists (including a live registration of another session)."""


class NoNodeError(MetadataError):
    """The node does not exist (for the cluster's own nodes: the cluster is not initialised)."""


class BadVersionError(MetadataError):
    """A compare-and-set lost: the node's version is not the one the caller read."""


class NotEmptyError(MetadataError):
    """A delete found children under the node."""


class SessionExpiredError(MetadataError):
    """The ZooKeeper session expired while the operation was in flight; its ephemerals are gone."""


class StoreClosedError(MetadataError):
    """The store was closed; no further operations are possible on it."""


class InvalidMetadataError(MetadataError, ValueError):
    """Ledger metadata (or a change to it) breaks the model's rules, or its stored bytes cannot be
    decoded. Never retried: the same input would fail again."""


class LedgerClosedConflict(MetadataError):
    """Closing a ledger that is already closed at a different end (last entry id or length).

    Two parties disagree about where the ledger ends; the first close won and the loser must not
    pretend otherwise (the client reports it as a metadata version error, as BookKeeper does).
    """


class LedgerAlreadyClosedError(MetadataError):
    """A change that only an unclosed ledger accepts (an ensemble change) met a closed ledger."""


class MetadataUpdateConflictError(BadVersionError):
    """The compare-and-set update loop lost the race too many times in a row and gave up."""
