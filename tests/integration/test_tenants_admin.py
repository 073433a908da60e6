"""Tenants from the command line and the HTTP admin API (DESIGN §4.7, §4.9) on real bookies that
check tokens, with ZooKeeper ACLs: `spark-bookie tenant ...`, `stream grant|revoke|permissions`,
`role create` whose config then writes where its role is granted and nowhere else, and Pulsar's
/admin/v2 endpoints answered by a bookie for superuser, tenant-admin and intruder tokens.

One cluster for the module; the CLI runs as subprocesses, as a user runs it (their count is kept
low: each is a Python start-up). The bookies' own client holds a service token: the admin API
decides by the caller's token, never by the process's.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger_client import ClientConfig, LedgerClient, errors
from spark_bookie.local.sandbox import Sandbox
from spark_bookie.server.auth import mint_token

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SECRET = b"the-tenants-admin-test-secret-0123456789"
ZK_AUTH = "spark-bookie:tenants-admin-pw"
CLAIMS = {"root": "admin", "gx-admin": "client", "intruder": "client", "svc": "service", "reader": "client"}


def token(role: str) -> str:
    return mint_token(SECRET, role, CLAIMS[role], ttl_s=3600)


def client(sb: Sandbox, role: str) -> LedgerClient:
    return LedgerClient(sb.connect_string, config=ClientConfig(zk_auth=ZK_AUTH, auth_token=token(role),
                                                               operation_timeout_ms=15_000))


class Env:
    def __init__(self, sb: Sandbox, root: Path) -> None:
        self.sb = sb
        self.root = root
        self.secret = root / "token-secret"
        self.confs = {role: self.conf(role) for role in ("root", "gx-admin", "intruder")}

    def conf(self, role: str) -> Path:
        path = self.root / f"{role}.toml"
        path.write_text(f'[client]\nzk_auth = "{ZK_AUTH}"\nauth_token = "{token(role)}"\n'
                        'zk_session_timeout_ms = 8000\n')
        return path

    def cli(self, conf: str | Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """`spark-bookie --client-conf CONF GROUP --zk Z ARGS` (the group is args[0])."""
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_BOOKIE_ZK", "SPARK_BOOKIE_CLIENT_CONF")}
        env["SPARK_BOOKIE_TOKEN_SECRET"] = str(self.secret)
        path = self.confs[conf] if isinstance(conf, str) else conf
        return subprocess.run([sys.executable, "-m", "spark_bookie.cli", "--client-conf", str(path), args[0],
                               "--zk", self.sb.connect_string, *args[1:]], input=stdin, capture_output=True,
                              text=True, timeout=120, cwd=REPO, env=env)

    def http(self, method: str, path: str, role: str | None = None, body: Any = None,
             raw: bytes | None = None) -> tuple[int, Any]:
        url = f"{self.sb.bookies[0].http_url}{path}"
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {token(role)}"} if role else {}
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                text = resp.read()
                return resp.status, json.loads(text) if text else None
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())


def ok(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 0, (p.args, p.stdout, p.stderr)
    return p.stdout


def refused(p: subprocess.CompletedProcess[str], prog: str, *words: str) -> str:
    """Exit 2 and one `PROG: error:` line holding ``words``, no traceback."""
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), (p.args, p.stderr)
    for w in words:
        assert w in lines[0], (w, p.stderr)
    return lines[0]


@pytest.fixture(scope="module")
def env(zk_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """Two bookies checking tokens (the first serves HTTP), ZooKeeper ACLs; namespace `open-ns`
    (tenant public) made by a superuser, granted to nobody."""
    root = tmp_path_factory.mktemp("tenants-admin")
    (root / "token-secret").write_bytes(SECRET)
    service = root / "service.toml"
    service.write_text(f'[client]\nzk_auth = "{ZK_AUTH}"\nauth_token = "{token("svc")}"\n')
    sb = Sandbox(root / "cluster", 2, zk_connect=f"{zk_server}/t-{uuid.uuid4().hex[:12]}/ledgers", http=True,
                 bookie_settings={"zk_session_timeout_ms": 4000, "gc_interval_ms": 3_600_000, "zk_auth": ZK_AUTH,
                                  "auth_enabled": True, "auth_token_secret_path": str(root / "token-secret"),
                                  "client_conf": str(service)})
    sb.start()
    try:
        with client(sb, "root") as c:
            c.create_namespace("open-ns", ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
        yield Env(sb, root)
    finally:
        sb.stop()


def test_cli_tenants_grants_and_a_role_config_that_writes_only_where_granted(env):
    ok(env.cli("root", "tenant", "create", "globex", "--admin-roles", "gx-admin"))
    assert "globex" in json.loads(ok(env.cli("root", "tenant", "list", "--json")))
    refused(env.cli("intruder", "tenant", "create", "evil"), "spark-bookie tenant", "'intruder'", "superusers")
    ok(env.cli("gx-admin", "stream", "create-namespace", "gx-orders", "--tenant", "globex", "--ensemble", "2",
               "--write-quorum", "2", "--ack-quorum", "2"))
    assert json.loads(ok(env.cli("gx-admin", "tenant", "info", "globex", "--json"))) == {
        "name": "globex", "admin_roles": ["gx-admin"], "namespaces": ["gx-orders"]}
    ok(env.cli("gx-admin", "stream", "grant", "gx-orders", "writer", "--actions", "produce,consume"))
    assert json.loads(ok(env.cli("gx-admin", "stream", "permissions", "gx-orders", "--json"))) == {
        "writer": ["consume", "produce"]}

    out = env.root / "writer.toml"     # the key: $SPARK_BOOKIE_TOKEN_SECRET, as a sandbox user sets it
    assert "role writer" in ok(env.cli("gx-admin", "role", "create", "writer", "--tenant", "globex", "--out", str(out)))
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    cfg = ClientConfig.from_toml(out)
    assert cfg.zk_auth == ZK_AUTH and cfg.auth_token and cfg.zk_session_timeout_ms == 8000

    assert "wrote 3 records" in ok(env.cli(out, "stream", "write", "gx-orders/s1", stdin="a\nb\nc\n"))
    refused(env.cli(out, "stream", "write", "open-ns/s1", stdin="x\n"), "spark-bookie shell",
            "'writer'", "'produce'", "'open-ns'")
    with client(env.sb, "root") as c:
        r = c.namespace("gx-orders").open_reader("s1")
        assert [r.read_next(timeout_ms=5_000).payload for _ in range(3)] == [b"a", b"b", b"c"]
        r.close()
        assert c.namespace("open-ns").list_streams() == []            # nothing of the refused write

    ok(env.cli("gx-admin", "stream", "revoke", "gx-orders", "writer"))
    with LedgerClient(env.sb.connect_string, config=cfg) as c:
        with pytest.raises(errors.UnauthorizedAccessError, match="'writer'"):
            c.namespace("gx-orders").open_writer("s1")
    refused(env.cli("root", "tenant", "delete", "globex"), "spark-bookie tenant", "still owns", "gx-orders")
    with client(env.sb, "root") as c:
        c.create_tenant("empty-co")
    ok(env.cli("root", "tenant", "delete", "empty-co"))


def test_role_create_refuses_a_tenant_admin_outside_its_tenant(env):
    with client(env.sb, "root") as c:
        c.create_tenant("initech-cli", admin_roles=["gx-admin"])
        c.create_tenant("other-cli", admin_roles=["other-admin"])
    out = env.root / "nope.toml"
    refused(env.cli("gx-admin", "role", "create", "other-admin", "--tenant", "initech-cli", "--out", str(out)),
            "spark-bookie role", "'gx-admin'", "admin role of tenant 'other-cli'")
    refused(env.cli("intruder", "role", "create", "x", "--tenant", "initech-cli", "--out", str(out)),
            "spark-bookie role", "'intruder'", "'initech-cli'")
    assert not out.exists()


T = "/admin/v2/tenants"
N = "/admin/v2/namespaces"


def test_http_tenants_by_superuser_tenant_admin_and_intruder(env):
    assert env.http("PUT", f"{T}/initech", "root", {"adminRoles": ["ini-admin", "gx-admin"]}) == (204, None)
    assert env.http("PUT", f"{T}/initech", "root", {"adminRoles": []})[0] == 409
    assert "initech" in env.http("GET", T, "root")[1]
    assert env.http("GET", f"{T}/initech", "gx-admin") == (
        200, {"adminRoles": ["gx-admin", "ini-admin"], "allowedClusters": []})
    for method, path, body in (("GET", T, None), ("GET", f"{T}/initech", None), ("PUT", f"{T}/evil", {}),
                               ("DELETE", f"{T}/initech", None), ("GET", f"{N}/initech", None)):
        status, err = env.http(method, path, "intruder", body)
        assert status == 403 and "'intruder'" in err["error"], (method, path, status, err)
    status, err = env.http("DELETE", f"{T}/initech", "gx-admin")
    assert status == 403 and "'gx-admin'" in err["error"] and "superusers only" in err["error"]
    assert env.http("GET", T)[0] == 401
    assert env.http("PUT", f"{T}/x", raw=b"{nope", role="root")[0] == 400
    status, err = env.http("PUT", f"{T}/bad%24name", "root", {})
    assert status == 400 and "bad tenant name" in err["error"]
    assert env.http("GET", f"{T}/nope", "root")[0] == 404
    assert env.http("POST", f"{T}/initech", "root", {"adminRoles": ["ini-admin"]}) == (204, None)
    assert env.http("GET", f"{T}/initech", "gx-admin")[0] == 403         # no longer one of its admins
    assert env.http("DELETE", f"{T}/initech", "root") == (204, None)
    assert env.http("DELETE", f"{T}/initech", "root")[0] == 404


def test_http_grants_reach_the_bookies_and_revokes_take_them_back(env):
    with client(env.sb, "root") as c:
        c.create_tenant("hooli", admin_roles=["gx-admin"])
        ns = c.create_namespace("hooli-logs", tenant="hooli", ensemble_size=2, write_quorum_size=2,
                                ack_quorum_size=2)
        w = ns.open_writer("events")
        w.write(b"first")
        w.close()
    perms = f"{N}/hooli/hooli-logs/permissions"
    assert env.http("GET", f"{N}/hooli", "gx-admin") == (200, ["hooli/hooli-logs"])
    status, err = env.http("POST", f"{perms}/reader", "intruder", ["consume"])
    assert status == 403 and "'intruder'" in err["error"]
    assert env.http("POST", f"{perms}/reader", "gx-admin", ["consume", "fly"])[0] == 400
    assert env.http("POST", f"{perms}/reader", "gx-admin", raw=b"consume")[0] == 400
    assert env.http("POST", f"{N}/public/hooli-logs/permissions/reader", "root", ["consume"])[0] == 404
    assert env.http("POST", f"{perms}/reader", "gx-admin", ["consume"]) == (204, None)
    assert env.http("GET", perms, "gx-admin") == (200, {"reader": ["consume"]})
    with client(env.sb, "reader") as c:
        r = c.namespace("hooli-logs").open_reader("events")
        assert r.read_next(timeout_ms=5_000).payload == b"first"
        r.close()
        assert env.http("DELETE", f"{perms}/reader", "gx-admin") == (204, None)
        assert env.http("GET", perms, "root") == (200, {})
        with pytest.raises(errors.UnauthorizedAccessError, match="'reader'"):
            c.namespace("hooli-logs").open_reader("events")
    status, err = env.http("DELETE", f"{T}/hooli", "root")
    assert status == 409 and "hooli-logs" in err["error"]
