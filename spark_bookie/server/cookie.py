"""Bookie identity: the cookie kept in every directory and in ZooKeeper.

As in BookKeeper (Cookie.java, Bookie.checkEnvironment), the cookie ties together the bookie id,
its journal and ledger directories and the cluster's instance id. A bookie refuses to start when
any of them disagree: that is how an emptied disk, swapped directories, a changed port or a disk
from another cluster are caught before they can serve wrong answers (DESIGN §5, invariant 7).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from spark_bookie.errors import CookieError
from spark_bookie.storage.files import fsync_dir

LAYOUT_VERSION = 5
COOKIE_FILE = "VERSION"


class CookieStore(Protocol):
    def read_cookie(self, bookie_id: str) -> tuple[bytes, int] | None: ...
    def write_cookie(self, bookie_id: str, data: bytes, version: int | None) -> int: ...


@dataclass(frozen=True)
class Cookie:
    bookie_id: str
    journal_dirs: tuple[str, ...]
    ledger_dirs: tuple[str, ...]
    instance_id: str
    layout_version: int = LAYOUT_VERSION

    def encode(self) -> bytes:
        lines = [
            str(self.layout_version),
            f'bookieHost: "{self.bookie_id}"',
            f'journalDir: "{",".join(self.journal_dirs)}"',
            f'ledgerDirs: "{",".join(self.ledger_dirs)}"',
            f'instanceId: "{self.instance_id}"',
        ]
        return ("\n".join(lines) + "\n").encode()

    @classmethod
    def decode(cls, data: bytes, where: str) -> Cookie:
        try:
            text = data.decode()
            first, *rest = text.strip().splitlines()
            fields = {}
            for line in rest:
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip().strip('"')
            return cls(bookie_id=fields["bookieHost"],
                       journal_dirs=tuple(p for p in fields["journalDir"].split(",") if p),
                       ledger_dirs=tuple(p for p in fields["ledgerDirs"].split(",") if p),
                       instance_id=fields.get("instanceId", ""), layout_version=int(first))
        except (UnicodeDecodeError, ValueError, KeyError) as e:
            raise CookieError(f"cookie in {where} is unreadable ({e}); refusing to start") from e

    def differences(self, other: Cookie) -> list[str]:
        """Plain-language reasons why `other` (found on disk or in ZooKeeper) is not this bookie's."""
        out = []
        if other.bookie_id != self.bookie_id:
            out.append(f"it belongs to bookie {other.bookie_id}, this bookie is {self.bookie_id} "
                       "(was the host or port changed?)")
        if other.journal_dirs != self.journal_dirs or other.ledger_dirs != self.ledger_dirs:
            out.append(f"it lists journal dirs {list(other.journal_dirs)} and ledger dirs "
                       f"{list(other.ledger_dirs)}, this bookie was given {list(self.journal_dirs)} and "
                       f"{list(self.ledger_dirs)} (were directories swapped or replaced?)")
        if other.instance_id != self.instance_id:
            out.append(f"it is from cluster instance {other.instance_id!r}, this cluster is "
                       f"{self.instance_id!r} (a disk from another cluster?)")
        return out


def _cookie_path(d: str) -> Path:
    return Path(d) / "current" / COOKIE_FILE


def _read_local(d: str) -> Cookie | None:
    p = _cookie_path(d)
    if not p.exists():
        return None
    return Cookie.decode(p.read_bytes(), str(p))


def _has_data(d: str) -> bool:
    cur = Path(d) / "current"
    return cur.exists() and any(cur.iterdir())


def _write_local(d: str, cookie: Cookie) -> None:
    p = _cookie_path(d)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(cookie.encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    fsync_dir(p.parent)


def normalize_dirs(dirs: Sequence[str]) -> tuple[str, ...]:
    return tuple(os.path.realpath(d) for d in dirs)


def verify_or_create(store: CookieStore, expected: Cookie) -> bool:
    """Check every directory's cookie and ZooKeeper's against `expected`; create them for a new bookie.

    Returns True when the bookie is new (cookies were written). Raises CookieError with a message
    that names the directory and the reason otherwise.
    """
    dirs = list(dict.fromkeys(expected.journal_dirs + expected.ledger_dirs))
    local = {d: _read_local(d) for d in dirs}
    zk = store.read_cookie(expected.bookie_id)
    zk_cookie = Cookie.decode(zk[0], f"ZooKeeper cookies/{expected.bookie_id}") if zk else None
    present = [d for d, c in local.items() if c is not None]
    if not present:
        if zk_cookie is not None:
            raise CookieError(
                f"ZooKeeper has a cookie for bookie {expected.bookie_id} but none of its directories "
                f"{dirs} has one: they are new or were emptied, so this bookie's data is gone or the "
                "wrong directories were given. Start it on its original directories, or decommission "
                "it (which deletes the ZooKeeper cookie) before reusing the id.")
        stray = [d for d in dirs if _has_data(d)]
        if stray:
            raise CookieError(f"directories {stray} hold data but no cookie: refusing to adopt them")
        for d in dirs:
            _write_local(d, expected)
        store.write_cookie(expected.bookie_id, expected.encode(), None)
        return True
    missing = [d for d, c in local.items() if c is None]
    if missing:
        raise CookieError(f"directories {missing} have no cookie while {present} do: they are new or "
                          "were emptied (a replaced disk?). Refusing to start.")
    for d, c in local.items():
        why = expected.differences(c) if c is not None else []
        if why:
            raise CookieError(f"cookie in {d} does not match: " + "; ".join(why))
    if zk_cookie is None:
        raise CookieError(f"directories carry a cookie for {expected.bookie_id} but ZooKeeper has none "
                          "(ZooKeeper was reset, or the bookie was decommissioned). Refusing to start.")
    why = expected.differences(zk_cookie)
    if why:
        raise CookieError("ZooKeeper's cookie does not match: " + "; ".join(why))
    return False
