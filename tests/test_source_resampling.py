"""Converted checkpoints at another image size compute what their source
library computes there: the position table is resampled with the source's
kernel (timm: antialiased bicubic; Hugging Face: bicubic without antialias;
big_vision: scipy's linear zoom), and timm's MAP head sees the tokens
`pool_include_prefix` says. Fixtures: scripts/make_pretrained_fixtures.py."""

from __future__ import annotations

import json
import shutil

import keras
import numpy as np
import pytest
import scipy.ndimage
import tensorflow as tf
from helpers import REPO, assert_close, check_dtype_policy_contract

import keras_vit
from keras_vit.models import position
from keras_vit.models.resolution import resample_position_embedding, with_image_size
from keras_vit.pretrained.convert import convert_checkpoint

FIXTURES = REPO / "tests" / "fixtures"
SIZES = {"48": (48, 48), "96": (96, 96), "48x80": (48, 80)}
# The acceptance bound: 1e-4 of the largest source logit. Measured: under
# 1e-7 of it for every size here (float32 sums in another order).
RELATIVE = 1e-4


def relative_error(actual, expected) -> float:
    expected = np.asarray(expected)
    return float(np.max(np.abs(np.asarray(actual) - expected))) / float(
        np.max(np.abs(expected))
    )


def test_timm_and_hf_kernels_are_torchs_interpolate():
    """Each kernel alone against torch's `F.interpolate` on a random grid,
    shrinking, growing, rectangular and down to one cell."""
    kernels = np.load(FIXTURES / "resample_kernels.npz")
    grid = kernels["grid"]
    for key in kernels.files:
        if key == "grid":
            continue
        kind, size = key.split("_")
        size = tuple(int(s) for s in size.split("x"))
        # The source library's float32 kernel, summed in another order: up to
        # 16 weighted terms, measured 5.7e-7 of the scale on Zen 4 (5 eps);
        # 5e-6 leaves room for another CPU's order, far below a wrong kernel.
        assert_close(position.resize_grid(grid, size, kind), kernels[key], 5e-6)


def test_timms_kernel_is_tensorflows_antialiased_bicubic():
    """Measured, so the choice is on record: TF's `antialias=True` bicubic is
    torch's antialiased bicubic; without antialias it is not, once the grid
    shrinks."""
    grid = np.random.default_rng(1).normal(0, 1, (1, 8, 8, 16)).astype("float32")
    for size in [(6, 6), (5, 11), (12, 12)]:
        ours = position.resize_grid(grid, size, "timm")
        tf_aa = tf.image.resize(grid, size, "bicubic", antialias=True)
        assert_close(ours, tf_aa, 5e-6)
    shrunk = tf.image.resize(grid, (6, 6), "bicubic", antialias=False)
    assert np.max(np.abs(position.resize_grid(grid, (6, 6), "timm") - shrunk)) > 0.1


@pytest.mark.parametrize("new_grid", [(6, 6), (12, 12), (5, 9), (1, 1)])
def test_big_vision_kernel_is_scipys_linear_zoom(new_grid):
    """big_vision's `resample_posemb` zooms the grid with
    `scipy.ndimage.zoom(order=1)`; big_vision has no package, so scipy is
    the reference."""
    rng = np.random.default_rng(2)
    table = rng.normal(0, 1, (1, 1 + 8 * 8, 16)).astype("float32")
    grid = table[0, 1:].reshape(8, 8, 16)
    zoom = (new_grid[0] / 8, new_grid[1] / 8, 1)
    expected = scipy.ndimage.zoom(grid.astype("float64"), zoom, order=1)
    resized = resample_position_embedding(table, new_grid, (8, 8), 1, "big_vision")
    np.testing.assert_array_equal(resized[0, :1], table[0, :1])
    # float32 against scipy's float64 linear zoom: measured 6e-7 of the
    # scale (5 eps); 3e-6 leaves room for another CPU's rounding.
    assert_close(resized[0, 1:].reshape(*new_grid, 16), expected, 3e-6)


@pytest.mark.parametrize(
    "fixture,kernel", [("timm_resize", "timm"), ("hf_vit_resize", "hf")]
)
def test_converted_models_match_the_source_at_other_sizes(fixture, kernel):
    """timm's `dynamic_img_size` path and HF's `interpolate_pos_encoding`,
    both through `with_image_size` and a dynamic-size model."""
    parity = np.load(FIXTURES / fixture / "parity.npz")
    model = convert_checkpoint(FIXTURES / fixture)
    assert model.get_layer("patch_encoder").position_resample == kernel
    dynamic = convert_checkpoint(FIXTURES / fixture, dynamic_size=True)
    assert dynamic.input_shape == (None, None, None, 3)
    x, expected = parity["images_64"], parity["logits_64"]
    assert relative_error(model(x), expected) < RELATIVE
    assert relative_error(dynamic(x), expected) < RELATIVE
    for name, size in SIZES.items():
        x, expected = parity[f"images_{name}"], parity[f"logits_{name}"]
        resized = with_image_size(model, size)
        assert resized.get_layer("patch_encoder").position_resample == kernel
        assert relative_error(resized(x), expected) < RELATIVE, name
        assert relative_error(dynamic(x), expected) < RELATIVE, name
    # The kernel matters: TensorFlow's bicubic is off where the grid shrinks.
    x, expected = parity["images_48"], parity["logits_48"]
    other = with_image_size(model, 48, method="bicubic")
    assert relative_error(other(x), expected) > RELATIVE


def test_big_vision_checkpoints_resample_with_the_linear_zoom():
    model = convert_checkpoint(FIXTURES / "big_vision_vit")
    encoder = model.get_layer("patch_encoder")
    assert encoder.position_resample == "big_vision"
    table = keras.ops.convert_to_numpy(encoder.pos_embedding)
    rows, cols = encoder.grid_size
    patch = model.get_layer("patches").patch_size
    new_grid = (rows - 1, cols + 2)
    resized = with_image_size(model, (new_grid[0] * patch, new_grid[1] * patch))
    prefix = encoder.num_embedded_prefix_tokens
    grid = table[0, prefix:].reshape(rows, cols, -1).astype("float64")
    zoom = (new_grid[0] / rows, new_grid[1] / cols, 1)
    expected = scipy.ndimage.zoom(grid, zoom, order=1)
    got = keras.ops.convert_to_numpy(resized.get_layer("patch_encoder").pos_embedding)
    assert_close(got[0, prefix:].reshape(expected.shape), expected, 1e-6)


def test_position_resample_is_checked_and_serialised(tmp_path):
    with pytest.raises(ValueError, match="kernel must be .*got 'lanczos'"):
        keras_vit.ViT("Ti/16", 32, position_resample="lanczos")
    model = keras_vit.ViT(
        "Ti/16", 32, num_classes=3, position_resample="hf", num_layers=1
    )
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert loaded.get_layer("patch_encoder").position_resample == "hf"
    assert with_image_size(loaded, 48).get_layer("patch_encoder").position_resample == (
        "hf"
    )


def _reg_map_with_flag(tmp_path, include_prefix: bool):
    folder = tmp_path / f"reg_map_{include_prefix}"
    shutil.copytree(FIXTURES / "timm_reg_map", folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_args"]["pool_include_prefix"] = include_prefix
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_timm_map_head_pools_what_pool_include_prefix_says(tmp_path):
    """4 registers, no class token, MAP head: timm >= 1.0.16 pools the patch
    tokens only unless `pool_include_prefix=True`."""
    parity = np.load(FIXTURES / "timm_reg_map" / "parity.npz")
    x = parity["images"]
    default = convert_checkpoint(FIXTURES / "timm_reg_map")
    assert default.get_layer("map_head").num_skipped_tokens == 4
    assert relative_error(default(x), parity["logits"]) < RELATIVE
    explicit = convert_checkpoint(_reg_map_with_flag(tmp_path, False))
    assert relative_error(explicit(x), parity["logits"]) < RELATIVE
    prefixed = convert_checkpoint(_reg_map_with_flag(tmp_path, True))
    assert prefixed.get_layer("map_head").num_skipped_tokens == 0
    assert relative_error(prefixed(x), parity["logits_prefix"]) < RELATIVE
    # The flag changes the logits far beyond the bound.
    assert relative_error(default(x), parity["logits_prefix"]) > 10 * RELATIVE
    default.save(tmp_path / "reg_map.keras")
    loaded = keras.saving.load_model(tmp_path / "reg_map.keras")
    np.testing.assert_array_equal(loaded(x), default(x))


def test_map_head_skips_the_leading_tokens():
    head = keras_vit.MAPHead(2, 16, num_skipped_tokens=3)
    tokens = np.random.default_rng(3).normal(0, 1, (2, 7, 8)).astype("float32")
    pooled = head(tokens)
    changed = tokens.copy()
    changed[:, :3] = 100.0
    np.testing.assert_array_equal(head(changed), pooled)
    assert head.get_config()["num_skipped_tokens"] == 3
    with pytest.raises(ValueError, match="num_skipped_tokens.*-1"):
        keras_vit.MAPHead(2, 16, num_skipped_tokens=-1)


@pytest.mark.slow
def test_exported_dynamic_model_serves_timms_logits_at_every_size(tmp_path):
    """The source's kernel lives in the SavedModel's graph: one export serves
    the timm fixture's logits at the native, a smaller and a larger size."""
    from keras_vit.deploy.export import export_model

    parity = np.load(FIXTURES / "timm_resize" / "parity.npz")
    model = convert_checkpoint(FIXTURES / "timm_resize", dynamic_size=True)
    # The signature takes raw pixels in [0, 255]: the fixtures' images
    # (standard normal) are mapped there and back by the mean and std.
    low, high = -8.0, 8.0
    preprocessing = {"mean": -low / (high - low), "std": 1.0 / (high - low)}
    export_model(
        model, "timm_dyn", tmp_path, version=1, tflite=(), preprocessing=preprocessing
    )
    loaded = tf.saved_model.load(str(tmp_path / "timm_dyn" / "1"))
    serve = loaded.signatures["serving_default"]
    for name in ["64", *SIZES]:
        x, expected = parity[f"images_{name}"], parity[f"logits_{name}"]
        pixels = (x.astype("float64") - low) / (high - low) * 255.0
        served = serve(pixels=tf.constant(pixels, tf.float32))["logits"].numpy()
        # The pixel round trip costs float32 rounding, far below the bound.
        assert relative_error(served, expected) < RELATIVE, name


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_new_options_keep_the_dtype_policy_contract(policy, tmp_path):
    check_dtype_policy_contract(
        lambda dtype: keras_vit.MAPHead(2, 16, num_skipped_tokens=2, dtype=dtype),
        (2, 7, 8),
        policy,
        tmp_path,
    )
    # Patches on a grid other than the table's: the timm kernel in the graph.
    check_dtype_policy_contract(
        lambda dtype: keras_vit.PatchEncoder(
            8, grid_size=(4, 4), position_resample="timm", dtype=dtype
        ),
        (2, 3, 5, 12),
        policy,
        tmp_path,
    )
