"""The replication protocol as plain state machines: no I/O, no clocks, no threads.

The client's handles drive them with real bookie responses; the simulator in tests/sim drives
them with an in-memory network under random faults; hypothesis drives them directly. Keeping
the protocol here, apart from transport, is what makes the invariants of DESIGN §5 checkable.
``stream_write`` is the same for a stream's writer: what to send when, rolls, in-order records.
"""

from .quorum import QuorumCoverage, write_set
from .recovery import ReadOutcome, RecoveryReadTally, fence_start_point
from .stream_write import StreamWriteState
from .write import AddState, Completion, Send

__all__ = ["AddState", "Completion", "QuorumCoverage", "ReadOutcome", "RecoveryReadTally", "Send",
           "StreamWriteState", "fence_start_point", "write_set"]
