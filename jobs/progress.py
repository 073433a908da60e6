"""Progress of compaction and tiering (``jobs/compact_to_delta.py``; DESIGN §4.7): a tqdm bar on a
terminal, one plain line per step elsewhere (logs, CI, a pipe), never both.

The job libraries (jobs/delta_compaction.py, jobs/stream_tiering.py) report named steps through a
hook and print nothing themselves; only the entry point makes a display. Jobs run without the
command-line tools installed, so the reporter lives here, and the benches (spark_bookie/bench)
use it too: they may import jobs, jobs never import them.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

COMPACTION_STEPS = ("scanned", "written", "committed", "deleted")
TIERING_STEPS = ("written", "committed", "marked", "deleted")


class StepProgress:
    """Counts the steps of one run; ``step(name)`` is the hook the job calls after each."""

    def __init__(self, what: str, steps: tuple[str, ...], out: IO[str] | None = None) -> None:
        self.what, self.steps = what, steps
        self.out = out if out is not None else sys.stderr
        self.t0 = time.monotonic()
        self.done: list[str] = []
        self._bar: Any = None
        if self.out.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=len(steps), desc=what, unit="step", file=self.out, leave=True)

    def step(self, name: str) -> None:
        if name in self.done:   # a step may be reported once per stream: count it once
            return
        self.done.append(name)
        if self._bar is not None:
            self._bar.set_postfix_str(name)
            self._bar.update(1)
        else:
            print(f"{self.what}: {name} ({len(self.done)}/{len(self.steps)} steps, "
                  f"{time.monotonic() - self.t0:.1f} s)", file=self.out, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
