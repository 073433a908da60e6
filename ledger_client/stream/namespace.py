"""Namespaces and the streams in them (DESIGN §4.5): create, list, inspect, delete, and the entry
points to writers and readers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from metadata.streams import (
    SegmentEnd,
    SegmentMeta,
    SegmentState,
    StreamMeta,
    StreamView,
    decode_access,
    decode_settings,
    encode_settings,
)
from metadata.tenancy import CONSUME, PRODUCE, PUBLIC_TENANT, NamespaceAccess

from .. import errors
from ..metadata_errors import metadata_errors
from . import subscriptions as subs
from .commits import COMMIT_INTERVAL_MS
from .dlsn import DLSN
from .meta import check_names, now_ms
from .placement import settings_problems
from .quota import NamespaceUsage, read_usage
from .reader import StreamReader
from .segments import apply_retention, live_end
from .settings import NamespaceSettings
from .subscriptions import SubscriptionInfo
from .tenants import create_public_tenant, denied_namespace, require_manage, require_namespace, require_tenant_admin
from .writer import StreamWriter

STREAM_INFO_TRIES = 3   # reads of a stream whose in-progress segment's ledger vanished meanwhile

if TYPE_CHECKING:
    from ..client import LedgerClient


@dataclass(frozen=True)
class SegmentInfo:
    """A segment as stream_info found it. The one in progress is read from its ledger (up to the LAC
    the bookies know, without fencing): its ``last_*``, ``record_count`` and ``bytes`` cover the
    records acknowledged so far."""

    sequence: int
    ledger_id: int | None          # None once tiered (its ledger is deleted)
    state: str                     # "in_progress" | "sealed" | "tiered"
    first_dlsn: DLSN
    last_dlsn: DLSN | None         # None while the segment has no (confirmed) record
    first_txid: int
    last_txid: int                 # -1 while the segment has no (confirmed) record
    record_count: int
    bytes: int                     # of its ledger (in progress: up to the LAC)
    ctime_ms: int
    table: str | None = None       # where a tiered segment's records are
    delta_version: int | None = None

    @classmethod
    def of(cls, s: SegmentMeta, live: SegmentEnd | None = None) -> SegmentInfo:
        """``live``: where an in-progress segment ends so far (segments.live_end)."""
        tier = s.tier
        last, last_txid, count, nbytes = s.last_dlsn, s.last_txid, s.record_count, s.bytes
        if not s.is_sealed and live is not None:
            last = (s.sequence, live.last_entry_id, live.last_slot) if live.record_count else None
            last_txid, count, nbytes = live.last_txid, live.record_count, live.nbytes
        return cls(s.sequence, s.ledger_id, s.state.value, DLSN(*s.first_dlsn), DLSN(*last) if last else None,
                   s.first_txid, last_txid, count, nbytes, s.ctime_ms,
                   tier.table if tier else None, tier.delta_version if tier else None)


@dataclass(frozen=True)
class StreamInfo:
    name: str
    segments: list[SegmentInfo]
    first_dlsn: DLSN | None        # the first record a reader can get (after truncation)
    last_dlsn: DLSN | None         # the last record acknowledged (in progress: confirmed) so far
    last_txid: int
    end_of_stream: bool
    truncated_before: DLSN | None
    # Storage against the namespace's quota (DESIGN §4.10, stream/quota.py): this stream's bytes on
    # bookies (sealed segments and the one in progress, not tiered ones), the namespace's (with
    # this stream's as counted here), and the quota (None: none).
    storage_bytes: int = 0
    namespace_storage_bytes: int = 0
    storage_quota_bytes: int | None = None
    # What keeps the namespace's placement groups from taking a new segment now (DESIGN §4.10:
    # a group without writable bookies, too few for an ensemble); empty when nothing does.
    placement_problems: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, name: str, view: StreamView, live: SegmentEnd | None = None) -> StreamInfo:
        """``live``: where the segment in progress ends so far (segments.live_end)."""
        segs = [SegmentInfo.of(s, live) for s in view.ordered()]
        lasts = [s.last_dlsn for s in segs if s.last_dlsn is not None]
        tb = DLSN(*view.meta.truncated_before) if view.meta.truncated_before else None
        first = segs[0].first_dlsn if segs else None
        if first is not None and tb is not None and tb > first:
            first = tb
        last_txid = max([view.meta.max_txid, *(s.last_txid for s in segs)])
        held = sum(s.bytes for s in segs if s.state != SegmentState.TIERED.value)
        return cls(name, segs, first, lasts[-1] if lasts else None, last_txid, view.meta.end_of_stream, tb, held)

    def with_usage(self, usage: NamespaceUsage) -> StreamInfo:
        """This info with its namespace's usage, this stream counted as here (the segment in
        progress read from its ledger, fresher than what its writer last published)."""
        mine = usage.streams.get(self.name)
        others = usage.used_bytes - (mine.total if mine is not None else 0)
        return replace(self, namespace_storage_bytes=others + self.storage_bytes,
                       storage_quota_bytes=usage.quota_bytes)


class Namespace:
    """A group of streams sharing settings. Get one from ``LedgerClient.namespace`` /
    ``create_namespace``; cheap to make, holds no resources."""

    def __init__(self, client: LedgerClient, name: str, settings: NamespaceSettings, version: int,
                 access: dict[str, object] | None = None) -> None:
        """``access``: the access record as stored (None: the namespace predates tenants)."""
        self.client = client
        self.name = name
        self._settings = settings
        self._version = version
        self._access = access

    def __repr__(self) -> str:
        return f"Namespace({self.name!r})"

    @property
    def settings(self) -> NamespaceSettings:
        return self._settings

    def refresh(self) -> NamespaceSettings:
        """Re-read the settings (another client may have changed them)."""
        fresh = get_namespace(self.client, self.name)
        self._settings, self._version, self._access = fresh._settings, fresh._version, fresh._access
        return self._settings

    @property
    def tenant(self) -> str:
        """The tenant that owns the namespace (``public`` for one made without a tenant)."""
        return NamespaceAccess.from_json(self._access, f"namespace {self.name}").tenant

    # -- permissions (DESIGN §4.9) ------------------------------------------------------------
    def grant_permission(self, role: str, actions: Iterable[str]) -> None:
        """Give ``role`` the ``actions`` (``produce``, ``consume``) on this namespace, replacing
        what it had; superusers and the tenant's admin roles only. Bookies apply it within
        seconds (they watch the namespace)."""
        access = require_manage(self.client, self.name, f"grant permissions on namespace {self.name!r}")
        try:
            change = access.granted(role, actions)   # checks role and actions before anything is written
        except (ValueError, TypeError) as e:
            raise errors.IncorrectParameterError(f"grant on namespace {self.name!r}: {e}") from e
        with metadata_errors(f"grant {role} on namespace {self.name}"):
            self.client.store.tenants.update_access(self.name, lambda a: a.granted(role, change.actions_of(role)))
            self.client.store.tenants.reapply_acls(self.name)
        self.refresh()

    def revoke_permission(self, role: str) -> None:
        """Take everything ``role`` was granted here; its open readers and writers are refused by
        the bookies within 5 s."""
        require_manage(self.client, self.name, f"revoke permissions on namespace {self.name!r}")
        with metadata_errors(f"revoke {role} on namespace {self.name}"):
            self.client.store.tenants.update_access(self.name, lambda a: a.revoked(role))
            self.client.store.tenants.reapply_acls(self.name)
        self.refresh()

    def permissions(self) -> dict[str, frozenset[str]]:
        """Role -> actions granted here (superusers and the tenant's admin roles)."""
        access = require_manage(self.client, self.name, f"read the permissions of namespace {self.name!r}")
        return dict(access.permissions)

    def require(self, *actions: str) -> None:
        """UnauthorizedAccessError unless this client's role may do one of ``actions`` here (no
        token: nothing is checked). Read fresh each time: a grant may have changed."""
        require_namespace(self.client, self.name, *actions)

    def update_settings(self, **changes: object) -> NamespaceSettings:
        """Change settings (validated; CAS on what was read): they apply to new segments."""
        new = self._settings.updated(**changes)
        require_manage(self.client, self.name, f"change the settings of namespace {self.name!r}")
        with metadata_errors(f"update namespace {self.name}"):
            self._version = self.client.store.streams.write_namespace(
                self.name, encode_settings(new.to_json(), self._access), self._version)
        self._settings = new
        return new

    # -- streams ----------------------------------------------------------------------------
    def create_stream(self, name: str) -> None:
        check_names((name, "stream"))
        self.require(PRODUCE)
        # Born with its byte counts (0 on bookies), so the namespace's usage needs no read of its segments.
        with metadata_errors(f"create stream {self.name}/{name}", exists=errors.StreamExistsError):
            self.client.store.streams.create_stream(self.name, name, StreamMeta(ctime_ms=now_ms(), sealed_bytes=0))

    def ensure_stream(self, name: str) -> None:
        """Create the stream unless it exists (opening a writer does this)."""
        try:
            self.create_stream(name)
        except errors.StreamExistsError:
            pass

    def list_streams(self, prefix: str = "") -> list[str]:
        self.require(CONSUME)
        with metadata_errors(f"list streams of {self.name}"):
            return [s for s in self.client.store.streams.list_streams(self.name) if s.startswith(prefix)]

    def stream_exists(self, name: str) -> bool:
        return self.view_if_any(name) is not None

    def view_if_any(self, name: str) -> StreamView | None:
        """The stream's metadata as read now, or None if it does not exist (its readers and its
        writers read it: either grant will do)."""
        check_names((name, "stream"))
        self.require(CONSUME, PRODUCE)
        with metadata_errors(f"read stream {self.name}/{name}"):
            return self.client.store.streams.read_stream(self.name, name)

    def view(self, name: str) -> StreamView:
        """The stream's metadata as read now; NoSuchStreamError if it does not exist."""
        view = self.view_if_any(name)
        if view is None:
            raise errors.NoSuchStreamError(f"stream {self.name}/{name} does not exist")
        return view

    def stream_info(self, name: str) -> StreamInfo:
        """The stream's segments and positions, the one in progress included up to the LAC the
        bookies know (read without fencing: its writer, alive or dead, is left alone)."""
        self.require(CONSUME)
        for attempt in range(STREAM_INFO_TRIES):
            view = self.view(name)
            seg = view.in_progress
            try:
                info = StreamInfo.of(name, view, live_end(self, name, seg) if seg is not None else None)
                info = info.with_usage(read_usage(self.client.store, self.name))
                return replace(info, placement_problems=settings_problems(self._settings,
                                                                          self.client.registry.writable()))
            except errors.NoSuchLedgerError:
                if attempt + 1 == STREAM_INFO_TRIES:
                    raise
                # The segment went after the read (an empty one dropped by a recovery): read again.
        raise errors.MetadataServiceError(f"stream {self.name}/{name}: no stream info")  # not reached

    def storage_usage(self) -> NamespaceUsage:
        """The namespace's bytes on bookies against its ``storage_quota_bytes`` (stream/quota.py:
        sealed segments exactly, segments in progress as their writers last published them)."""
        self.require(CONSUME, PRODUCE)
        return read_usage(self.client.store, self.name)

    def delete_stream(self, name: str) -> None:
        """The stream, its metadata and its segments' ledgers."""
        self.require(PRODUCE)
        view = self.view(name)
        with metadata_errors(f"delete stream {self.name}/{name}"):
            self.client.store.streams.delete_stream(self.name, name)
        for seg in view.ordered():
            if seg.ledger_id is not None:
                self.client.delete_ledger(seg.ledger_id)

    def apply_retention(self, name: str, now_ms: int | None = None) -> int:
        """Delete the sealed segments past the namespace's retention limits; how many went."""
        self.require(PRODUCE)
        return apply_retention(self, name, now_ms)

    # -- writers and readers ----------------------------------------------------------------
    def open_writer(self, name: str, lock_timeout_ms: int = 30_000) -> StreamWriter:
        """The stream's single writer (created if missing); StreamLockedError while another live
        writer holds it after ``lock_timeout_ms``."""
        self.require(PRODUCE)
        return StreamWriter(self, name, lock_timeout_ms)

    def open_reader(self, name: str, start: DLSN | str = DLSN.INITIAL, start_txid: int | None = None, *,
                    subscription: str | None = None, commit_interval_ms: int = COMMIT_INTERVAL_MS) -> StreamReader:
        """A reader from ``start`` (a DLSN, or "latest"), or from the first record with txid >= ``start_txid``.
        ``subscription``: resume after its committed position (a new one is created, starting at
        ``start``); the reader's ``commit`` writes at most once per ``commit_interval_ms``."""
        self.require(CONSUME)
        return StreamReader(self, name, start, start_txid, subscription=subscription,
                            commit_interval_ms=commit_interval_ms)

    # -- subscriptions (DESIGN §4.11) -----------------------------------------------------------
    def subscriptions(self, name: str) -> dict[str, SubscriptionInfo]:
        """Every subscription of the stream with its position and exact backlog."""
        self.require(CONSUME)
        return subs.infos(self, name)

    def commit_subscription(self, name: str, subscription: str, dlsn: DLSN) -> None:
        """Move ``subscription`` forward to ``dlsn`` without a reader (created if absent; a lower
        position is ignored); written at once."""
        subs.check_subscription(subscription)
        self.require(CONSUME)
        view = self.view(name)
        pos = subs.as_position(dlsn)
        subs.check_not_past_end(self, name, view, pos)
        subs.commit_position(self, name, subscription, pos, create=True, view=view)

    def reset_subscription(self, name: str, subscription: str, dlsn: DLSN | str) -> None:
        """Move ``subscription`` to ``dlsn`` (the last record consumed: readers resume after it),
        backwards too; or to ``"earliest"`` / ``"latest"``. NoSuchSubscriptionError if absent."""
        subs.check_subscription(subscription)
        self.require(CONSUME)
        subs.reset_position(self, name, subscription, dlsn)

    def delete_subscription(self, name: str, subscription: str) -> None:
        """NoSuchSubscriptionError if absent. Its readers read on; their commits then fail."""
        subs.check_subscription(subscription)
        self.require(CONSUME)
        subs.delete(self, name, subscription)


# ---------------------------------------------------------------------- client-level

def create_namespace(client: LedgerClient, name: str, tenant: str = PUBLIC_TENANT, **settings: object) -> Namespace:
    """A namespace owned by ``tenant`` (superusers and the tenant's admin roles; NoSuchTenantError
    for a tenant never created, except ``public``, which exists from the first namespace on)."""
    check_names((name, "namespace"))
    s = NamespaceSettings.build(**settings)
    if tenant == PUBLIC_TENANT:
        create_public_tenant(client)
    require_tenant_admin(client, tenant, f"create namespace {name!r} in tenant {tenant!r}")
    access = NamespaceAccess(tenant).to_json()
    with metadata_errors(f"create namespace {name}", exists=errors.NamespaceExistsError):
        client.store.streams.create_namespace(name, encode_settings(s.to_json(), access))
    return Namespace(client, name, s, 0, access)


def get_namespace(client: LedgerClient, name: str) -> Namespace:
    check_names((name, "namespace"))
    with metadata_errors(f"read namespace {name}", denied=denied_namespace(client, name)):
        got = client.store.streams.read_namespace(name)
        if got is None:
            raise errors.NoSuchNamespaceError(f"namespace {name!r} does not exist")
        settings = NamespaceSettings.from_json(decode_settings(got[0], f"namespace {name}"))
        access = decode_access(got[0], f"namespace {name}")
    return Namespace(client, name, settings, got[1], access)


def list_namespaces(client: LedgerClient) -> list[str]:
    with metadata_errors("list namespaces"):
        return client.store.streams.list_namespaces()


def delete_namespace(client: LedgerClient, name: str, force: bool = False) -> None:
    """NamespaceNotEmptyError while it has streams, unless ``force`` (then they go too)."""
    ns = get_namespace(client, name)
    require_manage(client, name, f"delete namespace {name!r}")
    streams = ns.list_streams()
    if streams and not force:
        raise errors.NamespaceNotEmptyError(f"namespace {name!r} has {len(streams)} streams "
                                            f"({', '.join(streams[:5])}); force=True deletes them")
    for s in streams:
        try:
            ns.delete_stream(s)
        except errors.NoSuchStreamError:
            pass
    # ZooKeeper checks a delete against the parent, which every member may create under: with the
    # tenant ACLs on, only the superuser's credentials delete a namespace's node.
    denied = (f"deleting namespace {name!r} takes a superuser's ZooKeeper credentials while ZooKeeper keeps "
              "tenants apart (its streams are gone)")
    with metadata_errors(f"delete namespace {name}", denied=denied):
        client.store.streams.delete_namespace(name)


__all__ = ["Namespace", "NamespaceUsage", "SegmentInfo", "StreamInfo", "SubscriptionInfo", "create_namespace",
           "delete_namespace", "get_namespace", "list_namespaces"]
