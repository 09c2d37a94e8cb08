"""transformers' SigLIP (`SiglipVisionModel`, `SiglipForImageClassification`,
`SiglipModel`) and CLIP (`CLIPVisionModel`, `CLIPVisionModelWithProjection`,
`CLIPForImageClassification`, `CLIPModel`) vision towers, as
`save_pretrained` writes them, onto keras_vit's `ViT`.

A two-tower checkpoint converts to its image tower: the text tower and the
logit scale are listed in the plan's ignored tensors, with the reason."""

from __future__ import annotations

import re

import numpy as np

from keras_vit.errors import CheckpointError
from keras_vit.models.vit import ViT
from keras_vit.pretrained.config_values import checked_int
from keras_vit.pretrained.hf_common import (
    activation,
    add_qkv,
    check_shape_options,
    check_sizes,
    epsilon,
    heads_of,
    ignore_buffers,
    ignore_except,
    root_of,
    vision_config,
)
from keras_vit.pretrained.layouts import (
    Plan,
    add_layer_norm,
    add_torch_linear,
    count_indexed,
    infer_grid,
    linear_kernel,
    model_name,
    patch_kernel,
    position_rule,
)

PATCHES = "embeddings.patch_embedding.weight"
TEXT_TOWER = "text tower and logit scale: keras_vit converts the image tower"


def _tower(tensors: dict, config: dict, hints: dict, family: str) -> tuple:
    """`(root, vision config, builder arguments, grid, prefix tokens)` of the
    encoder both families share."""
    root = root_of(tensors, PATCHES)
    vision = vision_config(config)
    hidden, channels, p, q = (int(d) for d in tensors[root + PATCHES].shape)
    heads = heads_of(vision, hidden, hints, family)
    size = check_shape_options(vision, family, hidden, heads, p, channels)
    enc = root + "encoder.layers."
    class_token = root + "embeddings.class_embedding" in tensors
    tokens = tensors[root + "embeddings.position_embedding.weight"].shape[0]
    prefix = int(class_token)
    grid, covered = infer_grid(tokens, prefix, size, p, hints.get("image_size"))
    if not covered:
        raise CheckpointError(
            f"{family}'s position table of {tokens} rows does not fit a "
            f"{grid[0]}x{grid[1]} grid with {prefix} class token(s)."
        )
    num_layers = count_indexed(tensors, re.escape(enc) + r"(\d+)\.")
    mlp_dim = int(tensors[enc + "0.mlp.fc1.weight"].shape[0])
    check_sizes(vision, family, num_layers, hidden, mlp_dim)
    kwargs = dict(
        variant="Ti",
        name=model_name(config.get("model_type"), f"hf_{family}") + "_converted",
        patch_size=p,
        num_channels=channels,
        hidden_dim=hidden,
        num_layers=num_layers,
        num_heads=heads,
        mlp_dim=mlp_dim,
        class_token=class_token,
        qkv_bias=enc + "0.self_attn.q_proj.bias" in tensors,
        # interpolate_pos_encoding: torch's bicubic without antialias.
        position_resample="hf",
    )
    return root, vision, kwargs, grid, prefix


def _add_encoder(plan: Plan, tensors: dict, root: str, prefix: int) -> None:
    emb = root + "embeddings."
    plan.add(
        "patch_encoder/projection/kernel", emb + "patch_embedding.weight", patch_kernel
    )
    if emb + "patch_embedding.bias" in tensors:
        plan.add("patch_encoder/projection/bias", emb + "patch_embedding.bias")
    else:
        # CLIP's patch convolution has no bias: a zero one is the same.
        plan.add(
            "patch_encoder/projection/bias",
            emb + "patch_embedding.weight",
            lambda w: np.zeros(w.shape[:1], w.dtype),
        )
    if prefix:
        plan.add(
            "patch_encoder/cls_token",
            emb + "class_embedding",
            lambda c: c.reshape(1, 1, -1),
        )
    plan.add(
        "patch_encoder/pos_embedding",
        emb + "position_embedding.weight",
        position_rule(True, prefix),
    )
    enc = root + "encoder.layers."
    for i in range(plan.kwargs["num_layers"]):
        src, dst = f"{enc}{i}.", f"block_{i}/"
        attn = src + "self_attn."
        add_qkv(plan, tensors, tuple(f"{attn}{n}_proj" for n in "qkv"), dst)
        add_torch_linear(plan, dst + "attention/proj", attn + "out_proj")
        add_torch_linear(plan, dst + "mlp/fc1", src + "mlp.fc1")
        add_torch_linear(plan, dst + "mlp/fc2", src + "mlp.fc2")
        add_layer_norm(plan, dst + "norm1", src + "layer_norm1")
        add_layer_norm(plan, dst + "norm2", src + "layer_norm2")
    ignore_buffers(plan, tensors)


def siglip_plan(tensors: dict, config: dict, hints: dict) -> Plan:
    family = "siglip"
    root, vision, kwargs, grid, prefix = _tower(tensors, config, hints, family)
    if prefix:
        raise CheckpointError("A SigLIP checkpoint with a class embedding.")
    act = activation(vision, family, "gelu_pytorch_tanh")
    map_head = root + "head.probe" in tensors
    if vision.get("vision_use_head") is not None and vision["vision_use_head"] != (
        map_head
    ):
        raise CheckpointError(
            f"siglip vision_use_head={vision['vision_use_head']!r} contradicts the "
            f"tensors, which {'have' if map_head else 'lack'} head.probe."
        )
    classifier = "classifier.weight" in tensors
    num_classes = int(tensors["classifier.weight"].shape[0]) if classifier else 0
    # SiglipForImageClassification averages every token into its classifier;
    # SiglipVisionModel / SiglipModel pool with the MAP head (pooler_output),
    # or give the tokens when there is none.
    pooling = "gap" if classifier else ("map" if map_head else None)
    kwargs.update(
        num_classes=max(num_classes, 1),
        include_top=classifier,
        pooling=pooling,
        layer_norm_epsilon=epsilon(vision, family, 1e-6),
        mlp_activation=act,
    )
    plan = Plan(ViT, kwargs, grid, kwargs["patch_size"], num_classes)
    _add_encoder(plan, tensors, root, prefix)
    add_layer_norm(plan, "encoder_norm", root + "post_layernorm")
    if map_head and pooling == "map":
        _add_map_head(plan, tensors, root + "head.", kwargs["hidden_dim"])
    elif map_head:
        plan.ignore(
            [k for k in tensors if k.startswith(root + "head.")],
            "MAP head of the vision tower, which SiglipForImageClassification "
            "does not use (it averages the tokens)",
        )
    if classifier:
        add_torch_linear(plan, "head", "classifier")
    ignore_except(plan, tensors, root, TEXT_TOWER)
    return plan


def _add_map_head(plan: Plan, tensors: dict, src: str, hidden: int) -> None:
    """`torch.nn.MultiheadAttention`'s packed input projection (query, key,
    value rows) as MAPHead's query and key/value Denses."""
    plan.add("map_head/probe", src + "probe", lambda w: w.reshape(1, -1))
    weight, bias = src + "attention.in_proj_weight", src + "attention.in_proj_bias"
    plan.add("map_head/query/kernel", weight, lambda w: linear_kernel(w[:hidden]))
    plan.add("map_head/key_value/kernel", weight, lambda w: linear_kernel(w[hidden:]))
    plan.add("map_head/query/bias", bias, lambda b: b[:hidden])
    plan.add("map_head/key_value/bias", bias, lambda b: b[hidden:])
    add_torch_linear(plan, "map_head/proj", src + "attention.out_proj")
    add_layer_norm(plan, "map_head/norm", src + "layernorm")
    add_torch_linear(plan, "map_head/mlp/fc1", src + "mlp.fc1")
    add_torch_linear(plan, "map_head/mlp/fc2", src + "mlp.fc2")


def clip_plan(tensors: dict, config: dict, hints: dict) -> Plan:
    family = "clip"
    root, vision, kwargs, grid, prefix = _tower(tensors, config, hints, family)
    if not prefix:
        raise CheckpointError("A CLIP checkpoint without class_embedding.")
    classifier = "classifier.weight" in tensors
    projection = "visual_projection.weight" in tensors
    kwargs.update(
        layer_norm_epsilon=epsilon(vision, family, 1e-5),
        mlp_activation=activation(vision, family, "quick_gelu"),
        norm_pre=True,
    )
    if classifier:
        # CLIPForImageClassification: the mean of the patch tokens as the
        # encoder leaves them (post_layernorm normalises the class token
        # only, which the classifier does not read).
        num_classes = int(tensors["classifier.weight"].shape[0])
        kwargs.update(pooling="gap", final_norm=False)
    else:
        # pooler_output: post_layernorm on the class token; with
        # visual_projection (no bias) on top, the image embeddings.
        num_classes = (
            int(tensors["visual_projection.weight"].shape[0]) if projection else 0
        )
        if projection:
            # CLIPModel's and CLIPVisionModelWithProjection's own config key.
            key, what = "projection_dim", "{} projected output(s)"
            checked_int(config, key, family, num_classes, what)
        kwargs.update(pooling="token", pool_norm=True)
    kwargs.update(num_classes=max(num_classes, 1), include_top=num_classes > 0)
    plan = Plan(ViT, kwargs, grid, kwargs["patch_size"], num_classes)
    _add_encoder(plan, tensors, root, prefix)
    add_layer_norm(plan, "norm_pre", root + "pre_layrnorm")
    if classifier:
        add_torch_linear(plan, "head", "classifier")
        plan.ignore(
            [k for k in tensors if k.startswith(root + "post_layernorm.")],
            "post_layernorm normalises the class token, which "
            "CLIPForImageClassification does not read",
        )
    else:
        _add_pooled_head(plan, root, projection)
    ignore_except(plan, tensors, root, TEXT_TOWER)
    return plan


def _add_pooled_head(plan: Plan, root: str, projection: bool) -> None:
    add_layer_norm(plan, "encoder_norm", root + "post_layernorm")
    if projection:
        plan.add("head/kernel", "visual_projection.weight", linear_kernel)
        plan.add(
            "head/bias",
            "visual_projection.weight",
            lambda w: np.zeros(w.shape[:1], w.dtype),
        )
