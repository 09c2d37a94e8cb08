"""A trainer killed at a chosen moment, in a subprocess: a restart resumes (in
a container too, where the new trainer is PID 1 again), the history keeps
one row per interval, and no user-visible file is ever half-written."""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import keras
import pytest
from helpers import read_json

from keras_vit.training import run_folder

TESTS = str(Path(__file__).parent)
# Trains the 4-interval tiny run of test_training in `argv[1]`; with a stop
# point it blocks there (printing "stopped") until the test kills it:
# `checkpoint:<step>` just before that checkpoint is saved (its history row is
# already written), `model.keras` half-way through saving the final model.
TRAIN = r"""
import os, sys, time
from pathlib import Path
import keras
from test_training import tiny
from keras_vit.errors import RunLockedError
from keras_vit.training import checkpoints, trainer

tmp, stop = Path(sys.argv[1]), sys.argv[2]
print("pid", os.getpid(), flush=True)
restore = checkpoints.restore_latest
def reporting_restore(*args):
    step = restore(*args)
    print("resumed at", step, flush=True)
    return step
checkpoints.restore_latest = reporting_restore

def block():
    print("stopped", flush=True)
    time.sleep(600)

if stop.startswith("checkpoint:"):
    save = checkpoints.save_checkpoint
    def stopping_save(run_dir, model, step, **kwargs):
        if step == int(stop.split(":")[1]):
            block()
        return save(run_dir, model, step, **kwargs)
    checkpoints.save_checkpoint = stopping_save
elif stop == "model.keras":
    def half_save(self, path, *args, **kwargs):
        Path(path).write_bytes(b"PK\x03\x04 half a zip")
        block()
    keras.Model.save = half_save
try:
    metadata = trainer.train(tiny(tmp, total_steps=sys.argv[3]))
except RunLockedError as error:
    print("locked:", error, flush=True)
    sys.exit(2)
print("steps", metadata["steps"], flush=True)
"""


def start(tmp_path, stop="", total_steps="4", container=False):
    command = [sys.executable, "-c", TRAIN, str(tmp_path), stop, total_steps]
    if container:
        command = ["unshare", "--pid", "--fork", "--mount-proc", *command]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, *sys.path])}
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def read_until(process, word: str) -> list[str]:
    lines = []
    for line in process.stdout:
        lines.append(line.strip())
        if line.startswith(word):
            return lines
    _, err = process.communicate()
    raise AssertionError(f"no {word!r} line; stdout {lines}, stderr tail {err[-2000:]}")


def kill_trainer(process, container: bool, sig=signal.SIGKILL) -> None:
    """Kills the trainer: in a container, its PID 1 (from outside, as a
    container runtime does); the whole PID namespace goes with it."""
    target = process.pid
    if container:
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
        target = int(children.read_text().split()[0])
    os.kill(target, sig)
    process.wait(timeout=60)


def finish(process) -> str:
    out, err = process.communicate(timeout=900)
    assert process.returncode == 0, err[-3000:]
    return out


def visible_files(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.parts)
    }


def history_epochs(run_dir: Path) -> list[int]:
    return [int(r["epoch"]) for r in run_folder.read_history(run_dir / "history.csv")]


def can_unshare() -> str | None:
    if shutil.which("unshare") is None:
        return "the unshare command is not installed"
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode:
        return f"unshare --pid --fork --mount-proc fails here: {probe.stderr.strip()}"
    return None


@pytest.mark.parametrize("container", [False, True], ids=["host", "container"])
def test_killed_trainer_resumes_with_every_history_row(tmp_path, container):
    if container and (reason := can_unshare()):
        pytest.skip(reason)
    first = start(tmp_path, "checkpoint:3", container=container)
    lines = read_until(first, "stopped")
    if container:
        assert "pid 1" in lines  # the trainer is its namespace's PID 1
    run_dir = tmp_path / "run"
    # Killed between the history row of steps 2-3 and their checkpoint.
    assert history_epochs(run_dir) == [0, 1, 2]
    # While it lives, a second trainer (its own PID 1 too) is refused.
    second = start(tmp_path, container=container)
    out, _ = second.communicate(timeout=900)
    assert second.returncode == 2
    (refusal,) = [line for line in out.splitlines() if line.startswith("locked:")]
    assert "is in use by process" in refusal
    kill_trainer(first, container)
    lock = read_json(run_dir / run_folder.LOCK_FILE)
    assert lock["pid"] == (1 if container else first.pid)  # left by the dead one
    restarted = start(tmp_path, container=container)
    lines = read_until(restarted, "pid")
    out = finish(restarted)
    if container:
        assert lines[-1] == "pid 1"  # the same PID as the dead holder
    # Resumed from the checkpoint at step 2, not restarted from scratch.
    assert "resumed at 2" in out and out.strip().endswith("steps 4")
    assert history_epochs(run_dir) == [0, 1, 2, 3]
    assert not (run_dir / run_folder.LOCK_FILE).exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=str)
def test_kill_while_a_resumed_run_saves_keeps_the_old_files(tmp_path, sig):
    finish(start(tmp_path, total_steps="2"))
    run_dir = tmp_path / "run"
    before = visible_files(run_dir)
    resumed = start(tmp_path, "model.keras", total_steps="4")
    read_until(resumed, "stopped")
    kill_trainer(resumed, container=False, sig=sig)
    after = visible_files(run_dir)
    for name in ("model.keras", "metadata.json"):
        assert after[name] == before[name], name
    assert keras.saving.load_model(run_dir / "model.keras").count_params() > 0
    # New checkpoints and history rows are whole files too.
    assert history_epochs(run_dir) == [0, 1, 2, 3]
    assert all(
        len(content) > 0 for name, content in after.items() if name not in before
    )
    # The only trace of the half save is a hidden temporary file, which no
    # reader takes for the model.
    assert {p.name for p in run_dir.iterdir() if "model" in p.name} <= {
        "model.keras",
        *(p.name for p in run_dir.glob(".model.*.tmp.keras")),
    }
