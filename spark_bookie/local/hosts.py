"""Many hosts on one machine: Linux network namespaces on a bridge, or loopback addresses.

Every other test runs every process on 127.0.0.1, where nothing can be partitioned and a bookie
id's host part says nothing about where a copy lives. This harness makes N hosts, each a network
namespace with one address on a private bridge in the root namespace, runs processes inside them
(``ip netns exec``), kills a host whole (SIGKILL to every process in its namespace) and lets its
processes start again on the same disks. Faults between hosts are nftables rules inside the
namespaces (spark_bookie.local.netfaults), so the root namespace and the machine's own network are
never touched.

Addresses come from 198.18.0.0/24 (RFC 2544's benchmark range, never routed): the /24 is cut into
eight slots of 32 addresses so eight harnesses can run at once; slot s has the bridge at
198.18.0.(32s+1) and host k at 198.18.0.(32s+1+k). Every namespace, veth and bridge is named
``sbh<slot>...``; a slot is owned through an flock, and a harness that takes a free slot first
deletes whatever a crashed predecessor left under that slot's names.

Without root (or without ``ip``), hosts fall back to loopback addresses 127.0.0.(k+1): processes
still bind and advertise distinct addresses (placement by host can be checked), a host can still be
killed whole (its processes' groups), but no fault can be injected; ``Hosts.reason`` says why.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from spark_bookie.local.netcmd import HostsError
from spark_bookie.local.netcmd import run_cmd as _run
from spark_bookie.local.netfaults import Faults, FaultUnsupportedError

log = logging.getLogger(__name__)

PREFIX = "sbh"
SUBNET = "198.18.0"
SLOT_SIZE = 32
SLOTS = 8
HOSTS_MAX = SLOT_SIZE - 3  # network, bridge and broadcast addresses take three
NETNS = "netns"
LOOPBACK = "loopback"


class Service(Protocol):
    """Something a host runs that can start again after the host was killed (a bookie, ...)."""

    def start(self) -> None: ...


def namespaces_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None if they can (root and ``ip``)."""
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_NET_ADMIN"
    if shutil.which("ip") is None:
        return "no `ip` command (Debian: iproute2)"
    return None


def slot_addresses(slot: int) -> tuple[str, int]:
    """(the bridge's address, the first host's last octet) of ``slot``."""
    base = slot * SLOT_SIZE
    return f"{SUBNET}.{base + 1}", base + 2


def _lock_dir() -> Path:
    path = Path("/run/sbh") if os.geteuid() == 0 and Path("/run").is_dir() else Path(tempfile.gettempdir()) / "sbh"
    path.mkdir(parents=True, exist_ok=True)
    return path


def clean_slot(slot: int) -> None:
    """Delete every namespace and link named for ``slot`` (a crashed harness's leftovers).

    Deleting a namespace deletes the veth end inside it, and with it its peer on the bridge."""
    ns_prefix = f"{PREFIX}{slot}-"
    listing = _run(["ip", "netns", "list"], check=False).stdout.split()
    for name in listing:
        if name.startswith(ns_prefix):
            _kill_netns_processes(name)
            _run(["ip", "netns", "delete", name], check=False)
    links = _run(["ip", "-o", "link", "show"], check=False).stdout.splitlines()
    for line in links:
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(f"{PREFIX}{slot}") and name[len(PREFIX) + len(str(slot)):][:1] in ("b", "v"):
                _run(["ip", "link", "delete", name], check=False)
    _clean_etc(slot)


ETC_NETNS = Path("/etc/netns")


def _clean_etc(slot: int) -> None:
    """Per-host files (``/etc/netns/<netns>/hosts``, which ``ip netns exec`` mounts over /etc/hosts)."""
    if ETC_NETNS.is_dir():
        for d in ETC_NETNS.glob(f"{PREFIX}{slot}-*"):
            shutil.rmtree(d, ignore_errors=True)


def netns_pids(netns: str) -> list[int]:
    out = _run(["ip", "netns", "pids", netns], check=False).stdout.split()
    return [int(p) for p in out if p.isdigit()]


def _kill_netns_processes(netns: str, timeout_s: float = 20.0) -> None:
    """SIGKILL every process in ``netns`` until none is left (a fork between the listing and the
    kill is caught by the next round)."""
    deadline = time.monotonic() + timeout_s
    while pids := netns_pids(netns):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise HostsError(f"processes {pids} in {netns} survived SIGKILL for {timeout_s:g} s")
        time.sleep(0.05)


@dataclass
class Host:
    """One host: a name, an address, its disks under ``root``, its namespace (None on loopback)."""

    index: int
    address: str
    root: Path
    netns: str | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    services: list[Service] = field(default_factory=list, repr=False)

    @property
    def name(self) -> str:
        return f"h{self.index}"

    def wrap(self, cmd: Sequence[str]) -> list[str]:
        """``cmd`` as run inside this host (``ip netns exec`` execs it: the pid stays the command's)."""
        return ["ip", "netns", "exec", self.netns, *cmd] if self.netns else list(cmd)

    def popen(self, cmd: Sequence[str], *, log_path: Path | None = None, env: dict[str, str] | None = None,
              stdout: int | IO[bytes] | None = None, volume: tuple[Path, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen[bytes]:
        """Start ``cmd`` inside this host in a session of its own; output to ``log_path`` (appended)
        or ``stdout``; ``volume`` = (disk, mount point) as ``with_volume``. The host remembers it, so
        killing the host kills it too on loopback hosts."""
        out: int | IO[bytes] | None = stdout
        logf = None
        if log_path is not None:
            logf = open(log_path, "ab")  # noqa: SIM115 (the child holds it; closed right after fork)
            out = logf
        try:
            command = self.with_volume(cmd, *volume) if volume else self.wrap(cmd)
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT if out is not None else None,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True, cwd=cwd)
        finally:
            if logf is not None:
                logf.close()
        self.procs = [p for p in self.procs if p.poll() is None] + [proc]
        return proc

    def name_hosts(self, names: dict[str, str]) -> None:
        """Make ``names`` (host name -> address) resolve inside this host, beside the machine's own
        /etc/hosts (what a cluster's DNS would do, e.g. Mesos-DNS names); namespaces only."""
        if self.netns is None:
            raise HostsError(f"{self.name} is a loopback host: it shares this machine's /etc/hosts")
        etc = ETC_NETNS / self.netns
        etc.mkdir(parents=True, exist_ok=True)
        base = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
        (etc / "hosts").write_text(base + "".join(f"{a} {n}\n" for n, a in names.items()))

    def with_volume(self, cmd: Sequence[str], disk: Path, mount_point: str) -> list[str]:
        """``cmd`` seeing this host's ``disk`` at ``mount_point`` (a mount namespace of its own, as a
        container's volume): every host can use one path, each with its own disk. ``mount_point``
        must exist; namespaces only (needs root)."""
        if self.netns is None:
            raise HostsError(f"{self.name} is a loopback host: no volumes without namespaces")
        disk.mkdir(parents=True, exist_ok=True)
        script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
        return ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--propagation", "private",
                "sh", "-c", script, "sh", str(disk), mount_point, *cmd]

    def run(self, cmd: Sequence[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` inside this host and return its result (no check of the exit code)."""
        return _run(self.wrap(cmd), check=False, timeout_s=timeout_s)

    def pids(self) -> list[int]:
        """Every live process of this host: its namespace's, or on loopback those started here."""
        if self.netns:
            return netns_pids(self.netns)
        return [p.pid for p in self.procs if p.poll() is None]


class Hosts:
    """N hosts on this machine (see the module's docstring); a context manager that always cleans up.

    ``mode`` is "auto" (namespaces where possible, else loopback, said in ``reason`` and the log),
    "netns" (namespaces or HostsError) or "loopback".
    """

    def __init__(self, root: str | Path, count: int, *, mode: str = "auto") -> None:
        if not 1 <= count <= HOSTS_MAX:
            raise ValueError(f"hosts must be 1..{HOSTS_MAX}, not {count}")
        if mode not in ("auto", NETNS, LOOPBACK):
            raise ValueError(f"mode must be auto, netns or loopback, not {mode!r}")
        self.root = Path(root).absolute()
        self.count = count
        self.requested_mode = mode
        self.mode = LOOPBACK
        self.reason = ""
        self.slot: int | None = None
        self._slot_lock: IO[str] | None = None
        self.hosts: list[Host] = []
        self._faults: Faults | None = None  # once started in netns mode

    # -- names ------------------------------------------------------------------------------
    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.slot}br"

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge: where hosts reach ZooKeeper and test clients."""
        if self.mode == NETNS and self.slot is not None:
            return slot_addresses(self.slot)[0]
        return "127.0.0.1"

    @property
    def faults(self) -> Faults:
        """Partitions, loss, delay (spark_bookie.local.netfaults); FaultUnsupportedError on loopback."""
        if self._faults is None:
            raise FaultUnsupportedError(f"no faults on loopback hosts: {self.reason or 'not started'}")
        return self._faults

    def __getitem__(self, key: int | str) -> Host:
        """A host by 1-based index or by name (``hosts[1]``, ``hosts["h1"]``)."""
        index = int(key[1:]) if isinstance(key, str) else key
        if not 1 <= index <= len(self.hosts):
            raise KeyError(key)
        return self.hosts[index - 1]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def host_of(self, address: str) -> Host | None:
        """The host owning ``address`` (a bookie id's host part), or None (e.g. the gateway)."""
        return next((h for h in self.hosts if h.address == address), None)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> Hosts:
        self.root.mkdir(parents=True, exist_ok=True)
        why = namespaces_unavailable() if self.requested_mode != LOOPBACK else "loopback requested"
        if why and self.requested_mode == NETNS:
            raise HostsError(f"cannot make network namespaces: {why}")
        if why is None:
            self._take_slot()
            self.mode = NETNS
            try:
                self._make_network()
            except HostsError as e:  # root without the capability (a container): fall back, or fail
                self.close()
                if self.requested_mode == NETNS:
                    raise
                why, self.mode = f"making the namespaces failed: {e}", LOOPBACK
            except BaseException:
                self.close()
                raise
        if why is not None:
            self.reason = why
            log.warning("hosts fall back to loopback addresses 127.0.0.2.. (no partitions, no netem): %s", why)
            self.hosts = [Host(k, f"127.0.0.{k + 1}", self._disk(k)) for k in range(1, self.count + 1)]
        return self

    def _disk(self, k: int) -> Path:
        path = self.root / f"h{k}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _take_slot(self) -> None:
        """Own the first free slot (flock); clean every free slot's leftovers on the way."""
        for slot in range(SLOTS):
            f = open(_lock_dir() / f"slot-{slot}.lock", "w")  # noqa: SIM115 (held while we own it)
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            clean_slot(slot)
            self.slot, self._slot_lock = slot, f
            return
        raise HostsError(f"all {SLOTS} host slots are in use by other harnesses")

    def _make_network(self) -> None:
        assert self.slot is not None
        gateway, first = slot_addresses(self.slot)
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{gateway}/27", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for k in range(1, self.count + 1):
            netns, outer, inner = f"{PREFIX}{self.slot}-h{k}", f"{PREFIX}{self.slot}v{k}", f"{PREFIX}{self.slot}p{k}"
            address = f"{SUBNET}.{first + k - 1}"
            _run(["ip", "netns", "add", netns])
            _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
            _run(["ip", "link", "set", inner, "netns", netns])
            _run(["ip", "link", "set", outer, "master", self.bridge])
            _run(["ip", "link", "set", outer, "up"])
            _run(["ip", "-n", netns, "addr", "add", f"{address}/27", "dev", inner])
            _run(["ip", "-n", netns, "link", "set", inner, "up"])
            _run(["ip", "-n", netns, "link", "set", "lo", "up"])
            self.hosts.append(Host(k, address, self._disk(k), netns))
        self._faults = Faults(self)

    def kill(self, host: Host) -> None:
        """Kill ``host`` whole: SIGKILL every process in it, and wait until none is left."""
        if host.netns:
            _kill_netns_processes(host.netns)
        else:
            for p in host.procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
        for p in host.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)

    def restart(self, host: Host) -> None:
        """Start again every service registered on ``host``, on its disks (after ``kill``)."""
        for service in host.services:
            service.start()

    def close(self) -> None:
        """Kill every host, heal every fault, delete namespaces, veths and the bridge; release the slot."""
        for host in self.hosts:
            with contextlib.suppress(Exception):
                self.kill(host)
        if self.slot is not None:
            clean_slot(self.slot)
            self.slot = None
        if self._slot_lock is not None:
            self._slot_lock.close()
            self._slot_lock = None
        self.hosts = []
        self._faults = None

    def __enter__(self) -> Hosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def hosts_by_name(hosts: Hosts, names: Iterable[str | Host]) -> list[Host]:
    return [n if isinstance(n, Host) else hosts[n] for n in names]
