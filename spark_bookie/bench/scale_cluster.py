"""The cluster `spark-bookie bench scale` measures (spark_bookie/bench/scale.py): every bookie a
process on this machine (spark_bookie.local.sandbox.Sandbox), or with ``--hosts`` one bookie per
host of spark_bookie.local.multihost (network namespaces as root, else loopback addresses), what
the benchmark needs of either behind one interface."""

from __future__ import annotations

from pathlib import Path
from typing import Any

BOOKIE_WAIT_S = 180.0


class ScaleCluster:
    """Start, grow and read a Sandbox or (``hosts`` > 0) a MultiHostCluster of ``hosts`` hosts
    with ``bookies`` bookies on the first ones; more bookies go to hosts without one, then (more
    bookies than hosts) to the host with the fewest. Every bookie serves the admin API."""

    def __init__(self, root: Path, bookies: int, settings: dict[str, Any], hosts: int = 0) -> None:
        self.hosts = hosts
        self.cluster: Any
        if hosts:
            from spark_bookie.local.multihost import MultiHostCluster

            self.cluster = MultiHostCluster(root, hosts, bookie_hosts=0, bookie_settings=settings)
            self._first = bookies
        else:
            from spark_bookie.local.sandbox import Sandbox

            self.cluster = Sandbox(root, bookies, bookie_settings=settings, http=True)
            self._first = 0

    def __enter__(self) -> ScaleCluster:
        self.cluster.start()
        try:
            if self._first:
                self.add_bookies(self._first)
        except BaseException:
            self.cluster.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.stop()

    # -- what the benchmark reads ---------------------------------------------------------------
    @property
    def connect_string(self) -> str:
        return str(self.cluster.connect_string)

    @property
    def store(self) -> Any:
        if self.cluster.store is None:
            raise RuntimeError("the cluster did not start")
        return self.cluster.store

    @property
    def bookies(self) -> list[Any]:
        return list(self.cluster.bookies)

    @property
    def alive(self) -> list[Any]:
        return [b for b in self.cluster.bookies if b.alive]

    @property
    def zk_pid(self) -> int | None:
        zk = self.cluster.zk
        return zk.pid if zk is not None else None

    def four_letter(self, command: str) -> str:
        """A ZooKeeper four-letter word, on ZooKeeper's own address (the gateway's with hosts)."""
        from spark_bookie.local.zookeeper import four_letter_word

        zk = self.cluster.zk
        assert zk is not None, "not started"
        return four_letter_word(zk.port, command, timeout_s=30.0, host=zk.host)

    def http_url(self, bookie: Any) -> str:
        """The bookie's admin API: it listens on its own address (its host's with hosts)."""
        port = bookie.settings.get("http_port")
        if not port:
            raise RuntimeError(f"bookie {bookie.bookie_id} serves no admin API")
        host = bookie.host.address if getattr(bookie, "host", None) is not None else "127.0.0.1"
        return f"http://{host}:{port}"

    def pids(self, bookies: list[Any]) -> list[int]:
        return [b.proc.pid for b in bookies if b.proc is not None]

    def where(self) -> dict[str, Any]:
        """Where the bookies ran: {"mode": "processes" | "netns" | "loopback", "hosts", "bookies", ...}."""
        if not self.hosts:
            return {"mode": "processes", "hosts": 1, "bookies": len(self.cluster.bookies)}
        h = self.cluster.hosts
        used = {b.host.index for b in self.cluster.bookies}
        return {"mode": h.mode, "hosts": len(h), "hosts_with_bookies": len(used), "bookies": len(self.cluster.bookies),
                "gateway": h.gateway, "reason": h.reason}

    # -- growing --------------------------------------------------------------------------------
    def add_bookies(self, count: int) -> list[Any]:
        """``count`` more bookie processes, started together, each waited for until registered."""
        added = [self._add_one() for _ in range(count)]
        for b in added:
            b.wait_registered(self.store, timeout_s=BOOKIE_WAIT_S)
        return added

    def _add_one(self) -> Any:
        from spark_bookie.local.zookeeper import free_port

        c = self.cluster
        if not self.hosts:
            return c.add_bookie(wait=False)
        host = min(c.hosts, key=lambda h: (len(c.bookies_on(h)), h.index))
        settings = {"http_port": free_port()}
        if not c.bookies_on(host):
            return c.add_bookie(host, wait=False, **settings)
        # a second bookie on a host: its own port (in namespaces every host's first one has 3181)
        from spark_bookie.local.multihost import HostBookie

        port = free_port()
        b = HostBookie(c.connect_string, port, host.root / f"bookie-{port}", {**c.settings, **settings}, host=host)
        c.bookies.append(b)
        host.services.append(b)
        b.start()
        return b
