"""What keeps a run folder one run: a lock for the whole run, the config
fingerprint checked before resuming, and a history file that stays readable.

- `RunLock`: an exclusive `flock` on `<run_dir>/run.lock`, which the kernel
  releases when the holder dies (a killed trainer, a container restarted as
  PID 1 again), so a second live trainer on the folder stops at once naming
  the first, and a restarted one resumes.
- `check_fingerprint`: `<run_dir>/fingerprint.json` records every setting that
  changes the training trajectory. A resume with other values is refused with
  each changed key and its old and new value, before anything in the folder is
  written, unless `allow_config_change` is set (the change is then recorded).
- `HistoryWriter`: `history.csv` is rewritten whole and atomically at every
  checkpoint, from the rows that parse, so a killed run, a new column or a
  hand-edited row never leaves a file the next run cannot read.
"""

from __future__ import annotations

import csv
import dataclasses
import fcntl
import io
import json
import math
import os
import socket
import time
import warnings
from pathlib import Path

import keras

from keras_vit.errors import ConfigChangedError, RunFolderError, RunLockedError
from keras_vit.files import write_atomic, write_json_atomic

LOCK_FILE = "run.lock"
FINGERPRINT_FILE = "fingerprint.json"
HISTORY_FILE = "history.csv"

# Keys that may change between the runs of one folder: where things go, what
# is printed, how the finished model is exported, and how long the run is.
# `total_steps` extends a finished run (the cosine schedule is then spread
# over the new length from the resume on); `jit_compile` changes rounding
# only; evaluation and checkpoint cadence do not touch the weights.
FREE_KEYS = frozenset(
    {
        "name",
        "run_dir",
        "verbose",
        "smoke",
        "export_name",
        "export_root",
        "export_quantize",
        "eval_every",
        "eval_batch_size",
        "checkpoint_every",
        "total_steps",
        "jit_compile",
        "allow_config_change",
        "data.tfds_data_dir",
    }
)


def _flatten(values: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _jsonable(value):
    """Tuples as lists (what JSON gives back), so old and new compare equal."""
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


def fingerprint(config, replicas: int) -> dict:
    """Every trajectory-changing setting of `config`, dotted keys -> values,
    plus the number of replicas the global batch is split over."""
    values = dataclasses.asdict(config)
    values["data"].pop("arrays", None)
    flat = {k: _jsonable(v) for k, v in _flatten(values).items() if k not in FREE_KEYS}
    flat["replicas"] = int(replicas)
    return flat


def _differences(old: dict, new: dict) -> dict:
    changed = {}
    # A key the folder did not record (a setting newer than the run) has
    # nothing to compare with.
    for key in sorted(set(old) & set(new)):
        if key in FREE_KEYS:
            continue
        before, after = old[key], new[key]
        if before != after and not _both_nan(before, after):
            changed[key] = [before, after]
    return changed


def _both_nan(a, b) -> bool:
    return isinstance(a, float) and isinstance(b, float) and math.isnan(a + b)


def _recorded(run_dir: Path) -> tuple[dict | None, list]:
    """The fingerprint the folder's run was started with (from
    fingerprint.json, else from an older folder's config.json) and the
    changes allowed so far."""
    path = run_dir / FINGERPRINT_FILE
    try:
        if path.is_file():
            saved = json.loads(path.read_text(encoding="utf-8"))
            return saved["fingerprint"], saved.get("allowed_changes", [])
        legacy = run_dir / "config.json"
        if legacy.is_file():
            config = _flatten(json.loads(legacy.read_text(encoding="utf-8")))
            return {k: v for k, v in config.items() if k not in FREE_KEYS}, []
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise RunFolderError(
            f"{path} is damaged ({type(error).__name__}); it records the config this "
            "run folder was trained with. Restore it, or start a new run_dir."
        ) from None
    return None, []


def check_fingerprint(run_dir, config, replicas: int, resumes: bool) -> list:
    """Compares `config` with the folder's recorded fingerprint when the
    folder holds a run to resume (`resumes`), then records the fingerprint
    and `config.json`. Raises `ConfigChangedError` naming each changed key
    (`key: old -> new`) unless `config.allow_config_change`; nothing is
    written when it raises. Returns the allowed changes so far, for the run
    metadata."""
    run_dir = Path(run_dir)
    new = fingerprint(config, replicas)
    old, allowed = _recorded(run_dir) if resumes else (None, [])
    changed = _differences(old, new) if old is not None else {}
    if changed and not getattr(config, "allow_config_change", False):
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
        raise ConfigChangedError(
            f"{run_dir} holds a run trained with another config; resuming it would "
            f"mix two runs. Changed: {listed}. Use the recorded values, another "
            "run_dir, or allow_config_change=true to continue anyway (recorded)."
        )
    if changed:
        warnings.warn(
            f"Resuming {run_dir} with a changed config (allow_config_change): "
            + "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items()),
            stacklevel=2,
        )
        allowed = [*allowed, {"changed": changed, "time": time.time()}]
    write_json_atomic(
        run_dir / FINGERPRINT_FILE, {"fingerprint": new, "allowed_changes": allowed}
    )
    values = dataclasses.asdict(config)
    values["data"].pop("arrays", None)
    write_json_atomic(run_dir / "config.json", values, indent=2)
    return allowed


def prepare_run_folder(run_dir) -> Path:
    """Creates `run_dir`; an unwritable folder is a one-line `RunFolderError`."""
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RunFolderError(
            f"cannot create run folder {str(run_dir)!r}: {error.strerror or error}"
        ) from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise RunFolderError(
            f"run folder {str(run_dir)!r} is not writable; choose another run_dir "
            "or fix its permissions."
        )
    return run_dir


class RunLock:
    """`with RunLock(run_dir):` holds an exclusive kernel lock (`flock`) on
    `<run_dir>/run.lock` for the block.

    The kernel releases the lock when its holder dies, however it dies, so a
    trainer restarted in a container (a new PID namespace where it is PID 1
    again, on the same host name) resumes, while a second live trainer on the
    folder, in any namespace, is refused at once. The file also records the
    holder's pid and host, for the refusal's message only: it is never used to
    judge whether the lock is held. Across machines the lock holds where the
    shared file system supports `flock` (NFSv4, Lustre mounted with `flock`).
    """

    def __init__(self, run_dir):
        self.path = Path(run_dir) / LOCK_FILE
        self.owner = {"pid": os.getpid(), "host": socket.gethostname()}
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()

    def acquire(self) -> None:
        for _ in range(3):
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder_text(fd)
                os.close(fd)
                raise RunLockedError(
                    f"run folder {str(self.path.parent)!r} is in use by {holder} "
                    f"(lock file {self.path}); wait for it to finish, or use "
                    "another run_dir."
                ) from None
            except OSError as error:
                os.close(fd)
                raise RunFolderError(
                    f"cannot lock {self.path}: {error.strerror or error}; the file "
                    "system of run_dir must support flock."
                ) from None
            # A holder that finished between our open and our flock unlinked
            # the file: our lock is then on a name nobody else sees. Retry.
            if _same_file(fd, self.path):
                self._fd = fd
                self._record()
                return
            os.close(fd)
        raise RunLockedError(f"could not take the lock {self.path}: contended")

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise RunFolderError(
                f"cannot write the lock file {self.path}: {error.strerror or error}"
            ) from None

    def _record(self) -> None:
        text = json.dumps({**self.owner, "started": time.time()}).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, text, 0)

    def release(self) -> None:
        if self._fd is None:
            return
        # Unlinked while still held, so no other trainer can lock this name
        # in between (a waiting opener finds another inode and retries).
        try:
            if _same_file(self._fd, self.path):
                self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)  # releases the flock
            self._fd = None


def _same_file(fd: int, path: Path) -> bool:
    try:
        named = path.stat()
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _holder_text(fd: int) -> str:
    """`process <pid> on host '<host>'` as the holder recorded it, or
    `another process` while it has not yet written its name."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        holder = {}
    if isinstance(holder, dict) and "pid" in holder:
        return f"process {holder['pid']} on host {holder.get('host')!r}"
    return "another process"


def read_history(path) -> list[dict]:
    """The rows of a `history.csv` that parse (an int `epoch`, a value for
    every column of the header); repeated headers and torn rows are dropped."""
    path = Path(path)
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = list(csv.reader(io.StringIO(text)))
    if not lines or not lines[0] or lines[0][0] != "epoch":
        return []
    header, rows = lines[0], []
    for line in lines[1:]:
        if len(line) != len(header) or not line[0].isdigit():
            continue
        rows.append(dict(zip(header, line, strict=True)))
    return rows


def write_history(path, rows: list[dict]) -> None:
    columns = sorted({key for row in rows for key in row} - {"epoch"})
    out = io.StringIO()
    writer = csv.DictWriter(out, ["epoch", *columns], restval="NA", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    text = out.getvalue()
    write_atomic(path, lambda p: p.write_text(text, encoding="utf-8"))


class HistoryWriter(keras.callbacks.Callback):
    """`history.csv`, one row per Keras epoch (checkpoint interval), kept
    well-formed: each epoch rewrites the file atomically from the rows that
    parse, dropping rows of epochs this run redoes (after a kill).

    Put it before the checkpoint callback: an epoch's row is then on disk
    before its checkpoint, so a kill between the two leaves a row that the
    resumed run (`first_epoch`, the epoch it resumes at) drops and writes
    again, never a checkpoint whose row is lost for good."""

    def __init__(self, path, first_epoch: int = 0):
        super().__init__()
        self.path = Path(path)
        self.first_epoch = int(first_epoch)

    def on_train_begin(self, logs=None):
        rows = read_history(self.path)
        kept = [r for r in rows if int(r["epoch"]) < self.first_epoch]
        if len(kept) != len(rows):
            write_history(self.path, kept)

    def on_epoch_end(self, epoch, logs=None):
        rows = [r for r in read_history(self.path) if int(r["epoch"]) < epoch]
        row = {"epoch": str(epoch)}
        row.update({k: _cell(v) for k, v in (logs or {}).items()})
        write_history(self.path, [*rows, row])


def _cell(value) -> str:
    try:
        return repr(float(value))
    except (TypeError, ValueError):
        return str(value).replace("\n", " ")
