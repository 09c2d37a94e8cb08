"""The numbers a converter reads from a checkpoint's config, checked before
they build anything: the right type (an int is an int, and a bool is not
one), finite, in a range a real checkpoint uses, and equal to what the
tensors say where they say it. Each refusal is one line naming the key, the
value and what is valid."""

from __future__ import annotations

import math

from keras_vit.errors import CheckpointError

# LayerNorm / RMSNorm epsilon. Checkpoints use 1e-12 (BERT-style HF ViT) to
# 1e-5 (CLIP, DINOv3); 0 or a negative one divides by zero on a constant
# token and gives NaN, one below 1e-30 vanishes in float32's variance of
# tiny activations the same way, and one above 1e-2 no longer normalises
# activations of order one (outputs finite but wrong). So: [1e-30, 1e-2].
EPS_RANGE = (1e-30, 1e-2)
# Rotary `theta` / `temperature`: 100 (DINOv3) and 10,000 (EVA-02, ROPE-ViT)
# in practice. Below 1 the bands' frequencies rise instead of fall; above
# 1e9 all but the first band rotate by less than float32 resolves over any
# grid keras_vit builds.
ROPE_THETA_RANGE = (1.0, 1e9)
# An image side from a config: at most the largest image keras_vit's image
# readers accept (16384 pixels), so a typo cannot ask for a huge table.
MAX_IMAGE_SIDE = 16384
# mlp_ratio: 4 for most ViTs, 2.67 to 5.33 for the SwiGLU and giant ones.
MLP_RATIO_RANGE = (1e-3, 64.0)


def shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def config_int(value, key: str, family: str, low: int = 1, high: int | None = None):
    """`value` if it is an int in `[low, high]`; else one line naming it."""
    if not is_int(value) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise CheckpointError(
            f"{family} {key}={shown(value)} is not valid; expected an int {bound}."
        )
    return value


def config_float(value, key: str, family: str, low: float, high: float) -> float:
    """`value` as a float if it is a finite number in `[low, high]`."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise CheckpointError(
            f"{family} {key}={shown(value)} is not valid; expected a "
            f"finite number in [{low:g}, {high:g}]."
        )
    return float(value)


def config_epsilon(value, key: str, family: str) -> float:
    return config_float(value, key, family, *EPS_RANGE)


def config_image_size(value, key: str, family: str) -> tuple[int, int]:
    """An image size given as `224` or `[height, width]`."""
    sides = value if isinstance(value, (list, tuple)) else [value]
    if len(sides) not in (1, 2) or not all(
        is_int(s) and 1 <= s <= MAX_IMAGE_SIDE for s in sides
    ):
        raise CheckpointError(
            f"{family} {key}={shown(value)} is not valid; expected an "
            f"int or [height, width] of ints in [1, {MAX_IMAGE_SIDE}]."
        )
    return (sides[0], sides[-1])


def agree(family: str, key: str, value, found, what: str, note: str = "") -> None:
    """A config number the tensors also tell: `found` is what they hold,
    `what` says it with `{}` for the number ("{} block(s)", "a hidden width
    of {}"); `note` says where the value came from when not from the config
    itself."""
    if value != found:
        raise CheckpointError(
            f"{family} {key}={shown(value)}{note} contradicts the tensors, which "
            f"have {what.format(found)}; the config and the weights describe "
            "different models."
        )


def agree_width(
    family: str, ratio, hidden: int, width: int, name: str, tensors: dict
) -> None:
    """`mlp_ratio` against the MLP width of tensor `name`'s rows."""
    rows = int(tensors[name].shape[0])
    if rows != width:
        raise CheckpointError(
            f"{family} mlp_ratio={shown(ratio)} makes the MLP {width} wide at hidden "
            f"width {hidden}; the tensors' {name} is {rows} wide. The config and "
            "the weights describe different models."
        )


def agree_flag(family: str, key: str, value, found: bool, what: str) -> None:
    """A config switch the tensors also tell (a class token, a bias)."""
    if value is None:
        return
    if not isinstance(value, bool):
        raise CheckpointError(
            f"{family} {key}={shown(value)} is not valid; expected true or false."
        )
    if value != found:
        raise CheckpointError(
            f"{family} {key}={value} contradicts the tensors, which "
            f"{'have' if found else 'lack'} {what}."
        )


def checked_int(config: dict, key: str, family: str, found: int, what: str, low=1):
    """`config[key]` validated as an int and checked against `found`; does
    nothing when the key is absent (or null)."""
    value = config.get(key)
    if value is None:
        return
    agree(family, key, config_int(value, key, family, low), found, what)


def config_heads(value, key: str, family: str, hidden: int) -> int:
    """A head count: an int in [1, hidden] that divides the hidden width."""
    heads = config_int(value, key, family, 1, hidden)
    if hidden % heads:
        raise CheckpointError(
            f"{family} {key}={heads} does not divide the hidden width "
            f"{hidden} the tensors have; valid: a divisor of {hidden}."
        )
    return heads


def config_flag(args: dict, key: str, default: bool, family: str) -> bool:
    """A switch: true or false (absent or null: `default`). `bool()` of
    anything else would read "false" or 0.5 as a choice."""
    value = args.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise CheckpointError(
            f"{family} {key}={shown(value)} is not valid; expected true or false."
        )
    return value


# Top-level config keys and the JSON type each must have, where present.
CONFIG_TYPES = {
    "model_type": str,
    "architecture": str,
    "model_args": dict,
    "pretrained_cfg": dict,
    "vision_config": dict,
    "hidden_act": str,
    "pooler_act": str,
    "global_pool": str,
}


def check_config_types(config: dict) -> None:
    """The keys that choose a layout and its options hold what they must
    (a string, an object), in the config and in its `vision_config`."""
    for scope, where in ((config, ""), (config.get("vision_config"), "vision_config.")):
        if not isinstance(scope, dict):
            continue
        for key, kind in CONFIG_TYPES.items():
            value = scope.get(key)
            if value is not None and not isinstance(value, kind):
                expected = "a string" if kind is str else "an object"
                raise CheckpointError(
                    f"config {where}{key}={shown(value)} is not valid; expected "
                    f"{expected}."
                )


def check_overrides(overrides: dict) -> None:
    """`convert_checkpoint`'s architecture overrides, which stand in for
    config values: the same checks."""
    family = "convert_checkpoint"
    for key, low in (("num_heads", 1), ("norm_groups", 1)):
        if overrides.get(key) is not None:
            value = overrides[key]
            if not is_int(value) or value < low:
                raise ValueError(f"{key}= must be a positive int, got {shown(value)}.")
    if overrides.get("layer_norm_epsilon") is not None:
        try:
            config_epsilon(overrides["layer_norm_epsilon"], "eps", family)
        except CheckpointError:
            raise ValueError(
                "layer_norm_epsilon= must be a finite number in "
                f"[{EPS_RANGE[0]:g}, {EPS_RANGE[1]:g}], got "
                f"{shown(overrides['layer_norm_epsilon'])}."
            ) from None
