"""File-system steps the bookie's durable files share."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from pathlib import Path


def fsync_dir(directory: str | Path) -> None:
    """Make a file creation, rename or deletion durable: the directory entry is metadata of the
    directory, not of the file, so fsyncing the file alone does not cover it."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn  # a CDLL function: ctypes releases the GIL around the call


_SYNC_FILE_RANGE = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing [offset, offset + nbytes) of `fd` to disk now, without
    waiting for it (Linux sync_file_range(SYNC_FILE_RANGE_WRITE); a no-op elsewhere).

    Durability still comes from fsync; this only spreads the disk writes. A checkpoint that
    handed its whole flush to the kernel at once and fsynced it queued megabytes on the disk the
    journals share, and every bookie's next journal fdatasync waited behind them (BookKeeper's
    flushEntrylogBytes serves the same purpose). Errors are ignored: the fsync reports them.
    """
    if _SYNC_FILE_RANGE is not None and nbytes > 0:
        _SYNC_FILE_RANGE(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)
