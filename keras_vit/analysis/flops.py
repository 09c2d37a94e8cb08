"""Parameter and FLOP counts, worked out from shapes rather than measured.

Counts are multiply-accumulates (MACs) of one image's forward pass through
every matrix product and convolution, the two attention products
(`q @ k^T` and `probs @ v`) included; FLOPs are twice the MACs. Element-wise
work (normalisation, softmax, GELU, biases) is left out, as in the ViT and
DeiT papers' figures: ViT-B/16 at 224 is 17.56 GMACs = 35.13 GFLOPs.

`count_macs` walks any functional model built from keras_vit's and Keras'
layers (ViT, HybridViT with its CNN stem, nested backbones);
`vit_parameter_count` and `vit_macs` compute the same figures for a ViT from
its variant alone, without building it (for the large variants).
"""

from __future__ import annotations

import math

import keras

from keras_vit.models.blocks import MultiHeadSelfAttention, TransformerBlock
from keras_vit.models.hybrid import StdConv2D
from keras_vit.models.layers import PatchEncoder, Patches
from keras_vit.models.pooling import MAPHead
from keras_vit.models.sublayers import MLP, LayerScale
from keras_vit.models.vit import resolve_architecture


def _attention_macs(tokens: int, hidden_dim: int, inner: int | None = None) -> int:
    # Fused QKV projection, q @ k^T, probs @ v, output projection; `inner` is
    # num_heads * head_dim, narrower than hidden_dim once heads are pruned.
    inner = hidden_dim if inner is None else inner
    return (
        tokens * hidden_dim * 3 * inner
        + 2 * tokens * tokens * inner
        + tokens * inner * hidden_dim
    )


def _mlp_macs(tokens: int, hidden_dim: int, mlp_dim: int) -> int:
    return 2 * tokens * hidden_dim * mlp_dim


def _block_macs(
    tokens: int, hidden_dim: int, mlp_dim: int, inner: int | None = None
) -> int:
    return _attention_macs(tokens, hidden_dim, inner) + _mlp_macs(
        tokens, hidden_dim, mlp_dim
    )


def _inner(attention) -> int | None:
    head_dim = getattr(attention, "head_dim", None)
    return None if head_dim is None else attention.num_heads * head_dim


def _map_head_macs(tokens: int, hidden_dim: int, mlp_dim: int) -> int:
    # Probe query, fused key/value, probe @ k^T, probs @ v, output
    # projection, MLP on the one pooled vector.
    return (
        hidden_dim * hidden_dim
        + tokens * hidden_dim * 2 * hidden_dim
        + 2 * tokens * hidden_dim
        + hidden_dim * hidden_dim
        + _mlp_macs(1, hidden_dim, mlp_dim)
    )


def _map_head_parameters(hidden_dim: int, mlp_dim: int, qkv_bias: bool) -> int:
    d, m = hidden_dim, mlp_dim
    return (
        d  # probe
        + 3 * d * d
        + (3 * d if qkv_bias else 0)
        + d * d
        + d
        + 2 * d  # LayerNorm
        + d * m
        + m
        + m * d
        + d
    )


def _layer_macs(layer, input_shape, output_shape) -> int | None:
    """MACs of one call for one example, or None for a layer this module
    does not know how to count."""
    if isinstance(layer, TransformerBlock):
        return _block_macs(
            input_shape[1], input_shape[2], layer.mlp_dim, _inner(layer.attention)
        )
    if isinstance(layer, MAPHead):
        return _map_head_macs(input_shape[1], input_shape[2], layer.mlp_dim)
    if isinstance(layer, MultiHeadSelfAttention):
        return _attention_macs(input_shape[1], input_shape[2], _inner(layer))
    if isinstance(layer, MLP):
        return _mlp_macs(math.prod(input_shape[1:-1]), input_shape[-1], layer.mlp_dim)
    if isinstance(layer, PatchEncoder):
        return math.prod(input_shape[1:-1]) * input_shape[-1] * layer.hidden_dim
    if isinstance(layer, keras.layers.Dense):
        return math.prod(input_shape[1:-1]) * input_shape[-1] * layer.units
    if isinstance(layer, StdConv2D):
        per_position = layer.kernel_size**2 * input_shape[-1] * layer.filters
        return math.prod(output_shape[1:-1]) * per_position
    if isinstance(layer, keras.layers.SeparableConv2D):
        positions = math.prod(output_shape[1:-1])
        channels = input_shape[-1] * layer.depth_multiplier
        return positions * (
            math.prod(layer.kernel_size) * channels + channels * layer.filters
        )
    if isinstance(layer, keras.layers.DepthwiseConv2D):
        channels = input_shape[-1] * layer.depth_multiplier
        return math.prod(output_shape[1:-1]) * math.prod(layer.kernel_size) * channels
    if isinstance(
        layer, (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D)
    ):
        if layer.data_format == "channels_first":
            raise ValueError(
                f"Layer {layer.name!r} is channels_first; FLOP counting supports "
                "channels_last models only."
            )
        per_position = (
            math.prod(layer.kernel_size)
            * (input_shape[-1] // layer.groups)
            * layer.filters
        )
        return math.prod(output_shape[1:-1]) * per_position
    return None


def _nodes(model: keras.Model):
    functional = getattr(model, "_functional", None) or model
    if not hasattr(functional, "_nodes_by_depth"):
        raise ValueError(
            f"Model {model.name!r} is not a functional model; FLOPs are counted "
            "from the functional graph's shapes."
        )
    for depth in sorted(functional._nodes_by_depth, reverse=True):
        yield from functional._nodes_by_depth[depth]


def macs_by_layer(model: keras.Model) -> tuple[dict[str, int], list[str]]:
    """Per-layer MACs for one image, and the layers with weights that were
    not counted (none for ViT and HybridViT).

    Returns:
        `(macs, uncounted)`: `macs` maps layer names to MACs (a nested model's
        layers as `"outer/inner"`); `uncounted` names layers that have
        weights but no known MAC formula (e.g. normalisation layers are
        expected there only if they are not LayerNorm, BatchNorm or
        GroupNorm).
    """
    macs: dict[str, int] = {}
    uncounted: list[str] = []
    elementwise = (
        LayerScale,
        keras.layers.LayerNormalization,
        keras.layers.BatchNormalization,
        keras.layers.GroupNormalization,
    )
    for node in _nodes(model):
        layer = node.operation
        if isinstance(layer, keras.layers.InputLayer):
            continue
        if isinstance(layer, keras.Model):
            inner, inner_uncounted = macs_by_layer(layer)
            for name, value in inner.items():
                key = f"{layer.name}/{name}"
                macs[key] = macs.get(key, 0) + value
            uncounted += [f"{layer.name}/{name}" for name in inner_uncounted]
            continue
        inputs, outputs = node.input_tensors, node.output_tensors
        if not inputs or not outputs:
            continue
        value = _layer_macs(layer, tuple(inputs[0].shape), tuple(outputs[0].shape))
        if value is None:
            if layer.weights and not isinstance(layer, elementwise):
                uncounted.append(layer.name)
            continue
        macs[layer.name] = macs.get(layer.name, 0) + int(value)
    return macs, uncounted


def count_macs(model: keras.Model) -> int:
    """Multiply-accumulates of one image's forward pass (FLOPs = 2 x MACs).

    Raises:
        ValueError: if a layer with weights has no known formula, so the
            count would silently be too low.
    """
    macs, uncounted = macs_by_layer(model)
    if uncounted:
        raise ValueError(
            f"Cannot count FLOPs of model {model.name!r}: no formula for layers "
            f"{uncounted}. Counted: Dense, Conv1D/2D/3D, DepthwiseConv2D, "
            "SeparableConv2D and keras_vit's layers."
        )
    return sum(macs.values())


def _vit_shape(variant, image_size, num_channels, options):
    """`(arch, num_patches, patch_dim, prefix tokens, other options)` for
    `ViT`'s arguments, checked as `ViT` checks them."""
    arch, (height, width), options = resolve_architecture(variant, image_size, options)
    _check_options(options)
    p = arch["patch_size"]
    distilled = bool(options.get("distilled", False))
    class_token = options.get("class_token")
    if class_token is None:
        class_token = options.get("pooling", "token") not in ("gap", "map")
        class_token = class_token or distilled
    prefix = int(bool(class_token)) + int(distilled)
    num_patches = (height // p) * (width // p)
    # Shifted patch tokenisation: the patch and four shifted copies of it.
    copies = 1 + len(Patches.SHIFTS) if options.get("shifted_patches", False) else 1
    return arch, num_patches, p * p * num_channels * copies, prefix, options


_COUNTED_OPTIONS = {
    "include_top",
    "pooling",
    "representation_size",
    "distilled",
    "class_token",
    "position_embedding",
    "patch_norm",
    "shifted_patches",
    "qkv_bias",
    "layer_scale_init",
    "num_register_tokens",
}
# Options that change no weight and no product.
_NEUTRAL_OPTIONS = {
    "pool_norm",
    "dropout_rate",
    "attention_dropout_rate",
    "drop_path_rate",
    "layer_norm_epsilon",
    "classifier_activation",
    "name",
}


def _check_options(options) -> None:
    unknown = set(options) - _COUNTED_OPTIONS - _NEUTRAL_OPTIONS
    if unknown:
        raise ValueError(
            f"Unknown ViT options {sorted(unknown)}; valid: "
            f"{sorted(_COUNTED_OPTIONS | _NEUTRAL_OPTIONS)}."
        )


def _pooled_width(hidden_dim: int, options: dict) -> int:
    """Features after pooling: `"token_gap"` puts the class token and the
    patch mean side by side."""
    return 2 * hidden_dim if options.get("pooling") == "token_gap" else hidden_dim


def vit_parameter_count(
    variant: str = "B/16",
    image_size: int | tuple[int, int] = 224,
    num_classes: int = 1000,
    *,
    num_channels: int = 3,
    **options,
) -> int:
    """`ViT(...).count_params()` for the same arguments, without building it.

    Takes `ViT`'s arguments; e.g. `vit_parameter_count("B/16")` is
    86,567,656 and `vit_parameter_count("Ti/16", include_top=False)` is
    5,524,416. Non-trainable weights (a sin-cos position table) count too,
    as in `count_params`.
    """
    arch, num_patches, patch_dim, prefix, options = _vit_shape(
        variant, image_size, num_channels, options
    )
    d, m = arch["hidden_dim"], arch["mlp_dim"]
    registers = options.get("num_register_tokens", 0)
    total = patch_dim * d + d + (prefix + registers) * d
    if options.get("patch_norm", False):
        total += 2 * patch_dim + 2 * d
    learned = options.get("position_embedding", "learned") == "learned"
    total += (prefix + num_patches if learned else num_patches) * d
    block = (
        2 * d
        + d * 3 * d
        + (3 * d if options.get("qkv_bias", True) else 0)
        + d * d
        + d
        + 2 * d
        + d * m
        + m
        + m * d
        + d
    )
    if options.get("layer_scale_init") is not None:
        block += 2 * d
    total += arch["num_layers"] * block + 2 * d
    if options.get("pooling") == "map":
        total += _map_head_parameters(d, m, options.get("qkv_bias", True))
    features = _pooled_width(d, options)
    representation = options.get("representation_size")
    if representation:
        total += features * representation + representation
        features = representation
    if options.get("include_top", True):
        heads = 2 if options.get("distilled", False) else 1
        total += heads * (features * num_classes + num_classes)
    return total


def vit_macs(
    variant: str = "B/16",
    image_size: int | tuple[int, int] = 224,
    num_classes: int = 1000,
    *,
    num_channels: int = 3,
    **options,
) -> int:
    """`count_macs(ViT(...))` for the same arguments, without building it."""
    arch, num_patches, patch_dim, prefix, options = _vit_shape(
        variant, image_size, num_channels, options
    )
    d = arch["hidden_dim"]
    tokens = prefix + options.get("num_register_tokens", 0) + num_patches
    total = num_patches * patch_dim * d
    total += arch["num_layers"] * _block_macs(tokens, d, arch["mlp_dim"])
    if options.get("pooling") == "map":
        total += _map_head_macs(tokens, d, arch["mlp_dim"])
    features = _pooled_width(d, options)
    representation = options.get("representation_size")
    pooled = 2 if options.get("distilled", False) else 1
    if representation:
        total += pooled * features * representation
        features = representation
    if options.get("include_top", True):
        total += pooled * features * num_classes
    return total
