"""The block options of the newer ViT families as layers: Keras' own layer
test harness (mixed precision included), numpy references, and the builder
options on a whole model."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from helpers import FLOAT32_PARITY, assert_close, check_config_round_trip
from keras.src.testing import TestCase

from keras_vit.models.blocks import MultiHeadSelfAttention, TransformerBlock
from keras_vit.models.layers import PatchEncoder, TokenPooling
from keras_vit.models.norms import RMSNorm
from keras_vit.models.pooling import MAPHead
from keras_vit.models.quantization import quantized_copy
from keras_vit.models.resolution import with_image_size
from keras_vit.models.rope import RotaryEmbedding, apply_rope
from keras_vit.models.sublayers import MLP
from keras_vit.models.vit import ViT


class KerasHarness(TestCase):
    def runTest(self):  # unittest needs one to instantiate the case
        pass


HARNESS = KerasHarness()

LAYER_CASES = [
    (RMSNorm, dict(epsilon=1e-5), (2, 5, 8), 1),
    (MLP, dict(mlp_dim=12, activation="quick_gelu"), (2, 5, 8), 4),
    (MLP, dict(mlp_dim=12, activation="silu", gated=True), (2, 5, 8), 4),
    (
        MLP,
        dict(
            mlp_dim=12,
            activation="silu",
            gated=True,
            use_bias=False,
            norm_type="layernorm",
        ),
        (2, 5, 8),
        4,
    ),
    (MultiHeadSelfAttention, dict(num_heads=2, qk_norm="layernorm"), (2, 5, 8), 8),
    (
        MultiHeadSelfAttention,
        dict(num_heads=2, qk_norm="rmsnorm", qkv_bias=False, proj_bias=False),
        (2, 5, 8),
        4,
    ),
    (
        TransformerBlock,
        dict(
            num_heads=2,
            mlp_dim=12,
            norm_type="rmsnorm",
            qk_norm=True,
            proj_bias=False,
            mlp_activation="silu",
            gated_mlp=True,
            mlp_norm=True,
        ),
        (2, 5, 8),
        10,
    ),
]


def run_harness(cls, kwargs, shape, output, trainable) -> None:
    HARNESS.run_layer_test(
        cls,
        init_kwargs=kwargs,
        input_shape=shape,
        expected_output_shape=output,
        expected_num_trainable_weights=trainable,
        expected_num_non_trainable_weights=0,
        run_mixed_precision_check=True,
    )


@pytest.mark.parametrize(("cls", "kwargs", "shape", "trainable"), LAYER_CASES)
def test_keras_layer_harness_with_mixed_precision(cls, kwargs, shape, trainable):
    run_harness(cls, kwargs, shape, shape, trainable)


# Pooling layers: (batch, tokens, hidden) in, one vector per image out.
POOLING_CASES = [
    (TokenPooling, dict(mode="token_gap", num_prefix_tokens=3), (2, 16), 0),
    (
        MAPHead,
        dict(num_heads=2, mlp_dim=12, activation="gelu_tanh", num_skipped_tokens=1),
        (2, 8),
        13,
    ),
]


@pytest.mark.parametrize(("cls", "kwargs", "output", "trainable"), POOLING_CASES)
def test_pooling_layers_in_the_keras_harness(cls, kwargs, output, trainable):
    run_harness(cls, kwargs, (2, 5, 8), output, trainable)


def test_map_head_mlp_uses_its_activation():
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype("float32") * 3
    exact = MAPHead(2, 12, activation="gelu")
    tanh = MAPHead(2, 12, activation="gelu_tanh")
    exact.build(x.shape)
    tanh.build(x.shape)
    tanh.set_weights(exact.get_weights())
    assert tanh.mlp.activation == "gelu_tanh"
    # The two GELUs differ by up to ~1e-3 of the values; rounding is ~1e-7.
    assert (
        np.abs(np.asarray(exact(x)) - np.asarray(tanh(x))).max()
        > 1e-5 * np.abs(np.asarray(exact(x))).max()
    )
    with pytest.raises(ValueError, match="`activation` must be one of"):
        MAPHead(2, 12, activation="relu")


def test_token_gap_model_head_reads_twice_the_width():
    model = ViT(
        "Ti/8",
        16,
        3,
        hidden_dim=8,
        num_layers=1,
        num_heads=2,
        mlp_dim=8,
        pooling="token_gap",
        num_register_tokens=2,
    )
    assert model.get_layer("head").kernel.shape == (16, 3)
    with pytest.raises(ValueError, match="pool_norm=True` needs a pooling mode"):
        ViT("Ti/8", 16, 3, pooling="token_gap", pool_norm=True)
    with pytest.raises(ValueError, match="pooling='token_gap'` needs `class_token"):
        ViT("Ti/8", 16, 3, pooling="token_gap", class_token=False)


@pytest.mark.parametrize(("cls", "kwargs", "shape", "trainable"), LAYER_CASES)
def test_config_round_trip(cls, kwargs, shape, trainable):
    layer = cls(**kwargs)
    layer.build(shape)
    check_config_round_trip(layer)


def test_rms_norm_matches_numpy_and_computes_in_float32():
    x = np.random.default_rng(0).standard_normal((3, 8)).astype("float32") * 300
    layer = RMSNorm(1e-6)
    layer.build(x.shape)
    layer.gamma.assign(np.linspace(0.5, 1.5, 8))
    expected = x / np.sqrt(np.mean(x**2, -1, keepdims=True) + 1e-6) * layer.gamma
    np.testing.assert_allclose(layer(x), expected, rtol=1e-5)
    half = RMSNorm(1e-6, dtype="mixed_float16")
    half.build(x.shape)
    # x**2 overflows float16 (300**2 * 8 > 65504): the mean is in float32.
    assert np.all(np.isfinite(np.asarray(half(x.astype("float16")))))


def test_gated_mlp_is_silu_gate_times_value():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4)).astype("float32")
    mlp = MLP(6, activation="silu", gated=True)
    mlp.build(x.shape)
    w1, b1 = mlp.fc1.kernel.numpy(), rng.standard_normal(12).astype("float32")
    mlp.fc1.bias.assign(b1)
    h = x @ w1 + b1
    gate, value = h[..., :6], h[..., 6:]
    hidden = gate / (1 + np.exp(-gate)) * value
    expected = hidden @ mlp.fc2.kernel.numpy() + mlp.fc2.bias.numpy()
    # float32 products of width 12 against float32 numpy, in another order.
    assert_close(mlp(x), expected, 1e-5)


def test_quick_gelu_is_x_sigmoid_1702x():
    x = np.linspace(-4, 4, 9, dtype="float32").reshape(1, 1, 9)
    mlp = MLP(9, activation="quick_gelu")
    mlp.build(x.shape)
    mlp.fc1.kernel.assign(np.eye(9))
    mlp.fc2.kernel.assign(np.eye(9))
    np.testing.assert_allclose(mlp(x), x / (1 + np.exp(-1.702 * x)), rtol=1e-5)


def test_rope_rotates_patch_tokens_only_in_the_half_layout():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 5, 4)).astype("float32")
    angles = rng.standard_normal((3, 2)).astype("float32")
    rope = np.stack([np.cos(np.tile(angles, 2)), np.sin(np.tile(angles, 2))])
    out = np.asarray(apply_rope(x, rope))
    np.testing.assert_array_equal(out[:, :2], x[:, :2])
    a, b = x[:, 2:, :2], x[:, 2:, 2:]
    c, s = np.cos(angles), np.sin(angles)
    # Two products and a sum per value (FMA or not, by CPU): a few epsilons.
    assert_close(out[:, 2:, :2], a * c - b * s, 1e-6, scale=np.abs(x).max())
    assert_close(out[:, 2:, 2:], b * c + a * s, 1e-6, scale=np.abs(x).max())


def test_patch_encoder_without_position_table_and_with_embed_norm():
    encoder = PatchEncoder(
        8, position_embedding="none", projection_norm="rmsnorm", num_register_tokens=2
    )
    encoder.build((None, 4, 12))
    assert {w.path.split("/")[-1] for w in encoder.weights} == {
        "kernel",
        "bias",
        "gamma",
        "cls_token",
        "register_tokens",
    }
    assert encoder(np.ones((1, 4, 12), "float32")).shape == (1, 7, 8)
    check_config_round_trip(encoder)


FAMILY_OPTIONS = dict(
    norm_type="rmsnorm",
    norm_pre=True,
    embed_norm=True,
    qk_norm=True,
    proj_bias=False,
    mlp_activation="silu",
    gated_mlp=True,
    mlp_norm=True,
    position_embedding="none",
    pooling="gap",
)


def small_vit(**options):
    return ViT(
        "Ti/8",
        image_size=16,
        num_classes=3,
        hidden_dim=16,
        num_layers=2,
        num_heads=2,
        mlp_dim=24,
        **options,
    )


def test_builder_options_survive_keras_save_and_int8(tmp_path):
    model = small_vit(**FAMILY_OPTIONS)
    layers = {layer.name for layer in model.layers}
    assert "norm_pre" in layers
    assert isinstance(model.get_layer("encoder_norm"), RMSNorm)
    block = model.get_layer("block_0")
    assert block.mlp.gated and block.attention.qk_norm == "rmsnorm"
    x = np.random.default_rng(3).standard_normal((2, 16, 16, 3)).astype("float32")
    path = tmp_path / "family.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(reloaded(x), model(x))
    quantized = quantized_copy(model, "int8")
    quantized.save(tmp_path / "q.keras")
    again = keras.saving.load_model(tmp_path / "q.keras", safe_mode=True)
    np.testing.assert_array_equal(again(x), quantized(x))


def test_final_norm_off_has_no_encoder_norm():
    model = small_vit(final_norm=False, pooling="gap")
    assert "encoder_norm" not in {layer.name for layer in model.layers}
    with pytest.raises(ValueError, match="pool_norm=True` needs `final_norm=True"):
        small_vit(final_norm=False, pooling="gap", pool_norm=True)


def test_plain_vit_blocks_get_no_new_options():
    block = small_vit().get_layer("block_0")
    # keras_vit's LayerNorm: Keras' LayerNormalization with the fused kernel.
    assert type(block.norm1).__name__ == "LayerNorm"
    assert not block.mlp.gated and block.mlp.norm is None
    assert block.attention.qk_norm is None
    assert block.mlp.activation == "gelu" and block.attention.proj_bias


def reference_angles(rows, cols, bands, centered, order, offset=0.0, reference=None):
    """numpy: per-token angles, `order` "ij" (row bands first) or "xy"."""
    k = np.arange(bands) / bands
    r, c = np.meshgrid(
        np.arange(rows) + offset, np.arange(cols) + offset, indexing="ij"
    )
    r, c = r.reshape(-1), c.reshape(-1)
    if centered:
        r, c = 2 * (r + 0.5) / rows - 1, 2 * (c + 0.5) / cols - 1
        freq = 2 * np.pi * 100.0**-k
    else:
        if reference is not None:
            r, c = r / rows * reference[0], c / cols * reference[1]
        freq = 10000.0**-k
    first, second = (r, c) if order == "ij" else (c, r)
    return np.concatenate([first[:, None] * freq, second[:, None] * freq], axis=1)


@pytest.mark.parametrize(
    "options",
    [
        dict(coordinates="centered", temperature=100.0, frequency_scale=2 * np.pi),
        dict(coordinates="index", axis_order="xy"),
        dict(coordinates="index", grid_offset=1.0, axis_order="xy"),
        dict(coordinates="index", reference_grid=(16, 8)),
    ],
)
def test_rotary_tables_match_numpy_at_any_grid(options):
    layer = RotaryEmbedding(16, stride=(8, 8), **options)
    check_config_round_trip(layer)
    fixed = np.asarray(layer(np.zeros((1, 24, 40, 3), "float32")))
    ref = reference_angles(
        3,
        5,
        4,
        options["coordinates"] == "centered",
        options.get("axis_order", "ij"),
        options.get("grid_offset", 0.0),
        options.get("reference_grid"),
    )
    ref = np.concatenate([ref, ref], axis=1)
    # float32 angles up to ~100 radians: cos / sin lose ~1e-5 of scale 1.
    assert_close(fixed, np.stack([np.cos(ref), np.sin(ref)]), 2e-5)
    # Without a stride the input is the patch grid.
    on_grid = RotaryEmbedding(16, **options)
    np.testing.assert_allclose(on_grid(np.zeros((1, 3, 5, 4), "float32")), fixed)


def test_rope_block_under_mixed_precision_matches_float32():
    x = np.random.default_rng(4).standard_normal((2, 7, 16)).astype("float32")
    table = RotaryEmbedding(8)(np.zeros((1, 2, 3, 1), "float32"))
    full = TransformerBlock(2, 24, name="b")
    half = TransformerBlock(2, 24, dtype="mixed_float16", name="b")
    full.build(x.shape)
    half.build(x.shape)
    half.set_weights(full.get_weights())
    expected = np.asarray(full(x, rope=table))
    got = half(x.astype("float16"), rope=table)
    assert keras.backend.standardize_dtype(got.dtype) == "float16"
    # float16 activations: a few 1e-3 of the values' scale.
    assert_close(np.asarray(got, "float32"), expected, 1e-2)
    # The rotation moves the patch tokens and leaves the prefix token's query alone.
    assert not np.allclose(np.asarray(full(x)), expected)


def test_rope_vit_is_the_same_model_at_fixed_and_dynamic_size():
    options = dict(
        position_embedding="none",
        rope=dict(coordinates="centered", temperature=100.0, frequency_scale=6.28),
    )
    fixed = small_vit(**options)
    dynamic = small_vit(dynamic_size=True, **options)
    dynamic.set_weights(fixed.get_weights())
    x = np.random.default_rng(5).standard_normal((2, 16, 16, 3)).astype("float32")
    # The same weights in another graph (tables computed in the graph).
    assert_close(dynamic(x), fixed(x), FLOAT32_PARITY)
    other = np.random.default_rng(6).standard_normal((1, 24, 8, 3)).astype("float32")
    resized = with_image_size(fixed, (24, 8))
    assert_close(resized(other), dynamic(other), FLOAT32_PARITY)
