"""`.keras` files saved by the previous release (0.1.0, the flat layout before
the subpackages) load with this one and compute the same logits.

tests/fixtures/release_0.1.0/ was written by scripts/make_release_fixture.py
running the 0.1.0 code: a tiny ViT (LayerScale, DropPath, pre-logits) and a
tiny HybridViT (ResNet-v2 stem with StdConv2D and GroupNorm), every weight
random, and their logits on fixed images."""

import json
from pathlib import Path

import keras
import numpy as np
import pytest
from helpers import FLOAT32_PARITY, assert_parity

import keras_vit.models  # noqa: F401  registers the layers

RELEASE = Path(__file__).parent / "fixtures" / "release_0.1.0"


@pytest.mark.parametrize("name", ["vit", "hybrid"])
def test_previous_release_model_loads_with_the_same_outputs(name):
    assert json.loads((RELEASE / "source.json").read_text())["keras_vit"] == "0.1.0"
    expected = np.load(RELEASE / "expected.npz")
    images, logits = expected[f"{name}_images"], expected[f"{name}_logits"]
    # The file names its layers by the old modules (keras_vit.layers,
    # keras_vit.blocks, keras_vit.hybrid); the registered names resolve them.
    model = keras.saving.load_model(RELEASE / f"{name}.keras", safe_mode=True)
    layer_modules = {type(layer).__module__ for layer in model.layers}
    assert any(m.startswith("keras_vit.models.") for m in layer_modules)
    # Random weights give each image its own logits: a model that ignored its
    # input or its weights could not match.
    assert np.ptp(logits, axis=0).min() > 1e-3
    out = np.asarray(model(images, training=False))
    # Same float32 network, possibly on another CPU and TF build than the one
    # that wrote the fixture: equal up to summation order (see FLOAT32_PARITY).
    assert_parity(out, logits, logits, FLOAT32_PARITY, f"release 0.1.0 {name}")
