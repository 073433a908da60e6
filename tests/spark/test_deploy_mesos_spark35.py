"""The legacy native-Mesos path (deploy/mesos/submit-spark35-mesos.sh) against real spark-submits.

There is no Mesos master or libmesos here, so the furthest a real run can get is Spark 3.5's
Mesos scheduler backend trying to load the native library: reaching that point shows the script's
command line is one Spark 3.5 accepts (mesos:// master, every --conf, the job's own arguments
passed through). Spark 4 must be refused by the script itself, with a message saying why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "mesos" / "submit-spark35-mesos.sh"
ARGS = ["--mesos-master", "mesos://zk://127.0.0.1:1/mesos", "--zk", "127.0.0.1:1/sb/ledgers", "--bookies", "2",
        "--skip-init", "--name", "sb"]

PROBE_JOB = """\
import sys
print("JOB ARGS", " ".join(sys.argv[1:]), flush=True)
from pyspark import SparkContext
SparkContext()        # the Mesos backend loads libmesos here
print("UNEXPECTED: a SparkContext on a mesos:// master without libmesos", flush=True)
"""


def _env(python: str) -> dict[str, str]:
    bindir = str(Path(python).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_HOME"))}
    env.update(PATH=f"{bindir}:{env.get('PATH', '/usr/bin:/bin')}", PYTHON=python, EXECUTOR_PYTHON=python,
               SPARK_SUBMIT=f"{bindir}/spark-submit", SPARK_LOCAL_IP="127.0.0.1")
    return env


@pytest.fixture(scope="module")
def spark35_python() -> str:
    """The Python of a pyspark 3.5 venv (scripts/pyspark35-venv creates it once; fast afterwards)."""
    done = subprocess.run([str(ROOT / "scripts" / "pyspark35-venv")], capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_spark4_is_refused_with_a_reason() -> None:
    done = subprocess.run(["bash", str(SCRIPT), *ARGS, "--job", "/nonexistent.py"], capture_output=True,
                          text=True, timeout=120, env=_env(sys.executable))
    assert done.returncode == 2, done.stderr
    assert "is Spark 4." in done.stderr and "needs Spark 3.5" in done.stderr


def test_spark35_accepts_the_command_up_to_libmesos(spark35_python: str, tmp_path: Path) -> None:
    job = tmp_path / "probe_job.py"
    job.write_text(PROBE_JOB, encoding="utf-8")
    env = _env(spark35_python) | {"MESOS_NATIVE_JAVA_LIBRARY": str(tmp_path / "no-libmesos.so")}
    done = subprocess.run(["bash", str(SCRIPT), *ARGS, "--job", str(job)], capture_output=True, text=True,
                          timeout=240, env=env, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "JOB ARGS --zk 127.0.0.1:1/sb/ledgers --bookies 2 --data-root /var/lib/spark-bookie --name sb" in out
    assert f"Failed to load native Mesos library from {tmp_path / 'no-libmesos.so'}" in out, out[-3000:]
    assert "UNEXPECTED" not in out
