"""Network faults between the hosts of spark_bookie.local.hosts: partitions, loss, delay, bandwidth.

Every fault is a rule inside the namespaces of the hosts it concerns (one nftables table
``inet sbh`` per namespace, rewritten whole and atomically by one ``nft -f`` transaction at each
change), or a qdisc on a host's own veth end; nothing is ever set in the root namespace, so the
machine's network and other harnesses are untouched, and deleting a namespace removes its faults.

Why rules on both ends: a symmetric partition drops A->B in A's output and in B's input (and the
reverse), so a partition still holds if one side's table is rewritten by a later fault. A one-way
partition drops only A->B: B's packets reach A, but A's answers (TCP's ACKs too) never reach B,
which is what a half-broken link does to a TCP connection: it stalls until a timeout notices.

``tc netem`` (delay, jitter) needs a kernel with CONFIG_NET_SCH_NETEM; where it is missing
(measured 2026-11-25: this CI kernel has tbf but no netem) ``delay`` raises FaultUnsupportedError
and tests skip; loss is done with nftables' ``numgen`` instead of netem, so it works everywhere.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from typing import TYPE_CHECKING

from spark_bookie.local.netcmd import HostsError
from spark_bookie.local.netcmd import run_cmd as _run

if TYPE_CHECKING:
    from spark_bookie.local.hosts import Host, Hosts

TABLE = "sbh"
CHAINS = ("input", "output")


class FaultUnsupportedError(HostsError):
    """This fault cannot be made here (loopback hosts, no nft, no netem in the kernel)."""


class Faults:
    """The faults of one ``Hosts``; ``heal()`` removes them all."""

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts
        self._rules: dict[str, list[tuple[str, str]]] = {}  # netns -> [(chain, rule)]
        self._qdiscs: set[str] = set()  # netns with a root qdisc of ours

    # -- partitions -----------------------------------------------------------------------
    def partition(self, a: Iterable[Host], b: Iterable[Host], *, one_way: bool = False) -> None:
        """Drop every packet from a host of ``a`` to a host of ``b`` (and back unless ``one_way``)."""
        side_a, side_b = list(a), list(b)
        if set(h.index for h in side_a) & set(h.index for h in side_b):
            raise ValueError("a host cannot be partitioned from itself")
        self._drop_between(side_a, side_b)
        if not one_way:
            self._drop_between(side_b, side_a)
        self._apply(side_a + side_b)

    def _drop_between(self, src: list[Host], dst: list[Host]) -> None:
        src_set = "{ " + ", ".join(h.address for h in src) + " }"
        dst_set = "{ " + ", ".join(h.address for h in dst) + " }"
        for h in src:
            self._add(h, "output", f"ip daddr {dst_set} drop")
        for h in dst:
            self._add(h, "input", f"ip saddr {src_set} drop")

    def isolate_from(self, hosts: Iterable[Host], address: str, port: int | None = None, *,
                     one_way: bool = False) -> None:
        """Cut ``hosts`` from a service in the root namespace (ZooKeeper: the gateway and its port).

        The port matters: test clients in the root namespace reach the hosts from the same gateway
        address, and a host cut from ZooKeeper must still serve them. ``one_way``: only the hosts'
        packets to the service are dropped."""
        hosts = list(hosts)
        to = f"ip daddr {address}" + (f" tcp dport {port}" if port else "")
        back = f"ip saddr {address}" + (f" tcp sport {port}" if port else "")
        for h in hosts:
            self._add(h, "output", f"{to} drop")
            if not one_way:
                self._add(h, "input", f"{back} drop")
        self._apply(hosts)

    # -- degraded links -------------------------------------------------------------------
    def loss(self, hosts: Iterable[Host], percent: float) -> None:
        """Drop each packet a host sends or receives with probability ``percent``/100."""
        if not 0 <= percent <= 100:
            raise ValueError(f"loss percent must be in 0..100, not {percent}")
        per_mille = round(percent * 10)
        rule = "drop" if per_mille >= 1000 else f"numgen random mod 1000 < {per_mille} drop"
        hosts = list(hosts)
        for h in hosts:
            for chain in CHAINS:
                if per_mille > 0:
                    self._add(h, chain, rule)
        self._apply(hosts)

    def delay(self, hosts: Iterable[Host], delay_ms: float, jitter_ms: float = 0.0) -> None:
        """Delay every packet a host sends by ``delay_ms`` (± ``jitter_ms``) with ``tc netem``."""
        args = ["delay", f"{delay_ms}ms"] + ([f"{jitter_ms}ms"] if jitter_ms else [])
        self._qdisc(list(hosts), ["netem", *args], "netem (CONFIG_NET_SCH_NETEM)")

    def bandwidth(self, hosts: Iterable[Host], kbit: int) -> None:
        """Limit what a host sends to ``kbit`` kbit/s (``tc tbf``; queueing adds delay under load)."""
        self._qdisc(list(hosts), ["tbf", "rate", f"{kbit}kbit", "burst", "32kbit", "latency", "400ms"], "tbf")

    def _qdisc(self, hosts: list[Host], spec: list[str], what: str) -> None:
        for h in hosts:
            netns = self._netns(h)
            dev = f"sbh{self.hosts.slot}p{h.index}"
            proc = _run(["tc", "-n", netns, "qdisc", "replace", "dev", dev, "root", *spec], check=False)
            if proc.returncode != 0:
                if "unknown" in proc.stderr.lower():
                    raise FaultUnsupportedError(f"this kernel has no {what}: {proc.stderr.strip()}")
                raise HostsError(f"tc on {h.name} failed: {proc.stderr.strip()}")
            self._qdiscs.add(netns)

    # -- healing --------------------------------------------------------------------------
    def heal(self, hosts: Iterable[Host] | None = None) -> None:
        """Remove every fault of ``hosts`` (all hosts by default): rules and qdiscs."""
        targets = list(self.hosts.hosts if hosts is None else hosts)
        for h in targets:
            netns = self._netns(h)
            self._rules.pop(netns, None)
            if netns in self._qdiscs:
                dev = f"sbh{self.hosts.slot}p{h.index}"
                _run(["tc", "-n", netns, "qdisc", "del", "dev", dev, "root"], check=False)
                self._qdiscs.discard(netns)
        self._apply(targets)

    def rules(self, host: Host) -> str:
        """The host's nftables ruleset as the kernel has it (for failure messages)."""
        return _run(["ip", "netns", "exec", self._netns(host), "nft", "list", "ruleset"], check=False).stdout

    # -- plumbing -------------------------------------------------------------------------
    def _netns(self, host: Host) -> str:
        if host.netns is None:
            raise FaultUnsupportedError(f"{host.name} is a loopback host: faults need network namespaces "
                                        f"({self.hosts.reason})")
        return host.netns

    def _add(self, host: Host, chain: str, rule: str) -> None:
        self._rules.setdefault(self._netns(host), []).append((chain, rule))

    def _apply(self, hosts: list[Host]) -> None:
        """Rewrite each host's table whole, in one transaction (declare, delete, recreate)."""
        if shutil.which("nft") is None:
            raise FaultUnsupportedError("no `nft` command: scripts/bootstrap installs Debian's nftables")
        for h in {h.index: h for h in hosts}.values():
            netns = self._netns(h)
            rules = self._rules.get(netns, [])
            chains = "".join(
                f"  chain {chain} {{\n    type filter hook {chain} priority 0; policy accept;\n"
                + "".join(f"    {r}\n" for c, r in rules if c == chain) + "  }\n"
                for chain in CHAINS)
            script = f"table inet {TABLE}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n{chains}}}\n"
            try:
                _run(["ip", "netns", "exec", netns, "nft", "-f", "-"], stdin=script)
            except subprocess.TimeoutExpired as e:
                raise HostsError(f"nft on {h.name} timed out") from e
