"""Files that hold captured calls before secrets are scrubbed (the journal, the spill file):
readable by the service's user only, whatever the umask, in folders only it may list."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: Path) -> Path:
    """Create the folder (and its parents) if needed and make it 0700: an existing one from an
    earlier version, created under a looser umask, is tightened too."""
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    os.chmod(path, DIR_MODE)
    return path


def private_file(path: Path) -> IO[bytes]:
    """Open the file for appending, created 0600 (an existing one is tightened)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return os.fdopen(fd, "ab")


def write_private(path: Path, data: bytes) -> None:
    """Replace the file's content (a small record such as a shipper's offset), 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
