"""Quantization-aware fine-tuning in the trainer (`TrainConfig.qat`).

With `qat=True` the trainer fits a `keras_vit.models.qat.quantize_aware`
copy of the recipe's model (usually `model.pretrained`, a trained float
model), evaluates that copy (int8 rounding included), writes its float
weights back into the ordinary model that `model.keras` holds, and writes
`<run_dir>/model_qat_int8.tflite`: the full-int8 file converted with the
trained ranges, and its top-1 agreement with the QAT model on the held-out
images.
"""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np

from keras_vit.deploy.qat import int8_tflite
from keras_vit.deploy.tflite import Runner
from keras_vit.files import write_atomic
from keras_vit.models.preprocessing import normalize_pixels
from keras_vit.models.qat import copy_float_weights, quantize_aware

TFLITE_FILE = "model_qat_int8.tflite"


def wrap(model: keras.Model, config) -> keras.Model:
    """The QAT copy of `model` when `config.qat`, else `model` itself."""
    return quantize_aware(model) if config.qat else model


def finish(model: keras.Model, qat_model: keras.Model) -> None:
    """Writes the fine-tuned float weights back into the ordinary `model`."""
    copy_float_weights(qat_model, model)


def write_tflite(
    qat_model: keras.Model,
    run_dir: Path,
    labels: list[str],
    preprocessing: dict,
    representative: np.ndarray,
    held_out: np.ndarray,
) -> dict:
    """Converts, checks agreement on `held_out` raw pixels and writes the
    full-int8 file; returns its path, size and agreement for the metadata."""
    content = int8_tflite(qat_model, representative, preprocessing, labels)
    path = Path(run_dir) / TFLITE_FILE
    write_atomic(path, lambda p: p.write_bytes(content))
    keras_top1 = np.argmax(
        qat_model.predict(normalize_pixels(held_out, preprocessing), verbose=0), -1
    )
    tflite_top1 = np.argmax(Runner(content)(held_out)["logits"], -1)
    return {
        "path": str(path),
        "bytes": len(content),
        "top1_agreement_with_qat_model": float(np.mean(keras_top1 == tflite_top1)),
        "images": len(held_out),
    }
