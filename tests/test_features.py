"""`feature_extractor`: per-block patch-token grids and sequences equal to
the full model's intermediate values, for ViT and HybridViT."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import FLOAT32_PARITY, assert_close

import keras_vit


def full_sequences(model, images):
    """Every block's output on all tokens, computed layer by layer (the
    model's own last block keeps only the class token)."""
    x = model.get_layer("patch_encoder")(model.get_layer("patches")(images))
    outputs = []
    for i in range(sum(layer.name.startswith("block_") for layer in model.layers)):
        x = model.get_layer(f"block_{i}")(x)
        outputs.append(np.asarray(x))
    return outputs


@pytest.fixture(scope="module")
def vit12():
    keras.utils.set_random_seed(0)
    return keras_vit.ViT(
        "Ti/16", 224, 10, hidden_dim=32, num_layers=12, num_heads=2, mlp_dim=64
    )


def test_class_token_vit_grids_equal_full_sequence_values(vit12):
    images = np.random.default_rng(0).standard_normal((2, 224, 224, 3))
    images = images.astype("float32")
    assert vit12.get_layer("block_11").output.shape == (None, 1, 32)
    features = keras_vit.feature_extractor(vit12, blocks=(2, 5, 8, -1))
    out = features(images)
    assert sorted(out) == ["block_11", "block_2", "block_5", "block_8"]
    reference = full_sequences(vit12, images)
    for i in (2, 5, 8, 11):
        grid = np.asarray(out[f"block_{i}"])
        assert grid.shape == (2, 14, 14, 32)
        expected = reference[i][:, 1:].reshape(2, 14, 14, 32)
        # Same ops on the same inputs in another graph: float32 reassociation.
        assert_close(grid, expected, FLOAT32_PARITY)


def test_tokens_with_and_without_prefix(vit12):
    images = np.random.default_rng(1).standard_normal((1, 224, 224, 3))
    images = images.astype("float32")
    reference = full_sequences(vit12, images)[3]
    with_prefix = keras_vit.feature_extractor(
        vit12, blocks=3, output="tokens", include_prefix=True
    )(images)["block_3"]
    without = keras_vit.feature_extractor(vit12, blocks=[3], output="tokens")(images)
    assert_close(with_prefix, reference, FLOAT32_PARITY)
    assert_close(without["block_3"], reference[:, 1:], FLOAT32_PARITY)


def test_last_block_shortcut_kept_when_last_block_not_requested(vit12):
    features = keras_vit.feature_extractor(vit12, blocks=(0, 1))
    names = {layer.name for layer in features.layers}
    assert "block_2" not in names and "block_11" not in names


def test_hybrid_grid(tmp_path):
    model = keras_vit.HybridViT(
        "Ti",
        64,
        3,
        stem=(1, 1),
        stem_width=8,
        norm_groups=4,
        hidden_dim=16,
        num_layers=2,
        num_heads=2,
        mlp_dim=32,
    )
    images = np.random.default_rng(2).standard_normal((2, 64, 64, 3))
    images = images.astype("float32")
    features = keras_vit.feature_extractor(model, blocks=(0, -1))
    out = features(images)
    stem = keras.Model(model.input, model.get_layer("patches").output)
    x = model.get_layer("patch_encoder")(stem(images))
    for i in range(2):
        x = model.get_layer(f"block_{i}")(x)
        expected = np.asarray(x)[:, 1:].reshape(2, 8, 8, 16)
        assert_close(out[f"block_{i}"], expected, FLOAT32_PARITY)


def test_saves_reloads_and_exports(vit12, tmp_path):
    features = keras_vit.feature_extractor(vit12, blocks=(5, -1))
    images = np.random.default_rng(3).standard_normal((1, 224, 224, 3))
    images = images.astype("float32")
    expected = {k: np.asarray(v) for k, v in features(images).items()}
    features.save(tmp_path / "features.keras")
    reloaded = keras.saving.load_model(tmp_path / "features.keras", safe_mode=True)
    for name, value in reloaded(images).items():
        np.testing.assert_array_equal(value, expected[name])
    features.export(str(tmp_path / "saved"), verbose=False)
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    for name, value in loaded.serve(images).items():
        # The SavedModel's graph (grappler's fusions) against eager Keras.
        assert_close(value, expected[name], FLOAT32_PARITY)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(blocks=12), "Block index 12 is out of range for 12 blocks"),
        (dict(blocks=(-13,)), "Block index -13 is out of range"),
        (dict(output="map"), "'grid' or 'tokens', got 'map'"),
        (dict(include_prefix=True), "include_prefix=True` needs output='tokens'"),
    ],
)
def test_bad_arguments(vit12, kwargs, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.feature_extractor(vit12, **kwargs)
