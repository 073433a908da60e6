"""Stream metadata (DistributedLog's model, DESIGN §4.5): the model (`model`), pure transitions
(`transitions`, `linking`, `tiering`) and the store (`store`, ``store.streams``), written once on
the node layer (:mod:`metadata.nodes`) for ZooKeeper and the in-memory twin."""

from metadata.streams.model import (
    FIRST_SEQUENCE,
    Position,
    SegmentMeta,
    SegmentState,
    StreamMeta,
    SubscriptionMeta,
    TierInfo,
    check_name,
    decode_access,
    decode_settings,
    encode_settings,
)
from metadata.streams.store import (
    NamespaceGoneError,
    StreamGoneError,
    StreamLockInfo,
    StreamLockTimeoutError,
    StreamStore,
    SubscriptionGoneError,
)
from metadata.streams.transitions import Change, SegmentEnd, StreamView

__all__ = ["FIRST_SEQUENCE", "Change", "NamespaceGoneError", "Position", "SegmentEnd", "SegmentMeta", "SegmentState",
           "StreamGoneError", "StreamLockInfo", "StreamLockTimeoutError", "StreamMeta", "StreamStore", "StreamView",
           "SubscriptionGoneError", "SubscriptionMeta", "TierInfo", "check_name", "decode_access", "decode_settings",
           "encode_settings"]
