"""notebooks/explore.ipynb and streams.ipynb run top to bottom in a kernel of this venv and draw their plots.

The notebook starts its own sandbox (embedded ZooKeeper + 3 bookie processes) and a local[2] Spark
session, so this is a Spark test. The kernel is this interpreter (a kernel spec written to a temp
JUPYTER_PATH), never whatever ``python3`` kernel the machine happens to have.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.spark

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "explore.ipynb"
KERNEL = "spark-bookie-venv"


def install_kernel_spec(root: Path) -> None:
    spec_dir = root / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "spark-bookie venv", "language": "python"}))


def processes_under(root: Path) -> list[int]:
    """PIDs whose command line names a path under `root`: the notebook's ZooKeeper and bookies."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(root) in cmd:
                pids.append(int(entry.name))
    return pids


def kill_leftovers(root: Path) -> list[int]:
    pids = processes_under(root)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while processes_under(root) and time.monotonic() < deadline:
            time.sleep(0.2)
    return pids


def cell_seconds(cell) -> float:
    t = cell.get("metadata", {}).get("execution", {})
    start, end = t.get("iopub.execute_input"), t.get("shell.execute_reply")
    if not (start and end):
        return 0.0
    parse = lambda s: dt.datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def execute(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list, str]:
    """Run the notebook top to bottom in this venv's kernel: (its outputs, its printed text)."""
    jupyter = tmp_path / "jupyter"
    install_kernel_spec(jupyter)
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter))
    monkeypatch.delenv("SPARK_BOOKIE_ZK", raising=False)     # the notebook starts its own sandbox
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("TMPDIR", str(tmp_path))              # its work dir lands here (cleaned by pytest)

    nb = nbformat.read(path, as_version=4)
    try:
        NotebookClient(nb, kernel_name=KERNEL, timeout=600, allow_errors=False,
                       resources={"metadata": {"path": str(path.parent)}}).execute()   # cwd as in Jupyter
    finally:
        print("cell seconds:", [round(cell_seconds(c), 1) for c in nb.cells if c.cell_type == "code"])
        leftovers = kill_leftovers(tmp_path)   # a failing cell must not leave bookies behind
    assert not leftovers, f"the notebook's last cell left processes running: {leftovers}"

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    return outputs, "".join(o.get("text", "") for o in outputs if o.output_type == "stream")


def images_in(outputs: list) -> list:
    return [o for o in outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]


@pytest.mark.timeout(900)
def test_notebook_executes_and_draws_its_plots(tmp_path, monkeypatch):
    outputs, text = execute(NOTEBOOK, tmp_path, monkeypatch)
    assert len(images_in(outputs)) == 2, "the latency histogram and the entries-per-ledger chart"
    assert "second run:" in text and "'compacted': []" in text      # compaction is idempotent
    assert text.rstrip().endswith("stopped")


@pytest.mark.timeout(900)
def test_streams_notebook_writes_tails_uses_spark_and_tiers(tmp_path, monkeypatch):
    outputs, text = execute(NOTEBOOK.parent / "streams.ipynb", tmp_path, monkeypatch)
    assert len(images_in(outputs)) == 1, "records per segment and end-to-end latency, one figure"
    assert "2000 records in" in text and "the tailing reader saw 2000 records" in text
    assert "notebook/shouted: 2000 records written by Spark" in text
    assert "same records, DLSNs and txids: True (2000 records)" in text and "'tiered':" in text
    assert "Spark after tiering: 2000 records" in text
    assert text.rstrip().endswith("stopped")
