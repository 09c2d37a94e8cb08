"""timm's `eva.py` models (EVA-02, DINOv3, ROPE-ViT axial): a ViT with 2-D
rotary position embedding, with or without an absolute table, SwiGLU and
query / value biases, onto keras_vit's `ViT` with `rope=`."""

from __future__ import annotations

import math

import numpy as np

from keras_vit.errors import CheckpointError
from keras_vit.models.vit import ViT
from keras_vit.pretrained.config_values import (
    ROPE_THETA_RANGE,
    agree_flag,
    agree_width,
    config_epsilon,
    config_flag,
    config_float,
    config_image_size,
)
from keras_vit.pretrained.layouts import (
    Plan,
    add_torch_linear,
    count_indexed,
    infer_heads,
    linear_kernel,
    model_name,
    packed,
    patch_kernel,
)
from keras_vit.pretrained.timm_options import (
    NORMS,
    check_timm_config,
    mlp_ratio_width,
    refuse_token_head,
)

# Eva arguments that do not change the inference forward pass, or that the
# tensors tell (shapes, tokens, biases).
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
    "qkv_fused",
    "init_values",
    "class_token",
    "num_reg_tokens",
    "no_embed_class",
    "global_pool",
    "dynamic_img_size",
    "dynamic_img_pad",
    "drop_rate",
    "pos_drop_rate",
    "patch_drop_rate",
    "proj_drop_rate",
    "attn_drop_rate",
    "drop_path_rate",
    "head_init_scale",
    "swiglu_align_to",
    # Train-time RoPE coordinate augmentations.
    "rope_shift_coords",
    "rope_jitter_coords",
    "rope_rescale_coords",
}
HANDLED = {
    "norm_layer",
    "qk_norm",
    "swiglu_mlp",
    "scale_mlp",
    "scale_attn_inner",
    "attn_type",
    "attn_only_layer_scale",
    "num_kv_heads",
    "use_abs_pos_emb",
    "use_rot_pos_emb",
    "rope_type",
    "rope_grid_offset",
    "rope_grid_indexing",
    "rope_temperature",
    "rope_rotate_half",
    "ref_feat_shape",
    "use_post_norm",
    "use_pre_transformer_norm",
    "use_post_transformer_norm",
    "use_fc_norm",
    "attn_pool_num_heads",
    "attn_pool_mlp_ratio",
}


def _refuse(args: dict) -> None:
    unknown = sorted(set(args) - NEUTRAL - HANDLED)
    if unknown:
        raise CheckpointError(
            f"timm Eva argument(s) {unknown} are not supported by keras_vit's "
            "converter."
        )
    refusals = (
        ("scale_attn_inner", False, "a norm inside the attention (scale_attn_inner)"),
        ("attn_only_layer_scale", False, "LayerScale on the attention only"),
        ("num_kv_heads", None, "grouped-query attention (num_kv_heads)"),
        ("use_post_norm", False, "post-norm blocks (use_post_norm)"),
        ("attn_type", "eva", None),
    )
    for key, default, what in refusals:
        value = args.get(key, default)
        if key == "attn_type":
            if value not in ("eva", "rope"):
                raise CheckpointError(f"timm Eva attn_type={value!r} is not supported.")
        elif value != default:
            raise CheckpointError(
                f"timm Eva {key}={value!r}: {what} is not supported by keras_vit."
            )
    if args.get("global_pool", "avg") not in ("avg", "token", ""):
        raise CheckpointError(
            f"timm Eva global_pool={args['global_pool']!r} is not supported; "
            "valid: 'avg', 'token', ''."
        )


def _norm(args: dict) -> tuple[str, float]:
    spec = args.get("norm_layer")
    if spec is None:
        return "layernorm", 1e-6  # timm's LayerNorm
    layer = spec.get("layer") if isinstance(spec, dict) else spec
    if (
        not isinstance(layer, str)
        or layer not in NORMS
        or (isinstance(spec, dict) and set(spec) - {"layer", "eps"})
    ):
        raise CheckpointError(f"timm Eva norm_layer={spec!r} is not supported.")
    eps = spec.get("eps", 1e-6) if isinstance(spec, dict) else 1e-6
    return NORMS[layer], config_epsilon(eps, "norm_layer.eps", "timm Eva")


def _rope(args: dict, head_dim: int) -> tuple[dict | None, bool]:
    """keras_vit's `rope=` options and whether the source is interleaved."""
    if not config_flag(args, "use_rot_pos_emb", False, "timm Eva"):
        return None, False
    kind = args.get("rope_type", "cat")
    # Grid coordinates are patch indices (at most 1024 per side): an offset
    # beyond that is no offset a model was trained with.
    offset = config_float(
        args.get("rope_grid_offset", 0.0), "rope_grid_offset", "timm Eva", -1024, 1024
    )
    order = args.get("rope_grid_indexing", "ij")
    if order not in ("ij", "xy"):
        raise CheckpointError(
            f"timm Eva rope_grid_indexing={order!r:.80} is not valid; expected "
            "'ij' or 'xy'."
        )
    if kind == "dinov3":
        options = dict(
            coordinates="centered",
            temperature=_temperature(args, 100.0),
            frequency_scale=2 * math.pi,
        )
        interleaved = not config_flag(args, "rope_rotate_half", True, "timm Eva")
    elif kind == "cat":
        ref = args.get("ref_feat_shape")
        if ref is not None:
            ref = list(config_image_size(ref, "ref_feat_shape", "timm Eva"))
        options = dict(
            coordinates="index",
            temperature=_temperature(args, 10000.0),
            frequency_scale=1.0,
            reference_grid=ref,
        )
        interleaved = not config_flag(args, "rope_rotate_half", False, "timm Eva")
    else:
        raise CheckpointError(
            f"timm rope_type={kind!r} is not supported; keras_vit reads 'cat' "
            "(EVA-02, ROPE-ViT axial) and 'dinov3'. ROPE-ViT 'mixed' learns "
            "per-block frequencies, which keras_vit's RoPE has not."
        )
    if head_dim % 4:
        raise CheckpointError(f"RoPE over heads {head_dim} wide (not a multiple of 4).")
    return dict(options, grid_offset=offset, axis_order=order), interleaved


def _temperature(args: dict, default: float) -> float:
    value = args.get("rope_temperature", default)
    return config_float(value, "rope_temperature", "timm Eva", *ROPE_THETA_RANGE)


def _check_config(tensors, config, args, kwargs) -> None:
    """What the config says against what the tensors hold."""
    num_classes = kwargs["num_classes"] if kwargs["include_top"] else 0
    if "head.weight" in tensors:
        num_classes = int(tensors["head.weight"].shape[0])
    found = {
        "depth": (kwargs["num_layers"], "{} block(s)"),
        "embed_dim": (kwargs["hidden_dim"], "a hidden width of {}"),
        "in_chans": (kwargs["num_channels"], "{} input channel(s)"),
        "patch_size": (kwargs["patch_size"], "{}-pixel patches"),
        "num_classes": (num_classes, "{} head class(es)"),
        "num_reg_tokens": (kwargs["num_register_tokens"], "{} register token(s)"),
    }
    check_timm_config(config, args, found)
    agree_flag("timm Eva", "class_token", args.get("class_token"),
               kwargs["class_token"], "a class token (cls_token)")  # fmt: skip
    width = mlp_ratio_width(args, kwargs["hidden_dim"], "timm Eva")
    # SwiGLU widths are aligned and rescaled (swiglu_align_to, scale_mlp):
    # only the plain MLP's width follows from mlp_ratio alone.
    if width is not None and not kwargs["gated_mlp"]:
        agree_width(
            "timm Eva", args["mlp_ratio"], kwargs["hidden_dim"], width,
            "blocks.0.mlp.fc1.weight", tensors,
        )  # fmt: skip


def _final_norms(args: dict) -> dict:
    pool = args.get("global_pool", "avg")
    fc_norm = config_flag(args, "use_fc_norm", pool == "avg", "timm Eva")
    post = config_flag(args, "use_post_transformer_norm", not fc_norm, "timm Eva")
    if fc_norm and post:
        raise CheckpointError(
            "timm Eva with both a final norm and fc_norm is not supported."
        )
    return dict(pool_norm=fc_norm and pool != "", final_norm=fc_norm or post)


def eva_plan(tensors: dict, config: dict, args: dict, hints: dict) -> Plan:
    _refuse(args)
    proj = tensors["patch_embed.proj.weight"]
    hidden, channels, p, q = (int(d) for d in proj.shape)
    if p != q:
        raise CheckpointError(f"Non-square patches {p}x{q} are not supported.")
    num_layers = count_indexed(tensors, r"blocks\.(\d+)\.norm1\.weight$")
    heads = infer_heads(hidden, args.get("num_heads"), hints.get("num_heads"))
    norm_type, eps = _norm(args)
    rope, interleaved = _rope(args, hidden // heads)
    class_token = "cls_token" in tensors
    registers = int(tensors["reg_token"].shape[1]) if "reg_token" in tensors else 0
    pool = args.get("global_pool", "avg")
    num_classes = (
        int(tensors["head.weight"].shape[0]) if "head.weight" in tensors else 0
    )
    refuse_token_head(pool, num_classes)
    size = config_image_size(args.get("img_size", 224), "img_size", "timm Eva")
    grid = (size[0] // p, size[1] // p)
    gated = config_flag(args, "swiglu_mlp", False, "timm Eva")
    split = "blocks.0.mlp.fc1_g.weight" in tensors
    kwargs = dict(
        variant="Ti",
        name=model_name(config.get("architecture"), "timm_eva"),
        patch_size=p,
        num_channels=channels,
        hidden_dim=hidden,
        num_layers=num_layers,
        num_heads=heads,
        mlp_dim=int(tensors["blocks.0.mlp.fc2.weight"].shape[1]),
        num_classes=max(num_classes, 1),
        include_top=num_classes > 0 and pool != "",
        pooling={"token": "token", "avg": "gap", "": None}[pool],
        class_token=class_token,
        num_register_tokens=registers,
        position_embedding="learned" if "pos_embed" in tensors else "none",
        # timm's `resample_abs_pos_embed`: torch's antialiased bicubic.
        position_resample="timm",
        layer_scale_init=1e-5 if "blocks.0.gamma_1" in tensors else None,
        layer_norm_epsilon=eps,
        norm_type=norm_type,
        norm_pre=config_flag(args, "use_pre_transformer_norm", False, "timm Eva"),
        qk_norm=config_flag(args, "qk_norm", False, "timm Eva"),
        mlp_activation="silu" if gated else "gelu",
        gated_mlp=gated,
        mlp_norm=config_flag(args, "scale_mlp", False, "timm Eva"),
        rope=rope,
        qkv_bias=any(
            f"blocks.0.attn.{n}" in tensors
            for n in ("q_bias", "qkv.bias", "q_proj.bias")
        ),
        **_final_norms(args),
    )
    if pool == "":
        kwargs.update(pooling=None, include_top=False, pool_norm=False)
    _check_config(tensors, config, args, kwargs)
    plan = Plan(ViT, kwargs, grid, p, num_classes)
    _add_embedding(plan, tensors, kwargs, registers, grid)
    order = _interleaved_to_half(hidden // heads, heads) if interleaved else None
    for i in range(num_layers):
        _add_block(plan, tensors, i, kwargs, order, split)
    if kwargs["final_norm"]:
        # fc_norm normalises every token when nothing is pooled (timm's
        # global_pool=''): then it is the encoder's final norm.
        source = "fc_norm" if "fc_norm.weight" in tensors else "norm"
        _add_norm(plan, "encoder_norm", source, norm_type)
    if num_classes:
        add_torch_linear(plan, "head", "head")
    return plan


def _add_norm(plan: Plan, target: str, source: str, norm_type: str, fn=None):
    plan.add(f"{target}/gamma", f"{source}.weight", fn)
    if norm_type == "layernorm":
        plan.add(f"{target}/beta", f"{source}.bias", fn)


def _add_embedding(plan, tensors, kwargs, registers, grid) -> None:
    plan.add("patch_encoder/projection/kernel", "patch_embed.proj.weight", patch_kernel)
    if "patch_embed.proj.bias" in tensors:
        plan.add("patch_encoder/projection/bias", "patch_embed.proj.bias")
    else:
        # Without a bias (use_pre_transformer_norm): a zero one is the same.
        plan.add(
            "patch_encoder/projection/bias",
            "patch_embed.proj.weight",
            lambda w: np.zeros(w.shape[:1], w.dtype),
        )
    if kwargs["norm_pre"]:
        _add_norm(plan, "norm_pre", "norm_pre", kwargs["norm_type"])
    if kwargs["class_token"]:
        plan.add("patch_encoder/cls_token", "cls_token")
    embedded = int(kwargs["class_token"])
    if "pos_embed" not in tensors:
        if registers:
            plan.add("patch_encoder/register_tokens", "reg_token")
        return
    tokens = tensors["pos_embed"].shape[1]
    covered = tokens == grid[0] * grid[1] + embedded + registers
    if not covered and tokens != grid[0] * grid[1]:
        raise CheckpointError(
            f"pos_embed of {tokens} tokens does not fit the {grid[0]}x{grid[1]} "
            "patch grid of the config's img_size."
        )
    stop = embedded + registers

    def table(pos):
        pos = pos.reshape(1, -1, pos.shape[-1])
        if covered:
            return np.delete(pos, np.s_[embedded:stop], axis=1)
        return np.concatenate([np.zeros_like(pos[:, :embedded]), pos], axis=1)

    plan.add("patch_encoder/pos_embedding", "pos_embed", table)
    if registers and covered:
        plan.add(
            "patch_encoder/register_tokens",
            ("reg_token", "pos_embed"),
            lambda reg, pos: reg + pos.reshape(1, -1, pos.shape[-1])[:, embedded:stop],
        )
    elif registers:
        plan.add("patch_encoder/register_tokens", "reg_token")


def _interleaved_to_half(head_dim: int, heads: int) -> np.ndarray:
    """Row order of a `(heads * head_dim, ...)` query or key projection that
    turns interleaved rotary pairs `(2i, 2i + 1)` into half pairs
    `(i, i + head_dim / 2)` (see `keras_vit.models.rope`)."""
    within = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    return (np.arange(heads)[:, None] * head_dim + within[None]).reshape(-1)


def _qkv(order, src: str, tensors: dict):
    """The fused `(3 * inner, hidden)` weight and bias, query and key rows
    reordered for the half rotary layout when `order` is given."""
    if f"{src}qkv.weight" in tensors:
        names = [f"{src}qkv.weight"]
    else:
        names = [f"{src}{n}_proj.weight" for n in "qkv"]
    bias_names = []
    if f"{src}q_bias" in tensors:
        bias_names = [f"{src}q_bias", f"{src}v_bias"]
    elif f"{src}qkv.bias" in tensors:
        bias_names = [f"{src}qkv.bias"]
    elif f"{src}q_proj.bias" in tensors:
        bias_names = [f"{src}{n}_proj.bias" for n in "qv"]
        if f"{src}k_proj.bias" in tensors:
            bias_names = [f"{src}{n}_proj.bias" for n in "qkv"]

    def reorder(w):
        if order is None:
            return w
        q, k, v = np.split(w, 3, axis=0)
        return np.concatenate([q[order], k[order], v], axis=0)

    def weight(*parts):
        return linear_kernel(reorder(np.concatenate(parts, axis=0)))

    def bias(*parts):
        if len(parts) == 2:  # EVA's q_bias / v_bias: the key has none
            parts = (parts[0], np.zeros_like(parts[0]), parts[1])
        return reorder(np.concatenate(parts, axis=0))

    return names, weight, bias_names, bias


def _add_block(plan, tensors, i, kwargs, order, split) -> None:
    src, dst = f"blocks.{i}.", f"block_{i}/"
    norm = kwargs["norm_type"]
    _add_norm(plan, dst + "norm1", src + "norm1", norm)
    _add_norm(plan, dst + "norm2", src + "norm2", norm)
    names, weight, bias_names, bias = _qkv(order, src + "attn.", tensors)
    plan.add(f"{dst}attention/qkv/kernel", names, weight)
    if bias_names:
        plan.add(f"{dst}attention/qkv/bias", bias_names, bias)
    if kwargs["qk_norm"]:
        within = (
            None
            if order is None
            else order[: kwargs["hidden_dim"] // kwargs["num_heads"]]
        )
        fn = None if within is None else (lambda w, o=within: w[o])
        _add_norm(plan, dst + "attention/q_norm", src + "attn.q_norm", norm, fn)
        _add_norm(plan, dst + "attention/k_norm", src + "attn.k_norm", norm, fn)
    add_torch_linear(plan, dst + "attention/proj", src + "attn.proj")
    if split:
        for part, index in (("kernel", "weight"), ("bias", "bias")):
            pair = (f"{src}mlp.fc1_g.{index}", f"{src}mlp.fc1_x.{index}")
            plan.add(f"{dst}mlp/fc1/{part}", pair, packed(part == "kernel"))
    else:
        add_torch_linear(plan, dst + "mlp/fc1", src + "mlp.fc1")
    if kwargs["mlp_norm"]:
        _add_norm(plan, dst + "mlp/norm", src + "mlp.norm", norm)
    add_torch_linear(plan, dst + "mlp/fc2", src + "mlp.fc2")
    if kwargs["layer_scale_init"] is not None:
        plan.add(f"{dst}layer_scale1/gamma", f"{src}gamma_1")
        plan.add(f"{dst}layer_scale2/gamma", f"{src}gamma_2")
