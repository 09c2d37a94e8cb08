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


def test_summary_names_every_file_and_the_commands():
    metadata = {
        "name": "digits",
        "accuracy": 0.98333,
        "run_dir": "runs/digits",
        "paths": {"model": "runs/digits/model.keras"},
        "export": {
            "name": "vit_digits",
            "files": {"vit_digits/3": 1, "vit_digits.tflite": 2},
        },
    }
    lines = run_summary(metadata, "saved_models").splitlines()
    assert lines[0] == "accuracy=0.9833 run_dir=runs/digits"
    assert lines[1:] == [
        "  model       runs/digits/model.keras",
        "  metadata    runs/digits/metadata.json",
        "  SavedModel  saved_models/vit_digits/3",
        "  TFLite      saved_models/vit_digits.tflite",
        "  predict     keras-vit predict saved_models/vit_digits IMAGE.png",
        '  serve       docker run --rm -p 8501:8501 -v "$PWD/saved_models/vit_digits:'
        '/models/vit_digits" -e MODEL_NAME=vit_digits tensorflow/serving',
    ]
    del metadata["export"]
    assert run_summary(metadata).splitlines()[-2:] == [
        "  predict     keras-vit predict runs/digits/model.keras IMAGE.png",
        "  export      keras-vit export runs/digits/model.keras --name digits",
    ]


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
        [sys.executable, str(REPO / "recipes" / "train.py"), "digits", "--smoke"]
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
    # One line per epoch after Keras' "Epoch i/n", no progress bar redraws.
    epochs = [i for i, line in enumerate(lines) if re.fullmatch(r"Epoch \d/2", line)]
    assert len(epochs) == 2
    for i in epochs:
        assert re.match(r"1/1 - \S+ - \S+/step - accuracy: ", lines[i + 1])
    assert "\r" not in proc.stdout and "\x1b[" not in proc.stdout
    summary = lines[-5:]
    assert re.fullmatch(
        rf"accuracy=\d\.\d{{4}} run_dir={re.escape(str(run_dir))}", summary[0]
    )
    assert summary[1] == f"  model       {run_dir / 'model.keras'}"
    assert summary[2] == f"  metadata    {run_dir / 'metadata.json'}"
    assert summary[3].startswith("  predict     keras-vit predict ")
    assert (run_dir / "model.keras").is_file() and (run_dir / "metadata.json").is_file()
