"""Hugging Face transformers' ViT / DeiT checkpoint layout."""

from __future__ import annotations

import re

import numpy as np

from keras_vit.errors import CheckpointError
from keras_vit.models.vit import ViT
from keras_vit.pretrained.config_values import checked_int
from keras_vit.pretrained.hf_common import (
    activation,
    check_shape_options,
    check_sizes,
    epsilon,
    require_flag,
)
from keras_vit.pretrained.layouts import (
    Plan,
    add_layer_norm,
    add_torch_linear,
    count_indexed,
    infer_grid,
    infer_heads,
    model_name,
    patch_kernel,
    position_rule,
    refuse_unsupported,
)

# transformers' model types saved in the ViT layout: I-JEPA has no class
# token; ViT-MSN and ViT-MAE encoders are ViTs (MAE's masking is a
# pretraining step, and its class token does not depend on the shuffle).
VIT_LAYOUTS = ("vit", "deit", "ijepa", "vit_msn", "vit_mae")


def huggingface_plan(tensors: dict, config: dict, hints: dict) -> Plan:
    kind = config.get("model_type")
    if kind is not None and kind not in VIT_LAYOUTS:
        raise CheckpointError(
            f"transformers model_type={kind!r} is not supported; the ViT layout "
            f"is read for {list(VIT_LAYOUTS)}."
        )
    refuse_unsupported(tensors, "huggingface")
    family = kind or "vit"
    mlp_activation = activation(config, family, "gelu")
    suffix = "embeddings.patch_embeddings.projection.weight"
    # "vit." (ViTForImageClassification), "deit." (DeiT), "" (ViTModel).
    root = next(k for k in sorted(tensors) if k.endswith(suffix))[: -len(suffix)]
    proj = tensors[root + "embeddings.patch_embeddings.projection.weight"]
    hidden, channels, p, q = proj.shape
    if p != q:
        raise CheckpointError(f"Non-square patches {p}x{q} are not supported.")
    enc = root + "encoder.layer."
    num_layers = count_indexed(tensors, re.escape(enc) + r"(\d+)\.")
    class_token = root + "embeddings.cls_token" in tensors
    distilled = root + "embeddings.distillation_token" in tensors
    prefix = int(class_token) + int(distilled)
    # DeiTForImageClassificationWithTeacher: class and distillation heads.
    head = "cls_classifier" if "cls_classifier.weight" in tensors else "classifier"
    heads = infer_heads(
        int(hidden),
        config.get("num_attention_heads"),
        hints.get("num_heads"),
        "num_attention_heads",
        family,
    )
    size = check_shape_options(config, family, int(hidden), heads, int(p), channels)
    mlp_dim = int(tensors[enc + "0.intermediate.dense.weight"].shape[0])
    check_sizes(config, family, num_layers, int(hidden), mlp_dim)
    qkv_bias = enc + "0.attention.attention.query.bias" in tensors
    require_flag(config, "qkv_bias", qkv_bias, family, "query / key / value biases")
    tokens = tensors[root + "embeddings.position_embeddings"].shape[1]
    grid, covered = infer_grid(tokens, prefix, size, p, hints.get("image_size"))
    num_classes = (
        tensors[f"{head}.weight"].shape[0] if f"{head}.weight" in tensors else 0
    )
    pooler = root + "pooler.dense.weight" in tensors
    if pooler:
        rows = int(tensors[root + "pooler.dense.weight"].shape[0])
        checked_int(config, "pooler_output_size", family, rows, "{} pooler output(s)")
    if pooler and config.get("pooler_act", "tanh") != "tanh":
        raise CheckpointError(
            f"{family} pooler_act={config['pooler_act']!r} is not supported; "
            "keras_vit's pre-logits layer uses tanh."
        )
    if distilled and head == "classifier" and num_classes:
        if "distillation_classifier.weight" not in tensors:
            raise CheckpointError(
                "DeiTForImageClassification classifies the class token alone; "
                "keras_vit's distilled ViT averages the class and distillation "
                "heads (DeiTForImageClassificationWithTeacher)."
            )
    kwargs = dict(
        variant="Ti",
        name=model_name(config.get("model_type"), "hf") + "_converted",
        patch_size=int(p),
        num_classes=max(num_classes, 1),
        include_top=num_classes > 0,
        num_channels=int(channels),
        hidden_dim=int(hidden),
        num_layers=num_layers,
        num_heads=heads,
        mlp_dim=mlp_dim,
        pooling="token" if class_token else "gap",
        class_token=class_token,
        distilled=distilled,
        # ViTConfig's pooler_output_size (hidden_size unless set).
        representation_size=(
            int(tensors[root + "pooler.dense.weight"].shape[0]) if pooler else None
        ),
        qkv_bias=qkv_bias,
        layer_norm_epsilon=epsilon(config, family, 1e-12),
        mlp_activation=mlp_activation,
        # `interpolate_pos_encoding`: torch's bicubic, no antialias.
        position_resample="hf",
    )
    plan = Plan(ViT, kwargs, grid, int(p), num_classes)
    embeddings = root + "embeddings."
    plan.add(
        "patch_encoder/projection/kernel",
        embeddings + "patch_embeddings.projection.weight",
        patch_kernel,
    )
    plan.add(
        "patch_encoder/projection/bias",
        embeddings + "patch_embeddings.projection.bias",
    )
    if class_token:
        plan.add("patch_encoder/cls_token", embeddings + "cls_token")
    if distilled:
        plan.add("patch_encoder/dist_token", embeddings + "distillation_token")
    plan.add(
        "patch_encoder/pos_embedding",
        embeddings + "position_embeddings",
        position_rule(covered, prefix),
    )
    for i in range(num_layers):
        _add_block(plan, f"{enc}{i}.", f"block_{i}/", kwargs["qkv_bias"])
    add_layer_norm(plan, "encoder_norm", root + "layernorm")
    if pooler:
        add_torch_linear(plan, "pre_logits", root + "pooler.dense")
    if num_classes:
        add_torch_linear(plan, "head", head)
    if num_classes and distilled and "distillation_classifier.weight" in tensors:
        add_torch_linear(plan, "head_dist", "distillation_classifier")
    return plan


def _add_block(plan: Plan, src: str, dst: str, qkv_bias: bool) -> None:
    """One `ViTLayer`: separate query, key and value projections become
    keras_vit's fused `qkv` Dense."""
    qkv = [f"{src}attention.attention.{n}" for n in ("query", "key", "value")]
    plan.add(
        f"{dst}attention/qkv/kernel",
        [n + ".weight" for n in qkv],
        lambda *w: np.concatenate([x.T for x in w], axis=1),
    )
    if qkv_bias:
        plan.add(
            f"{dst}attention/qkv/bias",
            [n + ".bias" for n in qkv],
            lambda *b: np.concatenate(b),
        )
    for a, b in (
        ("attention.output.dense", "attention/proj"),
        ("intermediate.dense", "mlp/fc1"),
        ("output.dense", "mlp/fc2"),
    ):
        add_torch_linear(plan, dst + b, src + a)
    add_layer_norm(plan, dst + "norm1", src + "layernorm_before")
    add_layer_norm(plan, dst + "norm2", src + "layernorm_after")
