"""AugReg / big_vision `.npz` checkpoint layout (JAX/Flax names)."""

from __future__ import annotations

import re

import numpy as np

from keras_vit.errors import CheckpointError
from keras_vit.models.vit import ViT
from keras_vit.pretrained.layouts import (
    FLAX_NORM,
    Plan,
    add_layer_norm,
    count_indexed,
    infer_grid,
    position_rule,
)

# Block sub-module names: (attention, second LayerNorm, MLP) in big_vision's
# own checkpoints and in the AugReg (`vit_jax`) ones.
BIG_VISION_NAMES = ("MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0")
AUGREG_NAMES = ("MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3")


def big_vision_plan(tensors: dict, config: dict, hints: dict) -> Plan:
    root = _root(tensors)
    map_head = root + "MAPHead_0/probe" in tensors
    kernel = tensors[root + "embedding/kernel"]
    p, q, channels, hidden = kernel.shape
    if p != q:
        raise CheckpointError(f"Non-square patches {p}x{q} are not supported.")
    scanned, block_names = _block_names(tensors, root)
    first = block_names[0] if block_names else ""
    big_vision = first + "MlpBlock_0/Dense_0/kernel" in tensors
    names = BIG_VISION_NAMES if big_vision else AUGREG_NAMES
    mha, _, mlp = names
    query = tensors.get(f"{first}{mha}/query/kernel")
    if query is None:
        raise CheckpointError(f"No {first}{mha}/query/kernel in this .npz checkpoint.")
    class_token = root + "cls" in tensors
    pos_key = (
        root + "pos_embedding"
        if root + "pos_embedding" in tensors
        else root + "Transformer/posembed_input/pos_embedding"
    )
    grid, covered = infer_grid(
        tensors[pos_key].shape[-2], int(class_token), None, p, hints.get("image_size")
    )
    head = tensors.get(root + "head/kernel")
    num_classes = head.shape[-1] if head is not None else 0
    pre_logits = tensors.get(root + "pre_logits/kernel")
    kwargs = dict(
        variant="Ti",
        name="big_vision_vit" if big_vision else "augreg_vit",
        patch_size=int(p),
        num_classes=max(num_classes, 1),
        include_top=num_classes > 0,
        num_channels=int(channels),
        hidden_dim=int(hidden),
        num_layers=len(block_names),
        num_heads=int(query.shape[-2]),
        mlp_dim=int(tensors[f"{first}{mlp}/Dense_0/kernel"].shape[-1]),
        pooling="map" if map_head else ("token" if class_token else "gap"),
        class_token=class_token,
        representation_size=(
            int(pre_logits.shape[-1]) if pre_logits is not None else None
        ),
        layer_norm_epsilon=1e-6,
        # `resample_posemb` (big_vision and vit_jax): scipy's linear zoom.
        position_resample="big_vision",
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
    for i, src in enumerate(block_names):
        # Scanned checkpoints stack the blocks on a leading axis.
        pick = (lambda w, i=i: w[i]) if scanned else (lambda w: w)
        _add_block(plan, src, f"block_{i}/", pick, names)
    if map_head:
        _add_map_head(plan, root + "MAPHead_0/")
    add_layer_norm(plan, "encoder_norm", root + "Transformer/encoder_norm", FLAX_NORM)
    for dense in ("pre_logits", "head"):
        if root + dense + "/kernel" in tensors:
            plan.add(f"{dense}/kernel", root + dense + "/kernel")
            plan.add(f"{dense}/bias", root + dense + "/bias")
    return plan


def _root(tensors: dict) -> str:
    """The prefix the checkpoint's tensors share (a training state nests
    them), refusing the hybrid layouts."""
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
    return root


def _block_names(tensors: dict, root: str) -> tuple[bool, list[str]]:
    """`(scanned, the prefix of each block)`; a scanned checkpoint has one
    `encoderblock/` whose tensors hold every block."""
    scanned_norm = tensors.get(root + "Transformer/encoderblock/LayerNorm_0/scale")
    if scanned_norm is not None:
        return True, [root + "Transformer/encoderblock/"] * scanned_norm.shape[0]
    pattern = re.escape(root) + r"Transformer/encoderblock_(\d+)/"
    num_layers = count_indexed(tensors, pattern)
    return False, [f"{root}Transformer/encoderblock_{i}/" for i in range(num_layers)]


def _add_block(plan: Plan, src: str, dst: str, pick, names) -> None:
    """One Flax `Encoder1DBlock`; `pick` takes this block's slice of a
    scanned tensor. Query, key and value (hidden, heads, head_dim) become
    keras_vit's fused `qkv` Dense."""
    mha, ln2, mlp = names
    qkv = [f"{src}{mha}/{n}" for n in ("query", "key", "value")]

    def qkv_kernel(*w):
        return np.concatenate([pick(x).reshape(x.shape[-3], -1) for x in w], axis=1)

    def qkv_bias(*b):
        return np.concatenate([pick(x).reshape(-1) for x in b])

    plan.add(f"{dst}attention/qkv/kernel", [n + "/kernel" for n in qkv], qkv_kernel)
    plan.add(f"{dst}attention/qkv/bias", [n + "/bias" for n in qkv], qkv_bias)
    plan.add(
        f"{dst}attention/proj/kernel",
        f"{src}{mha}/out/kernel",
        lambda w: pick(w).reshape(-1, w.shape[-1]),
    )
    plan.add(f"{dst}attention/proj/bias", f"{src}{mha}/out/bias", pick)
    add_layer_norm(plan, dst + "norm1", src + "LayerNorm_0", FLAX_NORM, pick)
    add_layer_norm(plan, dst + "norm2", src + ln2, FLAX_NORM, pick)
    for a, b in (("Dense_0", "fc1"), ("Dense_1", "fc2")):
        plan.add(f"{dst}mlp/{b}/kernel", f"{src}{mlp}/{a}/kernel", pick)
        plan.add(f"{dst}mlp/{b}/bias", f"{src}{mlp}/{a}/bias", pick)


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
    add_layer_norm(plan, "map_head/norm", src + "LayerNorm_0", FLAX_NORM)
    for a, b in (("Dense_0", "fc1"), ("Dense_1", "fc2")):
        plan.add(f"map_head/mlp/{b}/kernel", f"{src}MlpBlock_0/{a}/kernel")
        plan.add(f"map_head/mlp/{b}/bias", f"{src}MlpBlock_0/{a}/bias")
