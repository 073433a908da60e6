"""The one wire protocol, shared by the client and the bookie: `bookkeeper.proto` and its generated
code, entry framing and digests, the TCP port's framing, and the `invariant()` helper."""

import os

# gRPC's C core installs fork handlers that, while another thread is inside gRPC, can abort a
# forked child before it execs (absl "Mutex::Fer with pending CondVar"): subprocess.Popen with
# preexec_fn, e.g. PySpark launching its JVM, then fails ~7% of the time in a process with live
# bookie streams. Python's gRPC already refuses to be used across fork, so the handlers buy
# nothing here. The core reads this once, when grpc is first imported: every package of the
# project that uses grpc imports this one first. An explicit setting by the user wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
