"""File-system steps the bookie's durable files share."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: str | Path) -> None:
    """Make a file creation, rename or deletion durable: the directory entry is metadata of the
    directory, not of the file, so fsyncing the file alone does not cover it."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
