import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import FLOAT32_PARITY, assert_close, check_config_round_trip

from keras_vit.models.blocks import MultiHeadSelfAttention, TransformerBlock
from keras_vit.models.layers import PatchEncoder, Patches, TokenPooling
from keras_vit.models.position import sincos_position_embedding
from keras_vit.models.sublayers import MLP, DropPath, LayerScale

RNG = np.random.default_rng(0)


def random(*shape):
    return RNG.standard_normal(shape).astype("float32")


LAYERS = [
    (Patches(4), (2, 8, 12, 3)),
    (Patches(4, shifted=True), (2, 8, 12, 3)),
    (PatchEncoder(16), (2, 9, 12)),
    (
        PatchEncoder(
            16,
            distillation_token=True,
            position_embedding="sincos",
            grid_size=(2, 3),
            patch_norm=True,
            dropout_rate=0.1,
            layer_norm_epsilon=1e-5,
        ),
        (2, 6, 12),
    ),
    (MultiHeadSelfAttention(4, qkv_bias=False, attention_dropout_rate=0.1), (2, 5, 16)),
    (MLP(32, dropout_rate=0.1, approximate_gelu=True), (2, 5, 16)),
    (DropPath(0.2, seed=3), (2, 5, 16)),
    (LayerScale(0.1), (2, 5, 16)),
    (
        TransformerBlock(
            4, 32, dropout_rate=0.1, drop_path_rate=0.1, layer_scale_init=1e-5
        ),
        (2, 5, 16),
    ),
    (TokenPooling("gap", 2), (2, 5, 16)),
]


@pytest.mark.parametrize("layer,shape", LAYERS, ids=lambda v: type(v).__name__)
def test_config_round_trip_after_build(layer, shape):
    layer(random(*shape))
    check_config_round_trip(layer)


def test_patches_cut_row_major_and_flatten_row_col_channel():
    images = random(2, 8, 12, 3)
    patches = np.asarray(Patches(4)(images))
    assert patches.shape == (2, 6, 48)
    # Patch 4 is grid row 1, column 1.
    np.testing.assert_array_equal(patches[:, 4], images[:, 4:8, 4:8].reshape(2, -1))


def test_patches_plus_dense_equal_a_strided_convolution():
    images = random(2, 8, 8, 5)
    kernel = random(4, 4, 5, 7)
    conv = tf.nn.conv2d(images, kernel, strides=4, padding="VALID")
    dense = np.asarray(Patches(4)(images)) @ kernel.reshape(-1, 7)
    # A convolution and a product over the same 80 terms, in other orders.
    assert_close(dense, np.reshape(conv, (2, 4, 7)), 1e-5)


def test_patches_reject_sizes_not_divisible_by_the_patch():
    with pytest.raises(ValueError, match=r"10x8 is not divisible by patch_size 4"):
        Patches(4)(random(1, 10, 8, 3))
    with pytest.raises(ValueError, match="patch_size"):
        Patches(0)


def test_patches_compile_with_xla():
    images = random(3, 16, 8, 2)
    layer = Patches(8)
    compiled = tf.function(layer, jit_compile=True)
    np.testing.assert_array_equal(compiled(images), layer(images))


def test_shifted_patches_hold_the_patch_and_its_four_diagonal_half_shifts():
    images = random(2, 8, 12, 3)
    patches = np.asarray(Patches(4, shifted=True)(images))
    assert patches.shape == (2, 6, 5 * 48)
    # Each copy is an image moved by (dy, dx) half patches (2 pixels), zero
    # where it moved in from outside; patch 4 is grid row 1, column 1.
    padded = np.pad(images, ((0, 0), (2, 2), (2, 2), (0, 0)))
    copies = [images] + [
        padded[:, 2 - 2 * dy : 10 - 2 * dy, 2 - 2 * dx : 14 - 2 * dx]
        for dy, dx in Patches.SHIFTS
    ]
    expected = np.concatenate(copies, axis=-1)[:, 4:8, 4:8].reshape(2, -1)
    np.testing.assert_array_equal(patches[:, 4], expected)
    # The unshifted channels are the plain patches.
    plain = np.asarray(Patches(4)(images))
    np.testing.assert_array_equal(
        patches.reshape(2, 6, 16, 5, 3)[:, :, :, 0], plain.reshape(2, 6, 16, 3)
    )


def test_shifted_patches_at_any_size_and_under_xla():
    layer = Patches(4, shifted=True, flatten=False)
    images = random(2, 12, 8, 1)
    fixed = np.asarray(layer(images))
    dynamic = tf.function(layer, input_signature=[tf.TensorSpec((None, None, None, 1))])
    np.testing.assert_array_equal(dynamic(images), fixed)
    compiled = tf.function(layer, jit_compile=True)
    np.testing.assert_array_equal(compiled(images), fixed)
    with pytest.raises(ValueError, match="patch_size >= 2"):
        Patches(1, shifted=True)
    with pytest.raises(ValueError, match="`shifted` must be True or False"):
        Patches(4, shifted=1)


def test_patch_encoder_prefix_tokens_and_learned_embedding():
    encoder = PatchEncoder(16, distillation_token=True)
    out = encoder(random(2, 9, 12))
    assert out.shape == (2, 11, 16)
    assert encoder.pos_embedding.shape == (1, 11, 16)
    assert encoder.pos_embedding.trainable
    assert encoder.num_prefix_tokens == 2
    # The learned embedding is truncated normal with stddev 0.02.
    values = keras.ops.convert_to_numpy(encoder.pos_embedding)
    assert np.abs(values).max() <= 0.04 + 1e-6
    assert 0.01 < values.std() < 0.02


def test_patch_encoder_sincos_is_fixed_and_skips_the_class_token():
    encoder = PatchEncoder(8, position_embedding="sincos", grid_size=(2, 3))
    patches = random(1, 6, 4)
    out = np.asarray(encoder(patches))
    projected = np.asarray(encoder.projection(patches))
    table = sincos_position_embedding((2, 3), 8)
    # One float32 addition against numpy's float32 + float64 one.
    assert_close(out[0, 1:], projected[0] + table, 1e-6)
    np.testing.assert_allclose(out[0, 0], 0.0)  # class token starts at zero
    assert not encoder.pos_embedding.trainable
    assert encoder.trainable_weights and all(
        "pos_embedding" not in w.path for w in encoder.trainable_weights
    )


def test_patch_encoder_errors():
    with pytest.raises(ValueError, match="do not form a square grid"):
        PatchEncoder(8)(random(1, 6, 4))
    with pytest.raises(ValueError, match=r"grid_size \(2, 2\) holds 4 patches"):
        PatchEncoder(8, grid_size=(2, 2))(random(1, 6, 4))
    with pytest.raises(ValueError, match="'learned', 'sincos' or 'none'"):
        PatchEncoder(8, position_embedding="rope")
    with pytest.raises(ValueError, match="needs `class_token=True`"):
        PatchEncoder(8, class_token=False, distillation_token=True)
    with pytest.raises(ValueError, match=r"dropout_rate.*\[0, 1\)"):
        PatchEncoder(8, dropout_rate=1.5)


def reference_attention(layer, x):
    """Plain numpy multi-head self-attention with the layer's weights."""
    kernel, bias = (keras.ops.convert_to_numpy(w) for w in layer.qkv.weights)
    qkv = x @ kernel + bias
    batch, tokens, width = x.shape
    heads = layer.num_heads
    qkv = qkv.reshape(batch, tokens, 3, heads, width // heads).transpose(2, 0, 3, 1, 4)
    q, k, v = qkv
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(width // heads)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, tokens, width)
    proj_kernel, proj_bias = (keras.ops.convert_to_numpy(w) for w in layer.proj.weights)
    return out @ proj_kernel + proj_bias, probs


def test_attention_matches_a_numpy_reference_on_both_paths():
    layer = MultiHeadSelfAttention(4)
    x = random(2, 7, 16)
    fast = np.asarray(layer(x))
    out, probs = layer(x, return_attention_scores=True)
    expected, expected_probs = reference_attention(layer, x)
    # Keras' kernels against float32 numpy: summation order at most.
    assert_close(fast, expected, FLOAT32_PARITY)
    assert_close(np.asarray(out), expected, FLOAT32_PARITY)
    assert_close(np.asarray(probs), expected_probs, FLOAT32_PARITY, scale=1.0)
    assert probs.shape == (2, 4, 7, 7)


def test_attention_softmax_runs_in_float32_under_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    layer = MultiHeadSelfAttention(2)
    # Large activations would overflow float16 logits without pre-scaling.
    x = random(1, 5, 8) * 60
    out, probs = layer(x, return_attention_scores=True)
    assert out.dtype == "float16"
    assert probs.dtype == "float32"
    assert np.isfinite(np.asarray(out, dtype="float32")).all()
    # float32 softmax rows: sums of values of order one.
    assert_close(np.asarray(probs).sum(-1), 1.0, 1e-5)


def test_attention_rejects_heads_that_do_not_divide_the_width():
    with pytest.raises(
        ValueError, match="hidden_dim 10 is not divisible by num_heads 4"
    ):
        MultiHeadSelfAttention(4)(random(1, 3, 10))


def test_mlp_uses_exact_gelu():
    layer = MLP(8)
    x = random(2, 3, 4)
    layer(x)
    w1, b1 = (keras.ops.convert_to_numpy(w) for w in layer.fc1.weights)
    w2, b2 = (keras.ops.convert_to_numpy(w) for w in layer.fc2.weights)
    h = x @ w1 + b1
    gelu = np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(h)
    # float32 kernels against float64 numpy (math.erf): float32 rounding.
    assert_close(np.asarray(layer(x)), gelu @ w2 + b2, FLOAT32_PARITY)


def test_drop_path_drops_whole_samples_and_rescales():
    layer = DropPath(0.5, seed=1)
    x = np.ones((256, 3, 4), "float32")
    np.testing.assert_array_equal(layer(x), x)  # inference is the identity
    out = np.asarray(layer(x, training=True))
    per_sample = out.reshape(256, -1)
    assert set(np.unique(per_sample)) <= {0.0, 2.0}
    assert (per_sample.min(1) == per_sample.max(1)).all()
    assert 0.3 < (per_sample[:, 0] == 0).mean() < 0.7


def test_layer_scale_multiplies_channels():
    layer = LayerScale(0.5)
    x = random(2, 3, 4)
    # A product by 0.5 is exact in float32.
    np.testing.assert_array_equal(layer(x), 0.5 * x)
    assert layer.gamma.shape == (4,)


def test_transformer_block_is_pre_norm_residual():
    block = TransformerBlock(2, 16)
    x = random(2, 5, 8)
    block(x)
    # With the branch outputs zeroed, each residual branch adds nothing.
    for dense in (block.attention.proj, block.mlp.fc2):
        dense.set_weights([np.zeros_like(w) for w in dense.get_weights()])
    # Residuals that add exact zeros (zero kernels and biases).
    np.testing.assert_array_equal(block(x), x)


def test_transformer_block_returns_attention_scores():
    block = TransformerBlock(2, 16)
    x = random(2, 5, 8)
    out, scores = block(x, return_attention_scores=True)
    # The path that returns scores computes them explicitly; the other may
    # not: float32 reassociation.
    assert_close(out, block(x), FLOAT32_PARITY)
    assert scores.shape == (2, 2, 5, 5)
    assert_close(np.asarray(scores).sum(-1), 1.0, 1e-5)


def test_query_tokens_give_the_same_rows_as_the_full_block():
    block = TransformerBlock(2, 16)
    x = random(2, 5, 8)
    full, full_scores = block(x, return_attention_scores=True)
    out, scores = block(x, return_attention_scores=True, num_query_tokens=2)
    assert out.shape == (2, 2, 8) and scores.shape == (2, 2, 2, 5)
    # Fewer query rows: products of other shapes, so other kernels.
    assert_close(out, np.asarray(full)[:, :2], FLOAT32_PARITY)
    assert_close(scores, np.asarray(full_scores)[:, :, :2], 1e-6, scale=1.0)
    for bad in (0, 6):
        with pytest.raises(ValueError, match=rf"must be in \[1, 5\].*got {bad}"):
            block(x, num_query_tokens=bad)


def test_token_pooling_modes():
    x = random(2, 5, 3)
    np.testing.assert_array_equal(TokenPooling("token")(x), x[:, 0])
    np.testing.assert_array_equal(TokenPooling("distillation", 2)(x), x[:, 1])
    # Means of three values in float32 against numpy's float32 mean.
    assert_close(TokenPooling("gap", 2)(x), x[:, 2:].mean(1), 1e-6)
    # transformers' DINOv2 classifier input: class token, then the mean of
    # the patch tokens (registers left out).
    assert_close(
        TokenPooling("token_gap", 2)(x),
        np.concatenate([x[:, 0], x[:, 2:].mean(1)], axis=-1),
        1e-6,
    )
    with pytest.raises(ValueError, match="'gap' or 'token_gap'"):
        TokenPooling("max")
    with pytest.raises(ValueError, match="needs at least 2 prefix tokens"):
        TokenPooling("distillation", 1)


def test_attention_scores_in_a_functional_graph():
    inputs = keras.Input((5, 8))
    out, scores = TransformerBlock(2, 16)(inputs, return_attention_scores=True)
    assert tuple(out.shape) == (None, 5, 8)
    assert tuple(scores.shape) == (None, 2, 5, 5)
    model = keras.Model(inputs, [out, scores])
    values = model(random(3, 5, 8))
    assert values[1].shape == (3, 2, 5, 5)
