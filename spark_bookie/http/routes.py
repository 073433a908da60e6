"""BookKeeper's admin API (``/api/v1/...``, bookkeeper-server's ``server/http/service``): same
paths, same parameters, same JSON shapes, served by a bookie or an autorecovery process.

Why these rules: BookKeeper's tools and dashboards call these paths, so a spark-bookie cluster
answers them as a BookKeeper cluster does; where BookKeeper answers with a bare string we send
the same string as a JSON string. Destructive or expensive calls (``gc``, ``decommission``,
``ledger/delete``) take only PUT/POST/DELETE, as BookKeeper's do; a GET gets 405. Ledger
endpoints use a LedgerClient of their own, created on first use (a bookie that nobody asks about
ledgers never opens one). Pulsar's tenant API (``/admin/v2/...``) is spark_bookie.http.tenants,
its subscription endpoints spark_bookie.http.subscriptions.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from ledger_client import errors as lerr
from metadata import MetadataError
from spark_bookie.http.params import (
    ApiError,
    bookie_id_param,
    bool_param,
    choice_param,
    int_param,
    json_body,
)
from spark_bookie.http.server import Request, Response, Routes
from spark_bookie.http.subscriptions import SUBSCRIPTION_ROUTES
from spark_bookie.http.tenants import TENANT_ROUTES

if TYPE_CHECKING:
    from ledger_client import ClientConfig, LedgerClient
    from ledger_client.read_handle import ReadHandle
    from metadata import LedgerMetadata
    from recovery import AutoRecovery
    from spark_bookie.server.auth import TokenVerifier
    from spark_bookie.server.bookie import Bookie

log = logging.getLogger(__name__)

READ_ENTRIES_MAX = 1000  # entries one /api/v1/ledger/read answers (BookKeeper's page size)


@dataclass
class AdminContext:
    """What the endpoints read: the process's bookie and/or autorecovery, and the cluster."""

    zk_connect: str
    registry: CollectorRegistry
    bookie: Bookie | None = None
    autorecovery: AutoRecovery | None = None
    config: Mapping[str, object] = field(default_factory=dict)
    ready: Callable[[], bool] | None = None  # overrides is_ready's rule (the Spark driver: hosting job running)
    client_config: ClientConfig | None = None  # credentials of the ledger client (secured clusters)
    verifier: TokenVerifier | None = None  # the process's token checks (None: it checks none)
    _client: LedgerClient | None = None
    _tenancy: LedgerClient | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    decommissions: dict[str, threading.Thread] = field(default_factory=dict)

    def client(self) -> LedgerClient:
        with self._lock:
            if self._client is None:
                from ledger_client import LedgerClient

                self._client = LedgerClient(self.zk_connect, config=self.client_config)
            return self._client

    def tenancy_client(self) -> LedgerClient:
        """The client the tenant API (spark_bookie.http.tenants) acts through, once its handler has
        checked the caller: the process's own connection and metadata session, without the
        process's token, whose role (a service identity, say) is not the caller's and would make
        the client refuse what the caller may do. Only metadata is touched through it."""
        client = self.client()
        with self._lock:
            if self._tenancy is None:
                from ledger_client import LedgerClient

                cfg = dataclasses.replace(client.config, auth_token=None, auth_token_file=None)
                self._tenancy = LedgerClient(self.zk_connect, config=cfg, metadata_store=client.store)
            return self._tenancy

    def close(self) -> None:
        with self._lock:
            if self._tenancy is not None:
                self._tenancy.close()   # first: it runs on the other's metadata session
                self._tenancy = None
            if self._client is not None:
                self._client.close()
                self._client = None

    def require_admin(self, req: Request, what: str) -> None:
        """ApiError unless the caller holds the admin role. A port that checks no tokens answers
        everyone only when its cluster is open: if its own client carries a token, the bookies
        check tokens, and a caller nobody checked gets 403."""
        from spark_bookie.http.security import require_admin

        cfg = self.client_config
        if self.verifier is None and cfg is not None and (cfg.auth_token or cfg.auth_token_file):
            raise ApiError(403, f"{what} takes the admin role, and this admin port checks no tokens")
        require_admin(self.verifier, req, what)

    def need_bookie(self) -> Bookie:
        if self.bookie is None:
            raise ApiError(404, "this process runs no bookie")
        return self.bookie


# ---------------------------------------------------------------------- bookie endpoints

def heartbeat(ctx: AdminContext, req: Request) -> Response:
    return Response.text("OK\n")


def server_config(ctx: AdminContext, req: Request) -> Response:
    return Response.json({k: str(v) for k, v in sorted(ctx.config.items())})


def bookie_info(ctx: AdminContext, req: Request) -> Response:
    b = ctx.need_bookie()
    free = total = 0
    for d in b.ledger_dirs:
        u = shutil.disk_usage(d)
        free, total = free + u.free, total + u.total
    return Response.json({"freeSpace": free, "totalSpace": total})


def bookie_state(ctx: AdminContext, req: Request) -> Response:
    b = ctx.need_bookie()
    return Response.json({"running": b.is_ready, "readOnly": b.read_only, "shuttingDown": b.stopping,
                          "availableForHighPriorityWrites": b.is_ready})


def is_ready(ctx: AdminContext, req: Request) -> Response:
    """200 ``OK`` once the process serves (bookie registered / autorecovery connected), else 503:
    what a load balancer's or Marathon's health check asks."""
    if ctx.ready is not None:
        ready = ctx.ready()
    elif ctx.bookie is not None:
        ready = ctx.bookie.is_ready
    elif ctx.autorecovery is not None:
        ready = ctx.autorecovery.wait_ready(0)
    else:
        ready = True
    if not ready:
        raise ApiError(503, "not ready")
    return Response.text("OK\n")


def list_bookies(ctx: AdminContext, req: Request) -> Response:
    """``{"host:port": hostname or null}`` of writable (``type=rw``) or read-only (``ro``) bookies."""
    kind = choice_param(req.params, "type", ("rw", "ro"))
    hostnames = bool_param(req.params, "print_hostnames")
    store = ctx.client().store
    ids = sorted(store.cluster.list_bookies(readonly=kind == "ro"))
    return Response.json({b: (_hostname(b) if hostnames else None) for b in ids})


def _hostname(bookie_id: str) -> str:
    host = bookie_id.rpartition(":")[0]
    try:
        return socket.gethostbyaddr(host)[0]
    except OSError:
        return host


def gc_status(ctx: AdminContext, req: Request) -> Response:
    return Response.json({"is_in_force_gc": str(ctx.need_bookie().gc_running).lower()})


def gc_trigger(ctx: AdminContext, req: Request) -> Response:
    b = ctx.need_bookie()
    b.trigger_gc()
    return Response.json(f"Triggered GC on BookieServer: {b.bookie_id}")


def last_log_mark(ctx: AdminContext, req: Request) -> Response:
    b = ctx.need_bookie()
    file_id, offset = b.last_log_mark()
    return Response.json({b.journal_dirs[0]: f"LogMark: logFileId - {file_id} , logFileOffset - {offset}"})


# ---------------------------------------------------------------------- autorecovery endpoints

def who_is_auditor(ctx: AdminContext, req: Request) -> Response:
    auditor = ctx.client().store.underreplication.current_auditor()
    if not auditor:
        raise ApiError(404, "No auditor elected")
    return Response.json({"Auditor": auditor})


def list_under_replicated(ctx: AdminContext, req: Request) -> Response:
    """Ledger ids (``printmissingreplica=true``: ``{id: [missing bookies]}``), filtered by
    ``missingreplica`` / ``excludingmissingreplica``; 404 when none, as BookKeeper answers."""
    include = req.params.get("missingreplica") or None
    exclude = req.params.get("excludingmissingreplica") or None
    with_replicas = bool_param(req.params, "printmissingreplica")
    queued = ctx.client().store.underreplication.list_underreplicated()
    chosen = {lid: missing for lid, missing in sorted(queued.items())
              if (include is None or include in missing) and (exclude is None or exclude not in missing)}
    if not chosen:
        raise ApiError(404, "No under replicated ledgers found")
    if with_replicas:
        return Response.json({str(lid): list(missing) for lid, missing in chosen.items()})
    return Response.json(list(chosen))


def decommission(ctx: AdminContext, req: Request) -> Response:
    """Start moving every ledger off ``bookie_src`` (body ``{"bookie_src": "host:port"}``) in the
    background, as BookKeeper's does; the cluster's replication workers copy the data."""
    body = json_body(req.body)
    bookie = bookie_id_param(body.get("bookie_src"), "bookie_src")
    running = ctx.decommissions.get(bookie)
    if running is not None and running.is_alive():
        raise ApiError(409, f"a decommission of {bookie} is already running")
    store = ctx.client().store
    t = threading.Thread(target=_decommission, args=(store, bookie), name=f"decommission-{bookie}", daemon=True)
    ctx.decommissions[bookie] = t
    t.start()
    return Response.json(f"Success send decommission Bookie command {bookie}")


def _decommission(store: Any, bookie: str) -> None:
    from recovery import RecoveryError, delete_cookie, drain_bookie

    try:
        done = drain_bookie(store, bookie, timeout_s=24 * 3600.0)
        delete_cookie(store, bookie)
        log.info("decommission of %s done: %d ledgers moved", bookie, done.total)
    except (RecoveryError, lerr.LedgerError) as e:
        log.error("decommission of %s failed: %s", bookie, e)
    except Exception:
        log.exception("decommission of %s failed", bookie)


# ---------------------------------------------------------------------- ledger endpoints

def _metadata_json(md: LedgerMetadata) -> dict[str, Any]:
    return {"ledgerId": md.ledger_id, "state": md.state.value, "ensembleSize": md.ensemble_size,
            "writeQuorumSize": md.write_quorum_size, "ackQuorumSize": md.ack_quorum_size,
            "lastEntryId": md.last_entry_id, "length": md.length, "digestType": md.digest_type.value,
            "ctime": md.ctime, "customMetadata": {k: v.hex() for k, v in md.custom_metadata.items()},
            "allEnsembles": {str(k): list(md.ensembles[k]) for k in sorted(md.ensembles)}}


def _ledger_errors(ledger_id: int, call: Callable[[], Any]) -> Any:
    """Client errors as HTTP answers: unknown ledger 404, bad password 403, bad input 400."""
    try:
        return call()
    except lerr.NoSuchLedgerError as e:
        raise ApiError(404, f"ledger {ledger_id} does not exist") from e
    except lerr.UnauthorizedAccessError as e:
        raise ApiError(403, str(e)) from e
    except (lerr.IncorrectParameterError, lerr.NoSuchEntryError) as e:
        raise ApiError(400, str(e)) from e
    except lerr.LedgerError as e:
        raise ApiError(503, f"{type(e).__name__}: {e}") from e


def ledger_list(ctx: AdminContext, req: Request) -> Response:
    """``{id: metadata or null}``; ``print_metadata=true`` fills in the metadata, ``page=N``
    (from 1) limits it to 100 ledgers."""
    with_md = bool_param(req.params, "print_metadata")
    page = int_param(req.params, "page", default=0, minimum=0, maximum=1 << 31)
    client = ctx.client()
    ids = sorted(_ledger_errors(-1, lambda: list(client.list_ledgers())))
    if with_md and page:
        ids = ids[(page - 1) * 100: page * 100]
    out: dict[str, Any] = {}
    for lid in ids:
        try:
            out[str(lid)] = _metadata_json(client.ledger_metadata(lid)) if with_md else None
        except lerr.NoSuchLedgerError:
            continue  # deleted since the listing
    return Response.json(out)


def ledger_metadata(ctx: AdminContext, req: Request) -> Response:
    lid = int_param(req.params, "ledger_id")
    md = _ledger_errors(lid, lambda: ctx.client().ledger_metadata(lid))
    return Response.json({str(lid): _metadata_json(md)})


def ledger_read(ctx: AdminContext, req: Request) -> Response:
    """``{entry id: payload}`` from ``start_entry_id`` (0) to ``end_entry_id`` (the last
    confirmed), at most 1,000; a payload that is not printable UTF-8 comes as ``hex:...``. The
    ledger is not fenced (a live writer goes on). With ``password``, the ledger opens as for any
    client (403 if it is wrong); without, a ledger whose password is empty opens for any caller,
    and any other only for the admin role (BookKeeper's administrative open), see _open_to_read."""
    lid = int_param(req.params, "ledger_id")
    first = int_param(req.params, "start_entry_id", default=0)
    last_asked = int_param(req.params, "end_entry_id", default=-1, minimum=-1)
    if last_asked != -1 and last_asked < first:
        raise ApiError(400, f"end_entry_id {last_asked} is before start_entry_id {first}")
    handle = _open_to_read(ctx, req, lid)
    lac = handle.last_add_confirmed
    last = min(lac if last_asked == -1 else last_asked, lac, first + READ_ENTRIES_MAX - 1)
    if first > last:
        return Response.json({})
    entries = _ledger_errors(lid, lambda: handle.read(first, last))
    return Response.json({str(e.entry_id): _render(e.data) for e in entries})


def _open_to_read(ctx: AdminContext, req: Request, lid: int) -> ReadHandle:
    """The administrative open reads with no password: the metadata keeps only the password's
    hash, and the bookies serve reads without it. So it is an admin's call on a cluster that
    checks tokens; an HMAC ledger (its digest is keyed by the password) still needs ``password``."""
    client = ctx.client()
    password = req.params.get("password")
    if password is not None:
        return _ledger_errors(lid, lambda: client.open_ledger(lid, password=password.encode(), recovery=False))
    md = _ledger_errors(lid, lambda: client.ledger_metadata(lid))
    if md.password_matches(b""):
        return _ledger_errors(lid, lambda: client.open_ledger(lid, password=b"", recovery=False))
    ctx.require_admin(req, f"reading ledger {lid} without its password")
    return _ledger_errors(lid, lambda: client.open_ledger_admin(lid))


def _render(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + data.hex()
    return text if text.isprintable() else "hex:" + data.hex()


def ledger_delete(ctx: AdminContext, req: Request) -> Response:
    lid = int_param(req.params, "ledger_id")
    client = ctx.client()
    _ledger_errors(lid, lambda: client.ledger_metadata(lid))  # 404 for an unknown ledger
    _ledger_errors(lid, lambda: client.delete_ledger(lid))
    return Response.json({"deleted": lid})


def build_routes(ctx: AdminContext) -> Routes:
    """Every endpoint, bound to ``ctx``: path -> {method: handler}."""
    def bind(fn: Callable[[AdminContext, Request], Response]) -> Callable[[Request], Response]:
        def handle(req: Request) -> Response:
            try:
                return fn(ctx, req)
            except (MetadataError, lerr.LedgerError) as e:  # ZooKeeper or bookies away: try again later
                raise ApiError(503, f"{type(e).__name__}: {e}") from e
        return handle

    api = "/api/v1"
    tenant_api = {path: {method: bind(fn) for method, fn in methods.items()}
                  for path, methods in (*TENANT_ROUTES.items(), *SUBSCRIPTION_ROUTES.items())}
    return {
        "/heartbeat": {"GET": bind(heartbeat)},
        f"{api}/config/server_config": {"GET": bind(server_config)},
        f"{api}/bookie/info": {"GET": bind(bookie_info)},
        f"{api}/bookie/state": {"GET": bind(bookie_state)},
        f"{api}/bookie/is_ready": {"GET": bind(is_ready)},
        f"{api}/bookie/list_bookies": {"GET": bind(list_bookies)},
        f"{api}/bookie/gc": {"GET": bind(gc_status), "PUT": bind(gc_trigger), "POST": bind(gc_trigger)},
        f"{api}/bookie/last_log_mark": {"GET": bind(last_log_mark)},
        f"{api}/autorecovery/who_is_auditor": {"GET": bind(who_is_auditor)},
        f"{api}/autorecovery/list_under_replicated_ledger": {"GET": bind(list_under_replicated)},
        f"{api}/autorecovery/decommission": {"PUT": bind(decommission), "POST": bind(decommission)},
        f"{api}/ledger/list": {"GET": bind(ledger_list)},
        f"{api}/ledger/metadata": {"GET": bind(ledger_metadata)},
        f"{api}/ledger/read": {"GET": bind(ledger_read)},
        f"{api}/ledger/delete": {"DELETE": bind(ledger_delete)},
        **tenant_api,
    }
