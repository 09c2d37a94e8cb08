"""How each ecosystem lays out a ViT checkpoint: the tensors are read for
the architecture (timm, Hugging Face transformers, AugReg / big_vision), and
each keras_vit variable gets its source tensors and a transform."""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from keras_vit.errors import CheckpointError
from keras_vit.models.vit import variant_heads
from keras_vit.pretrained.config_values import config_heads as config_heads_value
from keras_vit.pretrained.json_files import name_list


@dataclass
class Plan:
    """What a checkpoint holds: the builder's arguments and, for each model
    variable path, the source tensors and how to turn them into its value."""

    builder: Callable
    kwargs: dict
    grid: tuple[int, int]
    stride: int
    num_classes: int
    assign: dict[str, tuple[tuple[str, ...], Callable]] = field(default_factory=dict)
    # "timm", "huggingface" or "big_vision" (AugReg too): where the
    # preprocessing and labels are read from.
    layout: str = ""
    # Tensors the checkpoint holds that the converted model deliberately
    # leaves out (a CLIP text tower, a pretraining mask token), each with
    # the reason; any other tensor the model does not use is an error.
    ignored: dict[str, str] = field(default_factory=dict)

    def add(self, target: str, sources, fn: Callable | None = None) -> None:
        sources = (sources,) if isinstance(sources, str) else tuple(sources)
        self.assign[target] = (sources, fn or (lambda x: x))

    def ignore(self, names, reason: str) -> None:
        for name in names:
            self.ignored[name] = reason


def linear_kernel(w):  # torch Linear (out, in) -> keras Dense (in, out)
    return w.T


def packed(kernel: bool):
    """A gated MLP's gate and value projections (torch `Linear` weights or
    biases) packed, gate first, as keras_vit's one `fc1`."""

    def fn(gate, value):
        both = np.concatenate([gate, value], axis=0)
        return linear_kernel(both) if kernel else both

    return fn


def conv_kernel(w):  # torch conv (out, in, kh, kw) -> keras (kh, kw, in, out)
    return w.transpose(2, 3, 1, 0)


def patch_kernel(w):  # torch (out, in, p, p) -> Patches + Dense (p * p * in, out)
    return w.transpose(2, 3, 1, 0).reshape(-1, w.shape[0])


# Suffixes of a normalisation's scale and offset: torch's and Flax's.
TORCH_NORM = (".weight", ".bias")
FLAX_NORM = ("/scale", "/bias")


def add_layer_norm(
    plan: Plan, target: str, source: str, suffixes=TORCH_NORM, fn=None
) -> None:
    """A normalisation layer's scale and offset (`gamma`, `beta`, the names
    keras' LayerNormalization and GroupNormalization share) from `source`
    plus each suffix: torch's `.weight` / `.bias`, Flax's `/scale` / `/bias`."""
    plan.add(f"{target}/gamma", source + suffixes[0], fn)
    plan.add(f"{target}/beta", source + suffixes[1], fn)


def add_torch_linear(plan: Plan, target: str, source: str, bias: bool = True) -> None:
    """A torch `Linear` (`source.weight`, `source.bias`) as a keras `Dense`."""
    plan.add(f"{target}/kernel", f"{source}.weight", linear_kernel)
    if bias:
        plan.add(f"{target}/bias", f"{source}.bias")


def count_indexed(tensors, pattern: str) -> int:
    regex = re.compile(pattern)
    found = {int(m.group(1)) for k in tensors if (m := regex.match(k))}
    if found and found != set(range(max(found) + 1)):
        gaps = sorted(set(range(max(found) + 1)) - found)
        raise CheckpointError(
            f"Block indices 0 to {max(found)} have gaps: no block {name_list(gaps)}."
        )
    return len(found)


def infer_heads(
    hidden_dim: int, config_heads, hint=None, key: str = "num_heads", family="timm"
) -> int:
    """The config's head count (validated: an int dividing `hidden_dim`),
    else the caller's `num_heads=`, else the VARIANTS table or a guess."""
    if config_heads is not None:
        return config_heads_value(config_heads, key, family, hidden_dim)
    if hint:
        return int(hint)
    table = variant_heads(hidden_dim)
    if table:
        return table
    # timm, DeiT and the paper use 64-wide heads for every size; the
    # tensors cannot tell, so say that this is a guess.
    guess = max(hidden_dim // 64, 1)
    warnings.warn(
        f"Neither the config nor the VARIANTS table gives the number of heads "
        f"for hidden_dim={hidden_dim}; assuming {guess} (64-wide heads). Pass "
        "num_heads= if the checkpoint used another number.",
        stacklevel=6,
    )
    return guess


def infer_grid(
    tokens: int,
    prefix: int,
    image_hw_: tuple[int, int] | None,
    stride: int,
    hint: tuple[int, int] | None = None,
):
    """The checkpoint's patch grid and whether its position table covers the
    prefix tokens (timm's `no_embed_class=False`).

    The checkpoint's own image size must fit; without one, the requested
    size is tried (a checkpoint used at its training size), then a square.
    """
    for size, must_fit in ((image_hw_, True), (hint, False)):
        if size is None:
            continue
        grid = (size[0] // stride, size[1] // stride)
        for covered in (True, False):
            if grid[0] * grid[1] == tokens - (prefix if covered else 0):
                return grid, covered
        if must_fit:
            raise CheckpointError(
                f"A position embedding of {tokens} tokens with {prefix} prefix "
                f"token(s) does not fit the checkpoint's {size[0]}x{size[1]} "
                f"images (its config's image size) at stride {stride}."
            )
    for covered in (True, False):
        patches = tokens - (prefix if covered else 0)
        side = math.isqrt(max(patches, 0))
        if patches > 0 and side * side == patches:
            return (side, side), covered
    raise CheckpointError(
        f"A position embedding of {tokens} tokens with {prefix} prefix token(s) "
        "is not a square grid and nothing gives the checkpoint's image size; "
        "pass image_size= of the checkpoint."
    )


def position_rule(covered: bool, prefix: int):
    def fn(pos):
        pos = pos.reshape(1, -1, pos.shape[-1])
        if not covered:
            # Prefix tokens without a position embedding (timm's
            # no_embed_class): zero rows are the same thing in a model whose
            # table covers the prefix tokens.
            pos = np.concatenate([np.zeros_like(pos[:, :prefix]), pos], axis=1)
        return pos

    return fn


def model_name(label, default: str) -> str:
    label = re.sub(r"[^0-9A-Za-z_]+", "_", str(label or "")).strip("_")
    return label or default


# Tensor-name patterns of architecture features keras_vit's ViT does not
# have, per layout, so a refusal names the features rather than only listing
# tensors it could not place.
UNSUPPORTED_FEATURES = {
    "timm": (
        (r"mlp\.(w12|w3)\.", "SwiGLU with w12 / w3 weights"),
        (r"attn\.norm\.", "LayerNorm before the attention projection"),
        (r"attn\.(q_bias|v_bias)$", "separate query / value biases (BEiT)"),
        (r"(^|\.)rope(\.|$)|freqs", "rotary position embedding (RoPE)"),
        (r"^attn_pool\.pos_embed", "position embedding inside the MAP head"),
        (r"relative_position", "relative position bias"),
    ),
    "huggingface": (
        (r"\.(q|k)_norm\.", "QK-norm (LayerNorm on queries and keys)"),
        (r"mlp\.weights_in\.|mlp\.(w12|w3)\.", "SwiGLU / gated MLP"),
        (r"relative_position", "relative position bias"),
    ),
}


def refuse_unsupported(tensors, layout: str) -> None:
    """Raises `CheckpointError` naming every unsupported feature found."""
    found: dict[str, list[str]] = {}
    for pattern, feature in UNSUPPORTED_FEATURES[layout]:
        regex = re.compile(pattern)
        names = sorted(n for n in tensors if regex.search(n))
        if names:
            found.setdefault(feature, []).extend(names)
    if found:
        listed = "; ".join(
            f"{feature} ({names[0]}{', ...' if len(names) > 1 else ''})"
            for feature, names in found.items()
        )
        raise CheckpointError(
            f"This {layout} checkpoint uses {len(found)} feature(s) keras_vit's "
            f"ViT does not have: {listed}. Supported: class / distillation / "
            "register tokens, learned, sin-cos or no position embedding, "
            "LayerScale, GELU / quick-GELU / SwiGLU MLPs, QK-norm, LayerNorm or "
            "RMSNorm, norm_pre, token / mean / MAP pooling, fc_norm, pre-logits."
        )
