"""ZooKeeper over TLS on a secured cluster (DESIGN §4.8, docs/security.md): the embedded ZooKeeper
serves only its secure client port, so a plain client finds nothing to talk to and no credential
crosses the network in clear; `sandbox --secure`'s files make the bookies, their autorecovery, the
sandbox and its clients connect over TLS; a CA file that does not load is a typed error at once.

One secured sandbox (one ZooKeeper, two bookies) serves the whole module."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bookie_helpers import wait_until

from ledger_client import ClientConfig, LedgerClient
from ledger_client.errors import IncorrectParameterError
from metadata import MetadataUnavailableError, ZkTls, ZkTlsError, connect
from spark_bookie.errors import ConfigError
from spark_bookie.local.certs import CertificateAuthority
from spark_bookie.local.sandbox import Sandbox
from spark_bookie.local.secure import SecureSandboxFiles, sandbox_secure_files
from spark_bookie.local.zookeeper import four_letter_word
from spark_bookie.server.config import load_config

pytestmark = pytest.mark.integration

REFUSED_WITHIN_S = 2.0   # the connect timeout given to clients that must not get a session


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sandbox, SecureSandboxFiles]]:
    """What `spark-bookie sandbox --secure --bookies 2` starts, with autorecovery beside each bookie."""
    root = tmp_path_factory.mktemp("zk-tls")
    files = sandbox_secure_files(root)
    settings = {**files.bookie_settings(), "zk_session_timeout_ms": 4000, "gc_interval_ms": 3_600_000,
                "autorecovery_enabled": True}
    with Sandbox(root, 2, bookie_settings=settings, zk_tls=files.zookeeper_tls()) as sb:
        yield sb, files


def _refused(zk: str, **options: object) -> float:
    """Seconds until a session attempt failed (it must fail)."""
    t0 = time.monotonic()
    with pytest.raises(MetadataUnavailableError):
        connect(zk, connect_timeout_ms=int(REFUSED_WITHIN_S * 1000), **options).close()
    return time.monotonic() - t0


def test_only_the_tls_port_is_served_and_a_plain_client_gets_no_session(secured):
    sb, files = secured
    assert sb.zk is not None and sb.zk.tls is not None
    assert re.fullmatch(r"127\.0\.0\.1:\d+", sb.connect_string)   # printed and used as ever: host:port
    zoo_cfg = (sb.zk.data_dir / "zoo.cfg").read_text().splitlines()
    assert f"secureClientPort={sb.zk.port}" in zoo_cfg and not any(x.startswith("clientPort=") for x in zoo_cfg)

    assert _refused(sb.connect_string, zk_auth=files.zk_auth) < REFUSED_WITHIN_S + 3   # no TLS: no session
    try:
        answer = four_letter_word(sb.zk.port, "ruok", 2.0)
    except OSError:
        answer = ""
    assert answer != "imok"   # nothing answers in clear on that port

    ca = str(files.ca_path)
    with connect(sb.connect_string, zk_auth=files.zk_auth, zk_tls=ZkTls(ca)) as store:
        assert sorted(store.cluster.list_bookies()) == sorted(b.bookie_id for b in sb.bookies)
    with connect(sb.connect_string, zk_auth=files.zk_auth,
                 zk_tls=ZkTls(ca, str(files.client_cert_path), str(files.client_key_path))) as store:
        assert store.cluster.instance_id()   # a client certificate of the sandbox CA is accepted too

    rogue = CertificateAuthority("rogue CA").write_cert(files.directory.parent / "rogue-ca.pem")
    assert _refused(sb.connect_string, zk_auth=files.zk_auth, zk_tls=ZkTls(str(rogue))) < REFUSED_WITHIN_S + 3


def test_a_secure_sandbox_writes_and_reads_with_the_client_toml_it_wrote(secured):
    """The client TOML says zk_tls; with it a client creates, writes and reads a ledger, and the
    autorecovery beside the bookies (their client_conf) holds the auditor election over TLS."""
    sb, files = secured
    cfg = ClientConfig.from_toml(files.client_conf_path)
    assert cfg.zk_tls and cfg.zookeeper_tls() == ZkTls(str(files.ca_path), str(files.client_cert_path),
                                                       str(files.client_key_path))
    with LedgerClient(sb.connect_string, config=cfg) as c:
        w = c.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2, password=b"pw")
        for i in range(10):
            w.append(b"over TLS %d" % i)
        w.close()
        entries = c.open_ledger(w.ledger_id, password=b"pw").read(0, 9)
        assert [e.data for e in entries] == [b"over TLS %d" % i for i in range(10)]
    assert sb.store is not None
    bookies = {b.bookie_id for b in sb.bookies}
    wait_until(lambda: sb.store is not None and sb.store.underreplication.current_auditor() in bookies, 30,
               "an auditor elected by the bookies' autorecovery")


def test_a_ca_that_does_not_load_is_a_typed_error_at_once(secured, tmp_path: Path):
    sb, files = secured
    missing = tmp_path / "missing-ca.pem"
    conf = tmp_path / "client.toml"
    conf.write_text(f'[client]\nzk_auth = "{files.zk_auth}"\nzk_tls = true\ntls_ca_path = "{missing}"\n')
    with pytest.raises(IncorrectParameterError, match=re.escape(str(missing))):
        ClientConfig.from_toml(conf)
    with pytest.raises(ConfigError, match=re.escape(str(missing))):
        load_config(None, journal_dirs=[str(tmp_path / "j")], ledger_dirs=[str(tmp_path / "l")],
                    zk_tls=True, zk_tls_ca_path=str(missing))
    t0 = time.monotonic()
    with pytest.raises(ZkTlsError, match=re.escape(str(missing))):   # not a connect timeout
        connect(sb.connect_string, zk_auth=files.zk_auth, zk_tls=ZkTls(str(missing)))
    assert time.monotonic() - t0 < 1.0
