"""/api/v1/ledger/read without the ledger's password (issue 27, item 3): BookKeeper's admin reads
any ledger, so the admin API does too, for the admin role (anyone on an open cluster), while the
Python client's open_ledger keeps requiring the right password. Two module-scoped clusters: one
open, one checking tokens."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from client_helpers import client

from ledger_client import DigestType, errors
from spark_bookie.local.sandbox import Sandbox
from spark_bookie.local.zookeeper import free_port
from spark_bookie.server.auth import mint_token

pytestmark = pytest.mark.integration

SECRET = b"admin-read-token-secret-0123456789abcdef"
PW = b"s3cret"
ENTRIES = [f"entry {i}".encode() for i in range(5)]


def _get(url: str, token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _write(sb: Sandbox, password: bytes, digest: DigestType = DigestType.CRC32C, **cfg: Any) -> int:
    with client(sb, **cfg) as c:
        w = c.create_ledger(3, 3, 2, digest_type=digest, password=password)
        for e in ENTRIES:
            w.append(e)
        w.close()
        return w.ledger_id


def _cluster(root: Path, zk_server: str, **settings: Any) -> Sandbox:
    sb = Sandbox(root, 3, zk_connect=f"{zk_server}/t-{uuid.uuid4().hex[:12]}/ledgers",
                 bookie_settings={"zk_session_timeout_ms": 4000, "gc_interval_ms": 3_600_000, **settings})
    sb.start()
    sb.add_bookie(http_port=free_port())   # the bookie whose admin API the tests call
    return sb


def _read_url(sb: Sandbox, lid: int, extra: str = "") -> str:
    return f"{sb.bookies[-1].http_url}/api/v1/ledger/read?ledger_id={lid}&start_entry_id=0&end_entry_id=4{extra}"


EXPECTED = {str(i): e.decode() for i, e in enumerate(ENTRIES)}


@pytest.fixture(scope="module")
def open_cluster(zk_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sb = _cluster(tmp_path_factory.mktemp("open"), zk_server)
    try:
        yield sb
    finally:
        sb.stop()


@pytest.fixture(scope="module")
def token_cluster(zk_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """Bookies checking tokens; the admin API's own client holds the cluster's `service` token
    (DESIGN §4.9): what the caller may read is decided by the caller's token, not by the process's."""
    root = tmp_path_factory.mktemp("tokens")
    secret = root / "token-secret"
    secret.write_bytes(SECRET)
    conf = root / "service.toml"
    conf.write_text(f'[client]\nauth_token = "{mint_token(SECRET, "bookie-service", "service", 3600)}"\n')
    sb = _cluster(root / "cluster", zk_server, auth_enabled=True, auth_token_secret_path=str(secret),
                  client_conf=str(conf))
    try:
        yield sb
    finally:
        sb.stop()


def test_admin_api_reads_a_ledger_without_its_password_on_an_open_cluster(open_cluster):
    sb = open_cluster
    lid = _write(sb, PW)
    assert _get(_read_url(sb, lid)) == (200, EXPECTED)
    status, err = _get(_read_url(sb, lid, "&password=wrong"))
    assert status == 403 and "wrong password" in err["error"], err       # a given password is still checked
    assert _get(_read_url(sb, lid, f"&password={PW.decode()}")) == (200, EXPECTED)
    with client(sb) as c:                                                 # the Python client: unchanged
        for wrong in (b"", b"wrong"):
            with pytest.raises(errors.UnauthorizedAccessError):
                c.open_ledger(lid, password=wrong, recovery=False)
        assert [e.data for e in c.open_ledger_admin(lid).read(0, 4)] == ENTRIES
        assert c.ledger_metadata(lid).state.value == "CLOSED"


def test_an_hmac_ledger_needs_its_password_even_for_the_admin(open_cluster):
    """HMAC digests are keyed by the password, which the metadata does not keep: a clear 403."""
    sb = open_cluster
    lid = _write(sb, PW, DigestType.HMAC)
    status, err = _get(_read_url(sb, lid))
    assert status == 403 and "HMAC" in err["error"] and "password" in err["error"], err
    assert _get(_read_url(sb, lid, f"&password={PW.decode()}")) == (200, EXPECTED)
    with client(sb) as c, pytest.raises(errors.UnauthorizedAccessError, match="HMAC"):
        c.open_ledger_admin(lid)


def test_on_a_token_cluster_only_the_admin_role_reads_without_the_password(token_cluster):
    sb = token_cluster
    admin = mint_token(SECRET, "ops", "admin", 600)
    user = mint_token(SECRET, "app", "client", 600)
    lid = _write(sb, PW, auth_token=admin)
    assert _get(_read_url(sb, lid), admin) == (200, EXPECTED)
    status, err = _get(_read_url(sb, lid), user)
    assert status == 403 and "admin" in err["error"], err
    assert _get(_read_url(sb, lid))[0] == 401                              # no token at all
    assert _get(_read_url(sb, lid, f"&password={PW.decode()}"), user) == (200, EXPECTED)
    open_lid = _write(sb, b"", auth_token=admin)                          # no password to keep from anyone
    assert _get(_read_url(sb, open_lid), user) == (200, EXPECTED)
