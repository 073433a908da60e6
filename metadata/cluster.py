"""The cluster's own nodes: its layout and instance id, bookie registrations, cookies, and the
programs' application data (``store.cluster``).

Written once on the node layer (:mod:`metadata.nodes`), for ZooKeeper and the in-memory twin.
Registrations are ephemeral: they go with the session, and after a session was LOST this store
re-creates them on the new one by itself before the store's users are told CONNECTED.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from metadata.errors import BadVersionError, MetadataError, NodeExistsError, NoNodeError, NotEmptyError
from metadata.layout import LAYOUT_TEXT, ZkLayout
from metadata.nodes import Nodes
from metadata.session import SessionEvent
from metadata.watches import BookiesWatch, BookiesWatchCallback, BookiesWatchState, WatchKeeper

log = logging.getLogger(__name__)

_POLL_S = 0.25  # how often a conflicting registration is re-checked (a watch wakes it sooner)


def parse_bookie_info(data: bytes) -> dict[str, str]:
    """A registration node's JSON object as ``str -> str`` ({} if it is not one): the bookie
    writes what clients need to reach it, and an old or foreign bookie may write nothing."""
    try:
        value = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}


class ClusterStore:
    """Cluster-wide nodes and bookie registrations. Every call has a deadline: ZooKeeper down
    means :class:`~metadata.errors.MetadataUnavailableError`, never a hang."""

    def __init__(self, nodes: Nodes, paths: ZkLayout, watches: WatchKeeper) -> None:
        self._nodes = nodes
        self._paths = paths
        self._watches = watches
        self._lock = threading.Lock()
        self._reg_lock = threading.Lock()  # serialises claiming/deleting registration nodes
        self._registrations: dict[str, bytes] = {}
        nodes.add_session_listener(self._session_event)

    # -- the cluster ---------------------------------------------------------------------------
    def init_cluster(self) -> str:
        """Create the layout (idempotent, safe to race) and return the cluster's instance id."""
        p = self._paths
        with self._nodes.deadline():
            for path in (p.root, p.available, p.available_readonly, p.cookies, p.underreplication, p.idgen):
                self._create_if_absent(path, b"")
            for path in (p.ur_ledgers, p.ur_locks, p.auditor_election):
                self._create_if_absent(path, b"")
            layout = self._create_if_absent(p.layout, LAYOUT_TEXT.encode())
            if layout.decode(errors="replace") != LAYOUT_TEXT:
                raise MetadataError(
                    f"{p.layout} holds an incompatible layout {layout!r}; expected {LAYOUT_TEXT!r}"
                )
            return self._create_if_absent(p.instance_id, str(uuid.uuid4()).encode()).decode()

    def _create_if_absent(self, path: str, data: bytes) -> bytes:
        """Create a persistent node unless it exists; return what it holds (safe to race)."""
        try:
            self._nodes.create(path, data, makepath=True)
            return data
        except NodeExistsError:
            got = self._nodes.get(path)
            if got is None:
                raise MetadataError(f"{path} was deleted while the cluster was being initialised") from None
            return got[0]

    def instance_id(self) -> str:
        """The cluster's instance id; NoNodeError if the cluster was never initialised."""
        path = self._paths.instance_id
        got = self._nodes.get(path)
        if got is None:
            raise NoNodeError(f"no cluster at {path}: run `spark-bookie init` first")
        return got[0].decode()

    def secure_tree(self) -> int:
        """Put the session's digest ACL (its ``zk_auth``) on the root and every node under it: an
        open cluster becomes a secured one. Returns how many nodes were changed. ZooKeeper only
        (MetadataError on the in-memory twin, which has no ACLs)."""
        return self._nodes.secure_tree(self._paths.root)

    # -- bookie registration -------------------------------------------------------------------
    def register_bookie(self, bookie_id: str, *, readonly: bool, data: bytes = b"", wait_ms_max: int,
                        left_by_dead: Callable[[bytes], bool] | None = None) -> None:
        """Create the ephemeral ``available[/readonly]/<id>`` node and keep it across sessions.

        A node left by a dead process lives until its session times out, so a conflicting node
        is waited for (up to ``wait_ms_max``) before NodeExistsError, unless ``left_by_dead`` says
        from its data that the process which wrote it is gone (the bookie knows its own
        predecessor on its own machine): that node is deleted (CAS on its version) and claimed at
        once. After a session is LOST the store re-creates its registrations on the new session by
        itself.
        """
        path = self._paths.bookie(bookie_id, readonly=readonly)
        give_up = time.monotonic() + wait_ms_max / 1000
        while True:
            status, session = self._claim(path, data)
            if status == "ours":
                with self._lock:
                    self._registrations[path] = data
                if self._nodes.session() != session:
                    # the session changed before we recorded the registration, so the re-creation
                    # after that change may have missed it: run it again
                    self._nodes.worker.submit(self._ensure_registrations)
                return
            if status == "foreign" and left_by_dead is not None:
                removed = self._remove_if_dead(path, left_by_dead)
                if removed is None:
                    left_by_dead = None   # could not delete it: wait for its session, and say so once
                elif removed:
                    continue
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                raise NodeExistsError(
                    f"bookie {bookie_id} is already registered at {path} by another ZooKeeper session "
                    f"and the node did not go away within {wait_ms_max} ms: is another bookie running "
                    f"with this id? (a killed bookie's node lasts until its session times out)"
                )
            self._await_change(path, min(_POLL_S, remaining))

    def _remove_if_dead(self, path: str, left_by_dead: Callable[[bytes], bool]) -> bool | None:
        """Delete ``path`` if its writer is known dead; whether to try claiming it again now (None:
        it is dead but could not be deleted)."""
        got = self._nodes.get(path)
        if got is None:
            return True
        value, version, owner = got
        if owner is None or owner == self._nodes.session() or not left_by_dead(value):
            return False
        try:
            self._nodes.delete(path, version, retry=False)
        except (NoNodeError, BadVersionError):
            return True   # gone or rewritten meanwhile: claim (or look) again
        except MetadataError as e:   # e.g. not ours to delete: wait for the session, as without the hint
            log.warning("could not remove %s, left by a dead process: %s; waiting for its session to end", path, e)
            return None
        log.info("removed %s: left by a process of this bookie that is no longer running (session %x)", path, owner)
        return True

    def _await_change(self, path: str, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for ``path`` to change (or go)."""
        changed = threading.Event()
        if self._nodes.watch(path, lambda _event: changed.set()) is not None:
            changed.wait(timeout_s)

    def _claim(self, path: str, data: bytes) -> tuple[str, int | None]:
        """Try to own the ephemeral ``path``: "ours", "foreign" (someone else's) or "gone" (retry),
        with the session id seen before trying."""
        with self._reg_lock, self._nodes.deadline():
            session = self._nodes.session()
            try:
                self._nodes.create(path, data, ephemeral=True, retry=False)
                return "ours", session
            except NoNodeError as e:
                raise NoNodeError(
                    f"cannot register {path}: the cluster is not initialised (run `spark-bookie init`)"
                ) from e
            except NodeExistsError:
                got = self._nodes.get(path)
            if got is None:
                return "gone", session
            if session is None or got[2] != session:
                return "foreign", session
            try:  # ours already (a retry, or re-registering with new data)
                self._nodes.set(path, data)
            except NoNodeError:
                return "gone", session
            return "ours", session

    def _session_event(self, event: str) -> None:
        """Session thread: after a reconnection, make sure our registrations exist on this session
        (the session's other listeners are told after this)."""
        if event == SessionEvent.CONNECTED:
            self._ensure_registrations()

    def _ensure_registrations(self) -> None:
        with self._lock:
            wanted = dict(self._registrations)
        missing = []
        for path, data in wanted.items():
            if self._nodes.live_session() is None:
                return  # the next CONNECTED event runs this again
            try:
                if self._claim(path, data)[0] != "ours":
                    missing.append(path)
            except MetadataError as e:
                log.warning("could not re-create registration %s: %s", path, e)
                missing.append(path)
        if missing and not self._nodes.closed:
            retry_s = self._nodes.retry_s
            log.warning("registrations %s not yet re-created; retrying in %g s", missing, retry_s)
            self._nodes.worker.submit_later(retry_s, self._ensure_registrations)

    def unregister_bookie(self, bookie_id: str, *, readonly: bool) -> None:
        """Delete our registration node (if it is ours) and stop re-creating it."""
        path = self._paths.bookie(bookie_id, readonly=readonly)
        with self._lock:
            self._registrations.pop(path, None)
        with self._reg_lock:
            got = self._nodes.get(path)
            if got is None or got[2] != self._nodes.session():
                return  # not ours: never delete another session's registration
            try:
                self._nodes.delete(path, got[1])
            except (NoNodeError, BadVersionError):
                pass

    def list_bookies(self, readonly: bool = False) -> list[str]:
        """Registered bookie ids, sorted; the writable list excludes the ``readonly`` child."""
        names = self._nodes.children(self._paths.available_readonly if readonly else self._paths.available)
        return sorted(n for n in names or [] if readonly or n != "readonly")

    def bookie_info(self, bookie_id: str) -> dict[str, str]:
        """The JSON registration data of a registered bookie (writable or read-only), e.g.
        ``{"id", "address", "network_location"}``; ``{}`` if not registered or not a JSON object."""
        for readonly in (False, True):
            got = self._nodes.get(self._paths.bookie(bookie_id, readonly=readonly))
            if got is not None:
                return parse_bookie_info(got[0])
        return {}

    def bookie_infos(self, bookie_ids: Sequence[str]) -> dict[str, dict[str, str]]:
        """:meth:`bookie_info` of many bookies in one round trip (two when some are read-only):
        a client starting on a cluster of many bookies waits for their data once, not per bookie."""
        ids = list(bookie_ids)
        out: dict[str, dict[str, str]] = {}
        for readonly in (False, True):
            wanted = [b for b in ids if b not in out]
            if not wanted:
                break
            got = self._nodes.get_many([self._paths.bookie(b, readonly=readonly) for b in wanted])
            out.update({b: parse_bookie_info(g[0]) for b, g in zip(wanted, got, strict=True) if g is not None})
        return {b: out.get(b, {}) for b in ids}

    def watch_bookies(self, callback: BookiesWatchCallback) -> Callable[[], None]:
        """Call ``callback(writable, readonly)`` (sorted bookie ids) now and whenever either changes.

        Callbacks run on the store's watch thread (never the ZooKeeper client's), one at a time,
        in order; they survive reconnections and session loss. Returns a cancel function
        (idempotent). MetadataUnavailableError if the watch could not be set within the store's
        deadline; NoNodeError if the cluster was never initialised.
        """
        p = self._paths
        return self._watches.start(BookiesWatch(self._watches, BookiesWatchState(callback), p.available,
                                                p.available_readonly, p.root))

    # -- cookies --------------------------------------------------------------------------------
    def read_cookie(self, bookie_id: str) -> tuple[bytes, int] | None:
        """``(data, version)`` of the bookie's cookie, or None if it has none."""
        got = self._nodes.get(self._paths.cookie(bookie_id))
        return None if got is None else (got[0], got[1])

    def write_cookie(self, bookie_id: str, data: bytes, version: int | None) -> int:
        """Create (``version=None``; NodeExistsError if present) or CAS-update; returns the new version."""
        path = self._paths.cookie(bookie_id)
        try:
            if version is None:
                self._nodes.create(path, data, retry=False)
                return 0
            return self._nodes.set(path, data, version, retry=False)
        except NodeExistsError as e:
            raise NodeExistsError(f"cookie {path} already exists") from e
        except BadVersionError as e:
            raise BadVersionError(f"cookie {path} changed since version {version}") from e
        except NoNodeError as e:
            raise NoNodeError(f"cookie {path} does not exist (or the cluster is not initialised)") from e

    def delete_cookie(self, bookie_id: str, version: int) -> None:
        """CAS-delete the cookie (``version=-1`` deletes whatever is there); NoNodeError if absent."""
        path = self._paths.cookie(bookie_id)
        try:
            self._nodes.delete(path, version, retry=False)
        except NoNodeError as e:
            raise NoNodeError(f"cookie does not exist ({path})") from e
        except BadVersionError as e:
            raise BadVersionError(f"cookie changed since version {version} ({path})") from e

    # -- application data -------------------------------------------------------------------
    # A small persistent key-value area under ``<root>/apps`` for the programs that run the cluster
    # (the Spark hosting application keeps its stop request and per-slot status there), so they
    # coordinate through the cluster's own ZooKeeper without a client library of their own.
    # Keys are ``/``-separated names; values are small (ZooKeeper's 1 MB node limit applies).
    def put_app_data(self, key: str, data: bytes) -> None:
        """Create or overwrite ``<root>/apps/<key>`` (parents are created); last writer wins."""
        path = self._paths.app(key)
        with self._nodes.deadline():
            # Unconditional set/create are safe to repeat after a lost answer: the outcome is the same.
            for _ in range(3):
                try:
                    self._nodes.set(path, data)
                    return
                except NoNodeError:
                    pass
                try:
                    self._nodes.create(path, data, makepath=True)
                    return
                except NodeExistsError:
                    continue  # created meanwhile (or our own retried create): overwrite it
        raise MetadataError(f"{path} keeps being created and deleted concurrently")

    def get_app_data(self, key: str) -> bytes | None:
        """The value at ``key``; None if there is none."""
        got = self._nodes.get(self._paths.app(key))
        return None if got is None else got[0]

    def list_app_data(self, key: str) -> list[str]:
        """The names of ``key``'s children, sorted; [] if ``key`` does not exist."""
        return sorted(self._nodes.children(self._paths.app(key)) or [])

    def delete_app_data(self, key: str) -> None:
        """Delete ``key`` and everything below it; no error if it does not exist."""
        path = self._paths.app(key)
        with self._nodes.deadline():
            self._delete_tree(path)

    def _delete_tree(self, path: str) -> None:
        for child in self._nodes.children(path) or []:
            self._delete_tree(f"{path}/{child}")
        try:
            self._nodes.delete(path)
        except NoNodeError:
            pass
        except NotEmptyError as e:
            raise MetadataError(f"{path} gained children while being deleted") from e

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        """The session is closing: re-create no registration any more."""
        with self._lock:
            self._registrations.clear()
