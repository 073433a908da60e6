"""The README's main job, as a user runs it: sandbox + demo end to end, exit 0, 'demo OK'."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_sandbox_demo_survives_a_bookie_kill(tmp_path):
    r = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "sandbox", "--bookies", "4", "--root",
                        str(tmp_path), "--demo"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "killed bookie" in out and "old writer is fenced" in out and "every byte matches" in out
    assert out.rstrip().endswith("demo OK")
    # Two fragments: the ensemble change after the kill.
    frags = [line for line in out.splitlines() if line.startswith("  ") and ": [" in line]
    assert len(frags) >= 2
    # The stream part: a second writer takes over from a dead one; the tailing reader misses nothing.
    assert "a second writer took the stream over" in out and "got all 3000 records once, in order" in out
    segments = [line for line in out.splitlines() if line.startswith("  segment ")]
    assert len(segments) >= 3 and all("sealed" in line for line in segments)
