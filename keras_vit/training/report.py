"""What a training run shows its user: Keras' progress display suited to where
the output goes, and the closing summary (held-out accuracy, where the model
and each export were written, the commands that predict with or serve them).
Shared by `keras-vit train` and recipes/train.py."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path, PurePath

IMAGE = "IMAGE.png"


def progress_verbosity(overrides: dict, stream=None) -> dict:
    """`overrides` with `verbose` chosen for `stream` (default stdout) unless
    the user set it: Keras' progress bar (1) in a terminal; elsewhere (a log
    file, CI, a pipe) one line per epoch (2), as the bar redraws itself with
    control characters that a file keeps."""
    if "verbose" in overrides:
        return overrides
    stream = sys.stdout if stream is None else stream
    interactive = bool(getattr(stream, "isatty", lambda: False)())
    return {**overrides, "verbose": "1" if interactive else "2"}


def run_summary(metadata: dict, export_root: str | PurePath = "saved_models") -> str:
    """The lines that end a run, from `train()`'s metadata: the held-out
    accuracy, the model and export paths, and commands that use them."""
    paths = metadata.get("paths", {})
    model = paths.get("model", str(Path(metadata["run_dir"]) / "model.keras"))
    lines = [
        f"accuracy={metadata['accuracy']:.4f} run_dir={metadata['run_dir']}",
        f"  model       {model}",
        f"  metadata    {Path(metadata['run_dir']) / 'metadata.json'}",
    ]
    export = metadata.get("export")
    if not isinstance(export, dict) or not export.get("files"):
        lines += [
            f"  predict     keras-vit predict {_quote(model)} {IMAGE}",
            f"  export      keras-vit export {_quote(model)} --name "
            f"{metadata.get('name', 'model')}",
        ]
        return "\n".join(lines)
    root = Path(export_root)
    name = export["name"]
    for file in export["files"]:
        kind = "TFLite" if file.endswith(".tflite") else "SavedModel"
        lines.append(f"  {kind:<11} {root / file}")
    lines += [
        f"  predict     keras-vit predict {_quote(root / name)} {IMAGE}",
        f"  serve       {serve_command(root, name)}",
    ]
    return "\n".join(lines)


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
