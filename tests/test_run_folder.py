"""One run folder, one run: the config fingerprint checked before resuming,
the run lock, a history that stays readable, and one-line errors for what
the user got wrong (keras_vit.training.run_folder)."""

import csv
import json
import os
import socket
import subprocess
import sys

import pytest
from test_training import tiny

from keras_vit.cli.main import main as cli_main
from keras_vit.errors import (
    CheckpointError,
    ConfigChangedError,
    RunFolderError,
    RunLockedError,
)
from keras_vit.training import outputs, run_folder
from keras_vit.training import trainer as training


def snapshot(folder):
    """Every file under `folder` with its bytes: what must survive a refusal."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def finished_run(tmp_path):
    """A 2-step run (checkpoints at steps 1 and 2) and its folder's files."""
    metadata = training.train(tiny(tmp_path))
    run_dir = tmp_path / "run"
    return run_dir, metadata, snapshot(run_dir)


def test_resume_with_a_changed_config_is_refused_naming_each_key(
    tmp_path, finished_run
):
    run_dir, _, before = finished_run
    changed = tiny(
        tmp_path,
        batch_size="16",
        seed="3",
        **{"optim.learning_rate": "2e-3", "optim.label_smoothing": "0.1"},
    )
    with pytest.raises(ConfigChangedError) as error:
        training.train(changed)
    message = str(error.value)
    for text in (
        str(run_dir),
        "batch_size: 8 -> 16",
        "seed: 0 -> 3",
        "optim.learning_rate: 0.001 -> 0.002",
        "optim.label_smoothing: 0.0 -> 0.1",
        "allow_config_change",
    ):
        assert text in message
    assert "\n" not in message
    # Refused before anything was written: config.json is the original one.
    assert snapshot(run_dir) == before
    assert json.loads((run_dir / "config.json").read_text())["batch_size"] == 8


def test_architecture_change_on_resume_names_the_config_change(tmp_path, finished_run):
    run_dir, _, before = finished_run
    with pytest.raises(ConfigChangedError, match="model.hidden_dim: 32 -> 64"):
        training.train(tiny(tmp_path, **{"model.hidden_dim": "64"}))
    assert snapshot(run_dir) == before


def test_allowed_change_is_recorded_and_free_keys_may_change(tmp_path, finished_run):
    run_dir, first, _ = finished_run
    # Length, logging and export settings do not change the trajectory.
    longer = training.train(tiny(tmp_path, total_steps="4", verbose="0"))
    assert longer["steps"] == 4 and longer["allowed_config_changes"] == []
    with pytest.warns(UserWarning, match="optim.learning_rate: 0.001 -> 0.002"):
        resumed = training.train(
            tiny(
                tmp_path,
                total_steps="6",
                allow_config_change="true",
                **{"optim.learning_rate": "2e-3"},
            )
        )
    (change,) = resumed["allowed_config_changes"]
    assert change["changed"] == {"optim.learning_rate": [0.001, 0.002]}
    on_disk = json.loads((run_dir / "metadata.json").read_text())
    assert on_disk["allowed_config_changes"][0]["changed"] == change["changed"]
    recorded = json.loads((run_dir / run_folder.FINGERPRINT_FILE).read_text())
    assert recorded["fingerprint"]["optim.learning_rate"] == 0.002
    assert first["steps"] == 2 and resumed["steps"] == 6


HOLD_LOCK = """
import sys, time
from keras_vit.training.run_folder import RunLock
lock = RunLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_second_trainer_stops_at_once_naming_the_first(tmp_path, finished_run):
    run_dir, _, _ = finished_run
    other = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline().strip() == "held"
        before = snapshot(run_dir)
        with pytest.raises(RunLockedError) as error:
            training.train(tiny(tmp_path, total_steps="4"))
        message = str(error.value)
        assert f"process {other.pid} on host {socket.gethostname()!r}" in message
        assert len(message.splitlines()) == 1
        assert snapshot(run_dir) == before  # nothing written, the lock kept
    finally:
        other.kill()  # SIGKILL: no cleanup runs, the kernel drops the lock
        other.wait()
    # The lock file is still there, naming a dead process; it is not a lock.
    assert (run_dir / run_folder.LOCK_FILE).exists()
    metadata = training.train(tiny(tmp_path, total_steps="4"))
    assert metadata["steps"] == 4
    assert not (run_dir / run_folder.LOCK_FILE).exists()  # released at the end


def test_lock_is_released_when_the_run_fails(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("data source went away")

    monkeypatch.setattr(training.data_lib, "class_names", broken)
    with pytest.raises(RuntimeError, match="went away"):
        training.train(tiny(tmp_path))
    assert not (tmp_path / "run" / run_folder.LOCK_FILE).exists()


def test_a_lock_file_nobody_holds_is_taken(tmp_path):
    """What a trainer killed in a container leaves: a file naming PID 1 of
    this very host (the restarted trainer's own pid there)."""
    tmp_path.joinpath(run_folder.LOCK_FILE).write_text(
        json.dumps({"pid": 1, "host": socket.gethostname()})
    )
    with run_folder.RunLock(tmp_path) as lock:
        assert lock.held
        recorded = json.loads(tmp_path.joinpath(run_folder.LOCK_FILE).read_text())
        assert recorded["pid"] == os.getpid()
        # A second lock in this process is another open file: refused too.
        with pytest.raises(RunLockedError, match=f"process {os.getpid()} on host"):
            run_folder.RunLock(tmp_path).acquire()
    assert not tmp_path.joinpath(run_folder.LOCK_FILE).exists()


def test_damaged_history_never_breaks_the_next_run(tmp_path, finished_run):
    run_dir, _, _ = finished_run
    history = run_dir / "history.csv"
    good = history.read_text().splitlines()
    # What two interleaved trainers and a kill mid-write left behind.
    history.write_text(
        "\n".join(
            [good[0], good[1], good[0], "1,0.5", "garbage,row,x", good[2], "2,0.1,"]
        )
        + "\n"
    )
    assert outputs.plot_history(history, run_dir / "curves.png") is not None
    metadata = training.train(tiny(tmp_path, total_steps="4"))
    assert (run_dir / "metadata.json").is_file() and metadata["steps"] == 4
    rows = list(csv.reader(history.open()))
    assert rows[0][0] == "epoch" and [r[0] for r in rows[1:]] == ["0", "1", "2", "3"]
    assert {len(r) for r in rows} == {len(rows[0])}


def test_read_only_run_folder_is_one_line_error(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if os.geteuid() == 0:
        # root writes through any mode bits: report the folder as read-only.
        real_access = os.access
        monkeypatch.setattr(
            run_folder.os,
            "access",
            lambda path, mode: (
                False if str(path) == str(run_dir) else real_access(path, mode)
            ),
        )
    else:
        run_dir.chmod(0o555)
    try:
        with pytest.raises(RunFolderError, match=f"'{run_dir}' is not writable"):
            training.train(tiny(tmp_path))
    finally:
        run_dir.chmod(0o755)
    assert list(run_dir.iterdir()) == []
    # A run_dir below a file cannot be created at all.
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(RunFolderError, match="cannot create run folder"):
        training.train(tiny(tmp_path, run_dir=str(blocker / "run")))
    assert blocker.read_text() == "x"


def cli_train(tmp_path, capsys, *options):
    argv = ["train", "digits", "--smoke", "--run_dir", str(tmp_path / "cli_run")]
    code = cli_main([*argv, "--verbose", "0", *options])
    return code, capsys.readouterr().err


def test_cli_turns_run_folder_errors_into_one_line(tmp_path, capsys, monkeypatch):
    code, err = cli_train(tmp_path, capsys)
    assert code == 0, err
    run_dir = tmp_path / "cli_run"
    before = snapshot(run_dir)
    code, err = cli_train(tmp_path, capsys, "--seed", "5")
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("keras-vit train: error:") and "seed: 0 -> 5" in line
    assert snapshot(run_dir) == before
    # Every checkpoint damaged: one line naming the folder and each file.
    for checkpoint in (run_dir / "checkpoints").glob("*.weights.h5"):
        checkpoint.write_bytes(b"\0" * 64)
    code, err = cli_train(tmp_path, capsys)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert "No checkpoint in" in line and str(run_dir / "checkpoints") in line
    with pytest.raises(CheckpointError):  # --traceback shows it in full
        cli_main(
            ["--traceback", "train", "digits", "--smoke", "--run_dir", str(run_dir)]
        )

    def bug(config):
        raise RuntimeError("a bug, not the user's doing")

    monkeypatch.setattr(training, "train", bug)
    with pytest.raises(RuntimeError, match="a bug"):  # keeps its traceback
        cli_train(tmp_path, capsys)


def test_train_command_turns_package_errors_into_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "keras_vit.cli", "train", "digits"]
        + ["--optim.learning_rate", "nan"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "optim.learning_rate" in proc.stderr.strip().splitlines()[-1]
