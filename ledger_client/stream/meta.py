"""What stream code does around every call to the metadata store: names checked before it (a
bad name is InvalidNameError, never a metadata failure), times in its unit (ms since the epoch).
Failures of the call itself are translated by ledger_client.metadata_errors, as for ledgers.

Its own module, below namespace.py and the reader, writer and segment steps that namespace.py
opens, so that none of them imports another's module to get these.
"""

from __future__ import annotations

import time

from metadata import InvalidMetadataError
from metadata.streams import check_name

from .. import errors

# The error a bad name of each kind is; DistributedLog's name for namespaces and streams.
_NAME_ERRORS: dict[str, type[errors.InvalidNameError]] = {
    "namespace": errors.InvalidStreamNameError, "stream": errors.InvalidStreamNameError}


def check_names(*names: tuple[str, str]) -> None:
    """Each (name, what) is a valid namespace, stream or subscription name, or InvalidNameError
    (InvalidStreamNameError for namespaces and streams) says why. The store's own check runs here,
    so what it refuses is known to be the name, without reading its message."""
    for name, what in names:
        try:
            check_name(name, what)
        except InvalidMetadataError as e:
            raise _NAME_ERRORS.get(what, errors.InvalidNameError)(f"{what} name: {e}") from e


def now_ms() -> int:
    return int(time.time() * 1000)
