"""The stream-metadata store: namespaces, streams, segments, the writer lock (DESIGN §4.5).

One interface, two backends, like the ledger store and the under-replication queue: the protocol
is written once (:mod:`metadata.streams.base`) on ZooKeeper-shaped primitives that ZooKeeper
(:mod:`metadata.zk.streams`) and the in-memory twin (:mod:`metadata.streams.memory`) implement;
a contract suite runs against both.

Layout under ``<root>/streams`` (DistributedLog's spirit):

- ``<ns>``: the namespace's settings (versioned JSON, ``model.encode_settings``);
- ``<ns>/<stream>``: the stream's meta (next segment number, max txid, truncation point, end of
  stream, Spark batches committed); every change of the stream is a CAS on its version;
- ``<ns>/<stream>/segments/<20-digit sequence>``: one node per segment (``SegmentMeta``);
- ``<ns>/<stream>/lock/lock-<seq>``: ephemeral sequential nodes of writers; the lowest holds the
  stream. Every change a writer makes checks that its own lock node still exists (in the same
  multi-op), so a writer whose session expired cannot change the stream after a new writer took it.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from metadata.errors import MetadataError
from metadata.streams.model import StreamMeta
from metadata.streams.transitions import Change, StreamView


class StreamLockTimeoutError(MetadataError):
    """Another live writer held the stream's lock for the whole wait."""


class StreamGoneError(MetadataError):
    """The stream (or its namespace) does not exist."""


class NamespaceGoneError(StreamGoneError):
    """The namespace does not exist."""


@dataclass(frozen=True)
class StreamLockInfo:
    """A held writer lock: the lock node (checked by every change the holder commits)."""

    path: str
    owner: str


class StreamStore(abc.ABC):
    """Stream metadata operations; every call has a deadline (MetadataUnavailableError)."""

    # -- namespaces -------------------------------------------------------------------------
    @abc.abstractmethod
    def create_namespace(self, name: str, settings: bytes) -> None:
        """NodeExistsError if it exists."""

    @abc.abstractmethod
    def read_namespace(self, name: str) -> tuple[bytes, int] | None:
        """(settings, version), or None."""

    @abc.abstractmethod
    def write_namespace(self, name: str, settings: bytes, version: int) -> int:
        """CAS; BadVersionError if changed, NamespaceGoneError if absent."""

    @abc.abstractmethod
    def list_namespaces(self) -> list[str]:
        """Sorted names."""

    @abc.abstractmethod
    def delete_namespace(self, name: str) -> None:
        """Only an empty one (MetadataError otherwise); NamespaceGoneError if absent."""

    # -- streams ----------------------------------------------------------------------------
    @abc.abstractmethod
    def create_stream(self, ns: str, name: str, meta: StreamMeta) -> None:
        """NodeExistsError if it exists, NamespaceGoneError if the namespace does not."""

    @abc.abstractmethod
    def list_streams(self, ns: str) -> list[str]:
        """Sorted names; NamespaceGoneError if the namespace does not exist."""

    @abc.abstractmethod
    def read_stream(self, ns: str, name: str) -> StreamView | None:
        """The stream and all its segments with their versions (consistent: the stream node is
        re-read until it did not change while the segments were listed), or None."""

    @abc.abstractmethod
    def read_stream_meta(self, ns: str, name: str) -> tuple[StreamMeta, int] | None:
        """Only the stream node (one round trip): a reader checks it before each batch, and
        reads the segments again only when its version moved."""

    @abc.abstractmethod
    def commit_stream(self, ns: str, name: str, base_version: int, change: Change,
                      lock: StreamLockInfo | None = None) -> int:
        """Apply ``change`` in one multi-op: the stream node CAS on ``base_version``, segment
        creates, CAS updates and deletes, and (with ``lock``) a check that the lock node exists.
        Returns the stream node's new version. BadVersionError when anything changed since it was
        read; StreamGoneError when the stream is gone; NoNodeError when ``lock``'s node is gone
        (its session expired); NodeExistsError when a created segment exists."""

    @abc.abstractmethod
    def delete_stream(self, ns: str, name: str) -> None:
        """The stream's nodes, all of them (its ledgers are the caller's); StreamGoneError if absent."""

    @abc.abstractmethod
    def lock_stream(self, ns: str, name: str, owner: str, timeout_s: float) -> StreamLockInfo:
        """Take the stream's writer lock, waiting up to ``timeout_s`` for a live holder to go
        (StreamLockTimeoutError). The lock is ephemeral: it goes with this store's session."""

    @abc.abstractmethod
    def unlock_stream(self, lock: StreamLockInfo) -> None:
        """Release (idempotent)."""

    @abc.abstractmethod
    def stream_lock_holder(self, ns: str, name: str) -> str | None:
        """The owner string of the current holder, or None."""
