"""What a training run shows its user: the progress display suited to where
the output goes, and the closing summary (held-out accuracy, the files the
run made, the commands to run next)."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path, PurePath

import keras

IMAGE = "IMAGE.png"


def progress_verbosity(overrides: dict, stream=None) -> dict:
    """`overrides` with `verbose` chosen for `stream` (default stdout) unless
    the user set it: Keras' progress bar (1) in a terminal; elsewhere (a log
    file, CI, a pipe) one short line per evaluation (2, `StepLines`), as the
    bar redraws itself with control characters that a file keeps."""
    if "verbose" in overrides:
        return overrides
    stream = sys.stdout if stream is None else stream
    interactive = bool(getattr(stream, "isatty", lambda: False)())
    return {**overrides, "verbose": "1" if interactive else "2"}


class StepLines(keras.callbacks.Callback):
    """One line at each held-out evaluation (every `eval_every` intervals of
    `steps_per_epoch` steps; each interval when 0) and at the last step: the
    step, the training loss and accuracy, the held-out accuracy, the time so
    far."""

    def __init__(
        self, name: str, total_steps: int, steps_per_epoch: int, eval_every: int
    ):
        super().__init__()
        self.name = name
        self.total_steps = total_steps
        self.steps_per_epoch = steps_per_epoch
        self.eval_every = eval_every
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        step = (epoch + 1) * self.steps_per_epoch
        shown = not self.eval_every or (epoch + 1) % self.eval_every == 0
        if not shown and step < self.total_steps:
            return
        parts = [f"{self.name}: step {step}/{self.total_steps}"]
        for key in ("loss", "accuracy"):
            if key in logs:
                parts.append(f"{key} {float(logs[key]):.4f}")
        if "val_accuracy" in logs:
            parts.append(f"held-out accuracy {float(logs['val_accuracy']):.4f}")
        parts.append(f"({time.perf_counter() - self.started:.0f} s)")
        print("  ".join(parts), flush=True)


def run_summary(
    metadata: dict, export_root: str | PurePath = "saved_models", data=None
) -> str:
    """The lines that end a run, from `train()`'s metadata: the held-out
    accuracy, each file the run made, and the commands that use them.
    `data` (the run's DataConfig) makes the `evaluate` command point at the
    run's own held-out split."""
    run_dir = Path(metadata["run_dir"])
    paths = metadata.get("paths", {})
    model = paths.get("model", str(run_dir / "model.keras"))
    name = metadata.get("name", "model")
    made = [
        (model, "the trained model"),
        (str(run_dir / "metadata.json"), "accuracy, labels, preprocessing"),
    ]
    if paths.get("history"):
        made.append((paths["history"], "loss and accuracy per interval"))
    if paths.get("curves"):
        made.append((paths["curves"], "the same, drawn"))
    export = metadata.get("export")
    exported = isinstance(export, dict) and export.get("files")
    root = Path(export_root)
    if exported:
        version = str(export.get("version"))
        made.append((str(root / export["name"] / version), "SavedModel (TF Serving)"))
        made += [
            (str(root / file), "TFLite")
            for file in export["files"]
            if file.endswith(".tflite")
        ]
    width = max(len(path) for path, _ in made) + 2
    lines = [f"{name}: done, held-out accuracy {metadata['accuracy']:.4f}. It made:"]
    lines += [f"  {path:<{width}}{what}" for path, what in made]
    lines.append("Next:")
    lines.append(f"  keras-vit evaluate {_quote(model)}{_data_flags(data)}")
    lines.append(f"  keras-vit visualize {_quote(model)} {IMAGE}")
    if exported:
        lines.append(f"  keras-vit predict {_quote(root / export['name'])} {IMAGE}")
        lines.append(f"  {serve_command(root, export['name'])}")
    else:
        lines.append(f"  keras-vit predict {_quote(model)} {IMAGE}")
        lines.append(f"  keras-vit export {_quote(model)} --name {name}")
    if paths.get("tensorboard"):
        lines.append(f"  tensorboard --logdir {_quote(paths['tensorboard'])}")
    return "\n".join(lines)


def _data_flags(data) -> str:
    """`evaluate`'s options for the run's held-out split (none for the
    digits, its default)."""
    if data is None or data.source == "digits":
        return ""
    flags = f" --data {data.source}"
    if data.path:
        flags += f" --data-path {_quote(data.path)}"
    if data.eval_split != "val":
        flags += f" --split {_quote(data.eval_split)}"
    return flags


def serve_command(root: str | PurePath, name: str) -> str:
    """TF Serving's container on the model folder `<root>/<name>` (which holds
    the numbered versions), REST on port 8501."""
    folder = Path(root) / name
    host = str(folder) if folder.is_absolute() else f"$PWD/{folder.as_posix()}"
    return (
        f'docker run --rm -p 8501:8501 -v "{host}:/models/{name}" '
        f"-e MODEL_NAME={name} tensorflow/serving"
    )


def _quote(path) -> str:
    return shlex.quote(str(path))
