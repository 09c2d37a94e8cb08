"""What every `keras-vit` command shares: the one-line user error, model
and metadata loading, the preprocessing a command applies."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Subcommands whose options belong to the code they run, passed through as is.
PASS_THROUGH = ("train", "bench")
# keras_vit's recipes normalise [0, 1] pixels as (x - 0.5) / 0.5.
DEFAULT_MEAN = 0.5
DEFAULT_STD = 0.5


class UsageError(Exception):
    """A mistake in what the user asked for: reported in one line, exit 2."""


# Errors caused by what the user passed in (files, values), not by a bug.
USER_ERRORS = (UsageError, ValueError, FileNotFoundError, IsADirectoryError)


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def existing_path(path: str, what: str) -> Path:
    result = Path(path)
    if not result.exists():
        raise UsageError(f"{what} {path!r} does not exist")
    return result


def load_keras_model(path: str):
    import keras

    import keras_vit.models  # noqa: F401  registers the layers

    source = existing_path(path, "model")
    if source.suffix != ".keras":
        raise UsageError(
            f"model {path!r} is not a .keras file; this command takes a model "
            "saved with model.save('name.keras')"
        )
    return keras.saving.load_model(source)


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
    model's metadata.json, then keras_vit's recipe default (x - 0.5) / 0.5."""
    from keras_vit.models import preprocessing as preprocessing_lib

    given = dict(model_metadata(model_path).get("preprocessing") or {})
    if not given and mean is None and std is None:
        print(
            f"note: no metadata.json beside {model_path}; normalising pixels as "
            f"(x / 255 - {DEFAULT_MEAN}) / {DEFAULT_STD} (set --mean / --std)"
        )
    given.setdefault("mean", DEFAULT_MEAN)
    given.setdefault("std", DEFAULT_STD)
    if mean is not None:
        given["mean"] = mean
    if std is not None:
        given["std"] = std
    return preprocessing_lib.normalize_preprocessing(model, given)


def split_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]
