"""compact_to_delta's progress: a tqdm bar on a terminal, one plain line per step elsewhere."""

from __future__ import annotations

import io

import pytest

from jobs.progress import TIERING_STEPS, StepProgress

pytestmark = pytest.mark.unit


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_pipe_gets_one_line_per_step_and_repeats_count_once():
    out = io.StringIO()
    p = StepProgress("tiering", TIERING_STEPS, out)
    for name in ("written", "committed", "marked", "deleted", "deleted"):   # deleted: once per stream
        p.step(name)
    p.close()
    lines = out.getvalue().splitlines()
    assert [line.split(" (")[0] for line in lines] == [f"tiering: {s}" for s in TIERING_STEPS]
    assert lines[-1].startswith("tiering: deleted (4/4 steps") and "\r" not in out.getvalue()


def test_a_terminal_gets_a_bar():
    out = _Tty()
    p = StepProgress("compaction", ("scanned", "written", "committed"), out)
    for name in ("scanned", "written", "committed"):
        p.step(name)
    p.close()
    text = out.getvalue()
    assert "compaction" in text and "3/3" in text and "\r" in text and "compaction: scanned (" not in text
