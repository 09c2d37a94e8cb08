"""timm's ViT checkpoint layout (`vit_*`, DeiT, hybrid `vit_*_r*`)."""

from __future__ import annotations

import numpy as np

from keras_vit.errors import CheckpointError
from keras_vit.models.hybrid import HybridViT
from keras_vit.models.vit import ViT
from keras_vit.pretrained.config_values import (
    agree_flag,
    agree_width,
    config_image_size,
)
from keras_vit.pretrained.layouts import (
    Plan,
    add_layer_norm,
    add_torch_linear,
    conv_kernel,
    count_indexed,
    infer_grid,
    infer_heads,
    linear_kernel,
    model_name,
    packed,
    patch_kernel,
    position_rule,
    refuse_unsupported,
)
from keras_vit.pretrained.timm_eva import eva_plan
from keras_vit.pretrained.timm_options import (
    check_timm_config,
    mlp_ratio_width,
    refuse_token_head,
    timm_arguments,
    vision_transformer_options,
)


def timm_plan(tensors: dict, config: dict, hints: dict) -> Plan:
    model_class, args = timm_arguments(config)
    if model_class == "Eva":
        return eva_plan(tensors, config, args, hints)
    refuse_unsupported(tensors, "timm")
    options = vision_transformer_options(args)
    gate_last = options.pop("gate_last")
    builder, kwargs, stride = _patch_embedding(tensors)
    num_layers = count_indexed(tensors, r"blocks\.(\d+)\.norm1\.weight$")
    if not num_layers:
        raise CheckpointError("timm checkpoint without blocks.N.* tensors.")
    class_token = "cls_token" in tensors
    distilled = "dist_token" in tensors
    embedded = int(class_token) + int(distilled)
    registers = tensors["reg_token"].shape[1] if "reg_token" in tensors else 0
    fc_norm = "fc_norm.weight" in tensors
    pool = _global_pool(tensors, config, args, class_token, fc_norm)
    include_prefix = _pool_include_prefix(args, pool, embedded + registers)
    num_classes = tensors["head.weight"].shape[0] if "head.weight" in tensors else 0
    refuse_token_head(pool, num_classes)
    _check_config(tensors, config, args, kwargs, num_layers, registers)
    grid, covered = _grid(tensors, config, args, hints, embedded + registers, stride)
    hidden = kwargs.pop("hidden_dim")
    kwargs.update(options)
    kwargs.update(
        variant="Ti",
        name=model_name(config.get("architecture"), "timm_vit"),
        num_classes=max(num_classes, 1),
        include_top=num_classes > 0 and pool != "",
        hidden_dim=hidden,
        num_layers=num_layers,
        num_heads=infer_heads(hidden, args.get("num_heads"), hints.get("num_heads")),
        mlp_dim=int(tensors["blocks.0.mlp.fc2.weight"].shape[1]),
        pooling={"token": "token", "avg": "gap", "map": "map"}.get(pool),
        num_register_tokens=int(registers),
        class_token=class_token,
        distilled=distilled,
        pool_norm=fc_norm,
        qkv_bias="blocks.0.attn.qkv.bias" in tensors,
        layer_scale_init=1e-5 if "blocks.0.ls1.gamma" in tensors else None,
        pool_include_prefix=include_prefix,
        # `resample_abs_pos_embed`: torch's antialiased bicubic.
        position_resample="timm",
    )
    if pool == "":
        # Unpooled tokens (timm's global_pool=""): the encoder's output.
        kwargs.update(pooling=None, include_top=False, pool_norm=False)
    plan = Plan(builder, kwargs, grid, stride, num_classes)
    plan.add("patch_encoder/projection/kernel", "patch_embed.proj.weight", patch_kernel)
    if "patch_embed.proj.bias" in tensors:
        plan.add("patch_encoder/projection/bias", "patch_embed.proj.bias")
    else:
        # CLIP's patch embedding has no bias: a zero one is the same.
        plan.add(
            "patch_encoder/projection/bias",
            "patch_embed.proj.weight",
            lambda w: np.zeros(w.shape[:1], w.dtype),
        )
    norm = options["norm_type"]
    if options.get("embed_norm"):
        add_norm(plan, "patch_encoder/embed_norm", "patch_embed.norm", norm)
    if options["norm_pre"]:
        add_norm(plan, "norm_pre", "norm_pre", norm)
    if class_token:
        plan.add("patch_encoder/cls_token", "cls_token")
    if distilled:
        plan.add("patch_encoder/dist_token", "dist_token")
    if options["position_embedding"] == "learned":
        _add_positions(plan, covered, embedded, registers)
    elif registers:
        plan.add("patch_encoder/register_tokens", "reg_token")
    for i in range(num_layers):
        _add_block(plan, tensors, i, kwargs, gate_last)
    if pool == "map":
        _add_map_head(plan, tensors, kwargs["mlp_dim"])
    if options["final_norm"]:
        add_norm(plan, "encoder_norm", "fc_norm" if fc_norm else "norm", norm)
    for head in ("head", "head_dist"):
        if f"{head}.weight" in tensors:
            add_torch_linear(plan, head, head)
    if builder is HybridViT:
        _add_resnet_stem(plan, tensors, kwargs["stem"])
    return plan


def _check_config(tensors, config, args, kwargs, num_layers, registers):
    """What the config says against what the tensors hold."""
    hidden = kwargs["hidden_dim"]
    num_classes = tensors["head.weight"].shape[0] if "head.weight" in tensors else 0
    found = {
        "depth": (num_layers, "{} block(s)"),
        "embed_dim": (hidden, "a hidden width of {}"),
        "in_chans": (kwargs["num_channels"], "{} input channel(s)"),
        "num_classes": (int(num_classes), "{} head class(es)"),
        "reg_tokens": (int(registers), "{} register token(s)"),
    }
    if "patch_size" in kwargs:  # a hybrid's patches are its CNN's features
        found["patch_size"] = (kwargs["patch_size"], "{}-pixel patches")
    check_timm_config(config, args, found)
    agree_flag("timm", "class_token", args.get("class_token"),
               "cls_token" in tensors, "a class token (cls_token)")  # fmt: skip
    fc1 = "blocks.0.mlp.fc1_g.weight"
    fc1 = fc1 if fc1 in tensors else "blocks.0.mlp.fc1.weight"
    # Mlp, GluMlp and SwiGLU all make fc1 (fc1_g) int(embed_dim * mlp_ratio)
    # wide; GluMlp halves it after the gate.
    width = mlp_ratio_width(args, hidden, "timm")
    if width is not None and fc1 in tensors:
        agree_width("timm", args["mlp_ratio"], hidden, width, fc1, tensors)


def _patch_embedding(tensors: dict) -> tuple:
    """`(builder, its patch-embedding arguments, stride)`: a plain ViT's
    patch size, or a hybrid's ResNet stages; `hidden_dim` rides along."""
    proj = tensors.get("patch_embed.proj.weight")
    if proj is None:
        raise CheckpointError("timm checkpoint without patch_embed.proj.weight.")
    hidden, channels, p, q = proj.shape
    if p != q:
        raise CheckpointError(f"Non-square patches {p}x{q} are not supported.")
    stem = tensors.get("patch_embed.backbone.stem.conv.weight")
    if stem is None:
        kwargs = dict(patch_size=int(p), num_channels=int(channels))
        return ViT, {**kwargs, "hidden_dim": int(hidden)}, p
    if p != 1:
        raise CheckpointError(
            f"This timm hybrid projects {p}x{p} patches of its CNN features; "
            "keras_vit's HybridViT uses 1x1 patches (the R26/R50 hybrids)."
        )
    stages = count_indexed(tensors, r"patch_embed\.backbone\.stages\.(\d+)\.")
    if not stages:
        raise CheckpointError(
            "Stem-only timm hybrids (no ResNet stages) are not supported."
        )
    blocks = tuple(
        count_indexed(tensors, rf"patch_embed\.backbone\.stages\.{s}\.blocks\.(\d+)\.")
        for s in range(stages)
    )
    kwargs = dict(
        stem=blocks,
        stem_width=int(stem.shape[0]),
        num_channels=int(stem.shape[1]),
        hidden_dim=int(hidden),
    )
    return HybridViT, kwargs, 4 * 2 ** (stages - 1)


def _global_pool(tensors, config, args, class_token: bool, fc_norm: bool) -> str:
    pool = config.get("global_pool", args.get("global_pool"))
    if pool is None and "attn_pool.latent" in tensors:
        pool = "map"
    if pool is None:
        pool = "avg" if (fc_norm or not class_token) else "token"
    if pool not in ("token", "avg", "map", ""):
        raise CheckpointError(
            f"timm global_pool={pool!r} is not supported; valid: 'token', 'avg', 'map'."
        )
    return pool


def _pool_include_prefix(args: dict, pool: str, prefix: int) -> bool:
    """timm's `pool_include_prefix` (default False since timm 1.0.16): the
    MAP head attends to the class and register tokens only when it is set;
    a mean over them too has no keras_vit counterpart."""
    include = args.get("pool_include_prefix", False)
    if not isinstance(include, bool):
        raise CheckpointError(f"timm pool_include_prefix={include!r} is not a bool.")
    if include and prefix and pool == "avg":
        raise CheckpointError(
            "timm global_pool='avg' with pool_include_prefix=True averages the "
            "class and register tokens too; keras_vit's mean pooling skips them."
        )
    return include


def _grid(tensors, config, args, hints, prefix: int, stride: int):
    """The patch grid and whether pos_embed covers the prefix tokens, from
    the configured image size (if any) and the table's length."""
    size = args.get("img_size")
    if size is None:
        input_size = (config.get("pretrained_cfg") or {}).get("input_size")
        size = input_size[1:] if input_size else None
    if size is not None:
        size = config_image_size(size, "img_size", "timm")
    tokens = tensors["pos_embed"].shape[1] if "pos_embed" in tensors else None
    if tokens is None:
        if args.get("pos_embed") != "none":
            raise CheckpointError(
                "timm checkpoint without pos_embed, and its config does not say "
                "pos_embed='none'."
            )
        if size is None:
            raise CheckpointError(
                "timm checkpoint without pos_embed and without an image size in "
                "its config; pass image_size= of the checkpoint."
            )
        return (size[0] // stride, size[1] // stride), False
    grid, covered = infer_grid(tokens, prefix, size, stride, hints.get("image_size"))
    if not covered and args.get("no_embed_class") is False:
        raise CheckpointError("pos_embed size contradicts no_embed_class=False.")
    return grid, covered


def add_norm(plan: Plan, target: str, source: str, norm_type: str) -> None:
    """A LayerNorm's scale and offset, or an RMSNorm's scale."""
    if norm_type == "rmsnorm":
        plan.add(f"{target}/gamma", f"{source}.weight")
    else:
        add_layer_norm(plan, target, source)


def _add_block(plan: Plan, tensors: dict, i: int, kwargs: dict, gate_last: bool):
    src, dst = f"blocks.{i}.", f"block_{i}/"
    norm = kwargs["norm_type"]
    add_norm(plan, dst + "norm1", src + "norm1", norm)
    add_norm(plan, dst + "norm2", src + "norm2", norm)
    if kwargs["qk_norm"]:
        add_norm(plan, dst + "attention/q_norm", src + "attn.q_norm", norm)
        add_norm(plan, dst + "attention/k_norm", src + "attn.k_norm", norm)
    if kwargs["mlp_norm"]:
        add_norm(plan, dst + "mlp/norm", src + "mlp.norm", norm)
    bias = kwargs["proj_bias"]
    add_torch_linear(
        plan, dst + "attention/qkv", src + "attn.qkv", f"{src}attn.qkv.bias" in tensors
    )
    add_torch_linear(plan, dst + "attention/proj", src + "attn.proj", bias)
    add_torch_linear(plan, dst + "mlp/fc2", src + "mlp.fc2", bias)
    if f"{src}mlp.fc1_g.weight" in tensors:
        # timm's SwiGLU: gate and value projections, packed gate first.
        for part, index in (("kernel", "weight"), ("bias", "bias")):
            if part == "bias" and not bias:
                continue
            names = (f"{src}mlp.fc1_g.{index}", f"{src}mlp.fc1_x.{index}")
            plan.add(f"{dst}mlp/fc1/{part}", names, packed(part == "kernel"))
    elif gate_last:
        # GluMlp(gate_last=True) gates with the second half: swap the halves.
        plan.add(f"{dst}mlp/fc1/kernel", f"{src}mlp.fc1.weight", _swapped(True))
        if bias:
            plan.add(f"{dst}mlp/fc1/bias", f"{src}mlp.fc1.bias", _swapped(False))
    else:
        add_torch_linear(plan, dst + "mlp/fc1", src + "mlp.fc1", bias)
    if kwargs["layer_scale_init"] is not None:
        plan.add(f"{dst}layer_scale1/gamma", f"{src}ls1.gamma")
        plan.add(f"{dst}layer_scale2/gamma", f"{src}ls2.gamma")


def _swapped(kernel: bool):
    def fn(w):
        half = w.shape[0] // 2
        w = np.concatenate([w[half:], w[:half]], axis=0)
        return linear_kernel(w) if kernel else w

    return fn


def _add_resnet_stem(plan: Plan, tensors: dict, stages: tuple[int, ...]) -> None:
    """timm's `patch_embed.backbone` ResNet-v2 onto `resnet_v2_stem`'s names."""
    root = "patch_embed.backbone."
    plan.add("stem_conv/kernel", root + "stem.conv.weight", conv_kernel)
    add_layer_norm(plan, "stem_norm", root + "stem.norm")
    for s, depth in enumerate(stages):
        for b in range(depth):
            src, dst = f"{root}stages.{s}.blocks.{b}.", f"stage{s}_block{b}_"
            parts = [(f"conv{r}", f"norm{r}") for r in (1, 2, 3)]
            if b == 0 and f"{src}downsample.conv.weight" in tensors:
                parts.append(("downsample.conv", "downsample.norm"))
            for conv, norm in parts:
                target = dst + conv.replace(".", "_") + "/kernel"
                plan.add(target, f"{src}{conv}.weight", conv_kernel)
                add_layer_norm(plan, dst + norm.replace(".", "_"), src + norm)


def _add_positions(plan: Plan, covered: bool, embedded: int, registers: int) -> None:
    """keras_vit's registers have no position embedding; a timm table that
    covers them (`no_embed_class=False`) adds a constant to each register,
    which is folded into the register tokens."""
    if not registers:
        plan.add(
            "patch_encoder/pos_embedding", "pos_embed", position_rule(covered, embedded)
        )
        return
    stop = embedded + registers
    if covered:
        plan.add(
            "patch_encoder/register_tokens",
            ("reg_token", "pos_embed"),
            lambda reg, pos: reg + pos.reshape(1, -1, pos.shape[-1])[:, embedded:stop],
        )
        plan.add(
            "patch_encoder/pos_embedding",
            "pos_embed",
            lambda pos: np.delete(
                pos.reshape(1, -1, pos.shape[-1]), np.s_[embedded:stop], axis=1
            ),
        )
    else:
        plan.add("patch_encoder/register_tokens", "reg_token")
        plan.add(
            "patch_encoder/pos_embedding", "pos_embed", position_rule(False, embedded)
        )


def _add_map_head(plan: Plan, tensors: dict, mlp_dim: int) -> None:
    """timm's AttentionPoolLatent as keras_vit's MAPHead."""
    head_mlp = tensors["attn_pool.mlp.fc1.weight"].shape[0]
    if head_mlp != mlp_dim:
        raise CheckpointError(
            f"The MAP head's MLP is {head_mlp} wide and the blocks' {mlp_dim}; "
            "keras_vit's MAPHead uses the blocks' mlp_dim."
        )
    latent = tensors["attn_pool.latent"]
    if latent.shape[1] != 1:
        raise CheckpointError(
            f"A MAP head with {latent.shape[1]} latent queries is not supported; "
            "keras_vit's MAPHead has one probe."
        )
    plan.add("map_head/probe", "attn_pool.latent", lambda w: w.reshape(1, -1))
    for src, dst in (
        ("q", "query"),
        ("kv", "key_value"),
        ("proj", "proj"),
        ("mlp.fc1", "mlp/fc1"),
        ("mlp.fc2", "mlp/fc2"),
    ):
        plan.add(f"map_head/{dst}/kernel", f"attn_pool.{src}.weight", linear_kernel)
        if f"attn_pool.{src}.bias" in tensors or src not in ("q", "kv"):
            plan.add(f"map_head/{dst}/bias", f"attn_pool.{src}.bias")
    plan.add("map_head/norm/gamma", "attn_pool.norm.weight")
    plan.add("map_head/norm/beta", "attn_pool.norm.bias")
