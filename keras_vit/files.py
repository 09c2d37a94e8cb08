"""File helpers every writer in keras_vit shares: atomic writes and hashing.

A file that another process may read (a checkpoint, its manifest, an export's
metadata, a converted `.keras`) is written to a hidden temporary name in the
same folder, synced, then renamed over the target: a reader sees the old file
or the new one, never half of one, and a killed writer leaves only a temporary
file that the next writer ignores.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import threading
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
    temp = stage(target, write)
    try:
        os.replace(temp, target)
    finally:
        discard(temp)
    fsync_dir(Path(target).parent)
    return Path(target)


def stage(target: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """The first half of `write_atomic`: `write(temp_path)` beside `target`,
    synced; returns the temporary path (removed if `write` raises). Stage
    every file of a set, then `publish` them: a failure while writing (a
    full disk) then publishes none."""
    temp = temporary_name(target)
    try:
        write(temp)
        if temp.is_file():
            fsync_file(temp)
    except BaseException:
        discard(temp)
        raise
    return temp


def publish(staged: list[tuple[Path, Path]]) -> None:
    """Renames each staged `(temp, target)` over its target (renames do not
    fail for want of space) and syncs their folders."""
    for temp, target in staged:
        os.replace(temp, target)
    for folder in {Path(target).parent for _, target in staged}:
        fsync_dir(folder)


def discard(temp: Path) -> None:
    """Removes a staged temporary file or folder, if it is still there."""
    temp = Path(temp)
    if temp.is_dir():
        shutil.rmtree(temp, ignore_errors=True)
    elif temp.exists():
        temp.unlink()


def write_json_atomic(target: str | os.PathLike, data, indent: int = 1) -> Path:
    text = json.dumps(data, indent=indent)
    return write_atomic(target, lambda path: path.write_text(text, encoding="utf-8"))


def write_bytes_atomic(target: str | os.PathLike, content: bytes) -> Path:
    return write_atomic(target, lambda path: path.write_bytes(content))


@contextlib.contextmanager
def signals_held(signums=(signal.SIGINT, signal.SIGTERM)):
    """Holds Ctrl-C (SIGINT) and SIGTERM for the block: a short publication
    step (a few renames, one file) completes whole, and a signal that arrived
    meanwhile is delivered, to the handler that was in place, when the block
    ends. Outside the main thread (where Python cannot set handlers) the
    block runs unguarded. SIGKILL cannot be held: the atomic writes make
    each file whole, not the set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = {}
    for signum in signums:
        old = signal.signal(signum, lambda number, frame: received.append(number))
        previous[signum] = signal.SIG_DFL if old is None else old
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if received:
            signal.raise_signal(received[0])


def check_free_space(target: str | os.PathLike, needed: int) -> None:
    """Raises OSError(ENOSPC) naming `target` when its folder has fewer than
    `needed` bytes free. HDF5 (h5py, which writes Keras weights) can crash
    the process when the disk fills during a write instead of raising, so
    writers of `.h5` and `.keras` files check first. Another writer may still
    fill the disk in between: this makes the common case (a disk filling up
    over a run) an error, not a guarantee."""
    free = shutil.disk_usage(Path(target).parent).free
    if free < needed:
        raise OSError(
            errno.ENOSPC,
            f"No space left on device: about {needed:,} bytes needed, {free:,} free",
            str(target),
        )


def weights_bytes(*variable_lists) -> int:
    """The bytes the given Keras variables hold (an estimate of a weights
    file's size, without its small per-variable overhead)."""
    import numpy as np

    return sum(
        int(np.prod(v.shape)) * np.dtype(getattr(v.dtype, "name", v.dtype)).itemsize
        for variables in variable_lists
        for v in variables
    )


def check_path_text(path: str | os.PathLike, what: str) -> Path:
    """`path` if TensorFlow can write and read back a SavedModel under it.

    TensorFlow finds a SavedModel's variables by a glob pattern built from
    its path: with `[1]` in the path the load fails ("Failed to find any
    matching files", measured with TF 2.21), after all of an export's work;
    a backslash fails the same way; `*` and `?` load, but would also match
    other folders' files. Those characters and control characters are
    refused, on the absolute path (a parent folder counts too), with a
    ValueError naming the character and what to do."""
    text = str(Path(path).absolute())
    bad = sorted({c for c in text if c in "[]*?\\" or ord(c) < 32 or ord(c) == 127})
    if bad:
        raise ValueError(
            f"{what} {str(path)!r} contains {''.join(bad)!r} (in {text!r}); "
            "TensorFlow reads a SavedModel's path as a glob pattern, where "
            "[ ] * ? \\ do not stand for themselves: choose a name and folder "
            "without them."
        )
    return Path(path)


__all__ = [
    "check_free_space",
    "check_path_text",
    "discard",
    "fsync_dir",
    "fsync_file",
    "publish",
    "sha256",
    "signals_held",
    "stage",
    "temporary_name",
    "weights_bytes",
    "write_atomic",
    "write_bytes_atomic",
    "write_json_atomic",
]
