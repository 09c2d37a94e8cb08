"""Every keras_vit layer follows Keras' dtype-policy contract on its own:
sub-layers share its policy, outputs are in its compute dtype, variables stay
float32, and it trains and reloads under a mixed policy."""

import functools

import keras
import numpy as np
import pytest
from helpers import assert_close, check_dtype_policy_contract

from keras_vit.models.blocks import MultiHeadSelfAttention, TransformerBlock
from keras_vit.models.hybrid import StdConv2D
from keras_vit.models.layers import PatchEncoder, Patches, TokenPooling
from keras_vit.models.sublayers import MLP, DropPath, LayerScale

POLICIES = ["float32", "mixed_float16", "mixed_bfloat16"]

LAYERS = {
    "Patches": (functools.partial(Patches, 4), (2, 8, 12, 3)),
    "PatchEncoder": (functools.partial(PatchEncoder, 16), (2, 9, 12)),
    "PatchEncoder_sincos_norm": (
        functools.partial(
            PatchEncoder,
            16,
            distillation_token=True,
            position_embedding="sincos",
            grid_size=(2, 3),
            patch_norm=True,
            dropout_rate=0.1,
        ),
        (2, 6, 12),
    ),
    "MultiHeadSelfAttention": (
        functools.partial(MultiHeadSelfAttention, 4, attention_dropout_rate=0.1),
        (2, 5, 16),
    ),
    "MLP": (functools.partial(MLP, 32, dropout_rate=0.1), (2, 5, 16)),
    "TransformerBlock": (
        functools.partial(
            TransformerBlock, 4, 32, drop_path_rate=0.1, layer_scale_init=0.1
        ),
        (2, 5, 16),
    ),
    "TokenPooling": (functools.partial(TokenPooling, "gap", 1), (2, 5, 16)),
    "DropPath": (functools.partial(DropPath, 0.2, seed=1), (2, 5, 16)),
    "LayerScale": (functools.partial(LayerScale, 0.1), (2, 5, 16)),
    "StdConv2D": (functools.partial(StdConv2D, 8, 3, strides=2), (2, 8, 8, 3)),
}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_alone_follows_the_dtype_policy(name, policy, tmp_path):
    make_layer, shape = LAYERS[name]
    check_dtype_policy_contract(make_layer, shape, policy, tmp_path)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_sub_layers_share_the_parent_policy_and_are_built(policy):
    block = TransformerBlock(2, 16, drop_path_rate=0.1, dtype=policy)
    block.build((None, 5, 8))
    subs = list(block._flatten_layers(include_self=False))
    assert {s.name for s in subs} >= {"qkv", "proj", "fc1", "fc2", "drop_path2"}
    for sub in subs:
        assert sub.built, sub.name
        # The attention probabilities' dropout is float32 on purpose.
        if sub.name != "probs_dropout":
            assert sub.dtype_policy.name == policy, sub.name


def test_attention_statistics_stay_float32_under_float16():
    layer = MultiHeadSelfAttention(2, dtype="mixed_float16")
    x = keras.ops.cast(
        np.random.default_rng(0).standard_normal((1, 5, 8)) * 60, "float16"
    )
    out, probs = layer(x, return_attention_scores=True)
    assert out.dtype == "float16"
    assert probs.dtype == "float32"
    # float32 softmax rows: sums of values of order one.
    assert_close(np.asarray(probs).sum(-1), 1.0, 1e-5)
