"""`shell recover` / `decommission` progress: a tqdm bar on a terminal, plain lines elsewhere."""

from __future__ import annotations

import io
import sys

import pytest

from recovery import DrainProgress
from spark_bookie.cli.autorecovery import _ProgressDisplay

pytestmark = pytest.mark.unit


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _steps() -> list[DrainProgress]:
    return [DrainProgress("b:1", 3, 3, 3, 0.0), DrainProgress("b:1", 4, 2, 2, 1.0),  # one more appeared
            DrainProgress("b:1", 4, 0, 0, 2.0, done=True)]


def test_terminal_gets_a_bar(monkeypatch):
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    d = _ProgressDisplay("decommission", quiet=False)
    for p in _steps():
        d(p)
    d.finish()
    out = err.getvalue()
    assert "decommission b:1" in out and "4/4" in out and "ledger" in out and "\r" in out


def test_pipe_gets_lines(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    d = _ProgressDisplay("recover", quiet=False)
    for p in _steps():
        d(p)
    d.finish()
    lines = err.getvalue().splitlines()
    assert lines[0] == "recover b:1: 0/3 ledgers moved, 3 still on it (3 queued), 0s"
    assert lines[-1] == "recover b:1: 4/4 ledgers moved, 0 still on it (0 queued), 2s"
    assert "\r" not in err.getvalue()


def test_json_mode_is_quiet(monkeypatch):
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    d = _ProgressDisplay("recover", quiet=True)
    for p in _steps():
        d(p)
    d.finish()
    assert err.getvalue() == ""
