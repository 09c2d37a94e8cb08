"""Reading what `keras_vit.export_model` wrote, for `predict`: the metadata
(labels and preprocessing) and the exported graphs, with one ValueError
naming the file for anything that is missing, damaged or not keras_vit's."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError


def read_metadata(path: Path, metadata, find_metadata):
    """`(metadata, labels, preprocessing)`; a file that is not JSON or lacks
    either is a ValueError naming it."""
    where = "the metadata given"
    if metadata is None:
        metadata = find_metadata(path)
    if not isinstance(metadata, dict):
        where = str(metadata)
        try:
            metadata = json.loads(Path(metadata).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{where!r} is not valid JSON: {error}") from None
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    pre = metadata.get("preprocessing") if isinstance(metadata, dict) else None
    if not isinstance(labels, list) or not labels or not isinstance(pre, dict):
        raise ValueError(
            f"{where!r} has no {'labels' if isinstance(pre, dict) else 'preprocessing'}"
            " list/dict as keras_vit.export_model writes it; export the model "
            "again or pass metadata= with 'labels' and 'preprocessing'."
        )
    files = metadata.get("files")
    if path.suffix == ".tflite" and isinstance(files, dict) and files:
        # The metadata found beside a .tflite file must be its own export's:
        # a file of another export (or renamed) would be read with another
        # model's labels and preprocessing.
        if path.name not in files:
            ours = sorted(f for f in files if f.endswith(".tflite"))
            raise ValueError(
                f"{str(path)!r} is not one of the files {where!r} describes "
                f"(its .tflite files: {ours}): it belongs to another export or "
                "was renamed; pass metadata= with its own labels and "
                "preprocessing."
            )
    return metadata, labels, pre


def run_exported(path: Path, pixels: np.ndarray, pre: dict) -> dict:
    """The outputs of a SavedModel folder or `.tflite` file on `pixels`; a file
    that cannot be loaded, or is not as keras_vit exports it, is a ValueError."""
    return exported_runner(path, pre)(pixels)


def exported_runner(path: Path, pre: dict):
    """A function from a pixel batch to the outputs of the SavedModel folder
    or `.tflite` file at `path`, loaded once (`predict` calls it once a
    batch); errors as `run_exported`."""
    kind = "SavedModel" if path.is_dir() else ".tflite file"
    with _as_value_error(path, kind):
        if path.is_dir():
            signatures = tf.saved_model.load(str(path)).signatures
            if "serving_default" not in signatures:
                raise ValueError("it has no serving_default signature")
            serve = signatures["serving_default"]

            def run(pixels):
                return serve(pixels=tf.constant(pixels))

        else:
            from keras_vit.deploy.tflite import Runner

            run = Runner(path, pixel_scale=pre["pixel_scale"])

    def checked(pixels):
        with _as_value_error(path, kind):
            return run(pixels)

    return checked


@contextlib.contextmanager
def _as_value_error(path: Path, kind: str):
    try:
        yield
    except (
        ValueError,
        TypeError,
        KeyError,
        OSError,
        RuntimeError,
        DecodeError,
        tf.errors.OpError,
    ) as error:
        if isinstance(error, tf.errors.InvalidArgumentError):
            raise  # the graph's own input checks, already one clear line
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(
            f"cannot run {kind} {str(path)!r} as keras_vit exports it (damaged, or "
            f"not written by keras_vit.export_model?): {first[:300]}"
        ) from None
