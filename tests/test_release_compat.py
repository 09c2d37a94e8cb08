"""`.keras` files saved by earlier releases load with this one and compute the
same logits.

tests/fixtures/release_<version>/ was written by
scripts/make_release_fixture.py running that release's code: a tiny ViT
(LayerScale, DropPath, pre-logits) and a tiny HybridViT (ResNet-v2 stem with
StdConv2D and GroupNorm), from 0.2.0 on also a ViT with a MAP head and
register tokens; every weight random, and their logits on fixed images.

0.1.0 had a flat layout (`keras_vit.layers`, `keras_vit.blocks`); 0.2.0
recorded `keras_vit.models.layers` and friends, some of whose names were
re-exports removed since. The files load through the registered names
(`keras_vit>ClassName`), whatever module they recorded."""

import json
from pathlib import Path

import keras
import numpy as np
import pytest
from helpers import FLOAT32_PARITY, assert_parity

import keras_vit.models  # noqa: F401  registers the layers

FIXTURES = Path(__file__).parent / "fixtures"
CASES = [
    ("0.1.0", "vit"),
    ("0.1.0", "hybrid"),
    ("0.2.0", "vit"),
    ("0.2.0", "hybrid"),
    ("0.2.0", "vit_map"),
]


@pytest.mark.parametrize("release,name", CASES)
def test_release_model_loads_with_the_same_outputs(release, name):
    folder = FIXTURES / f"release_{release}"
    assert json.loads((folder / "source.json").read_text())["keras_vit"] == release
    expected = np.load(folder / "expected.npz")
    images, logits = expected[f"{name}_images"], expected[f"{name}_logits"]
    model = keras.saving.load_model(folder / f"{name}.keras", safe_mode=True)
    layer_modules = {type(layer).__module__ for layer in model.layers}
    assert any(m.startswith("keras_vit.models.") for m in layer_modules)
    # Random weights give each image its own logits: a model that ignored its
    # input or its weights could not match.
    assert np.ptp(logits, axis=0).min() > 1e-3
    out = np.asarray(model(images, training=False))
    # Same float32 network, possibly on another CPU and TF build than the one
    # that wrote the fixture: equal up to summation order (see FLOAT32_PARITY).
    assert_parity(out, logits, logits, FLOAT32_PARITY, f"release {release} {name}")


def test_every_release_fixture_is_tested():
    """A new release folder without a case here would go unchecked."""
    folders = {p.name.removeprefix("release_") for p in FIXTURES.glob("release_*")}
    assert folders == {release for release, _ in CASES}
    for release in folders:
        saved = {p.stem for p in (FIXTURES / f"release_{release}").glob("*.keras")}
        assert saved == {name for r, name in CASES if r == release}
