"""transformers' DINOv2 (`Dinov2Model`, `Dinov2ForImageClassification`, and
the `Dinov2WithRegisters` pair) and DINOv3 ViT (`DINOv3ViTModel`) layouts,
as `save_pretrained` writes them, onto keras_vit's `ViT`."""

from __future__ import annotations

import math
import re

from keras_vit.errors import CheckpointError
from keras_vit.models.vit import ViT
from keras_vit.pretrained.config_values import (
    MLP_RATIO_RANGE,
    ROPE_THETA_RANGE,
    agree_width,
    checked_int,
    config_float,
)
from keras_vit.pretrained.hf_common import (
    activation,
    add_qkv,
    check_shape_options,
    check_sizes,
    epsilon,
    heads_of,
    ignore_buffers,
    require_flag,
    root_of,
)
from keras_vit.pretrained.layouts import (
    Plan,
    add_layer_norm,
    add_torch_linear,
    count_indexed,
    infer_grid,
    model_name,
    packed,
    patch_kernel,
    position_rule,
)

DINOV2_PATCHES = "embeddings.patch_embeddings.projection.weight"
DINOV3_PATCHES = "embeddings.patch_embeddings.weight"
MASK_TOKEN = "masked-image pretraining token, unused at inference"


def dinov2_plan(tensors: dict, config: dict, hints: dict) -> Plan:
    family = config.get("model_type") or "dinov2"
    root = root_of(tensors, DINOV2_PATCHES)
    hidden, channels, p, q = (int(d) for d in tensors[root + DINOV2_PATCHES].shape)
    heads = heads_of(config, hidden, hints, family)
    size = check_shape_options(config, family, hidden, heads, p, channels)
    enc = root + "encoder.layer."
    num_layers = count_indexed(tensors, re.escape(enc) + r"(\d+)\.")
    registers_name = root + "embeddings.register_tokens"
    registers = _registers(tensors, config, registers_name, family)
    swiglu = enc + "0.mlp.weights_in.weight" in tensors
    require_flag(config, "use_swiglu_ffn", swiglu, family, "SwiGLU (mlp.weights_in)")
    mlp = "weights_out" if swiglu else "fc2"
    check_sizes(config, family, num_layers, hidden)
    _check_mlp_ratio(tensors, config, family, hidden, enc, swiglu)
    tokens = tensors[root + "embeddings.position_embeddings"].shape[1]
    grid, covered = infer_grid(tokens, 1, size, p, hints.get("image_size"))
    if not covered:
        raise CheckpointError(
            f"{family}'s position table of {tokens} tokens must cover the class "
            f"token and a {grid[0]}x{grid[1]} grid."
        )
    classifier = "classifier.weight" in tensors
    num_classes = int(tensors["classifier.weight"].shape[0]) if classifier else 0
    kwargs = dict(
        variant="Ti",
        name=model_name(family, "hf_dinov2") + "_converted",
        patch_size=p,
        num_channels=channels,
        hidden_dim=hidden,
        num_layers=num_layers,
        num_heads=heads,
        mlp_dim=int(tensors[f"{enc}0.mlp.{mlp}.weight"].shape[1]),
        num_classes=max(num_classes, 1),
        include_top=classifier,
        # The classifier reads the class token and the mean of the patch
        # tokens (registers left out); the bare model's pooler_output is the
        # class token.
        pooling="token_gap" if classifier else "token",
        class_token=True,
        num_register_tokens=registers,
        qkv_bias=enc + "0.attention.attention.query.bias" in tensors,
        # LayerScale is always there (lambda1); its init value is unused.
        layer_scale_init=1.0,
        layer_norm_epsilon=epsilon(config, family, 1e-6),
        # SwiGLU gates with SiLU whatever hidden_act says.
        mlp_activation="silu" if swiglu else activation(config, family, "gelu"),
        gated_mlp=swiglu,
        # interpolate_pos_encoding: torch's bicubic, with antialias in the
        # registers model (as timm), without in the plain one.
        position_resample="timm" if registers_name in tensors else "hf",
    )
    plan = Plan(ViT, kwargs, grid, p, num_classes)
    emb = root + "embeddings."
    plan.add("patch_encoder/projection/kernel", emb + DINOV2_PATCHES[11:], patch_kernel)
    plan.add("patch_encoder/projection/bias", emb + "patch_embeddings.projection.bias")
    plan.add("patch_encoder/cls_token", emb + "cls_token")
    plan.add(
        "patch_encoder/pos_embedding",
        emb + "position_embeddings",
        position_rule(True, 1),
    )
    _add_registers(plan, tensors, registers_name, registers)
    for i in range(num_layers):
        src, dst = f"{enc}{i}.", f"block_{i}/"
        attention = src + "attention."
        add_qkv(
            plan,
            tensors,
            tuple(f"{attention}attention.{n}" for n in ("query", "key", "value")),
            dst,
        )
        add_torch_linear(plan, dst + "attention/proj", attention + "output.dense")
        if swiglu:
            # weights_in packs the gate then the value: keras_vit's order.
            add_torch_linear(plan, dst + "mlp/fc1", src + "mlp.weights_in")
            add_torch_linear(plan, dst + "mlp/fc2", src + "mlp.weights_out")
        else:
            add_torch_linear(plan, dst + "mlp/fc1", src + "mlp.fc1")
            add_torch_linear(plan, dst + "mlp/fc2", src + "mlp.fc2")
        add_layer_norm(plan, dst + "norm1", src + "norm1")
        add_layer_norm(plan, dst + "norm2", src + "norm2")
        plan.add(f"{dst}layer_scale1/gamma", src + "layer_scale1.lambda1")
        plan.add(f"{dst}layer_scale2/gamma", src + "layer_scale2.lambda1")
    add_layer_norm(plan, "encoder_norm", root + "layernorm")
    if classifier:
        add_torch_linear(plan, "head", "classifier")
    plan.ignore([n for n in tensors if n == emb + "mask_token"], MASK_TOKEN)
    ignore_buffers(plan, tensors)
    return plan


def dinov3_plan(tensors: dict, config: dict, hints: dict) -> Plan:
    family = config.get("model_type") or "dinov3_vit"
    root = root_of(tensors, DINOV3_PATCHES)
    hidden, channels, p, q = (int(d) for d in tensors[root + DINOV3_PATCHES].shape)
    heads = heads_of(config, hidden, hints, family)
    if (hidden // heads) % 4:
        raise CheckpointError(
            f"{family} heads {hidden // heads} wide: RoPE needs a multiple of 4."
        )
    size = check_shape_options(config, family, hidden, heads, p, channels)
    if size is None:
        size = hints.get("image_size")
    if size is None:
        raise CheckpointError(
            f"{family} config without image_size, and the checkpoint has no "
            "position table to tell it; pass image_size=."
        )
    found = [
        m.group(1)
        for k in tensors
        if (m := re.match(re.escape(root) + r"((model\.)?layer\.)\d+\.", k))
    ]
    enc = root + (found[0] if found else "layer.")
    num_layers = count_indexed(tensors, re.escape(enc) + r"(\d+)\.")
    registers_name = root + "embeddings.register_tokens"
    registers = _registers(tensors, config, registers_name, family)
    gated = enc + "0.mlp.gate_proj.weight" in tensors
    require_flag(config, "use_gated_mlp", gated, family, "a gated MLP (gate_proj)")
    proj_bias = enc + "0.attention.o_proj.bias" in tensors
    mlp_bias = enc + "0.mlp.up_proj.bias" in tensors
    require_flag(config, "proj_bias", proj_bias, family, "an o_proj bias")
    require_flag(config, "mlp_bias", mlp_bias, family, "MLP biases")
    if proj_bias != mlp_bias:
        raise CheckpointError(
            f"{family} proj_bias={proj_bias} with mlp_bias={mlp_bias}: keras_vit "
            "has one switch (proj_bias) for the attention output and the MLP."
        )
    for key, name in (("query", "q"), ("key", "k"), ("value", "v")):
        there = f"{enc}0.attention.{name}_proj.bias" in tensors
        require_flag(config, f"{key}_bias", there, family, f"a {name}_proj bias")
    mlp_dim = int(tensors[f"{enc}0.mlp.down_proj.weight"].shape[1])
    check_sizes(config, family, num_layers, hidden, mlp_dim)
    theta = config.get("rope_theta")
    theta = config_float(
        100.0 if theta is None else theta, "rope_theta", family, *ROPE_THETA_RANGE
    )
    for key in ("rope_scaling", "rope_parameters"):
        if config.get(key) not in (None, {}, {"rope_theta": theta}):
            raise CheckpointError(
                f"{family} {key}={config[key]!r} is not supported; keras_vit's "
                "DINOv3 RoPE has rope_theta only."
            )
    act = activation(config, family, "gelu")
    kwargs = dict(
        variant="Ti",
        name=model_name(family, "hf_dinov3") + "_converted",
        patch_size=p,
        num_channels=channels,
        hidden_dim=hidden,
        num_layers=num_layers,
        num_heads=heads,
        mlp_dim=mlp_dim,
        num_classes=1,
        include_top=False,
        # pooler_output: the normalised class token.
        pooling="token",
        class_token=True,
        num_register_tokens=registers,
        position_embedding="none",
        qkv_bias=any(
            f"{enc}0.attention.{n}_proj.bias" in tensors for n in ("q", "k", "v")
        ),
        proj_bias=proj_bias,
        layer_scale_init=1.0,
        layer_norm_epsilon=epsilon(config, family, 1e-5),
        mlp_activation=act,
        gated_mlp=gated,
        # Patch centres in [-1, 1], 2 pi theta^(-k / bands) radians per unit,
        # rotate-half pairs: timm's DINOv3 RoPE. pos_embed_shift / jitter /
        # rescale augment the coordinates in training only.
        rope=dict(
            coordinates="centered",
            temperature=float(theta),
            frequency_scale=2 * math.pi,
            grid_offset=0.0,
            axis_order="ij",
        ),
    )
    grid = (size[0] // p, size[1] // p)
    plan = Plan(ViT, kwargs, grid, p, 0)
    emb = root + "embeddings."
    plan.add(
        "patch_encoder/projection/kernel", emb + "patch_embeddings.weight", patch_kernel
    )
    plan.add("patch_encoder/projection/bias", emb + "patch_embeddings.bias")
    plan.add("patch_encoder/cls_token", emb + "cls_token")
    _add_registers(plan, tensors, registers_name, registers)
    for i in range(num_layers):
        src, dst = f"{enc}{i}.", f"block_{i}/"
        attention = src + "attention."
        add_qkv(plan, tensors, tuple(f"{attention}{n}_proj" for n in "qkv"), dst)
        add_torch_linear(plan, dst + "attention/proj", attention + "o_proj", proj_bias)
        if gated:
            # The gate first, then the value: keras_vit's packed order.
            for part, index in (("kernel", "weight"), ("bias", "bias")):
                if part == "bias" and not mlp_bias:
                    continue
                pair = (f"{src}mlp.gate_proj.{index}", f"{src}mlp.up_proj.{index}")
                plan.add(f"{dst}mlp/fc1/{part}", pair, packed(part == "kernel"))
        else:
            add_torch_linear(plan, dst + "mlp/fc1", src + "mlp.up_proj", mlp_bias)
        add_torch_linear(plan, dst + "mlp/fc2", src + "mlp.down_proj", mlp_bias)
        add_layer_norm(plan, dst + "norm1", src + "norm1")
        add_layer_norm(plan, dst + "norm2", src + "norm2")
        plan.add(f"{dst}layer_scale1/gamma", src + "layer_scale1.lambda1")
        plan.add(f"{dst}layer_scale2/gamma", src + "layer_scale2.lambda1")
    add_layer_norm(plan, "encoder_norm", root + "norm")
    plan.ignore([n for n in tensors if n == emb + "mask_token"], MASK_TOKEN)
    ignore_buffers(plan, tensors)
    return plan


def _add_registers(plan: Plan, tensors: dict, name: str, registers: int) -> None:
    """The register tokens; `num_register_tokens=0` saves an empty table."""
    if registers:
        plan.add("patch_encoder/register_tokens", name)
    elif name in tensors:
        plan.ignore([name], "empty register table (num_register_tokens=0)")


def _registers(tensors: dict, config: dict, name: str, family: str) -> int:
    registers = int(tensors[name].shape[1]) if name in tensors else 0
    key, what = "num_register_tokens", "{} register token(s)"
    checked_int(config, key, family, registers, what, low=0)
    return registers


def _check_mlp_ratio(tensors, config, family, hidden, enc, swiglu) -> None:
    """transformers' DINOv2 MLP is `int(hidden_size * mlp_ratio)` wide; its
    SwiGLU takes 2/3 of that, rounded up to a multiple of 8, twice (gate and
    value) in weights_in."""
    ratio = config.get("mlp_ratio")
    if ratio is None:
        return
    width = int(hidden * config_float(ratio, "mlp_ratio", family, *MLP_RATIO_RANGE))
    if swiglu:
        width = 2 * ((int(width * 2 / 3) + 7) // 8 * 8)
    name = f"{enc}0.mlp.{'weights_in' if swiglu else 'fc1'}.weight"
    if name in tensors:
        agree_width(family, ratio, hidden, width, name, tensors)
