"""Writing files so that a reader never sees part of one, and hashing them."""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replaced(path: str | Path, sync: bool = True) -> Iterator[Path]:
    """A temporary path beside `path` to write (a file, or a symlink); when the block ends without an error it is
    fsynced (`sync`, a regular file) and renamed over `path` in one step, so readers see the old file or the whole
    new one, never a part. On an error the temporary file goes and `path` is left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        yield tmp
        if sync and tmp.is_file() and not tmp.is_symlink():
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()


def write_text(text: str, path: str | Path, sync: bool = True) -> None:
    """Write a text file atomically (`replaced`; `sync=False` leaves the fsync to the caller)."""
    with replaced(path, sync=sync) as tmp:
        tmp.write_text(text, encoding="utf-8")


def fsync_dir(path: str | Path) -> None:
    """Make a directory's entries (renames into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_of(path: str | Path) -> str:
    """A file's SHA-256, read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
