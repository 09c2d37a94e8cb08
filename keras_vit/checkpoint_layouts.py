"""How each ecosystem lays out a ViT checkpoint: the tensors are read for
the architecture (timm, Hugging Face transformers, AugReg / big_vision), and
each keras_vit variable gets its source tensors and a transform."""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from keras_vit.hybrid import HybridViT
from keras_vit.vit import VARIANTS, ViT, image_hw
from keras_vit.weights import CheckpointError


@dataclass
class Plan:
    """What a checkpoint holds: the builder's arguments and, for each model
    variable path, the source tensors and how to turn them into its value."""

    builder: Callable
    kwargs: dict
    grid: tuple[int, int]
    stride: int
    num_classes: int
    assign: dict[str, tuple[tuple[str, ...], Callable]] = field(default_factory=dict)

    def add(self, target: str, sources, fn: Callable | None = None) -> None:
        sources = (sources,) if isinstance(sources, str) else tuple(sources)
        self.assign[target] = (sources, fn or (lambda x: x))


def _linear(w):  # torch Linear (out, in) -> keras Dense (in, out)
    return w.T


def _conv(w):  # torch conv (out, in, kh, kw) -> keras (kh, kw, in, out)
    return w.transpose(2, 3, 1, 0)


def _patch_kernel(w):  # torch (out, in, p, p) -> Patches + Dense (p * p * in, out)
    return w.transpose(2, 3, 1, 0).reshape(-1, w.shape[0])


def _count(tensors, pattern: str) -> int:
    regex = re.compile(pattern)
    found = {int(m.group(1)) for k in tensors if (m := regex.match(k))}
    if found and found != set(range(max(found) + 1)):
        raise CheckpointError(f"Block indices {sorted(found)} have gaps.")
    return len(found)


def _heads(hidden_dim: int, config_heads, hint=None) -> int:
    if config_heads:
        return int(config_heads)
    if hint:
        return int(hint)
    for arch in VARIANTS.values():
        if arch["hidden_dim"] == hidden_dim:
            return arch["num_heads"]
    # timm, DeiT and the paper use 64-wide heads for every size; the
    # tensors cannot tell, so say that this is a guess.
    guess = max(hidden_dim // 64, 1)
    warnings.warn(
        f"Neither the config nor the VARIANTS table gives the number of heads "
        f"for hidden_dim={hidden_dim}; assuming {guess} (64-wide heads). Pass "
        "num_heads= if the checkpoint used another number.",
        stacklevel=6,
    )
    return guess


def _grid(
    tokens: int,
    prefix: int,
    image_hw_: tuple[int, int] | None,
    stride: int,
    hint: tuple[int, int] | None = None,
):
    """The checkpoint's patch grid and whether its position table covers the
    prefix tokens (timm's `no_embed_class=False`).

    The checkpoint's own image size must fit; without one, the requested
    size is tried (a checkpoint used at its training size), then a square.
    """
    for size, must_fit in ((image_hw_, True), (hint, False)):
        if size is None:
            continue
        grid = (size[0] // stride, size[1] // stride)
        for covered in (True, False):
            if grid[0] * grid[1] == tokens - (prefix if covered else 0):
                return grid, covered
        if must_fit:
            raise CheckpointError(
                f"A position embedding of {tokens} tokens with {prefix} prefix "
                f"token(s) does not fit the checkpoint's {size[0]}x{size[1]} "
                f"images at stride {stride}."
            )
    for covered in (True, False):
        patches = tokens - (prefix if covered else 0)
        side = math.isqrt(max(patches, 0))
        if patches > 0 and side * side == patches:
            return (side, side), covered
    raise CheckpointError(
        f"A position embedding of {tokens} tokens with {prefix} prefix token(s) "
        "is not a square grid and nothing gives the checkpoint's image size; "
        "pass image_size= of the checkpoint."
    )


def _pos(covered: bool, prefix: int):
    def fn(pos):
        pos = pos.reshape(1, -1, pos.shape[-1])
        if not covered:
            # Prefix tokens without a position embedding (timm's
            # no_embed_class): zero rows are the same thing in a model whose
            # table covers the prefix tokens.
            pos = np.concatenate([np.zeros_like(pos[:, :prefix]), pos], axis=1)
        return pos

    return fn


def _timm_plan(tensors: dict, config: dict, hints: dict) -> Plan:
    args = dict(config.get("model_args") or {})
    if args.get("act_layer") not in (None, "gelu"):
        raise CheckpointError(
            f"timm act_layer={args['act_layer']!r} is not supported; keras_vit's "
            "MLP uses exact GELU."
        )
    hybrid = "patch_embed.backbone.stem.conv.weight" in tensors
    proj = tensors.get("patch_embed.proj.weight")
    if proj is None:
        raise CheckpointError("timm checkpoint without patch_embed.proj.weight.")
    hidden, channels, p, q = proj.shape
    if p != q:
        raise CheckpointError(f"Non-square patches {p}x{q} are not supported.")
    if hybrid and p != 1:
        raise CheckpointError(
            f"This timm hybrid projects {p}x{p} patches of its CNN features; "
            "keras_vit's HybridViT uses 1x1 patches (the R26/R50 hybrids)."
        )
    num_layers = _count(tensors, r"blocks\.(\d+)\.norm1\.weight$")
    if not num_layers:
        raise CheckpointError("timm checkpoint without blocks.N.* tensors.")
    class_token = "cls_token" in tensors
    distilled = "dist_token" in tensors
    prefix = int(class_token) + int(distilled)
    fc_norm = "fc_norm.weight" in tensors
    pool = config.get("global_pool", args.get("global_pool"))
    if pool is None:
        pool = "avg" if (fc_norm or not class_token) else "token"
    if pool not in ("token", "avg", ""):
        raise CheckpointError(
            f"timm global_pool={pool!r} is not supported; valid: 'token', 'avg'."
        )
    num_classes = tensors["head.weight"].shape[0] if "head.weight" in tensors else 0

    stride, builder, kwargs = p, ViT, {}
    if hybrid:
        stem = tensors["patch_embed.backbone.stem.conv.weight"]
        stages = _count(tensors, r"patch_embed\.backbone\.stages\.(\d+)\.")
        if not stages:
            raise CheckpointError(
                "Stem-only timm hybrids (no ResNet stages) are not supported."
            )
        blocks = tuple(
            _count(tensors, rf"patch_embed\.backbone\.stages\.{s}\.blocks\.(\d+)\.")
            for s in range(stages)
        )
        stride = 4 * 2 ** (stages - 1)
        channels = stem.shape[1]
        builder = HybridViT
        kwargs = dict(stem=blocks, stem_width=int(stem.shape[0]))
    else:
        kwargs = dict(patch_size=int(p))

    size = args.get("img_size")
    if size is None:
        input_size = (config.get("pretrained_cfg") or {}).get("input_size")
        size = input_size[1:] if input_size else None
    size = image_hw(tuple(size) if isinstance(size, list) else size) if size else None
    tokens = tensors["pos_embed"].shape[1] if "pos_embed" in tensors else None
    if tokens is None:
        raise CheckpointError("timm checkpoint without pos_embed is not supported.")
    grid, covered = _grid(tokens, prefix, size, stride, hints.get("image_size"))
    if not covered and args.get("no_embed_class") is False:
        raise CheckpointError("pos_embed size contradicts no_embed_class=False.")

    kwargs.update(
        variant="Ti",
        name=_model_name(config.get("architecture"), "timm_vit"),
        num_classes=max(num_classes, 1),
        include_top=num_classes > 0 and pool != "",
        num_channels=int(channels),
        hidden_dim=int(hidden),
        num_layers=num_layers,
        num_heads=_heads(int(hidden), args.get("num_heads"), hints.get("num_heads")),
        mlp_dim=int(tensors["blocks.0.mlp.fc1.weight"].shape[0]),
        pooling=("token" if pool == "token" else "gap") if pool else None,
        class_token=class_token,
        distilled=distilled,
        pool_norm=fc_norm,
        qkv_bias="blocks.0.attn.qkv.bias" in tensors,
        layer_scale_init=1e-5 if "blocks.0.ls1.gamma" in tensors else None,
        layer_norm_epsilon=1e-6,
    )
    if pool == "":
        # Unpooled tokens (timm's global_pool=""): the encoder's output.
        kwargs.update(pooling=None, include_top=False, pool_norm=False)
    plan = Plan(builder, kwargs, grid, stride, num_classes)

    plan.add(
        "patch_encoder/projection/kernel", "patch_embed.proj.weight", _patch_kernel
    )
    plan.add("patch_encoder/projection/bias", "patch_embed.proj.bias")
    if class_token:
        plan.add("patch_encoder/cls_token", "cls_token")
    if distilled:
        plan.add("patch_encoder/dist_token", "dist_token")
    plan.add("patch_encoder/pos_embedding", "pos_embed", _pos(covered, prefix))
    for i in range(num_layers):
        src, dst = f"blocks.{i}.", f"block_{i}/"
        for a, b in (("norm1", "norm1"), ("norm2", "norm2")):
            plan.add(f"{dst}{b}/gamma", f"{src}{a}.weight")
            plan.add(f"{dst}{b}/beta", f"{src}{a}.bias")
        for a, b in (
            ("attn.qkv", "attention/qkv"),
            ("attn.proj", "attention/proj"),
            ("mlp.fc1", "mlp/fc1"),
            ("mlp.fc2", "mlp/fc2"),
        ):
            plan.add(f"{dst}{b}/kernel", f"{src}{a}.weight", _linear)
            if f"{src}{a}.bias" in tensors or a != "attn.qkv":
                plan.add(f"{dst}{b}/bias", f"{src}{a}.bias")
        if kwargs["layer_scale_init"] is not None:
            plan.add(f"{dst}layer_scale1/gamma", f"{src}ls1.gamma")
            plan.add(f"{dst}layer_scale2/gamma", f"{src}ls2.gamma")
    norm = "fc_norm" if fc_norm else "norm"
    plan.add("encoder_norm/gamma", f"{norm}.weight")
    plan.add("encoder_norm/beta", f"{norm}.bias")
    for head in ("head", "head_dist"):
        if f"{head}.weight" in tensors:
            plan.add(f"{head}/kernel", f"{head}.weight", _linear)
            plan.add(f"{head}/bias", f"{head}.bias")

    if hybrid:
        root = "patch_embed.backbone."
        plan.add("stem_conv/kernel", root + "stem.conv.weight", _conv)
        plan.add("stem_norm/gamma", root + "stem.norm.weight")
        plan.add("stem_norm/beta", root + "stem.norm.bias")
        for s, depth in enumerate(kwargs["stem"]):
            for b in range(depth):
                src, dst = f"{root}stages.{s}.blocks.{b}.", f"stage{s}_block{b}_"
                parts = [(f"conv{r}", f"norm{r}") for r in (1, 2, 3)]
                if b == 0 and f"{src}downsample.conv.weight" in tensors:
                    parts.append(("downsample.conv", "downsample.norm"))
                for conv, norm_ in parts:
                    plan.add(
                        dst + conv.replace(".", "_") + "/kernel",
                        f"{src}{conv}.weight",
                        _conv,
                    )
                    plan.add(
                        dst + norm_.replace(".", "_") + "/gamma", f"{src}{norm_}.weight"
                    )
                    plan.add(
                        dst + norm_.replace(".", "_") + "/beta", f"{src}{norm_}.bias"
                    )
    return plan


def _model_name(label, default: str) -> str:
    label = re.sub(r"[^0-9A-Za-z_]+", "_", str(label or "")).strip("_")
    return label or default


def _hf_plan(tensors: dict, config: dict, hints: dict) -> Plan:
    if config.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(
            f"hidden_act={config['hidden_act']!r} is not supported; keras_vit's MLP "
            "uses exact GELU ('gelu')."
        )
    suffix = "embeddings.patch_embeddings.projection.weight"
    # "vit." (ViTForImageClassification), "deit." (DeiT), "" (ViTModel).
    root = next(k for k in sorted(tensors) if k.endswith(suffix))[: -len(suffix)]
    proj = tensors[root + "embeddings.patch_embeddings.projection.weight"]
    hidden, channels, p, q = proj.shape
    if p != q:
        raise CheckpointError(f"Non-square patches {p}x{q} are not supported.")
    enc = root + "encoder.layer."
    num_layers = _count(tensors, re.escape(enc) + r"(\d+)\.")
    class_token = root + "embeddings.cls_token" in tensors
    distilled = root + "embeddings.distillation_token" in tensors
    prefix = int(class_token) + int(distilled)
    # DeiTForImageClassificationWithTeacher: class and distillation heads.
    head = "cls_classifier" if "cls_classifier.weight" in tensors else "classifier"
    size = config.get("image_size")
    size = image_hw(tuple(size) if isinstance(size, list) else size) if size else None
    tokens = tensors[root + "embeddings.position_embeddings"].shape[1]
    grid, covered = _grid(tokens, prefix, size, p, hints.get("image_size"))
    num_classes = (
        tensors[f"{head}.weight"].shape[0] if f"{head}.weight" in tensors else 0
    )
    pooler = root + "pooler.dense.weight" in tensors
    kwargs = dict(
        variant="Ti",
        name=_model_name(config.get("model_type"), "hf") + "_converted",
        patch_size=int(p),
        num_classes=max(num_classes, 1),
        include_top=num_classes > 0,
        num_channels=int(channels),
        hidden_dim=int(hidden),
        num_layers=num_layers,
        num_heads=_heads(
            int(hidden), config.get("num_attention_heads"), hints.get("num_heads")
        ),
        mlp_dim=int(tensors[enc + "0.intermediate.dense.weight"].shape[0]),
        pooling="token" if class_token else "gap",
        class_token=class_token,
        distilled=distilled,
        representation_size=int(hidden) if pooler else None,
        qkv_bias=enc + "0.attention.attention.query.bias" in tensors,
        layer_norm_epsilon=float(config.get("layer_norm_eps", 1e-12)),
    )
    plan = Plan(ViT, kwargs, grid, int(p), num_classes)
    plan.add(
        "patch_encoder/projection/kernel",
        root + "embeddings.patch_embeddings.projection.weight",
        _patch_kernel,
    )
    plan.add(
        "patch_encoder/projection/bias",
        root + "embeddings.patch_embeddings.projection.bias",
    )
    if class_token:
        plan.add("patch_encoder/cls_token", root + "embeddings.cls_token")
    if distilled:
        plan.add("patch_encoder/dist_token", root + "embeddings.distillation_token")
    plan.add(
        "patch_encoder/pos_embedding",
        root + "embeddings.position_embeddings",
        _pos(covered, prefix),
    )
    for i in range(num_layers):
        src, dst = f"{enc}{i}.", f"block_{i}/"
        qkv = [f"{src}attention.attention.{n}" for n in ("query", "key", "value")]
        plan.add(
            f"{dst}attention/qkv/kernel",
            [n + ".weight" for n in qkv],
            lambda *w: np.concatenate([x.T for x in w], axis=1),
        )
        if kwargs["qkv_bias"]:
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
            plan.add(f"{dst}{b}/kernel", f"{src}{a}.weight", _linear)
            plan.add(f"{dst}{b}/bias", f"{src}{a}.bias")
        for a, b in (("layernorm_before", "norm1"), ("layernorm_after", "norm2")):
            plan.add(f"{dst}{b}/gamma", f"{src}{a}.weight")
            plan.add(f"{dst}{b}/beta", f"{src}{a}.bias")
    plan.add("encoder_norm/gamma", root + "layernorm.weight")
    plan.add("encoder_norm/beta", root + "layernorm.bias")
    if pooler:
        plan.add("pre_logits/kernel", root + "pooler.dense.weight", _linear)
        plan.add("pre_logits/bias", root + "pooler.dense.bias")
    if num_classes:
        plan.add("head/kernel", f"{head}.weight", _linear)
        plan.add("head/bias", f"{head}.bias")
    if num_classes and distilled and "distillation_classifier.weight" in tensors:
        plan.add("head_dist/kernel", "distillation_classifier.weight", _linear)
        plan.add("head_dist/bias", "distillation_classifier.bias")
    return plan


def _jax_plan(tensors: dict, config: dict, hints: dict) -> Plan:
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
    if any("MAPHead" in k for k in tensors):
        raise CheckpointError(
            "big_vision MAP-head pooling is not supported; valid pooling: class "
            "token or mean (gap)."
        )
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
        num_layers = _count(
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
    grid, covered = _grid(
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
        pooling="token" if class_token else "gap",
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
    plan.add("patch_encoder/pos_embedding", pos_key, _pos(covered, int(class_token)))

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
    plan.add("encoder_norm/gamma", root + "Transformer/encoder_norm/scale")
    plan.add("encoder_norm/beta", root + "Transformer/encoder_norm/bias")
    if pre_logits:
        plan.add("pre_logits/kernel", root + "pre_logits/kernel")
        plan.add("pre_logits/bias", root + "pre_logits/bias")
    if num_classes:
        plan.add("head/kernel", root + "head/kernel")
        plan.add("head/bias", root + "head/bias")
    return plan


def detect_architecture(
    tensors: dict, config: dict | None = None, hints: dict | None = None
) -> Plan:
    """Recognises timm, Hugging Face and AugReg/big_vision layouts.

    `hints` (`image_size`, `num_heads`) fill in what neither the tensors nor
    the config tell.
    """
    try:
        return _detect(tensors, config or {}, hints or {})
    except CheckpointError:
        raise
    except KeyError as error:
        raise CheckpointError(
            f"The checkpoint lacks tensor {error.args[0]!r}, which its layout "
            "needs to tell the architecture."
        ) from None
    except (ValueError, IndexError) as error:
        raise CheckpointError(
            f"A tensor that tells the architecture has an unexpected shape: {error}"
        ) from None


def _detect(tensors: dict, config: dict, hints: dict) -> Plan:
    if "patch_embed.proj.weight" in tensors:
        return _timm_plan(tensors, config, hints)
    if any(
        k.endswith("embeddings.patch_embeddings.projection.weight") for k in tensors
    ):
        return _hf_plan(tensors, config, hints)
    if any(k.endswith("embedding/kernel") for k in tensors):
        return _jax_plan(tensors, config, hints)
    raise CheckpointError(
        "Unrecognised checkpoint layout (expected timm, Hugging Face ViT or "
        f"AugReg/big_vision names); first tensors: {sorted(tensors)[:5]}."
    )
