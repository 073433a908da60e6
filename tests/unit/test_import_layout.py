"""The tree keeps its layout rules (layout_check.py), and the check notices when it does not."""

from __future__ import annotations

from pathlib import Path

import pytest
from layout_check import check_layout, oversized_modules

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_the_tree_keeps_the_layout_rules():
    problems = check_layout(REPO)
    assert problems == [], "\n".join(problems)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


BASE = {
    "metadata/__init__.py": "",
    "metadata/model.py": "X = 1\n",
    "ledger_client/__init__.py": "",
    "ledger_client/protocol/__init__.py": "",
    "ledger_client/protocol/framing.py": "from metadata.model import X\n",
    "ledger_client/client.py": "from .protocol.framing import X\n",
    "spark_bookie/__init__.py": "",
    "spark_bookie/server/__init__.py": "",
    "spark_bookie/server/bookie.py": "from ledger_client.protocol import framing\n",
    "spark_bookie/cli/__init__.py": "",
    "spark_bookie/cli/main.py": "def main():\n    from spark_bookie.server.bookie import framing\n",
    "jobs/__init__.py": "",
}


def test_no_module_is_over_the_size_limit(tmp_path):
    assert oversized_modules(REPO) == [], "\n".join(oversized_modules(REPO))
    tree = _tree(tmp_path, {**BASE, "metadata/big.py": "x = 1\n" * 601, "metadata/big_pb2.py": "x = 1\n" * 900})
    assert oversized_modules(tree) == ["metadata/big.py: 601 lines (over 600: split it by role)"]


def test_a_clean_fake_tree_passes(tmp_path):
    assert check_layout(_tree(tmp_path, BASE)) == []


def test_planted_upward_import_fails(tmp_path):
    bookie = "from ledger_client.protocol import framing\n\ndef f():\n    import ledger_client.client\n"
    tree = _tree(tmp_path, {**BASE, "spark_bookie/server/bookie.py": bookie})
    problems = check_layout(tree)
    assert len(problems) == 1 and "spark_bookie.server.bookie (server) imports ledger_client.client (client)" \
        in problems[0] and "bookie.py:4" in problems[0]


def test_planted_import_of_the_cli_or_jobs_fails(tmp_path):
    tree = _tree(tmp_path, {**BASE, "ledger_client/client.py": "from spark_bookie.cli.main import main\n",
                            "spark_bookie/server/lac.py": "import jobs\n"})
    problems = check_layout(tree)
    assert any("ledger_client.client (client) imports spark_bookie.cli.main (cli)" in p for p in problems)
    assert any("spark_bookie.server.lac (server) imports jobs (jobs)" in p for p in problems)


def test_planted_circle_across_roles_fails_and_shows_the_chain(tmp_path):
    # protocol -> metadata is allowed; a relative import back from metadata closes a circle.
    tree = _tree(tmp_path, {**BASE, "metadata/model.py": "from ledger_client.protocol.framing import Y\nX = 1\n"})
    problems = check_layout(tree)
    assert any(p.startswith("import circle across roles:") and "metadata.model" in p
               and "ledger_client.protocol.framing" in p for p in problems), problems


def test_circle_within_one_role_is_allowed_outside_acyclic_and_type_checking_imports_do_not_count(tmp_path):
    tree = _tree(tmp_path, {**BASE,
                            "spark_bookie/server/a.py": "from spark_bookie.server.b import B\nA = 1\n",
                            "spark_bookie/server/b.py": "from spark_bookie.server.a import A\nB = 1\n",
                            "ledger_client/protocol/framing.py": "from typing import TYPE_CHECKING\n"
                                "if TYPE_CHECKING:\n    from ledger_client.client import Z\n"})
    assert check_layout(tree, acyclic=frozenset({"jobs"})) == []
    assert any("spark_bookie.server" in p for p in check_layout(tree))   # every package is acyclic now


def test_planted_circle_within_metadata_fails(tmp_path):
    tree = _tree(tmp_path, {**BASE, "metadata/a.py": "from metadata.b import B\nA = 1\n",
                            "metadata/b.py": "from metadata.a import A\nB = 1\n"})
    assert check_layout(tree) == ["import circle in metadata: metadata.a -> metadata.b -> metadata.a"]


def test_a_generated_protobuf_module_is_an_import_of_its_own_not_of_its_package(tmp_path):
    tree = _tree(tmp_path, {**BASE, "metadata/__init__.py": "from metadata.model import M\n",
                            "metadata/model.py": "from metadata import thing_pb2\nM = 1\n",
                            "metadata/thing_pb2.py": ""})
    assert check_layout(tree) == []


def test_kazoo_only_under_metadata_zk(tmp_path):
    tree = _tree(tmp_path, {**BASE, "metadata/zk/__init__.py": "import kazoo\n",
                            "metadata/store.py": "import kazoo.client\n"})
    problems = check_layout(tree)
    assert len(problems) == 1 and "metadata.store imports kazoo" in problems[0]


def test_planted_circle_within_jobs_fails_even_through_a_function_level_import(tmp_path):
    tree = _tree(tmp_path, {**BASE, "jobs/source.py": "from jobs.read import R\n",
                            "jobs/read.py": "def f():\n    from jobs.source import S\n"})
    problems = check_layout(tree)
    assert problems == ["import circle in jobs: jobs.read -> jobs.source -> jobs.read"], problems
    assert check_layout(tree, acyclic=frozenset()) == []     # the rule covers only the packages named


def test_type_checking_imports_make_no_circle_in_jobs(tmp_path):
    tree = _tree(tmp_path, {**BASE, "jobs/source.py": "from jobs.read import R\n",
                            "jobs/read.py": "from typing import TYPE_CHECKING\n"
                                            "if TYPE_CHECKING:\n    from jobs.source import S\n"})
    assert check_layout(tree) == []


def test_planted_import_of_the_tools_from_jobs_fails(tmp_path):
    tools = {"spark_bookie/local/__init__.py": "", "spark_bookie/local/progress.py": "",
             "spark_bookie/bench/__init__.py": "", "spark_bookie/bench/scan.py": ""}
    job = "from spark_bookie.local.progress import StepProgress\n\ndef f():\n    import spark_bookie.bench.scan\n" \
          "    from spark_bookie.cli import main\n"
    problems = check_layout(_tree(tmp_path, {**BASE, **tools, "jobs/compact.py": job}))
    assert len(problems) == 3, problems
    for where, target, role in (("compact.py:1", "spark_bookie.local.progress", "local"),
                                ("compact.py:4", "spark_bookie.bench.scan", "bench"),
                                ("compact.py:5", "spark_bookie.cli.main", "cli")):
        assert any(where in p and f"jobs.compact (jobs) imports {target} ({role}), which jobs may not" in p
                   for p in problems), (target, problems)


STREAMS = {"ledger_client/stream/__init__.py": "", "ledger_client/stream/reader.py": "from ..read_handle import R\n",
           "ledger_client/read_handle.py": "R = 1\n",
           "ledger_client/client.py": "from .protocol.framing import X\nfrom .stream.reader import S\n"}


def test_streams_import_ledgers_and_the_client_imports_both(tmp_path):
    assert check_layout(_tree(tmp_path, {**BASE, **STREAMS})) == []


def test_planted_import_of_streams_from_ledger_code_fails_even_inside_a_function(tmp_path):
    ledger = "R = 1\n\ndef tail():\n    from ledger_client.stream import reader\n"
    problems = check_layout(_tree(tmp_path, {**BASE, **STREAMS, "ledger_client/read_handle.py": ledger,
                                             "ledger_client/metrics.py": "from .stream.reader import S\n"}))
    assert problems == [
        "ledger_client/metrics.py:1: ledger_client.metrics imports ledger_client.stream.reader: ledger code does "
        "not know streams (only stream/ and the public clients above both may)",
        "ledger_client/read_handle.py:4: ledger_client.read_handle imports ledger_client.stream.reader: ledger code "
        "does not know streams (only stream/ and the public clients above both may)",
        # stream/reader.py imports read_handle: the import back also closes a circle
        "import circle in ledger_client: ledger_client.read_handle -> ledger_client.stream.reader "
        "-> ledger_client.read_handle"], problems


def test_planted_circle_within_ledger_client_fails(tmp_path):
    tree = _tree(tmp_path, {**BASE, **STREAMS,
                            "ledger_client/stream/reader.py": "from ..read_handle import R\nfrom .writer import W\n",
                            "ledger_client/stream/writer.py": "def f():\n    from .reader import S\n"})
    assert check_layout(tree) == [
        "import circle in ledger_client: ledger_client.stream.reader -> ledger_client.stream.writer "
        "-> ledger_client.stream.reader"]


def test_the_hosting_job_and_the_ledger_client_load_without_pyarrow():
    """The bookie hosting job also runs on Spark 3.5 clusters without pyarrow (deploy/mesos): the
    modules it loads must not import pyarrow (or deltalake) at import time; Arrow reads import it
    when called."""
    import subprocess
    import sys

    code = ("import sys; import spark_bookie.hosting.driver, spark_bookie.hosting.slots, ledger_client; "
            "ledger_client.LedgerClient; print(sorted(m for m in ('pyarrow', 'deltalake') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("module", ["ledger_client", "spark_bookie.server.service", "recovery.worker",
                                    "jobs.ledger_source"])
def test_every_package_turns_grpc_fork_handlers_off_before_grpc_loads(module):
    """ledger_client/protocol/grpc_setup.py: the setting counts only if made before `import grpc`."""
    import os
    import subprocess
    import sys

    code = ("import builtins, os\n"
            "seen = []\n"
            "real = builtins.__import__\n"
            "def spy(name, *a, **k):\n"
            "    if name == 'grpc' and not seen:\n"
            "        seen.append(os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = spy\n"
            f"import {module}\n"
            "print(seen)\n")
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() in ("['0']", "[]"), out.stdout   # [] : this module loads no grpc at all
