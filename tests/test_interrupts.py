"""Ctrl-C (SIGINT) and SIGTERM during `keras-vit export` and `keras-vit
train`: one line, exit status 128 + the signal (130 for Ctrl-C), and nothing
half-written, whichever step the signal lands in."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from helpers import read_json

from keras_vit.cli.main import main as cli_main
from keras_vit.models.vit import ViT
from keras_vit.training import run_folder

TESTS = str(Path(__file__).parent)
# Runs `keras-vit ARGV...`; `MODULE:FUNCTION` (if not "") first prints
# "at FUNCTION" when that function is called, then sleeps `PAUSE` seconds
# (0: none, the signal lands inside the function's own work) and runs it.
CLI = r"""
import importlib, sys, time
target, pause, argv = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
from keras_vit.cli.main import main
if target:
    module_name, name = target.split(":")
    module = importlib.import_module(module_name)
    original = getattr(module, name)
    def marked(*args, **kwargs):
        print("at", name, flush=True)
        time.sleep(pause)
        return original(*args, **kwargs)
    setattr(module, name, marked)
sys.exit(main(argv))
"""
RECIPE = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_training import tiny

def get_config():
    return tiny(Path({tmp!r}), total_steps=4)
"""


def run_cli(argv, target="", pause=0.0, sig=signal.SIGINT):
    """Runs the CLI in a subprocess; with a target, sends `sig` when the
    target is reached. Returns (exit status, stderr lines)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, *sys.path])}
    process = subprocess.Popen(
        [sys.executable, "-c", CLI, target, str(pause), *map(str, argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    if target:
        for line in process.stdout:
            if line.startswith("at "):
                process.send_signal(sig)
                break
    _, err = process.communicate(timeout=900)
    return process.returncode, [line for line in err.splitlines() if line.strip()]


def assert_one_interrupt_line(status, err, command, sig=signal.SIGINT):
    assert status == 128 + sig, err[-20:]
    assert not any("Traceback" in line for line in err), err[-40:]
    ours = [line for line in err if line.startswith(f"keras-vit {command}:")]
    assert ours == [err[-1]], err[-5:]
    assert f"interrupted ({signal.Signals(sig).name})" in err[-1]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    keras.utils.set_random_seed(0)
    model = ViT(
        "Ti/4",
        image_size=8,
        num_classes=4,
        num_channels=1,
        hidden_dim=16,
        num_layers=1,
        num_heads=2,
        mlp_dim=32,
    )
    model.save(folder / "tiny.keras")
    pixels = np.random.default_rng(0).uniform(0, 255, (16, 8, 8, 1))
    np.save(folder / "calibration.npy", pixels.astype("float32"))
    return folder


def export_argv(model_file, root):
    return [
        "export",
        model_file / "tiny.keras",
        "--name",
        "tiny",
        "--root",
        root,
        "--mean",
        "0",
        "--std",
        "1",
        "--tflite",
        "float32,int8",
        "--representative",
        model_file / "calibration.npy",
    ]


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize(
    "target",
    [
        "keras_vit.deploy.export:write_saved_model",
        "keras_vit.deploy.tflite:convert",
        "keras_vit.deploy.export:_stage_latest",
    ],
)
def test_ctrl_c_during_export_work_leaves_no_file(tmp_path, model_file, target):
    root = tmp_path / "exports"
    status, err = run_cli(export_argv(model_file, root), target)
    assert_one_interrupt_line(status, err, "export")
    assert "published whole or not at all" in err[-1]
    assert files_under(root) == []  # no version, no partial, no reservation


def test_sigterm_during_publication_finishes_the_version(tmp_path, model_file):
    root = tmp_path / "exports"
    target = "keras_vit.deploy.export:publish_staged"
    status, err = run_cli(export_argv(model_file, root), target, 2.0, signal.SIGTERM)
    assert_one_interrupt_line(status, err, "export", signal.SIGTERM)
    # The signal waited for the publication: the whole version is there.
    metadata = read_json(root / "tiny" / "metadata.json")
    for name, size in metadata["files"].items():
        path = root / name
        assert path.exists(), name
        if path.is_file():
            assert path.stat().st_size == size, name
    assert (root / "tiny.keras").is_file()
    assert not [p for p in (root / "tiny").iterdir() if p.name.startswith(".")]


def test_an_absorbed_ctrl_c_still_exits_130(monkeypatch, capsys):
    """An interrupt that something on the way swallowed (TensorFlow calls
    back into Python from C++, where a KeyboardInterrupt can be lost) still
    ends the command as interrupted, not as a success."""

    def swallowing_export(args):
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            pass
        return 0

    # The package re-exports `main`, which hides the module of that name.
    monkeypatch.setattr(
        sys.modules["keras_vit.cli.main"], "cmd_export", swallowing_export
    )
    status = cli_main(["export", "x.keras", "--name", "x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 130
    assert err == [
        "keras-vit export: interrupted (SIGINT); a version is published "
        "whole or not at all; rerun to export."
    ]


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "tiny_recipe.py"
    path.write_text(RECIPE.format(tests=TESTS, tmp=str(tmp_path)))
    return path


def visible_files(run_dir: Path) -> list[str]:
    return sorted(
        str(p.relative_to(run_dir))
        for p in run_dir.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.parts)
    )


@pytest.mark.parametrize(
    ("target", "pause", "sig"),
    [
        ("keras_vit.training.checkpoints:save_checkpoint", 0.0, signal.SIGINT),
        ("keras_vit.training.trainer:write_outputs", 0.0, signal.SIGTERM),
    ],
    ids=["during-checkpoint", "during-outputs"],
)
def test_interrupted_train_resumes_when_rerun(tmp_path, recipe, target, pause, sig):
    status, err = run_cli(["train", recipe], target, pause, sig)
    assert_one_interrupt_line(status, err, "train", sig)
    assert "resume from the last checkpoint" in err[-1]
    run_dir = tmp_path / "run"
    manifest = run_dir / "checkpoints" / "checkpoints.json"
    entries = read_json(manifest)["checkpoints"] if manifest.exists() else []
    listed = {entry["file"] for entry in entries}
    on_disk = {p.name for p in (run_dir / "checkpoints").glob("ckpt-*")}
    assert on_disk == listed  # every visible checkpoint is a listed, whole one
    assert not (run_dir / "model.keras").exists()
    assert not (run_dir / run_folder.LOCK_FILE).exists()  # released on the way out
    status, err = run_cli(["train", recipe])
    assert status == 0, err[-20:]
    assert read_json(run_dir / "metadata.json")["steps"] == 4
    history = run_folder.read_history(run_dir / "history.csv")
    assert [int(row["epoch"]) for row in history] == [0, 1, 2, 3]
    assert "model.keras" in visible_files(run_dir)
