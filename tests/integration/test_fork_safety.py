"""A process using the client can still start programs the way PySpark starts its JVM.

`subprocess.Popen(..., preexec_fn=...)` forks (no vfork) and runs Python in the child. With
gRPC's C-core fork handlers installed, a child forked while another thread is inside gRPC
aborted before exec ~7% of the time (absl "Mutex::Fer with pending CondVar") or hung there,
which surfaced in the notebook as PySpark's JAVA_GATEWAY_EXITED. Importing the client turns those
handlers off.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

CHILD = textwrap.dedent("""
    import signal, subprocess, sys, threading
    from ledger_client import LedgerClient          # first, as a user would: before grpc loads

    client = LedgerClient(sys.argv[1])
    writer = client.create_ledger(3, 3, 2, password=b"fork")
    stop = threading.Event()

    def keep_writing():                            # gRPC threads busy during every fork
        while not stop.is_set():
            writer.append(b"x" * 100)

    t = threading.Thread(target=keep_writing)
    t.start()
    codes = []
    for _ in range(int(sys.argv[2])):
        p = subprocess.Popen(["/bin/sh", "-c", "exit 7"],
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        codes.append(p.wait())
    stop.set(); t.join()
    print("appended", writer.last_add_confirmed + 1)
    writer.close(); client.close()
    print("exit codes", sorted(set(codes)), "failed", sum(c != 7 for c in codes))
""")


def test_forked_children_exec_while_streams_are_busy(cluster_factory):
    sb = cluster_factory(3)
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    try:                                           # 150 forks take ~3 s when nothing goes wrong
        out = subprocess.run([sys.executable, "-c", CHILD, sb.connect_string, "150"], env=env,
                             capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"a forked child hung before exec (Popen never returned): {e.stderr!r:.2000}")
    print(out.stdout, out.stderr[-2000:])
    assert out.returncode == 0, out.stderr[-2000:]
    assert "failed 0" in out.stdout, out.stdout
    appended = int(out.stdout.split("appended ")[1].split()[0])
    assert appended > 0
