"""Checkpoints, kill-and-resume, damaged checkpoints and NaN
(keras_vit.training.checkpoints)."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import h5py
import keras
import numpy as np
import pytest
from helpers import REPO

from keras_vit.errors import CheckpointError
from keras_vit.training.checkpoints import (
    MANIFEST,
    CheckpointCallback,
    NonFiniteLossError,
    checkpoint_path,
    list_checkpoints,
    restore_latest,
    save_checkpoint,
)

WORKERS = REPO / "tests" / "workers"
sys.path.insert(0, str(WORKERS))
from common import compile_tiny, stream, tiny_vit  # noqa: E402

TOTAL, EVERY = 40, 10


def train_command(run_dir, sleep=0.0):
    return [
        sys.executable,
        str(WORKERS / "train_run.py"),
        str(run_dir),
        "--total-steps", str(TOTAL),
        "--every", str(EVERY),
        "--sleep", str(sleep),
    ]  # fmt: skip


ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def run_to_end(command):
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=ENV, cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return proc.stdout


def read_log(run_dir):
    rows = [line.split() for line in (run_dir / "steps.log").read_text().splitlines()]
    return [(int(step), int(fingerprint), loss) for step, fingerprint, loss in rows]


def h5_arrays(path):
    arrays = {}
    with h5py.File(path, "r") as file:
        file.visititems(
            lambda name, obj: (
                arrays.__setitem__(name, obj[()])
                if isinstance(obj, h5py.Dataset)
                else None
            )
        )
    return arrays


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """An uninterrupted run of TOTAL steps, checkpointed every EVERY steps."""
    run_dir = tmp_path_factory.mktemp("reference")
    run_to_end(train_command(run_dir))
    return run_dir


@pytest.mark.slow
def test_sigkill_mid_epoch_then_restart_resumes_exactly(reference_run, tmp_path):
    run_dir = tmp_path / "run"
    # A moment after the first checkpoint, inside the second interval.
    kill_at = random.Random().randint(EVERY + 1, 2 * EVERY - 2)
    proc = subprocess.Popen(
        train_command(run_dir, sleep=0.1),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=ENV,
        cwd=REPO,
    )
    deadline = time.monotonic() + 240
    log = run_dir / "steps.log"
    while not (log.exists() and len(log.read_text().splitlines()) >= kill_at):
        assert proc.poll() is None, proc.stderr.read().decode()[-4000:]
        assert time.monotonic() < deadline, "the run never reached the kill step"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    killed_at = read_log(run_dir)[-1][0]
    # Normally the kill lands between steps 11 and 18 (resume at 10); a slow
    # poll on a loaded machine may let it run past the next checkpoint.
    resume_at = list_checkpoints(run_dir)[-1]["step"]
    assert resume_at in (EVERY, 2 * EVERY) and 0 <= killed_at - resume_at < EVERY
    print(f"killed at step {killed_at} (aimed at {kill_at}), resuming at {resume_at}")

    output = run_to_end(train_command(run_dir, sleep=0.1))  # the same command
    assert f"start_step {resume_at}" in output

    reference = {step: (fp, loss) for step, fp, loss in read_log(reference_run)}
    rows = read_log(run_dir)
    steps = [step for step, _, _ in rows]
    # First attempt 1..killed_at, second attempt resume_at+1..TOTAL: the steps
    # after the last checkpoint run again, nothing else repeats or is lost.
    assert steps == [*range(1, killed_at + 1), *range(resume_at + 1, TOTAL + 1)]
    # Each step saw the same batch (label fingerprint) as the uninterrupted
    # run, with the same loss (printed to 9 digits).
    assert [(fp, loss) for _, fp, loss in rows] == [reference[s] for s in steps]
    assert len({fp for fp, _ in reference.values()}) == TOTAL  # batches differ

    final, expected = (checkpoint_path(d, TOTAL) for d in (run_dir, reference_run))
    assert [e["step"] for e in list_checkpoints(run_dir)] == [20, 30, 40]
    got, want = h5_arrays(final), h5_arrays(expected)
    assert got.keys() == want.keys()
    # Measured: bit-identical on CPU (dropout masks included, since the seed
    # states are checkpointed too).
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert not [p for p in os.listdir(run_dir) if ".tmp" in p]


def restored_model(run_dir, dropout_rate=0.1):
    """A model like train_run.py's (dropout 0.1), restored from `run_dir`."""
    model = compile_tiny(tiny_vit(dropout_rate))
    return model, restore_latest(run_dir, model)


def test_damaged_latest_checkpoint_falls_back_to_previous(reference_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    latest = checkpoint_path(run_dir, TOTAL)
    data = bytearray(latest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: only the checksum sees it
    latest.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match=f"{latest}: sha256 mismatch"):
        model, step = restored_model(run_dir)
    assert step == 30
    assert int(model.optimizer.iterations.numpy()) == 30
    only_30 = tmp_path / "only_30"
    only_30.mkdir()
    shutil.copy(checkpoint_path(run_dir, 30), only_30)
    expected, _ = restored_model(only_30)
    for got, want in zip(model.get_weights(), expected.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_truncated_checkpoint_without_manifest_falls_back(reference_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    (run_dir / MANIFEST).unlink()
    latest = checkpoint_path(run_dir, TOTAL)
    latest.write_bytes(latest.read_bytes()[:1000])
    # A temporary file left by a writer killed mid-save is never a candidate.
    (run_dir / ".ckpt-00000050.123.tmp.weights.h5").write_bytes(b"torn")
    with pytest.warns(UserWarning, match=f"{latest}: unreadable"):
        _, step = restored_model(run_dir)
    assert step == 30


def test_no_readable_checkpoint_fails_loudly_naming_each_file(reference_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    for step in (20, 30, 40):
        checkpoint_path(run_dir, step).write_bytes(b"\0" * 64)
    with pytest.raises(CheckpointError) as info:
        restored_model(run_dir)
    for step in (20, 30, 40):
        assert f"{checkpoint_path(run_dir, step)}: sha256 mismatch" in str(info.value)


def test_fresh_run_starts_at_zero(tmp_path):
    assert restored_model(tmp_path / "missing")[1] == 0
    assert restored_model(tmp_path)[1] == 0


def test_checkpoint_of_another_model_fails_loudly(reference_run, tmp_path):
    with pytest.raises(CheckpointError, match="saved from a different model"):
        restored_model(reference_run, dropout_rate=0.0)


def test_save_keeps_last_k_and_lists_them(tmp_path):
    model = compile_tiny(tiny_vit())
    for step in (5, 10, 15):
        save_checkpoint(tmp_path, model, step, keep=2, loss=1.5)
    entries = list_checkpoints(tmp_path)
    assert [e["step"] for e in entries] == [10, 15] and entries[-1]["loss"] == 1.5
    assert sorted(os.listdir(tmp_path)) == [
        MANIFEST,
        "ckpt-00000010.weights.h5",
        "ckpt-00000015.weights.h5",
    ]
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest["format"] == 1 and len(entries[0]["sha256"]) == 64
    with pytest.raises(ValueError, match="keep must be an int >= 1, got 0"):
        save_checkpoint(tmp_path, model, 20, keep=0)


def test_unlisted_file_and_damaged_manifest_lose_nothing(tmp_path):
    model = compile_tiny(tiny_vit())
    for step in (5, 10):
        save_checkpoint(tmp_path, model, step)
    # Killed after renaming ckpt 10 into place, before rewriting the manifest.
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    manifest["checkpoints"] = manifest["checkpoints"][:1]
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    assert restored_model(tmp_path, dropout_rate=0.0)[1] == 10
    (tmp_path / MANIFEST).write_text('{"checkpoints": [')
    with pytest.warns(UserWarning, match="checkpoints.json is unreadable"):
        save_checkpoint(tmp_path, model, 15, keep=3)
    assert [e["step"] for e in list_checkpoints(tmp_path)] == [5, 10, 15]
    assert len(list(tmp_path.glob("ckpt-*.weights.h5"))) == 3


def fit_with_checkpoints(model, run_dir, callbacks=(), nan_at=-1, raise_on_nan=True):
    checkpoints = CheckpointCallback(run_dir, keep=5, raise_on_nan=raise_on_nan)
    model.fit(
        stream(nan_at=nan_at),
        steps_per_epoch=5,
        epochs=4,
        verbose=0,
        callbacks=[*callbacks, checkpoints],
    )
    return checkpoints


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    model = compile_tiny(tiny_vit())
    with pytest.raises(NonFiniteLossError) as info:
        fit_with_checkpoints(model, tmp_path, nan_at=11)  # batch 11 = step 12
    assert "Training stopped at step 12: loss nan" in str(info.value)
    assert f"last good checkpoint is {checkpoint_path(tmp_path, 10)}" in str(info.value)
    assert [e["step"] for e in list_checkpoints(tmp_path)] == [5, 10]
    fresh, step = restored_model(tmp_path, dropout_rate=0.0)
    assert step == 10
    assert all(np.isfinite(w).all() for w in fresh.get_weights())


def test_nan_without_raising_stops_training(tmp_path):
    model = compile_tiny(tiny_vit())
    with pytest.warns(UserWarning, match="Training stopped at step 10: loss nan"):
        checkpoints = fit_with_checkpoints(
            model, tmp_path, nan_at=9, raise_on_nan=False
        )
    assert checkpoints.nan_step == 10 and model.stop_training
    assert [e["step"] for e in list_checkpoints(tmp_path)] == [5]


def test_non_finite_weight_is_never_saved(tmp_path):
    class PoisonAtStep10(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if self.model.optimizer.iterations.numpy() == 10:  # last of epoch 2
                kernel = self.model.get_layer("head").kernel
                kernel.assign(np.full(kernel.shape, np.inf, "float32"))

    model = compile_tiny(tiny_vit())
    with pytest.raises(NonFiniteLossError, match="step 10: weight head/kernel"):
        fit_with_checkpoints(model, tmp_path, callbacks=[PoisonAtStep10()])
    assert [e["step"] for e in list_checkpoints(tmp_path)] == [5]


def test_callback_needs_steps_per_epoch(tmp_path):
    model = compile_tiny(tiny_vit())
    unknown_length = stream().take(2).filter(lambda images, labels: True)
    with pytest.raises(
        ValueError, match="needs fit\\(steps_per_epoch=checkpoint_every"
    ):
        model.fit(
            unknown_length,
            epochs=1,
            verbose=0,
            callbacks=[CheckpointCallback(tmp_path)],
        )
