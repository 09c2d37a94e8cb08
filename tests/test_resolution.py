import numpy as np
import pytest
from helpers import assert_close

from keras_vit import ViT
from keras_vit.models.resolution import resample_position_embedding, with_image_size


def test_resampling_to_the_same_grid_is_the_identity():
    table = np.random.default_rng(0).normal(size=(1, 1 + 14 * 14, 8)).astype("float32")
    np.testing.assert_array_equal(resample_position_embedding(table, (14, 14)), table)


def test_resampling_keeps_prefix_tokens_and_interpolates_the_grid():
    rng = np.random.default_rng(0)
    prefix = rng.normal(size=(1, 2, 4)).astype("float32")
    # A constant grid stays constant under interpolation.
    grid = np.full((1, 9, 4), 0.5, "float32")
    out = resample_position_embedding(
        np.concatenate([prefix, grid], 1),
        (5, 7),
        num_prefix_tokens=2,
        method="bilinear",
    )
    assert out.shape == (1, 2 + 35, 4)
    np.testing.assert_array_equal(out[:, :2], prefix)
    # Interpolation weights that sum to one, in float32: one rounding.
    assert_close(out[:, 2:], 0.5, 1e-6)


def test_resampling_errors():
    with pytest.raises(ValueError, match="do not form a square grid"):
        resample_position_embedding(np.zeros((1, 1 + 6, 4)), (3, 3))
    with pytest.raises(ValueError, match=r"old_grid \(2, 2\) holds 4 positions"):
        resample_position_embedding(np.zeros((1, 1 + 6, 4)), (3, 3), old_grid=(2, 2))
    with pytest.raises(ValueError, match="'bicubic' or 'bilinear'"):
        resample_position_embedding(np.zeros((1, 5, 4)), (3, 3), method="nearest")


def test_moving_a_b16_model_from_224_to_384():
    model = ViT("Ti/16", image_size=224, num_classes=10)
    moved = with_image_size(model, 384)
    old = model.get_layer("patch_encoder").pos_embedding.numpy()
    new = moved.get_layer("patch_encoder").pos_embedding.numpy()
    assert old.shape == (1, 1 + 14 * 14, 192)
    assert new.shape == (1, 1 + 24 * 24, 192)
    np.testing.assert_array_equal(new[:, 0], old[:, 0])
    image = np.random.default_rng(0).normal(size=(1, 384, 384, 3)).astype("float32")
    assert moved(image).shape == (1, 10)
    for name in ("block_3", "head", "encoder_norm"):
        for a, b in zip(
            model.get_layer(name).get_weights(),
            moved.get_layer(name).get_weights(),
            strict=True,
        ):
            np.testing.assert_array_equal(a, b)


def test_same_size_rebuild_gives_identical_outputs():
    model = ViT(
        "Ti/8",
        image_size=(16, 24),
        num_classes=3,
        hidden_dim=32,
        num_layers=1,
        num_heads=2,
        mlp_dim=32,
        distilled=True,
    )
    x = np.random.default_rng(0).normal(size=(2, 16, 24, 3)).astype("float32")
    np.testing.assert_array_equal(with_image_size(model, (16, 24))(x), model(x))


def test_sincos_models_recompute_their_table():
    model = ViT(
        "Ti/8",
        image_size=16,
        num_classes=3,
        hidden_dim=32,
        num_layers=1,
        num_heads=2,
        mlp_dim=32,
        pooling="gap",
        position_embedding="sincos",
    )
    moved = with_image_size(model, (24, 32))
    assert moved.get_layer("patch_encoder").pos_embedding.shape == (1, 12, 32)
    assert moved(np.zeros((1, 24, 32, 3), "float32")).shape == (1, 3)


def test_with_image_size_rejects_sizes_off_the_stride():
    model = ViT(
        "Ti/8",
        image_size=16,
        num_classes=3,
        hidden_dim=32,
        num_layers=1,
        num_heads=2,
        mlp_dim=32,
    )
    with pytest.raises(
        ValueError, match="20x20 is not divisible by the model's stride 8x8"
    ):
        with_image_size(model, 20)
