"""Checkpoints that survive a kill at any moment, and resuming from them.

The trainer's calls (`checkpoint_every` steps make one `fit` "epoch"):

    step = restore_latest(run_dir, model)          # 0 for a fresh run
    dataset = make_train_dataset(..., start_step=step)
    model.fit(
        dataset,
        steps_per_epoch=checkpoint_every,
        epochs=total_steps // checkpoint_every,
        initial_epoch=step // checkpoint_every,
        callbacks=[CheckpointCallback(run_dir, keep=3)],
    )

A checkpoint is one Keras `.weights.h5` file holding the model's weights and
the optimizer's state (slots, iteration count, loss scale), named
`ckpt-<step>.weights.h5`. It is written under a temporary name in the same
folder, fsynced and renamed into place, so a reader sees either the whole
file or none; `checkpoints.json` (written the same way) lists the kept files
with their step and sha256, so a damaged file is noticed before it is loaded.

Under MultiWorkerMirroredStrategy every worker runs the callback (saving
reads distributed variables, which is a collective), but only the chief
writes into `run_dir`; the others write into a temporary folder that is
removed at once. Every worker must see the same `run_dir` to resume.

A kill (SIGTERM or SIGKILL, any worker) loses at most the steps since the
last checkpoint; `checkpoint_every` bounds that. TF's
`PreemptionCheckpointHandler` is not used: it saves a `tf.train.Checkpoint`
at a step all workers agree on after a SIGTERM, which wants a custom
training loop, a second checkpoint format and resuming mid-interval.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import h5py
import keras
import numpy as np

from keras_vit.errors import CheckpointError, NonFiniteLossError
from keras_vit.files import (
    check_free_space,
    sha256,
    weights_bytes,
    write_atomic,
    write_json_atomic,
)
from keras_vit.training.distribute import is_chief

MANIFEST = "checkpoints.json"
_NAME = re.compile(r"^ckpt-(\d+)\.weights\.h5$")


def checkpoint_path(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / f"ckpt-{step:08d}.weights.h5"


def list_checkpoints(run_dir: str | os.PathLike) -> list[dict]:
    """The manifest's entries, oldest first (`[]` when there is none)."""
    manifest = Path(run_dir) / MANIFEST
    if not manifest.exists():
        return []
    try:
        entries = json.loads(manifest.read_text())["checkpoints"]
        return sorted(entries, key=lambda entry: entry["step"])
    except (ValueError, KeyError, TypeError) as error:
        warnings.warn(
            f"{manifest} is unreadable ({error!r}); using the checkpoint files "
            "found in the folder without checksums.",
            stacklevel=2,
        )
        return []


def save_checkpoint(
    run_dir: str | os.PathLike,
    model: keras.Model,
    step: int,
    *,
    keep: int = 3,
    loss: float | None = None,
) -> Path | None:
    """Saves weights + optimizer state as step `step`; keeps the last `keep`.

    Every worker must call this; returns the file on the chief, else None.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an int >= 1, got {keep!r}.")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}.")
    _build_optimizer(model)  # else its slots are missing from the file
    if not is_chief(model.distribute_strategy):
        scratch = tempfile.mkdtemp(prefix="keras_vit_worker_ckpt_")
        try:
            model.save_weights(os.path.join(scratch, "ckpt.weights.h5"))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(run_dir, step)

    def write(temp):
        model.save_weights(temp)
        _save_random_state(temp, model)
        _save_lora_state(temp, model)

    check_free_space(final, _expected_bytes(run_dir, model))
    write_atomic(final, write)
    entries = [e for e in _known(run_dir).values() if e["step"] != step]
    entries.append(
        {
            "step": step,
            "file": final.name,
            "sha256": sha256(final),
            "bytes": final.stat().st_size,
            "loss": loss,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    )
    entries = sorted(entries, key=lambda entry: entry["step"])[-keep:]
    write_json_atomic(run_dir / MANIFEST, {"format": 1, "checkpoints": entries})
    kept = {entry["file"] for entry in entries}
    for path in run_dir.iterdir():
        if _NAME.match(path.name) and path.name not in kept:
            path.unlink(missing_ok=True)
    return final


def _expected_bytes(run_dir: Path, model) -> int:
    """A checkpoint's size: the last one's, or the weights' and optimizer
    state's bytes, with 10% and 64 KiB to spare."""
    optimizer = getattr(model, "optimizer", None)
    estimate = weights_bytes(model.weights, optimizer.variables if optimizer else [])
    for path in run_dir.glob("ckpt-*.weights.h5"):
        estimate = max(estimate, path.stat().st_size)
    return int(estimate * 1.1) + (64 << 10)


def restore_latest(run_dir: str | os.PathLike, model: keras.Model) -> int:
    """Loads the newest readable checkpoint of `run_dir` into `model` (and its
    optimizer) and returns its step; 0 when there is none.

    A damaged newest checkpoint (wrong checksum, unreadable file) is skipped
    with a warning naming it, in favour of the previous one; when none can be
    read, `CheckpointError` lists every file and why.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return 0
    candidates = _known(run_dir)
    if not candidates:
        return 0
    _build_optimizer(model)
    failures = []
    for name, entry in sorted(candidates.items(), key=lambda kv: -kv[1]["step"]):
        path = run_dir / name
        problem = _check_file(path, entry)
        if problem is None:
            problem = _load(model, path)
        if problem is None:
            if failures:
                warnings.warn(
                    "Skipped damaged checkpoint(s): "
                    + "; ".join(failures)
                    + f". Resumed from {path} (step {entry['step']}).",
                    stacklevel=2,
                )
            return int(entry["step"])
        failures.append(f"{path}: {problem}")
    raise CheckpointError(
        f"No checkpoint in {run_dir} can be restored:\n  " + "\n  ".join(failures)
    )


def _known(run_dir):
    """Manifest entries plus checkpoint files the manifest does not list (a
    kill between renaming the file and rewriting the manifest, or a damaged
    manifest), by file name."""
    known = {entry["file"]: entry for entry in list_checkpoints(run_dir)}
    for path in run_dir.iterdir():
        match = _NAME.match(path.name)
        if match and path.name not in known:
            known[path.name] = {"step": int(match[1]), "file": path.name}
    return known


def _check_file(path, entry):
    if not path.exists():
        return "listed in the manifest but missing"
    if "sha256" in entry and sha256(path) != entry["sha256"]:
        return (
            f"sha256 mismatch ({path.stat().st_size} bytes, manifest says "
            f"{entry.get('bytes')}): the file is damaged"
        )
    return None


def _damage(path) -> str | None:
    """Why the HDF5 file at `path` cannot be read back whole; None when every
    dataset in it reads."""

    def read(_, item):
        if isinstance(item, h5py.Dataset):
            item[()]

    try:
        with h5py.File(path, "r") as file:
            file.visititems(read)
    except Exception as error:  # h5py raises OSError, KeyError, ValueError...
        return f"unreadable ({type(error).__name__}: {error})"
    return None


def _load(model, path):
    # Only a file that does not read back is damaged: one that reads whole
    # but does not load is a mismatch with this model, and saying "damaged"
    # would invite the user to delete a good checkpoint.
    problem = _damage(path)
    if problem is not None:
        return problem
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model.load_weights(path)
            seeds = _load_random_state(path)
            _load_lora_state(path, model)
        except Exception as error:
            raise CheckpointError(
                f"{path} is intact (it reads back whole) but does not load into "
                f"this model: {type(error).__name__}: {error}"
            ) from None
    for warning in caught:
        if "Skipping variable loading" in str(warning.message):
            # Not damage: the model or optimizer differs from the one saved.
            raise CheckpointError(
                f"{path} does not match this model/optimizer: {warning.message}"
            )
    variables = _random_state_variables(model)
    if seeds is not None:
        # Seed-generator names carry a process-wide counter, so match by order.
        if len(variables) != len(seeds[0]):
            raise CheckpointError(
                f"{path} holds {len(seeds[0])} random-seed states, but this model "
                f"has {len(variables)}: it was saved from a different model."
            )
        for variable, value in zip(variables, seeds[1], strict=True):
            variable.assign(value)
    return None


# Keras' weights file leaves out the seed-generator states (dropout, drop
# path), so a resumed run would draw the masks of step 0 again; they travel
# in a group of their own in the same file.
_RANDOM_GROUP = "keras_vit_random_state"


def _random_state_variables(model):
    weights = {id(w) for w in model.weights}
    metrics = {id(v) for v in model.metrics_variables}
    return [v for v in model.variables if id(v) not in weights | metrics]


def _save_random_state(path, model):
    variables = _random_state_variables(model)
    with h5py.File(path, "a") as file:
        group = file.create_group(_RANDOM_GROUP)
        group.attrs["paths"] = json.dumps([v.path for v in variables])
        for i, variable in enumerate(variables):
            group[str(i)] = keras.ops.convert_to_numpy(variable)


def _load_random_state(path):
    with h5py.File(path, "r") as file:
        if _RANDOM_GROUP not in file:
            return None
        group = file[_RANDOM_GROUP]
        paths = json.loads(group.attrs["paths"])
        return paths, [group[str(i)][()] for i in range(len(paths))]


# Keras saves a LoRA Dense with its adapters merged into the kernel and
# zeroes them on load: training would go on from fresh adapters and frozen
# merged kernels, another run than the one that was stopped. The base kernels
# and the adapters themselves travel in a group of their own.
_LORA_GROUP = "keras_vit_lora"
_LORA_PARTS = ("_kernel", "lora_kernel_a", "lora_kernel_b")


def _lora_layers(model):
    return [
        layer
        for layer in model._flatten_layers(include_self=False)
        if getattr(layer, "lora_enabled", False) and hasattr(layer, "_kernel")
    ]


def _save_lora_state(path, model):
    layers = _lora_layers(model)
    if not layers:
        return
    with h5py.File(path, "a") as file:
        group = file.create_group(_LORA_GROUP)
        group.attrs["paths"] = json.dumps([layer._kernel.path for layer in layers])
        for i, layer in enumerate(layers):
            for part in _LORA_PARTS:
                value = keras.ops.convert_to_numpy(getattr(layer, part))
                group[f"{i}/{part}"] = value


def _load_lora_state(path, model) -> None:
    layers = _lora_layers(model)
    with h5py.File(path, "r") as file:
        if _LORA_GROUP not in file:
            return
        group = file[_LORA_GROUP]
        paths = json.loads(group.attrs["paths"])
        if paths != [layer._kernel.path for layer in layers]:
            raise CheckpointError(
                f"{path} holds LoRA adapters for {len(paths)} layers, this model "
                f"has {len(layers)}: it was saved from a different model."
            )
        for i, layer in enumerate(layers):
            for part in _LORA_PARTS:
                getattr(layer, part).assign(group[f"{i}/{part}"][()])


def holds_lora_state(run_dir: str | os.PathLike, step: int) -> bool:
    """Whether the checkpoint of `step` holds its LoRA adapters unmerged (a
    checkpoint of an older keras_vit holds them merged only)."""
    with h5py.File(checkpoint_path(run_dir, step), "r") as file:
        return _LORA_GROUP in file


def _build_optimizer(model):
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        with model.distribute_strategy.scope():
            optimizer.build(model.trainable_variables)


class CheckpointCallback(keras.callbacks.Callback):
    """Saves a checkpoint at the end of every `fit` epoch (= every
    `steps_per_epoch` steps) and stops the run on a non-finite loss.

    Args:
        run_dir: folder for the checkpoints and `checkpoints.json`.
        keep: how many checkpoints to keep.
        raise_on_nan: raise `NonFiniteLossError` on a NaN/inf loss (default),
            or only stop training (`self.nan_step` says where).

    A checkpoint is only written at the end of a complete epoch whose losses
    were all finite and whose weights are all finite, so a NaN is never saved
    and the last checkpoint stays the last good one.
    """

    def __init__(self, run_dir, keep: int = 3, raise_on_nan: bool = True):
        super().__init__()
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}.")
        self.run_dir = Path(run_dir)
        self.keep = keep
        self.raise_on_nan = raise_on_nan
        self.nan_step = None
        self.last_saved_step = None

    def on_train_begin(self, logs=None):
        if not self.params.get("steps"):
            raise ValueError(
                "CheckpointCallback needs fit(steps_per_epoch=checkpoint_every), "
                f"got steps_per_epoch={self.params.get('steps')!r}."
            )
        self.nan_step = None
        if is_chief(self.model.distribute_strategy) and self.run_dir.is_dir():
            for pattern in (".ckpt-*.tmp.weights.h5", f".{MANIFEST}.*.tmp"):
                for path in self.run_dir.glob(pattern):
                    path.unlink(missing_ok=True)  # left by a killed writer

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(np.mean(loss))):
            self._stop(self._epoch * self.params["steps"] + batch + 1, f"loss {loss}")

    def on_epoch_end(self, epoch, logs=None):
        if self.nan_step is not None or self._batches < self.params["steps"]:
            return
        step = (epoch + 1) * self.params["steps"]
        for variable in self.model.weights:
            values = keras.ops.convert_to_numpy(variable)
            if values.dtype.kind == "f" and not np.isfinite(values).all():
                self._stop(step, f"weight {variable.path} non-finite")
                return
        loss = (logs or {}).get("loss")
        save_checkpoint(
            self.run_dir,
            self.model,
            step,
            keep=self.keep,
            loss=None if loss is None else float(np.mean(loss)),
        )
        self.last_saved_step = step

    def _stop(self, step, what):
        self.nan_step = step
        self.model.stop_training = True
        entries = list_checkpoints(self.run_dir)
        last = (
            f"the last good checkpoint is {self.run_dir / entries[-1]['file']} "
            f"(step {entries[-1]['step']})"
            if entries
            else f"there is no checkpoint in {self.run_dir} yet"
        )
        message = f"Training stopped at step {step}: {what}; nothing saved, {last}."
        if self.raise_on_nan:
            raise NonFiniteLossError(message)
        warnings.warn(message, stacklevel=2)


__all__ = [
    "MANIFEST",
    "CheckpointCallback",
    "NonFiniteLossError",
    "checkpoint_path",
    "list_checkpoints",
    "restore_latest",
    "holds_lora_state",
    "save_checkpoint",
]
