"""The one way the local hosts run `ip`, `nft` and `tc`: a command that fails raises HostsError
with its output. Its own module so that hosts.py (making hosts) and netfaults.py (cutting links
between them) both use it without importing each other."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence


class HostsError(RuntimeError):
    """The hosts could not be made or a command in one failed (the message shows its output)."""


def run_cmd(cmd: Sequence[str], *, stdin: str | None = None, check: bool = True,
            timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), input=stdin, capture_output=True, text=True, timeout=timeout_s)
    if check and proc.returncode != 0:
        raise HostsError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc
