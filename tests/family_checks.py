"""Checks shared by the family parity tests (test_families.py: timm,
test_hf_families.py: transformers): a fixture folder holds a small
random-weight checkpoint and `parity.npz` with NHWC images
(`images_<h>x<w>`) and the source library's outputs for them
(`logits_<h>x<w>`), native size first."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from helpers import FLOAT32_PARITY, assert_close, assert_parity

from keras_vit.deploy import tflite
from keras_vit.models.features import feature_extractor
from keras_vit.models.lora import enable_lora, lora_layers
from keras_vit.models.quantization import quantized_copy

# Relative to max(1, max |outputs|): float32 through a different framework
# (the measured differences are below 1e-6).
PARITY = 1e-4


def parity_data(folder: Path) -> dict:
    with np.load(folder / "parity.npz") as data:
        return dict(data)


def sizes(folder: Path) -> list[tuple[int, int]]:
    """Native first, then the smaller and the larger size."""
    keys = [k.removeprefix("images_") for k in parity_data(folder) if "images" in k]
    return [tuple(int(v) for v in k.split("x")) for k in keys]


def size_cases(folders: dict[str, Path]):
    """`(name, size)` test parameters: each fixture at each of its sizes.
    Away from the native size the position table (where there is one) is
    resampled with the source's kernel, which the converted model records."""
    for name, folder in folders.items():
        native, *others = sizes(folder)
        yield pytest.param(name, native, id=f"{name}-native")
        for size in others:
            yield pytest.param(name, size, id=f"{name}-{size[0]}x{size[1]}")


def images_at(folder: Path, size) -> np.ndarray:
    return parity_data(folder)[f"images_{size[0]}x{size[1]}"]


def check(model, folder: Path, size, what: str) -> float:
    """The model's outputs (or given outputs) against the source's at
    `size`; returns max |difference|."""
    data = parity_data(folder)
    key = f"{size[0]}x{size[1]}"
    expected = data[f"logits_{key}"]
    actual = model(data[f"images_{key}"]) if callable(model) else model
    return assert_parity(np.asarray(actual), expected, expected, PARITY, what)


def check_saved_model_and_tflite(model, folder: Path, tmp_path: Path) -> dict:
    """The served SavedModel signature and the float32 `.tflite` (LiteRT's
    own signature runner) give the source's outputs at the native size."""
    size = sizes(folder)[0]
    images = images_at(folder, size)
    path = tmp_path / "saved_model"
    model.export(str(path), format="tf_saved_model", verbose=False)
    served = tf.saved_model.load(str(path)).signatures["serving_default"]
    outputs = list(served(tf.constant(images)).values())
    measured = {"saved_model": check(outputs[0].numpy(), folder, size, "SavedModel")}
    flatbuffer = tflite.convert(path, "float32")
    ops = tflite.check_builtin_only(flatbuffer)
    assert "FULLY_CONNECTED" in ops
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=flatbuffer)
    runner = interpreter.get_signature_runner("serving_default")
    (result,) = runner(**{runner.get_input_details().popitem()[0]: images}).values()
    measured["tflite"] = check(result, folder, size, "float32 .tflite")
    return measured


def check_quantize_lora_and_grids(model, fresh, images: np.ndarray) -> None:
    """int8 weights run and stay close; LoRA starts as the identity with the
    base kernels frozen; `feature_extractor` gives patch grids. `fresh` is
    a second copy of the model (LoRA changes it in place)."""
    reference = np.asarray(model(images))

    quantized = quantized_copy(model, "int8")
    kernels = [
        w for w in quantized.weights if w.path.endswith(("qkv/kernel", "fc1/kernel"))
    ]
    assert kernels and all(w.dtype == "int8" for w in kernels)
    # int8 weights: the outputs move by about a percent of their scale.
    assert_parity(quantized(images), reference, reference, 0.1, "int8")

    targets = ("qkv", "proj", "fc1", "fc2")
    # A features-only model has no head to keep trainable.
    trainable = ("head",) if "head" in [la.name for la in fresh.layers] else ()
    trainable = trainable or ("encoder_norm",)
    enable_lora(fresh, rank=2, targets=targets, trainable=trainable)
    dense = lora_layers(fresh, targets)
    assert dense and all(d.lora_enabled for d in dense)
    # LoRA starts as the identity (B = 0): the converted model's outputs.
    # Another model object and graph: summation order at most (see helpers).
    assert_close(fresh(images), reference, FLOAT32_PARITY, what="LoRA at start")
    frozen = {w.path for w in fresh.weights if not w.trainable}
    assert {f"{d.path}/kernel" for d in dense} <= frozen
    assert {w.path for w in fresh.trainable_weights} >= {
        f"{d.path}/lora_kernel_a" for d in dense
    }

    grids = feature_extractor(model, blocks=(0, -1))(images)
    patch = model.get_layer("patches").patch_size
    hidden_dim = model.get_layer("patch_encoder").hidden_dim
    height, width = images.shape[1:3]
    for grid in grids.values():
        assert grid.shape == (2, height // patch, width // patch, hidden_dim)
        assert np.all(np.isfinite(np.asarray(grid)))
