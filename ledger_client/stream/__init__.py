"""Streams and namespaces (DistributedLog's model, DESIGN §4.5): an unbounded log of records
built from a chain of ledgers (segments), with one writer at a time, read by any number of readers.

`namespace` (namespaces, stream admin, info), `writer` (record sets, rolling, fencing a dead
writer), `reader` (read-ahead, tailing), `records` (the record-set format), `segments` (metadata
steps: commit loop, recovery of a dead writer's segment, retention), `tiered` (segments in Delta),
`meta` (what each of them does around a metadata-store call). Streams are built on ledgers: stream
code uses the ledger client, ledger code never imports this package (tests/unit/layout_check.py).
"""

from .dlsn import DLSN, LogRecord
from .namespace import Namespace, SegmentInfo, StreamInfo
from .reader import StreamReader
from .settings import NamespaceSettings
from .subscriptions import SubscriptionInfo
from .writer import StreamWriter

__all__ = ["DLSN", "LogRecord", "Namespace", "NamespaceSettings", "SegmentInfo", "StreamInfo", "StreamReader",
           "StreamWriter", "SubscriptionInfo"]
