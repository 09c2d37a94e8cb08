"""A low-precision model's float32 twin (`keras_vit.models.precision`), and
the exports made from it: what a model trained under the automatic
precision on a CPU with AVX512_BF16 or AMX, or a GPU, exports as."""

import keras
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter
from helpers import (
    FLOAT32_PARITY,
    TFLITE_FLOAT32_PARITY,
    assert_parity,
    parity_bound,
)

from keras_vit.deploy.export import export_model
from keras_vit.models.hybrid import HybridViT
from keras_vit.models.precision import (
    computes_in_float32,
    float32_copy,
    low_precision_policy,
)
from keras_vit.models.preprocessing import normalize_pixels
from keras_vit.models.vit import ViT

TINY = dict(image_size=8, num_classes=4, num_channels=1, hidden_dim=16)
TINY.update(num_layers=2, num_heads=2, mlp_dim=32)


def build(kind: str, policy: str) -> keras.Model:
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy(policy)
    try:
        if kind == "hybrid":
            model = HybridViT("Ti", stem="cnn", cnn_widths=(4, 8), **TINY)
        else:
            model = ViT("Ti/4", **TINY)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    # A random head: the zero-initialised one gives all-zero logits.
    head = model.get_layer("head")
    kernel = np.random.default_rng(0).normal(0, 0.5, head.kernel.shape)
    head.kernel.assign(kernel.astype(head.kernel.dtype))
    return model


def images(n=8):
    return np.random.default_rng(1).uniform(-1, 1, (n, 8, 8, 1)).astype("float32")


@pytest.mark.parametrize("kind", ["vit", "hybrid"])
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16", "bfloat16"])
def test_the_twin_computes_in_float32_with_the_same_weights(kind, policy):
    model = build(kind, policy)
    assert not computes_in_float32(model) and low_precision_policy(model) == policy
    twin = float32_copy(model)
    assert computes_in_float32(twin) and low_precision_policy(twin) is None
    assert [w.path for w in twin.weights] == [w.path for w in model.weights]
    for a, b in zip(model.weights, twin.weights, strict=True):
        assert b.dtype == "float32"
        np.testing.assert_array_equal(np.asarray(a.numpy(), "float32"), b.numpy())
    # The model itself is unchanged.
    assert low_precision_policy(model) == policy
    x = images()
    low = np.asarray(model(x), "float32")
    exact = np.asarray(twin(x))
    # The model rounds its activations to 8 (bfloat16) or 11 (float16)
    # significant bits, over two blocks: within 5% of the largest logit
    # (measured 0.2% for float16 to 2.0% for bfloat16); the twin computes the
    # same weights in float32.
    assert np.abs(low - exact).max() <= 0.05 * np.abs(exact).max()


@pytest.mark.bfloat16
def test_the_twin_is_float32_under_a_mixed_global_policy():
    # A trainer exports while its mixed policy is still the global one.
    model = build("hybrid", "mixed_bfloat16")
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    twin = float32_copy(model)
    assert computes_in_float32(twin)
    assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"


def test_a_float32_model_is_its_own_precision():
    model = build("vit", "float32")
    assert computes_in_float32(model) and low_precision_policy(model) is None


def test_a_bfloat16_model_exports_its_twin_and_says_so(tmp_path):
    model = build("vit", "mixed_bfloat16")
    pixels = np.random.default_rng(2).uniform(0, 255, (16, 8, 8, 1)).astype("float32")
    metadata = export_model(model, "bf16", tmp_path, representative_images=pixels)
    assert metadata["trained_precision"] == "mixed_bfloat16"
    parity = metadata["parity"]
    # Every artifact matches the twin as a float32 model's do (the export
    # checks them); the twin's distance from the model is recorded.
    twin = float32_copy(model)
    normalized = normalize_pixels(pixels, metadata["preprocessing"])
    twin_logits = np.asarray(twin(normalized))
    saved = parity["saved_model"]["max_abs_diff_logits"]
    assert saved <= parity_bound(twin_logits, FLOAT32_PARITY)
    twin_vs_model = parity["float32_vs_trained"]
    # As in the test above: 5% of the largest logit.
    assert twin_vs_model["max_abs_diff_logits"] <= 0.05 * np.abs(twin_logits).max()
    # LiteRT itself runs the float32 file, on a float32 graph.
    runner = Interpreter(model_path=str(tmp_path / "bf16.tflite")).get_signature_runner(
        "serving_default"
    )
    got = runner(pixels=pixels[:2])["logits"]
    assert_parity(got, twin_logits[:2], twin_logits, TFLITE_FLOAT32_PARITY, "tflite")
    # The trained model is left as it was.
    assert low_precision_policy(model) == "mixed_bfloat16"
