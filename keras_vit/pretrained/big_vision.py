"""AugReg / big_vision `.npz` checkpoint layout (JAX/Flax names)."""

from __future__ import annotations

import re

import numpy as np

from keras_vit.errors import CheckpointError
from keras_vit.models.vit import ViT
from keras_vit.pretrained.layouts import (
    Plan,
    count_indexed,
    infer_grid,
    position_rule,
)


def big_vision_plan(tensors: dict, config: dict, hints: dict) -> Plan:
    root = next(
        (
            r
            for r in ("", "params/", "opt/target/", "params/img/")
            if r + "embedding/kernel" in tensors
        ),
        None,
    )
    if root is None:
        raise CheckpointError("No embedding/kernel tensor in this .npz checkpoint.")
    if root + "conv_root/kernel" in tensors:
        raise CheckpointError(
            "Hybrid (ResNet + ViT) .npz checkpoints are not supported; convert "
            "timm's safetensors of the same model instead."
        )
    map_head = root + "MAPHead_0/probe" in tensors
    kernel = tensors[root + "embedding/kernel"]
    p, q, channels, hidden = kernel.shape
    if p != q:
        raise CheckpointError(f"Non-square patches {p}x{q} are not supported.")
    scanned = root + "Transformer/encoderblock/LayerNorm_0/scale" in tensors
    if scanned:
        num_layers = tensors[root + "Transformer/encoderblock/LayerNorm_0/scale"].shape[
            0
        ]
        block_names = [root + "Transformer/encoderblock/"] * num_layers
    else:
        num_layers = count_indexed(
            tensors, re.escape(root) + r"Transformer/encoderblock_(\d+)/"
        )
        block_names = [
            f"{root}Transformer/encoderblock_{i}/" for i in range(num_layers)
        ]
    first = block_names[0] if block_names else ""
    big_vision = first + "MlpBlock_0/Dense_0/kernel" in tensors
    mha, ln2, mlp = (
        ("MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0")
        if big_vision
        else ("MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3")
    )
    query = tensors.get(f"{first}{mha}/query/kernel")
    if query is None:
        raise CheckpointError(f"No {first}{mha}/query/kernel in this .npz checkpoint.")
    num_heads = query.shape[-2]
    mlp_dim = tensors[f"{first}{mlp}/Dense_0/kernel"].shape[-1]
    class_token = root + "cls" in tensors
    pos_key = (
        root + "pos_embedding"
        if root + "pos_embedding" in tensors
        else root + "Transformer/posembed_input/pos_embedding"
    )
    grid, covered = infer_grid(
        tensors[pos_key].shape[-2], int(class_token), None, p, hints.get("image_size")
    )
    num_classes = (
        tensors[root + "head/kernel"].shape[-1]
        if root + "head/kernel" in tensors
        else 0
    )
    pre_logits = root + "pre_logits/kernel" in tensors
    kwargs = dict(
        variant="Ti",
        name="big_vision_vit" if big_vision else "augreg_vit",
        patch_size=int(p),
        num_classes=max(num_classes, 1),
        include_top=num_classes > 0,
        num_channels=int(channels),
        hidden_dim=int(hidden),
        num_layers=int(num_layers),
        num_heads=int(num_heads),
        mlp_dim=int(mlp_dim),
        pooling="map" if map_head else ("token" if class_token else "gap"),
        class_token=class_token,
        representation_size=(
            int(tensors[root + "pre_logits/kernel"].shape[-1]) if pre_logits else None
        ),
        layer_norm_epsilon=1e-6,
    )
    plan = Plan(ViT, kwargs, grid, int(p), num_classes)
    plan.add(
        "patch_encoder/projection/kernel",
        root + "embedding/kernel",
        lambda w: w.reshape(-1, w.shape[-1]),
    )
    plan.add("patch_encoder/projection/bias", root + "embedding/bias")
    if class_token:
        plan.add("patch_encoder/cls_token", root + "cls")
    plan.add(
        "patch_encoder/pos_embedding", pos_key, position_rule(covered, int(class_token))
    )

    def at(i):  # scanned checkpoints stack blocks on a leading axis
        return (lambda w: w[i]) if scanned else (lambda w: w)

    for i, src in enumerate(block_names):
        dst, pick = f"block_{i}/", at(i)
        names = [f"{src}{mha}/{n}" for n in ("query", "key", "value")]

        def qkv_kernel(*w, pick=pick):
            return np.concatenate([pick(x).reshape(x.shape[-3], -1) for x in w], axis=1)

        def qkv_bias(*b, pick=pick):
            return np.concatenate([pick(x).reshape(-1) for x in b])

        plan.add(
            f"{dst}attention/qkv/kernel", [n + "/kernel" for n in names], qkv_kernel
        )
        plan.add(f"{dst}attention/qkv/bias", [n + "/bias" for n in names], qkv_bias)
        plan.add(
            f"{dst}attention/proj/kernel",
            f"{src}{mha}/out/kernel",
            lambda w, pick=pick: pick(w).reshape(-1, w.shape[-1]),
        )
        plan.add(f"{dst}attention/proj/bias", f"{src}{mha}/out/bias", pick)
        for a, b in (("LayerNorm_0", "norm1"), (ln2, "norm2")):
            plan.add(f"{dst}{b}/gamma", f"{src}{a}/scale", pick)
            plan.add(f"{dst}{b}/beta", f"{src}{a}/bias", pick)
        for a, b in (("Dense_0", "fc1"), ("Dense_1", "fc2")):
            plan.add(f"{dst}mlp/{b}/kernel", f"{src}{mlp}/{a}/kernel", pick)
            plan.add(f"{dst}mlp/{b}/bias", f"{src}{mlp}/{a}/bias", pick)
    if map_head:
        _add_map_head(plan, root + "MAPHead_0/")
    plan.add("encoder_norm/gamma", root + "Transformer/encoder_norm/scale")
    plan.add("encoder_norm/beta", root + "Transformer/encoder_norm/bias")
    if pre_logits:
        plan.add("pre_logits/kernel", root + "pre_logits/kernel")
        plan.add("pre_logits/bias", root + "pre_logits/bias")
    if num_classes:
        plan.add("head/kernel", root + "head/kernel")
        plan.add("head/bias", root + "head/bias")
    return plan


def _add_map_head(plan: Plan, src: str) -> None:
    """big_vision's MAPHead (probe, MultiHeadDotProductAttention_0,
    LayerNorm_0, MlpBlock_0) as keras_vit's MAPHead."""
    mha = src + "MultiHeadDotProductAttention_0/"
    plan.add("map_head/probe", src + "probe", lambda w: w.reshape(1, -1))
    plan.add(
        "map_head/query/kernel", mha + "query/kernel", lambda w: w.reshape(len(w), -1)
    )
    plan.add("map_head/query/bias", mha + "query/bias", lambda b: b.reshape(-1))
    plan.add(
        "map_head/key_value/kernel",
        [mha + "key/kernel", mha + "value/kernel"],
        lambda *w: np.concatenate([x.reshape(len(x), -1) for x in w], axis=1),
    )
    plan.add(
        "map_head/key_value/bias",
        [mha + "key/bias", mha + "value/bias"],
        lambda *b: np.concatenate([x.reshape(-1) for x in b]),
    )
    plan.add(
        "map_head/proj/kernel",
        mha + "out/kernel",
        lambda w: w.reshape(-1, w.shape[-1]),
    )
    plan.add("map_head/proj/bias", mha + "out/bias")
    plan.add("map_head/norm/gamma", src + "LayerNorm_0/scale")
    plan.add("map_head/norm/beta", src + "LayerNorm_0/bias")
    for a, b in (("Dense_0", "fc1"), ("Dense_1", "fc2")):
        plan.add(f"map_head/mlp/{b}/kernel", f"{src}MlpBlock_0/{a}/kernel")
        plan.add(f"map_head/mlp/{b}/bias", f"{src}MlpBlock_0/{a}/bias")
