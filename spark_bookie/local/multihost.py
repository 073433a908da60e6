"""A cluster spread over the hosts of spark_bookie.local.hosts: ZooKeeper in the root namespace on
the bridge's address, one bookie per host binding and advertising that host's address.

Used by the partition tests and by ``spark-bookie sandbox --hosts N``. In namespace mode every
bookie listens on the same port (3181, BookKeeper's) on its own address, as on real machines, so
a bookie id's host part is all that tells two bookies' hosts apart, which is what host-aware
placement relies on.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from metadata import MetadataStore
from spark_bookie.local.hosts import NETNS, Host, Hosts
from spark_bookie.local.sandbox import (
    BookieProcess,
    SandboxError,
    connect_as_bookies,
    group_setting,
    init_layout,
    stop_cluster,
)
from spark_bookie.local.secure import SecureSandboxFiles, load_secure_files, sandbox_secure_files

if TYPE_CHECKING:
    from spark_bookie.local.sandbox_dir import SandboxDir
from spark_bookie.local.zookeeper import EmbeddedZooKeeper, free_port

log = logging.getLogger(__name__)

BOOKIE_PORT = 3181


class HostsLayout(Protocol):
    """Where a previous hosts cluster ran (spark_bookie.local.sandbox_dir.SandboxRecord)."""

    zk_port: int
    addresses: list[str]
    bookie_ports: list[int]


@dataclass
class HostBookie(BookieProcess):
    """A ``spark-bookie bookie`` process inside a host, bound to and advertising its address."""

    host: Host | None = None

    @property
    def bookie_id(self) -> str:
        assert self.host is not None
        return f"{self.host.address}:{self.port}"

    def command(self) -> list[str]:
        assert self.host is not None
        return self.host.wrap([*super().command(), "--host", self.host.address])

    def start(self) -> None:
        """Start (or start again, on the same disks) and let the host know, so killing it whole
        on a loopback host reaches this process too."""
        super().start()
        if self.host is not None and self.proc is not None:
            self.host.procs = [p for p in self.host.procs if p.poll() is None] + [self.proc]


class MultiHostCluster:
    """Hosts + ZooKeeper on the gateway + a bookie on each of ``bookie_hosts`` (default: all)."""

    def __init__(self, root: str | Path, hosts: int = 3, *, bookie_hosts: int | None = None, mode: str = "auto",
                 bookie_settings: dict[str, Any] | None = None, zk_session_timeout_ms_max: int = 20_000,
                 secure: bool = False, resume: HostsLayout | None = None, bookie_groups: Sequence[str] = ()) -> None:
        """`secure`: TLS with client certificates, tokens, ZooKeeper ACLs and ZooKeeper over TLS
        (sandbox --secure), with certificates for the hosts' and the gateway's addresses;
        `self.secure_files` then holds the client config.
        `resume`: come back as a previous cluster under the same root was (its addresses, ports,
        data and secure files); SandboxError if the hosts do not get its addresses again.
        `bookie_groups`: the placement group of each host's bookie, in host order ("": none)."""
        self.root = Path(root).absolute()
        self._secure = secure
        self._resume = resume
        self.secure_files: SecureSandboxFiles | None = None
        self.hosts = Hosts(self.root / "hosts", hosts, mode=mode)
        self._groups = list(bookie_groups)
        self.bookie_hosts = hosts if bookie_hosts is None else bookie_hosts
        self.settings = {"zk_session_timeout_ms": 4000, "gc_interval_ms": 3_600_000, **(bookie_settings or {})}
        self.zk: EmbeddedZooKeeper | None = None
        self._zk_session_max = zk_session_timeout_ms_max
        self.bookies: list[HostBookie] = []
        self.store: MetadataStore | None = None

    @property
    def connect_string(self) -> str:
        assert self.zk is not None, "not started"
        return self.zk.connect_string

    @property
    def zk_port(self) -> int:
        assert self.zk is not None, "not started"
        return self.zk.port

    def start(self) -> MultiHostCluster:
        resume = self._resume
        try:
            self.hosts.start()
            if resume is not None:
                self._check_resumable(resume)
            if self._secure:   # the addresses are known now: the certificates name them (ZooKeeper: the gateway)
                self.secure_files = (load_secure_files(self.root) if resume is not None else
                                     sandbox_secure_files(self.root, tuple(h.address for h in self.hosts),
                                                          zookeeper_host=self.hosts.gateway))
                self.settings.update(self.secure_files.bookie_settings())
            self.zk = EmbeddedZooKeeper(resume.zk_port if resume else free_port(), self.root / "zookeeper",
                                        host=self.hosts.gateway, max_session_timeout_ms=self._zk_session_max,
                                        tls=self.secure_files.zookeeper_tls() if self.secure_files else None)
            self.zk.start()
            self.store = connect_as_bookies(self.connect_string, self.settings)
            init_layout(self.store, self.settings)
            for i, host in enumerate(list(self.hosts)[: self.bookie_hosts]):
                self.add_bookie(host, wait=False, **group_setting(self._groups, i))
            for b in self.bookies:
                b.wait_registered(self.store)
        except BaseException:
            self.stop()
            raise
        return self

    def _check_resumable(self, resume: HostsLayout) -> None:
        addresses = [h.address for h in self.hosts]
        if addresses != list(resume.addresses):
            raise SandboxError(f"cannot resume the hosts sandbox in {self.root}: its hosts had addresses "
                               f"{', '.join(resume.addresses)}, these got {', '.join(addresses)} "
                               f"({self.hosts.reason or 'another harness may hold its network slot'})")

    def add_bookie(self, host: Host, wait: bool = True, **settings: Any) -> HostBookie:
        port = BOOKIE_PORT if self.hosts.mode == NETNS else free_port()
        if self._resume is not None and len(self.bookies) < len(self._resume.bookie_ports):
            port = self._resume.bookie_ports[len(self.bookies)]
        b = HostBookie(self.connect_string, port, host.root / f"bookie-{port}", {**self.settings, **settings},
                       host=host)
        self.bookies.append(b)
        host.services.append(b)
        b.start()
        if wait:
            b.wait_registered(self._store())
        return b

    def _store(self) -> MetadataStore:
        if self.store is None:
            raise RuntimeError("the multi-host cluster is not started")
        return self.store

    def bookies_on(self, host: Host) -> list[HostBookie]:
        return [b for b in self.bookies if b.host is host]

    def host_of(self, bookie_id: str) -> Host:
        """The host a bookie id names (its address part)."""
        host = self.hosts.host_of(bookie_id.rsplit(":", 1)[0])
        if host is None:
            raise KeyError(f"no host has the address of {bookie_id}")
        return host

    def kill_host(self, host: Host) -> None:
        """SIGKILL every process of ``host`` (bookies, clients, anything else in its namespace)."""
        self.hosts.kill(host)

    def restart_host(self, host: Host, wait: bool = True) -> None:
        """Start the host's bookies again on their disks; wait until they registered again."""
        self.hosts.restart(host)
        if wait:
            for b in self.bookies_on(host):
                b.wait_registered(self._store())

    def python_command(self, *args: str) -> list[str]:
        """This interpreter with ``args`` (to run a client inside a host with ``host.popen``)."""
        return [sys.executable, *args]

    def stop(self) -> None:
        """Stop bookies gracefully, then ZooKeeper; always remove the hosts (namespaces, bridge)."""
        try:
            stop_cluster(self.bookies, self.store, self.zk)
            self.store = None
        finally:
            self.hosts.close()

    def __enter__(self) -> MultiHostCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_hosts_sandbox(root: str | Path, hosts: int, wait: Callable[[], object], *,
                      mode: str = "auto", secure: bool = False, sandbox_dir: SandboxDir | None = None,
                      resume: HostsLayout | None = None, bookie_groups: Sequence[str] = ()) -> int:
    """`spark-bookie sandbox --hosts N [--secure]`: a bookie on each of N hosts, ZooKeeper on the
    gateway; print where everything is and how to run a command inside a host, then wait for
    ``wait`` to return. ``resume``: the previous sandbox's record (same addresses, ports, data);
    ``sandbox_dir`` gets this one's once it is up. ``bookie_groups``: each host's bookie's group."""
    with MultiHostCluster(Path(root) / "hosts-sandbox", hosts, mode=mode, secure=secure, resume=resume,
                          bookie_groups=bookie_groups) as cluster:
        h = cluster.hosts
        if sandbox_dir is not None:
            _record(sandbox_dir, cluster, hosts, secure)
        if h.mode == NETNS:
            print(f"sandbox up on {hosts} hosts (network namespaces on bridge {h.bridge}, "
                  f"gateway {h.gateway})", flush=True)
        else:
            print(f"sandbox up on {hosts} loopback hosts: no network namespaces here ({h.reason}); "
                  "partitions cannot be made", flush=True)
        for host in h:
            where = f"ip netns exec {host.netns} COMMAND" if host.netns else "(runs on this machine)"
            ids = ", ".join(b.bookie_id + (f" (group {b.settings['bookie_group']})" if b.settings.get("bookie_group")
                                           else "") for b in cluster.bookies_on(host))
            print(f"host {host.name} {host.address}: bookie {ids}; {where}", flush=True)
        if cluster.secure_files is not None:
            cluster.secure_files.announce()
        print(f"export SPARK_BOOKIE_ZK={cluster.connect_string}", flush=True)
        wait()   # says "press Ctrl-C to stop" once Ctrl-C is handled
    return 0


def _record(sandbox_dir: SandboxDir, cluster: MultiHostCluster, hosts: int, secure: bool) -> None:
    from spark_bookie.local.sandbox_dir import HOSTS, SandboxRecord

    pids = [b.proc.pid for b in cluster.bookies if b.proc is not None]
    if cluster.zk is not None and cluster.zk.pid is not None:
        pids.append(cluster.zk.pid)
    sandbox_dir.save(SandboxRecord(HOSTS, secure, len(cluster.bookies), hosts=hosts, zk_port=cluster.zk_port,
                                   bookie_ports=[b.port for b in cluster.bookies],
                                   addresses=[h.address for h in cluster.hosts], pids=pids))
