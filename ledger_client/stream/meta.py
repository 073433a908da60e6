"""What stream code does around every call to the metadata store: names checked before it,
failures translated after it into the client's errors, times in its unit (ms since the epoch).

Its own module, below namespace.py and the reader, writer and segment steps that namespace.py
opens, so that none of them imports another's module to get these.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from metadata import (
    BadVersionError,
    InvalidMetadataError,
    MetadataAccessDeniedError,
    MetadataError,
    MetadataUnavailableError,
    NodeExistsError,
)
from metadata.streams import NamespaceGoneError, StreamGoneError, StreamLockTimeoutError, check_name

from .. import errors


@contextmanager
def stream_errors(what: str, exists: type[errors.LedgerError] | None = None) -> Iterator[None]:
    """Metadata failures as the client's typed errors (``exists``: what NodeExistsError means here)."""
    try:
        yield
    except NamespaceGoneError as e:
        raise errors.NoSuchNamespaceError(f"{what}: {e}") from e
    except StreamGoneError as e:
        raise errors.NoSuchStreamError(f"{what}: {e}") from e
    except StreamLockTimeoutError as e:
        raise errors.StreamLockedError(f"{what}: {e}") from e
    except NodeExistsError as e:
        raise (exists or errors.MetadataServiceError)(f"{what}: {e}") from e
    except InvalidMetadataError as e:
        if "name" in str(e):
            raise errors.InvalidStreamNameError(f"{what}: {e}") from e
        raise errors.MetadataServiceError(f"{what}: {e}") from e
    except BadVersionError as e:
        raise errors.MetadataVersionError(f"{what}: changed concurrently ({e})") from e
    except MetadataUnavailableError as e:
        raise errors.MetadataServiceError(f"{what}: ZooKeeper unavailable ({e})") from e
    except MetadataAccessDeniedError as e:
        raise errors.UnauthorizedAccessError(f"{what}: {e}") from e
    except MetadataError as e:
        raise errors.MetadataServiceError(f"{what}: {e}") from e


def check_names(*names: tuple[str, str]) -> None:
    for name, what in names:
        with stream_errors(f"{what} name"):
            check_name(name, what)


def now_ms() -> int:
    return int(time.time() * 1000)
