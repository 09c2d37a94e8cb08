"""What transformers' newer vision families (DINOv2, DINOv3, SigLIP, CLIP)
share in their `save_pretrained` layouts: the config options that change
the forward pass, read and refused by name, and the separate query / key /
value projections that become keras_vit's fused `qkv` Dense."""

from __future__ import annotations

import numpy as np

from keras_vit.errors import CheckpointError
from keras_vit.pretrained.config_values import (
    agree_flag,
    checked_int,
    config_epsilon,
    config_heads,
    config_image_size,
    config_int,
    shown,
)
from keras_vit.pretrained.layouts import Plan, linear_kernel

# transformers' `ACT2FN` names keras_vit's MLP computes exactly.
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "quick_gelu": "quick_gelu",
    "silu": "silu",
    "swish": "silu",
}


def vision_config(config: dict) -> dict:
    """The vision tower's options: `vision_config` of a two-tower config
    (`SiglipConfig`, `CLIPConfig`), else the config itself."""
    nested = config.get("vision_config")
    return nested if isinstance(nested, dict) else config


def activation(config: dict, family: str, default: str) -> str:
    act = config.get("hidden_act", default)
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise CheckpointError(
            f"{family} hidden_act={act!r} is not supported; valid: "
            f"{sorted(ACTIVATIONS)}."
        )
    return ACTIVATIONS[act]


def epsilon(config: dict, family: str, default: float) -> float:
    eps = config.get("layer_norm_eps")
    return config_epsilon(default if eps is None else eps, "layer_norm_eps", family)


def check_sizes(config: dict, family: str, layers: int, hidden: int, mlp=None):
    """`num_hidden_layers`, `hidden_size` and `intermediate_size` (when the
    family has one: `mlp`, the MLP width the tensors hold) against the
    tensors."""
    checked_int(config, "num_hidden_layers", family, layers, "{} block(s)")
    checked_int(config, "hidden_size", family, hidden, "a hidden width of {}")
    if mlp is not None:
        checked_int(config, "intermediate_size", family, mlp, "an MLP width of {}")


def check_shape_options(
    config: dict, family: str, hidden: int, heads: int, patch: int, channels: int
) -> tuple[int, int] | None:
    """Checks `patch_size`, `num_channels` and `head_dim` against the
    tensors; returns the configured `image_size` as `(height, width)`."""
    size = config.get("patch_size")
    if size is not None:
        sizes = config_image_size(size, "patch_size", family)
        if sizes != (patch, patch):
            raise CheckpointError(
                f"{family} patch_size={shown(size)} contradicts the tensors, "
                f"whose patch projection is {patch}x{patch} (keras_vit has square "
                "patches)."
            )
    checked_int(config, "num_channels", family, channels, "{} input channel(s)")
    head_dim = config.get("head_dim")
    if head_dim is not None:
        config_int(head_dim, "head_dim", family)
        if head_dim * heads != hidden:
            raise CheckpointError(
                f"{family} head_dim={head_dim!r} with {heads} heads does not span "
                f"hidden_size {hidden}; keras_vit's heads split the hidden width."
            )
    image = config.get("image_size")
    return None if image is None else config_image_size(image, "image_size", family)


def heads_of(config: dict, hidden: int, hints: dict, family: str) -> int:
    heads = config.get("num_attention_heads")
    if heads is not None:
        return config_heads(heads, "num_attention_heads", family, hidden)
    heads = hints.get("num_heads")
    if not heads:
        raise CheckpointError(
            f"{family} config without num_attention_heads; pass num_heads=."
        )
    return config_heads(heads, "num_heads", "convert_checkpoint", hidden)


def require_flag(config: dict, key: str, found: bool, family: str, what: str) -> None:
    """A config flag the tensors also tell: they must agree."""
    agree_flag(family, key, config.get(key), found, what)


def root_of(tensors: dict, suffix: str) -> str:
    """The prefix (`"dinov2."`, `"vision_model."`, `""`) of the one tensor
    ending in `suffix`."""
    roots = sorted(k[: -len(suffix)] for k in tensors if k.endswith(suffix))
    if len(roots) != 1:
        raise CheckpointError(
            f"Expected one tensor ending in {suffix!r}, found {len(roots)}."
        )
    return roots[0]


def add_qkv(plan: Plan, tensors: dict, names: tuple[str, str, str], dst: str) -> bool:
    """Separate query, key and value `Linear`s (`names`, without `.weight`)
    as the fused `qkv` Dense; a missing bias (DINOv3's key) is zero.
    Returns whether there is any bias."""
    plan.add(
        f"{dst}attention/qkv/kernel",
        [n + ".weight" for n in names],
        lambda *w: np.concatenate([linear_kernel(x) for x in w], axis=1),
    )
    present = [n + ".bias" for n in names if n + ".bias" in tensors]
    if not present:
        return False
    has = tuple(n + ".bias" in tensors for n in names)

    def bias(*given, width=tensors[names[0] + ".weight"].shape[0]):
        given = iter(given)
        return np.concatenate(
            [next(given) if h else np.zeros(width, "float32") for h in has]
        )

    plan.add(f"{dst}attention/qkv/bias", present, bias)
    return True


def ignore_except(plan: Plan, tensors: dict, root: str, reason: str) -> None:
    """Every tensor outside `root` that the plan does not use (a two-tower
    checkpoint's text tower and its logit scale) is left out on purpose,
    with `reason`; call it once the plan is complete."""
    used = {s for sources, _ in plan.assign.values() for s in sources}
    plan.ignore(
        [k for k in tensors if not k.startswith(root) and k not in used], reason
    )


def ignore_buffers(plan: Plan, tensors: dict) -> None:
    """Older checkpoints carry the `position_ids` index buffer
    (0, 1, ..., N - 1): nothing to convert."""
    plan.ignore(
        [k for k in tensors if k.endswith("position_ids")],
        "index buffer of older transformers releases",
    )
