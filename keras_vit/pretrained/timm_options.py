"""What a timm ViT checkpoint's forward pass is, from its `config.json`.

timm writes only the arguments given to `timm.create_model` into a
checkpoint's `model_args`; the rest come from the registered architecture
(`vit_small_patch14_dinov2` means 14-pixel patches, LayerScale, ...).
`timm_architectures.json` holds every `vision_transformer.py` and `eva.py`
architecture's registered arguments as timm 1.0.31 defines them (written by
scripts/make_family_fixtures.py); the checkpoint's own `model_args` win.
Every argument is either mapped onto a keras_vit builder option, known to
change nothing at inference, or refused by name.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from keras_vit.errors import CheckpointError
from keras_vit.pretrained.config_values import (
    MLP_RATIO_RANGE,
    agree,
    config_epsilon,
    config_flag,
    config_float,
    config_image_size,
    config_int,
)

TABLE = Path(__file__).with_name("timm_architectures.json")

# Arguments that do not change the inference forward pass (or that the
# tensors and the rest of the converter read: shapes, tokens, pooling).
NEUTRAL = {
    "img_size",
    "patch_size",
    "in_chans",
    "num_classes",
    "embed_dim",
    "depth",
    "num_heads",
    "mlp_ratio",
    "qkv_bias",
    "class_token",
    "reg_tokens",
    "no_embed_class",
    "init_values",
    "global_pool",
    "fc_norm",
    "dynamic_img_size",
    "dynamic_img_pad",
    "drop_rate",
    "pos_drop_rate",
    "patch_drop_rate",
    "proj_drop_rate",
    "attn_drop_rate",
    "drop_path_rate",
    "weight_init",
    "fix_init",
    # Read by the MAP pooling (pooling.py's owner).
    "pool_include_prefix",
}
ACTIVATIONS = {
    None: "gelu",
    "gelu": "gelu",
    "GELU": "gelu",
    "gelu_tanh": "gelu_tanh",
    "GELUTanh": "gelu_tanh",
    "quick_gelu": "quick_gelu",
    "QuickGELU": "quick_gelu",
    "silu": "silu",
    "swish": "silu",
    "SiLU": "silu",
}
NORMS = {
    "LayerNorm": "layernorm",
    "layernorm": "layernorm",
    "RmsNorm": "rmsnorm",
    "rmsnorm": "rmsnorm",
}
DEFAULTS = {"block_fn": "Block", "attn_layer": "Attention", "embed_layer": "PatchEmbed"}


@functools.cache
def architectures() -> dict:
    return json.loads(TABLE.read_text())


def timm_arguments(config: dict) -> tuple[str | None, dict]:
    """`(timm model class, arguments)`: the registered architecture's
    arguments updated by the checkpoint's `model_args`. An architecture the
    table does not hold (a hybrid, a custom name) has the checkpoint's
    arguments only, with timm's class defaults for the rest."""
    name = config.get("architecture")
    entry = architectures().get(name) if isinstance(name, str) else None
    args = dict(entry["model_args"]) if entry else {}
    # `timm.create_model` drops arguments given as None, so a null in
    # `model_args` leaves the registered value in force (EVA-02's
    # ref_feat_shape=None still rescales RoPE to 16x16).
    given = config.get("model_args") or {}
    args.update({k: v for k, v in given.items() if v is not None})
    return (entry["class"] if entry else None), args


def _norm(spec, default_eps: float, what: str) -> tuple[str, float]:
    if spec is None:
        return "layernorm", default_eps
    layer, eps = spec, default_eps
    if isinstance(spec, dict):
        extra = set(spec) - {"layer", "eps"}
        if extra:
            raise CheckpointError(
                f"timm {what}={spec!r} has arguments keras_vit does not read: "
                f"{sorted(extra)}."
            )
        layer = spec.get("layer")
        eps = config_epsilon(spec.get("eps", 1e-6), f"{what}.eps", "timm")
    if not isinstance(layer, str) or layer not in NORMS:
        raise CheckpointError(
            f"timm {what}={spec!r} is not supported; keras_vit has LayerNorm and "
            "RmsNorm."
        )
    return NORMS[layer], eps


# Arguments that count something of which a checkpoint may have none.
MAY_BE_ZERO = ("num_classes", "reg_tokens", "num_reg_tokens")


def check_timm_config(config: dict, args: dict, found: dict) -> None:
    """The numbers of a timm config (`model_args` over the registered
    architecture's, the top-level `num_classes` / `num_features` and
    `pretrained_cfg.input_size`) against the tensors: `found` maps an
    argument to `(what the tensors hold, what that counts)`. A contradiction
    is refused rather than the tensors trusted: timm itself builds the
    config's model, and these weights do not load into it."""
    given = config.get("model_args") or {}
    name = config.get("architecture")
    top = {"num_features": "embed_dim", "num_classes": "num_classes"}
    for key, (value, what) in found.items():
        note = "" if key in given else f" (registered for {name!r})"
        if args.get(key) is not None:
            low = 0 if key in MAY_BE_ZERO else 1
            checked = config_int(args[key], key, "timm", low)
            agree("timm", key, checked, value, what, note)
    for key, argument in top.items():
        if config.get(key) is not None and argument in found:
            value, what = found[argument]
            low = 0 if key in MAY_BE_ZERO else 1
            agree("timm", key, config_int(config[key], key, "timm", low), value, what)
    size = (config.get("pretrained_cfg") or {}).get("input_size")
    if size is None:
        return
    if not (isinstance(size, list) and len(size) == 3):
        raise CheckpointError(
            f"timm config pretrained_cfg.input_size={size!r:.80} is not valid; "
            "expected [channels, height, width]."
        )
    config_image_size(size[1:], "pretrained_cfg.input_size", "timm")
    channels = config_int(size[0], "pretrained_cfg.input_size[0]", "timm")
    if "in_chans" in found:
        agree("timm", "pretrained_cfg.input_size[0]", channels, *found["in_chans"])


def mlp_ratio_width(args: dict, hidden: int, what: str) -> int | None:
    """timm's MLP width, `int(embed_dim * mlp_ratio)`, when the config
    gives `mlp_ratio`."""
    ratio = args.get("mlp_ratio")
    if ratio is None:
        return None
    ratio = config_float(ratio, "mlp_ratio", what, *MLP_RATIO_RANGE)
    return int(hidden * ratio)


def refuse_token_head(pool: str, num_classes: int) -> None:
    """timm's `global_pool=''` with a head classifies every token; keras_vit's
    head reads one pooled vector, so that is refused rather than dropped."""
    if pool == "" and num_classes:
        raise CheckpointError(
            f"timm global_pool='' with a {num_classes}-class head applies the head "
            "to every token, which keras_vit's ViT does not; save the checkpoint "
            "with num_classes=0 for the tokens, or with a global_pool."
        )


def activation(args: dict) -> str:
    act = args.get("act_layer")
    if not isinstance(act, (str, type(None))) or act not in ACTIVATIONS:
        raise CheckpointError(
            f"timm act_layer={act!r} is not supported; valid: "
            f"{sorted(k for k in ACTIVATIONS if k)}."
        )
    return ACTIVATIONS[act]


def _mlp(args: dict) -> dict:
    """`gated_mlp` and whether the packed gate is the second half."""
    layer = args.get("mlp_layer")
    if layer in (None, "Mlp"):
        return {"gated_mlp": False, "gate_last": False}
    if layer == "SwiGLU":
        return {"gated_mlp": True, "gate_last": False}
    if isinstance(layer, dict) and layer.get("layer") in ("GluMlp", "SwiGLUPacked"):
        extra = set(layer) - {"layer", "act_layer", "gate_last"}
        if extra:
            raise CheckpointError(
                f"timm mlp_layer={layer!r} has arguments keras_vit does not read: "
                f"{sorted(extra)}."
            )
        gate_last = config_flag(
            layer, "gate_last", layer["layer"] == "GluMlp", "timm mlp_layer"
        )
        return {"gated_mlp": True, "gate_last": gate_last}
    raise CheckpointError(
        f"timm mlp_layer={layer!r} is not supported; valid: Mlp, SwiGLU, "
        "SwiGLUPacked (GluMlp)."
    )


def vision_transformer_options(args: dict) -> dict:
    """keras_vit builder options for timm `VisionTransformer` arguments;
    refuses every argument it cannot reproduce, by name."""
    known = NEUTRAL | {
        "act_layer",
        "mlp_layer",
        "norm_layer",
        "embed_norm_layer",
        "pre_norm",
        "final_norm",
        "qk_norm",
        "scale_mlp_norm",
        "scale_attn_norm",
        "proj_bias",
        "pos_embed",
        *DEFAULTS,
    }
    unknown = sorted(set(args) - known)
    if unknown:
        raise CheckpointError(
            f"timm VisionTransformer argument(s) {unknown} are not supported by "
            "keras_vit's converter."
        )
    for key, default in DEFAULTS.items():
        if args.get(key, default) != default:
            raise CheckpointError(
                f"timm {key}={args[key]!r} is not supported; keras_vit has "
                f"timm's {default} only."
            )
    if config_flag(args, "scale_attn_norm", False, "timm"):
        raise CheckpointError("timm scale_attn_norm=True is not supported.")
    pos = args.get("pos_embed", "learn")
    if pos not in ("learn", "none"):
        raise CheckpointError(
            f"timm pos_embed={pos!r} is not supported; valid: 'learn', 'none'."
        )
    norm_type, eps = _norm(args.get("norm_layer"), 1e-6, "norm_layer")
    options = dict(
        norm_type=norm_type,
        layer_norm_epsilon=eps,
        mlp_activation=activation(args),
        norm_pre=config_flag(args, "pre_norm", False, "timm"),
        final_norm=config_flag(args, "final_norm", True, "timm"),
        qk_norm=config_flag(args, "qk_norm", False, "timm"),
        mlp_norm=config_flag(args, "scale_mlp_norm", False, "timm"),
        proj_bias=config_flag(args, "proj_bias", True, "timm"),
        position_embedding="learned" if pos == "learn" else "none",
        **_mlp(args),
    )
    if args.get("embed_norm_layer") is not None:
        embed_type, embed_eps = _norm(
            args["embed_norm_layer"], 1e-6, "embed_norm_layer"
        )
        if (embed_type, embed_eps) != (norm_type, eps):
            raise CheckpointError(
                f"timm embed_norm_layer={args['embed_norm_layer']!r} differs from "
                f"norm_layer={args.get('norm_layer')!r}; keras_vit uses one norm."
            )
        options["embed_norm"] = True
    return options
