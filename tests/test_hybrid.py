import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    FLOAT32_PARITY,
    assert_close,
    check_config_round_trip,
    check_reloads_in_fresh_process,
    fit_one_step,
)

from keras_vit import HybridViT, StdConv2D
from keras_vit.models.resolution import with_image_size


def tiny_hybrid(**kwargs):
    options = dict(
        image_size=32,
        num_classes=5,
        stem=(1, 1),
        stem_width=8,
        norm_groups=4,
        hidden_dim=32,
        num_layers=2,
        num_heads=4,
        mlp_dim=64,
    )
    options.update(kwargs)
    return HybridViT(options.pop("variant", "Ti"), **options)


def images(batch=2, size=32, channels=3, seed=0):
    rng = np.random.default_rng(seed)
    shape = (batch, *((size, size) if isinstance(size, int) else size), channels)
    return rng.standard_normal(shape).astype("float32")


@pytest.mark.parametrize(
    "variant,stem,kwargs,expected",
    [
        # timm vit_base_r50_s16_224 with a 1000-class head: 98,659,112.
        ("B/16", "R50", dict(num_classes=1000), 98_659_112),
        # timm vit_small_r26_s32_224: 36,431,912.
        ("S/32", "R26", dict(num_classes=1000), 36_431_912),
    ],
)
def test_exact_parameter_counts_match_timm_at_224(variant, stem, kwargs, expected):
    model = HybridViT(variant, image_size=224, stem=stem, **kwargs)
    assert model.count_params() == expected
    keras.backend.clear_session()


def test_r50_feature_map_is_stride_16_with_1024_channels():
    model = HybridViT("Ti", image_size=64, num_classes=3, stem="R50", num_layers=1)
    assert model.get_layer("patches").input.shape == (None, 4, 4, 1024)
    assert model.get_layer("patch_encoder").grid_size == (4, 4)
    keras.backend.clear_session()


def test_small_hybrid_builds_and_runs_on_non_square_images():
    model = tiny_hybrid(image_size=(32, 48), num_layers=1)
    # Two stages: stride 8, a 4x6 grid of 1x1 patches of 64 channels.
    assert model.get_layer("patches").input.shape == (None, 4, 6, 64)
    out = model(images(2, (32, 48)))
    assert out.shape == (2, 5) and out.dtype == "float32"
    assert model.get_layer("stage1_block0_downsample_conv").strides == 2
    assert fit_one_step(model, images(4, (32, 48)), np.arange(4) % 5) > 0


def test_keras_applications_stem_is_cut_at_the_output_stride():
    model = HybridViT(
        "Ti",
        image_size=64,
        num_classes=3,
        stem="ResNet50",
        hidden_dim=32,
        num_layers=1,
        num_heads=2,
        mlp_dim=64,
    )
    assert model.get_layer("patches").input.shape == (None, 4, 4, 1024)
    # The backbone's layers join the hybrid's own graph, cut at conv4.
    model.get_layer("conv4_block6_out")
    with pytest.raises(ValueError):
        model.get_layer("conv5_block1_out")
    assert model(images(1, 64)).shape == (1, 3)
    keras.backend.clear_session()
    stride32 = HybridViT(
        "Ti",
        image_size=64,
        include_top=False,
        stem="ResNet50",
        output_stride=32,
        hidden_dim=32,
        num_layers=1,
        num_heads=2,
        mlp_dim=64,
    )
    assert stride32.get_layer("patches").input.shape == (None, 2, 2, 2048)
    keras.backend.clear_session()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(stem="NoSuchNet"), "Unknown stem 'NoSuchNet'; valid stems are"),
        (dict(stem=(1, 0)), "positive block counts"),
        (
            dict(image_size=36),
            "image_size 36x36 is not divisible by the stem's output stride 8",
        ),
        (
            dict(variant="Ti/16"),
            "asks for stride 16, but stem (1, 1) has output stride 8",
        ),
        (dict(output_stride=16), "has output stride 8, not output_stride=16"),
        (dict(norm_groups=3), "norm_groups=3 does not divide the 8 channels"),
        (dict(stem_weights="imagenet"), "only applies to keras.applications stems"),
        (dict(variant="Q"), "Unknown ViT variant 'Q'"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(
        ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        tiny_hybrid(**kwargs)


def test_options_it_cannot_take_are_named_with_the_reason():
    with pytest.raises(TypeError, match="HybridViT does not take 'shifted_patches'"):
        tiny_hybrid(shifted_patches=True)
    with pytest.raises(TypeError, match="stem's 1x1 features"):
        tiny_hybrid(shifted_patches=True)
    with pytest.raises(TypeError, match="does not take 'widht'; its transformer"):
        tiny_hybrid(widht=3)


def test_std_conv2d_config_round_trip_and_standardisation():
    layer = StdConv2D(6, 3, strides=2, use_bias=True, epsilon=1e-8, name="conv")
    config = check_config_round_trip(layer)
    assert config["filters"] == 6 and config["epsilon"] == 1e-8
    x = images(2, 9, channels=4)
    y = layer(x)
    assert y.shape == (2, 5, 5, 6)
    kernel = np.asarray(layer.kernel)
    mean = kernel.mean(axis=(0, 1, 2), keepdims=True)
    std = np.sqrt(kernel.var(axis=(0, 1, 2), keepdims=True) + 1e-8)
    standardized = (kernel - mean) / std
    # float32 mean and variance against numpy's float64 pairwise sums.
    assert_close(layer.standardized_kernel(), standardized, 1e-5)
    layer.bias.assign(np.arange(6, dtype="float32"))
    expected = tf.nn.conv2d(x, standardized, 2, "SAME") + np.arange(6)
    # The same convolution, oneDNN's or Eigen's, summed in another order.
    assert_close(layer(x), expected, 1e-5)
    with pytest.raises(ValueError, match="`filters` must be a positive int, got 0"):
        StdConv2D(0, 3)


def test_xla_forward_equals_eager():
    model = tiny_hybrid()
    x = images(2)
    eager = model(x, training=False)
    xla = tf.function(lambda t: model(t, training=False), jit_compile=True)(x)
    # XLA's fusions and summation order against eager oneDNN kernels.
    assert_close(xla, eager, FLOAT32_PARITY)


def test_mixed_bfloat16_keeps_float32_variables_and_logits():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = tiny_hybrid()
    assert {v.dtype for v in model.weights} == {"float32"}
    out = model(images(2))
    assert out.dtype == "float32" and np.isfinite(np.asarray(out)).all()


def test_with_image_size_moves_a_hybrid_to_a_larger_grid():
    model = tiny_hybrid()
    bigger = with_image_size(model, 64)
    assert bigger.get_layer("patch_encoder").grid_size == (8, 8)
    assert bigger(images(1, 64)).shape == (1, 5)
    old = model.get_layer("patch_encoder").pos_embedding.numpy()
    new = bigger.get_layer("patch_encoder").pos_embedding.numpy()
    np.testing.assert_array_equal(new[:, 0], old[:, 0])
    np.testing.assert_array_equal(
        bigger.get_layer("stem_conv").kernel.numpy(),
        model.get_layer("stem_conv").kernel,
    )


@pytest.mark.slow
def test_hybrid_reloads_in_a_fresh_process(tmp_path):
    model = tiny_hybrid(distilled=True)
    check_reloads_in_fresh_process(model, images(2), tmp_path)
