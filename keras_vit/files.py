"""File helpers every writer in keras_vit shares: atomic writes and hashing.

A file that another process may read (a checkpoint, its manifest, an export's
metadata, a converted `.keras`) is written to a hidden temporary name in the
same folder, synced, then renamed over the target: a reader sees the old file
or the new one, never half of one, and a killed writer leaves only a temporary
file that the next writer ignores.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path


def sha256(path: str | os.PathLike) -> str:
    """The hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb+") as file:
        os.fsync(file.fileno())


def fsync_dir(path: str | os.PathLike) -> None:
    """Makes a rename inside `path` durable (the directory entry itself)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temporary_name(target: str | os.PathLike) -> Path:
    """A hidden name beside `target`, unique to this process and call, that
    keeps all of the target's suffixes (Keras checks `.keras` and
    `.weights.h5`)."""
    target = Path(target)
    base, _, suffixes = target.name.partition(".")
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tail = f".{suffixes}" if suffixes else ""
    return target.with_name(f".{base}.{tag}.tmp{tail}")


def write_atomic(target: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """Calls `write(temp_path)`, syncs the file, then renames it over `target`.

    The temporary file is removed whatever `write` raises.
    """
    target = Path(target)
    temp = temporary_name(target)
    try:
        write(temp)
        if temp.is_file():
            fsync_file(temp)
        os.replace(temp, target)
    finally:
        if temp.is_dir():
            shutil.rmtree(temp, ignore_errors=True)
        elif temp.exists():
            temp.unlink()
    fsync_dir(target.parent)
    return target


def write_json_atomic(target: str | os.PathLike, data, indent: int = 1) -> Path:
    text = json.dumps(data, indent=indent)
    return write_atomic(target, lambda path: path.write_text(text, encoding="utf-8"))


def write_bytes_atomic(target: str | os.PathLike, content: bytes) -> Path:
    return write_atomic(target, lambda path: path.write_bytes(content))


__all__ = [
    "fsync_dir",
    "fsync_file",
    "sha256",
    "temporary_name",
    "write_atomic",
    "write_bytes_atomic",
    "write_json_atomic",
]
