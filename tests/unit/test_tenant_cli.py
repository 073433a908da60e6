"""`spark-bookie tenant`, `stream grant|revoke|permissions`, `stream create-namespace --tenant` and
`role create`, run in this process over the in-memory metadata twin (``--zk memory://...``): what
they print, their one-line errors with exit status 2, and a refusal naming the role. The same
commands against real bookies, as subprocesses: tests/integration/test_tenants_admin.py."""

from __future__ import annotations

import json
import logging
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest

from ledger_client import ClientConfig
from metadata import connect
from spark_bookie.cli.main import main
from spark_bookie.server.auth import mint_token

pytestmark = pytest.mark.unit

SECRET = b"tenant-cli-unit-test-secret-0123456789"
CLAIMS = {"root": "admin", "acme-admin": "client", "intruder": "client"}


class Cli:
    def __init__(self, tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.zk = f"memory://cli-{uuid.uuid4().hex}/ledgers"
        store = connect(self.zk)
        store.cluster.init_cluster()
        store.close()
        self.tmp = tmp
        self.capsys = capsys
        self.secret = tmp / "token-secret"
        self.secret.write_bytes(SECRET)
        self.confs = {}
        for role, claim in CLAIMS.items():
            conf = tmp / f"{role}.toml"
            conf.write_text(f'[client]\nauth_token = "{mint_token(SECRET, role, claim, 600)}"\n'
                            f'zk_session_timeout_ms = 9000\n')
            self.confs[role] = str(conf)

    def __call__(self, role: str, group: str, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(["--client-conf", self.confs[role], group, "--zk", self.zk, *args])
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[Cli]:
    root, kazoo = logging.getLogger(), logging.getLogger("kazoo")
    levels = root.level, kazoo.level   # the commands quieten logging for their own output
    try:
        yield Cli(tmp_path, capsys)
    finally:
        root.setLevel(levels[0])
        kazoo.setLevel(levels[1])


def failed(got: tuple[int, str, str], prog: str, *words: str) -> str:
    code, out, err = got
    assert code == 2 and out == "", got
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), got
    for w in words:
        assert w in lines[0], (w, got)
    return lines[0]


def test_tenant_commands_and_their_refusals(cli):
    assert cli("root", "tenant", "create", "acme", "--admin-roles", "acme-admin, ops")[:2] == (
        0, "created tenant acme (admin roles: acme-admin, ops)\n")
    assert cli("root", "tenant", "list", "--json")[:2] == (0, '["acme"]\n')
    assert cli("acme-admin", "tenant", "info", "acme")[:2] == (
        0, "tenant: acme\nadmin_roles: acme-admin, ops\nnamespaces: \n")
    assert cli("root", "tenant", "update", "acme", "--admin-roles", "acme-admin")[0] == 0
    assert json.loads(cli("root", "tenant", "info", "acme", "--json")[1]) == {
        "name": "acme", "admin_roles": ["acme-admin"], "namespaces": []}
    failed(cli("intruder", "tenant", "create", "evil"), "spark-bookie tenant", "'intruder'", "superusers only")
    failed(cli("intruder", "tenant", "info", "acme"), "spark-bookie tenant", "'intruder'", "'acme'")
    failed(cli("acme-admin", "tenant", "delete", "acme"), "spark-bookie tenant", "'acme-admin'")
    failed(cli("root", "tenant", "create", "acme"), "spark-bookie tenant", "acme")
    failed(cli("root", "tenant", "create", "bad name"), "spark-bookie tenant", "tenant name")
    failed(cli("root", "tenant", "create", "x", "--admin-roles", "a:b"), "spark-bookie tenant", "bad role name")
    failed(cli("root", "tenant", "delete", "nope"), "spark-bookie tenant", "'nope'", "does not exist")
    assert cli("root", "tenant", "list")[:2] == (0, "acme\n")
    assert cli("root", "tenant", "delete", "acme")[:2] == (0, "deleted tenant acme\n")


def test_namespace_grants_from_the_command_line(cli):
    cli("root", "tenant", "create", "acme", "--admin-roles", "acme-admin")
    assert cli("acme-admin", "stream", "create-namespace", "pay", "--tenant", "acme")[:2] == (
        0, "created namespace pay in tenant acme\n")
    failed(cli("acme-admin", "stream", "create-namespace", "mine"), "spark-bookie shell", "'acme-admin'", "'public'")
    failed(cli("root", "stream", "create-namespace", "x", "--tenant", "nope"), "spark-bookie shell", "'nope'")
    assert cli("acme-admin", "stream", "grant", "pay", "billing", "--actions", "produce,consume")[0] == 0
    assert cli("root", "stream", "grant", "pay", "auditor", "--actions", "consume")[0] == 0
    assert json.loads(cli("acme-admin", "stream", "permissions", "pay", "--json")[1]) == {
        "auditor": ["consume"], "billing": ["consume", "produce"]}
    assert cli("acme-admin", "stream", "permissions", "pay")[1] == "auditor\tconsume\nbilling\tconsume,produce\n"
    failed(cli("acme-admin", "stream", "grant", "pay", "billing", "--actions", "fly"), "spark-bookie shell",
           "bad actions")
    failed(cli("acme-admin", "stream", "grant", "pay", "a:b", "--actions", "consume"), "spark-bookie shell",
           "bad role name")
    failed(cli("intruder", "stream", "grant", "pay", "intruder", "--actions", "consume"), "spark-bookie shell",
           "'intruder'")
    failed(cli("intruder", "stream", "permissions", "pay"), "spark-bookie shell", "'intruder'")
    assert cli("acme-admin", "stream", "revoke", "pay", "billing")[0] == 0
    assert cli("acme-admin", "stream", "permissions", "pay", "--json")[1] == '{"auditor": ["consume"]}\n'
    failed(cli("root", "tenant", "delete", "acme"), "spark-bookie tenant", "still owns", "pay")


def _token_of(path: Path) -> dict[str, object]:
    cfg = ClientConfig.from_toml(path)
    return jwt.decode(cfg.auth_token or "", SECRET, algorithms=["HS256"])


def test_role_create_writes_a_private_config_for_superusers_and_tenant_admins(cli, monkeypatch):
    cli("root", "tenant", "create", "acme", "--admin-roles", "acme-admin")
    cli("root", "tenant", "create", "globex", "--admin-roles", "gx-admin")
    out = cli.tmp / "billing.toml"
    code, text, err = cli("acme-admin", "role", "create", "billing", "--tenant", "acme", "--out", str(out),
                          "--token-secret", str(cli.secret), "--ttl-days", "2")
    assert code == 0 and text.startswith(f"wrote {out}: role billing (client token, valid until"), (text, err)
    claims = _token_of(out)
    assert (claims["sub"], claims["role"]) == ("billing", "client")
    assert 2 * 86_400 - 60 < int(claims["exp"]) - int(claims["iat"]) <= 2 * 86_400      # type: ignore[operator]
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert ClientConfig.from_toml(out).zk_session_timeout_ms == 9000   # the maker's settings, as its file says
    failed(cli("acme-admin", "role", "create", "billing", "--tenant", "acme", "--out", str(out),
               "--token-secret", str(cli.secret)), "spark-bookie role", "exists", "--force")
    monkeypatch.setenv("SPARK_BOOKIE_TOKEN_SECRET", str(cli.secret))      # the default key
    assert cli("root", "role", "create", "ops", "--out", str(out), "--force", "--role-claim", "service")[0] == 0
    assert _token_of(out)["role"] == "service"


@pytest.mark.parametrize("role,args,words", [
    ("acme-admin", (), ["'acme-admin'", "superusers only"]),                          # no --tenant: superusers
    ("acme-admin", ("--tenant", "acme", "--role-claim", "service"), ["'acme-admin'", "service"]),
    ("acme-admin", ("--tenant", "globex"), ["'acme-admin'", "'globex'"]),
    ("intruder", ("--tenant", "acme"), ["'intruder'", "'acme'"]),
    ("root", ("--tenant", "nope"), ["'nope'", "does not exist"]),
    ("root", ("--tenant", "bad name"), ["tenant name"]),
    ("root", ("--ttl-days", "0"), ["lifetime"]),
    ("root", ("--token-secret", "/nonexistent"), ["cannot read"]),
])
def test_role_create_refusals_are_one_line_and_write_nothing(cli, role, args, words):
    cli("root", "tenant", "create", "acme", "--admin-roles", "acme-admin")
    cli("root", "tenant", "create", "globex", "--admin-roles", "gx-admin")
    out = cli.tmp / "new.toml"
    key = () if "--token-secret" in args else ("--token-secret", str(cli.secret))
    failed(cli(role, "role", "create", "newrole", "--out", str(out), *key, *args), "spark-bookie role", *words)
    assert not out.exists()


def test_a_tenant_admin_may_not_mint_a_role_another_tenant_names(cli):
    cli("root", "tenant", "create", "acme", "--admin-roles", "acme-admin")
    cli("root", "tenant", "create", "globex", "--admin-roles", "gx-admin")
    out = cli.tmp / "x.toml"
    failed(cli("acme-admin", "role", "create", "gx-admin", "--tenant", "acme", "--out", str(out), "--token-secret",
               str(cli.secret)), "spark-bookie role", "'acme-admin'", "admin role of tenant 'globex'")
    assert cli("root", "role", "create", "gx-admin", "--out", str(out), "--token-secret", str(cli.secret))[0] == 0


def test_role_create_without_a_key_says_how_to_give_one(cli, monkeypatch):
    monkeypatch.delenv("SPARK_BOOKIE_TOKEN_SECRET", raising=False)
    failed(cli("root", "role", "create", "x", "--out", str(cli.tmp / "x.toml")), "spark-bookie role",
           "token key", "SPARK_BOOKIE_TOKEN_SECRET")


def test_the_roles_own_client_certificate_is_written_with_absolute_paths(cli, monkeypatch):
    monkeypatch.chdir(cli.tmp)
    for name in ("ca.pem", "role.pem", "role-key.pem"):
        (cli.tmp / name).write_text("x")
    conf = Path(cli.confs["root"])
    conf.write_text(conf.read_text() + f'tls_ca_path = "{cli.tmp / "ca.pem"}"\n')
    code, _, err = cli("root", "role", "create", "billing", "--out", "billing.toml", "--token-secret",
                       str(cli.secret), "--tls-cert", "role.pem", "--tls-key", "role-key.pem")
    assert code == 0, err
    cfg = ClientConfig.from_toml(cli.tmp / "billing.toml")
    assert (cfg.tls_cert_path, cfg.tls_key_path) == (str(cli.tmp / "role.pem"), str(cli.tmp / "role-key.pem"))
    assert cfg.tls_ca_path == str(cli.tmp / "ca.pem")
