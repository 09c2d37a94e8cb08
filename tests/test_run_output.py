"""What a user sees: the recipes and `keras-vit` keep TensorFlow's native
logs down, show one line per epoch when the output is not a terminal, and end
with a summary of what was written and how to use it."""

import io
import os
import re
import subprocess
import sys

import pytest
from helpers import REPO

from keras_vit.logs import started_as_command
from keras_vit.training.report import progress_verbosity, run_summary

# Printed by TensorFlow as it loads, whatever TF_CPP_MIN_LOG_LEVEL says.
ONEDNN_NOTICE = re.compile(r"^(WARNING: All log messages before absl|I\d{4} .*oneDNN)")
NATIVE_LOG = re.compile(r"^[IWEF]\d{4} ")
LINE_BUDGET = 60


def user_env() -> dict:
    """The environment of a user who did not set TensorFlow's log level (the
    test process sets it, see conftest.py)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return {**env, "PYTHONPATH": str(REPO)}


def native_lines(text: str) -> list[str]:
    """TensorFlow's native log lines other than its load-time oneDNN notice."""
    return [
        line
        for line in text.splitlines()
        if NATIVE_LOG.match(line) and not ONEDNN_NOTICE.match(line)
    ]


@pytest.mark.parametrize(
    "argv0, orig_argv, expected",
    [
        ("/venv/bin/keras-vit", ["/venv/bin/python", "/venv/bin/keras-vit"], True),
        ("-m", ["python", "-m", "keras_vit.cli", "info", "B/16"], True),
        ("-m", ["python", "-X", "dev", "-m", "keras_vit.cli"], True),
        ("-m", ["python", "-m", "pytest", "tests"], False),
        ("-c", ["python", "-c", "import keras_vit"], False),
        ("train.py", ["python", "train.py", "-m", "keras_vit.cli"], False),
    ],
)
def test_only_the_command_quiets_tensorflow(argv0, orig_argv, expected):
    assert started_as_command(argv0, orig_argv) is expected


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_a_bar_in_a_terminal_and_one_line_per_epoch_elsewhere():
    assert progress_verbosity({}, Terminal())["verbose"] == "1"
    assert progress_verbosity({"a": "1"}, io.StringIO()) == {"a": "1", "verbose": "2"}
    assert progress_verbosity({"verbose": "0"}, Terminal()) == {"verbose": "0"}


def test_summary_names_every_file_and_what_to_run_next():
    metadata = {
        "name": "digits",
        "accuracy": 0.98333,
        "run_dir": "runs/digits",
        "paths": {
            "model": "runs/digits/model.keras",
            "history": "runs/digits/history.csv",
            "curves": "runs/digits/curves.png",
            "tensorboard": "runs/digits/tensorboard",
        },
        "export": {
            "name": "vit_digits",
            "version": 3,
            "files": {"vit_digits/3": 1, "vit_digits.tflite": 2},
        },
    }
    lines = run_summary(metadata, "saved_models").splitlines()
    assert lines[0] == "digits: done, held-out accuracy 0.9833. It made:"
    made = [line.split()[0] for line in lines[1 : lines.index("Next:")]]
    assert made == [
        "runs/digits/model.keras",
        "runs/digits/metadata.json",
        "runs/digits/history.csv",
        "runs/digits/curves.png",
        "saved_models/vit_digits/3",
        "saved_models/vit_digits.tflite",
    ]
    assert lines[lines.index("Next:") + 1 :] == [
        "  keras-vit evaluate runs/digits/model.keras",
        "  keras-vit visualize runs/digits/model.keras IMAGE.png",
        "  keras-vit predict saved_models/vit_digits IMAGE.png",
        '  docker run --rm -p 8501:8501 -v "$PWD/saved_models/vit_digits:'
        '/models/vit_digits" -e MODEL_NAME=vit_digits tensorflow/serving',
        "  tensorboard --logdir runs/digits/tensorboard",
    ]
    del metadata["export"]
    assert run_summary(metadata).splitlines()[-3:-1] == [
        "  keras-vit predict runs/digits/model.keras IMAGE.png",
        "  keras-vit export runs/digits/model.keras --name digits",
    ]


def test_summary_evaluates_a_folder_run_on_its_own_held_out_split():
    from keras_vit.training.config import DataConfig

    metadata = {"name": "mine", "accuracy": 0.5, "run_dir": "runs/mine"}
    data = DataConfig(source="folder", path="my images", eval_split="test")
    lines = run_summary(metadata, data=data).splitlines()
    assert (
        "  keras-vit evaluate runs/mine/model.keras --data folder "
        "--data-path 'my images' --split test"
    ) in lines


def test_command_hides_tensorflows_info_lines(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "keras_vit.cli", "info", "Ti/4", "--image-size", "8"],
        cwd=tmp_path,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "parameters:" in proc.stdout
    assert native_lines(proc.stdout + proc.stderr) == []


@pytest.mark.slow
def test_smoke_run_output_is_short_and_ends_with_the_summary(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "keras_vit.cli", "train", "digits", "--smoke"]
        + ["--run_dir", str(run_dir)],
        cwd=tmp_path,
        env=user_env(),
        stdout=subprocess.PIPE,  # not a terminal
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert len(lines) < LINE_BUDGET, proc.stdout
    assert native_lines(proc.stdout) == []
    # One short line per interval (no evaluation in smoke mode), no progress
    # bar redraws.
    steps = [line for line in lines if re.match(r"digits: step \d/2  loss ", line)]
    assert len(steps) == 2, proc.stdout
    assert "\r" not in proc.stdout and "\x1b[" not in proc.stdout
    made = lines.index(next(line for line in lines if line.endswith("It made:")))
    assert re.fullmatch(
        r"digits: done, held-out accuracy \d\.\d{4}\. It made:", lines[made]
    )
    assert lines[made + 1].split()[0] == str(run_dir / "model.keras")
    assert lines[made + 2].split()[0] == str(run_dir / "metadata.json")
    assert f"  keras-vit evaluate {run_dir / 'model.keras'}" in lines
    assert (run_dir / "model.keras").is_file() and (run_dir / "metadata.json").is_file()
