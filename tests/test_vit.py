import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    FLOAT32_PARITY,
    assert_close,
    check_reloads_in_fresh_process,
    fit_one_step,
)

import keras_vit
from keras_vit import VARIANTS, ViT, distillation_heads, parse_variant
from keras_vit.models.blocks import TransformerBlock


def tiny(**kwargs):
    options = dict(
        image_size=16,
        num_classes=5,
        hidden_dim=32,
        num_layers=2,
        num_heads=4,
        mlp_dim=64,
    )
    options.update(kwargs)
    return ViT(options.pop("variant", "Ti/8"), **options)


def images(batch=2, size=16, channels=3, seed=0):
    rng = np.random.default_rng(seed)
    shape = (batch, *((size, size) if isinstance(size, int) else size), channels)
    return rng.standard_normal(shape).astype("float32")


@pytest.mark.parametrize(
    "variant,kwargs,expected",
    [
        ("Ti/16", dict(include_top=False), 5_524_416),
        ("S/16", dict(include_top=False), 21_665_664),
        ("B/16", dict(include_top=False), 85_798_656),
        ("B/32", dict(include_top=False), 87_455_232),
        ("L/16", dict(include_top=False), 303_301_632),
        ("B/16", dict(num_classes=1000), 86_567_656),
    ],
)
def test_exact_parameter_counts_at_224(variant, kwargs, expected):
    model = ViT(variant, image_size=224, **kwargs)
    assert model.count_params() == expected
    keras.backend.clear_session()


@pytest.mark.parametrize("size", list(VARIANTS))
def test_every_variant_builds_small_with_the_expected_shape(size):
    model = ViT(f"{size}/16", image_size=32, num_classes=7)
    assert model.output_shape == (None, 7)
    assert model(images(1, 32)).shape == (1, 7)
    assert (
        len([layer for layer in model.layers if isinstance(layer, TransformerBlock)])
        == (VARIANTS[size]["num_layers"])
    )
    keras.backend.clear_session()


def test_parse_variant_and_overrides():
    assert parse_variant("S/14") == dict(
        hidden_dim=384, num_layers=12, num_heads=6, mlp_dim=1536, patch_size=14
    )
    assert parse_variant("B", patch_size=8, num_layers=3)["num_layers"] == 3
    with pytest.raises(ValueError, match=r"Unknown ViT variant 'X/16'.*Ti, S, B, L, H"):
        parse_variant("X/16")
    with pytest.raises(ValueError, match="no patch size"):
        parse_variant("B")
    with pytest.raises(ValueError, match="Bad patch size 'a'"):
        parse_variant("B/a")
    with pytest.raises(ValueError, match="not divisible by num_heads 5"):
        parse_variant("Ti/16", num_heads=5)


def test_builder_errors_name_the_bad_values():
    with pytest.raises(
        ValueError, match="image_size 225x225 is not divisible by patch_size 16"
    ):
        ViT("Ti/16", image_size=225)
    with pytest.raises(ValueError, match="'token', 'gap', 'token_gap', 'map' or None"):
        tiny(pooling="max")
    with pytest.raises(ValueError, match="only valid with `include_top=False`"):
        tiny(pooling=None)
    with pytest.raises(ValueError, match="needs `class_token=True`"):
        tiny(class_token=False)
    with pytest.raises(ValueError, match="`num_classes` must be a positive int, got 0"):
        tiny(num_classes=0)
    with pytest.raises(ValueError, match="needs pooling='token'"):
        tiny(distilled=True, pooling="gap")
    # Named with the options there are, not as an internal function's.
    with pytest.raises(TypeError, match="ViT does not take 'widht'; its transformer"):
        tiny(widht=3)


def test_wrong_channel_count_at_call_time_is_a_clear_error():
    model = tiny()
    with pytest.raises(
        ValueError, match=r"Expected images with 3 channels, got shape \(2, 16, 16, 1\)"
    ):
        model(images(2, 16, channels=1))


def test_non_square_images_and_other_channel_counts():
    model = tiny(image_size=(16, 24), num_channels=5)
    assert model(images(2, (16, 24), channels=5)).shape == (2, 5)
    assert model.get_layer("patch_encoder").grid_size == (2, 3)


def test_pooling_and_features():
    x = images()
    features = tiny(include_top=False)
    assert features(x).shape == (2, 32)
    tokens = tiny(include_top=False, pooling=None)
    assert tokens(x).shape == (2, 5, 32)
    gap = tiny(pooling="gap", include_top=False)
    assert gap.get_layer("patch_encoder").num_prefix_tokens == 0
    assert gap(x).shape == (2, 32)
    timm_avg = tiny(pooling="gap", class_token=True, pool_norm=True)
    assert timm_avg.get_layer("patch_encoder").num_prefix_tokens == 1
    assert timm_avg(x).shape == (2, 5)
    pre_logits = tiny(representation_size=24, include_top=False)
    assert pre_logits(x).shape == (2, 24)
    assert pre_logits.get_layer("pre_logits").activation.__name__ == "tanh"
    softmax = tiny(classifier_activation="softmax")
    assert_close(np.asarray(softmax(x)).sum(-1), 1.0, 1e-6)


@pytest.mark.parametrize("distilled", [False, True])
def test_last_block_runs_only_the_prefix_tokens_a_token_head_reads(distilled):
    model = tiny(distilled=distilled, include_top=False)
    prefix = 2 if distilled else 1
    assert tuple(model.get_layer("block_1").output.shape) == (None, prefix, 32)
    # The same layers called on the whole sequence give the same class token.
    x = images(3)
    encoder = model.get_layer("patch_encoder")
    tokens = keras.Model(model.input, encoder.output)(x)
    for name in ("block_0", "block_1", "encoder_norm"):
        tokens = model.get_layer(name)(tokens)
    assert tokens.shape == (3, 5 + prefix - 1, 32)
    # Layer by layer in eager against the functional graph.
    assert_close(model(x), np.asarray(tokens)[:, 0], FLOAT32_PARITY)
    gap = tiny(pooling="gap", class_token=True)
    assert tuple(gap.get_layer("block_1").output.shape) == (None, 5, 32)


def test_distilled_model_averages_two_heads_and_exposes_both_for_training():
    model = tiny(distilled=True)
    for name in ("head", "head_dist"):
        layer = model.get_layer(name)
        layer.set_weights(
            [np.random.default_rng(1).normal(size=w.shape) for w in layer.get_weights()]
        )
    x = images()
    heads = distillation_heads(model)
    cls_logits, dist_logits = (np.asarray(t) for t in heads(x))
    assert not np.allclose(cls_logits, dist_logits)
    assert_close(model(x), (cls_logits + dist_logits) / 2, FLOAT32_PARITY)
    assert model.get_layer("patch_encoder").num_prefix_tokens == 2
    with pytest.raises(ValueError, match="no distillation head"):
        distillation_heads(tiny())


def test_drop_path_rate_grows_linearly_over_blocks():
    model = tiny(num_layers=5, drop_path_rate=0.2)
    rates = [model.get_layer(f"block_{i}").drop_path_rate for i in range(5)]
    np.testing.assert_allclose(rates, [0.0, 0.05, 0.1, 0.15, 0.2])


def test_stable_layer_names():
    names = [layer.name for layer in tiny(distilled=True, representation_size=8).layers]
    for name in (
        "images",
        "patches",
        "patch_encoder",
        "block_0",
        "block_1",
        "encoder_norm",
        "pooling",
        "pre_logits",
        "head",
        "head_dist",
    ):
        assert name in names


def test_xla_forward_equals_eager():
    model = tiny(pooling="gap", position_embedding="sincos", layer_scale_init=0.1)
    x = images(3)
    eager = np.asarray(model(x, training=False))
    compiled = tf.function(lambda t: model(t, training=False), jit_compile=True)
    # XLA's fusions and summation order against eager oneDNN kernels.
    assert_close(np.asarray(compiled(x)), eager, FLOAT32_PARITY)


def test_mixed_bfloat16_keeps_float32_variables_and_logits():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = tiny(distilled=True)
    assert {v.dtype for v in model.weights} == {"float32"}
    logits = model(images())
    assert logits.dtype == "float32"
    assert np.isfinite(np.asarray(logits)).all()
    assert model.get_layer("block_0").compute_dtype == "bfloat16"
    fit_one_step(model, images(4), np.arange(4) % 5)


def test_fit_reduces_the_loss():
    keras.utils.set_random_seed(0)
    model = tiny(drop_path_rate=0.1, dropout_rate=0.1)
    x, y = images(8), np.arange(8) % 5
    first = fit_one_step(model, x, y)
    for _ in range(10):
        last = model.fit(x, y, batch_size=8, verbose=0).history["loss"][-1]
    assert last < first


@pytest.mark.slow
def test_saved_keras_file_reloads_in_a_fresh_process(tmp_path):
    model = tiny(
        distilled=True,
        representation_size=16,
        patch_norm=True,
        shifted_patches=True,
        layer_scale_init=1e-3,
        image_size=(16, 24),
    )
    check_reloads_in_fresh_process(model, images(3, (16, 24)), tmp_path)


def test_every_public_layer_is_registered_for_safe_loading():
    for name in keras_vit.__all__:
        obj = getattr(keras_vit, name)
        if isinstance(obj, type) and issubclass(obj, keras.layers.Layer):
            assert keras.saving.get_registered_name(obj) == f"keras_vit>{name}"
