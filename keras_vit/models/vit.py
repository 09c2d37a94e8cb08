"""ViT variants as data, and the builder that turns one into a `keras.Model`."""

from __future__ import annotations

import inspect

import keras

from keras_vit.models.blocks import TransformerBlock, check_remat
from keras_vit.models.layers import PatchEncoder, Patches, TokenPooling
from keras_vit.models.norms import make_norm
from keras_vit.models.pooling import MAPHead
from keras_vit.models.rope import RotaryEmbedding

POOLING_MODES = ("token", "gap", "token_gap", "map", None)

# One line per size: hidden_dim, num_layers, num_heads, mlp_dim (paper, Table 1;
# Ti and S from DeiT / timm).
VARIANTS = {
    "Ti": dict(hidden_dim=192, num_layers=12, num_heads=3, mlp_dim=768),
    "S": dict(hidden_dim=384, num_layers=12, num_heads=6, mlp_dim=1536),
    "B": dict(hidden_dim=768, num_layers=12, num_heads=12, mlp_dim=3072),
    "L": dict(hidden_dim=1024, num_layers=24, num_heads=16, mlp_dim=4096),
    "H": dict(hidden_dim=1280, num_layers=32, num_heads=16, mlp_dim=5120),
}

ARCHITECTURE_KEYS = ("patch_size", "hidden_dim", "num_layers", "num_heads", "mlp_dim")
# The classification heads' layer names (`build_transformer`).
HEAD_LAYERS = ("head", "head_dist")
# The largest image side the config and the CLI accept. Attention memory
# grows with the fourth power of the side: at 1024 px and patch 16 a model
# holds 4,096 tokens, and each head's scores are 64 MiB per image in float32;
# at 4096 px the same head needs 16 GiB. Published ViT classifiers stop at
# 518-560 px. The Python builders take any size, on purpose.
MAX_IMAGE_SIZE = 1024


def variant_heads(hidden_dim: int) -> int | None:
    """The number of heads of the `VARIANTS` size of this width, or None."""
    for arch in VARIANTS.values():
        if arch["hidden_dim"] == hidden_dim:
            return arch["num_heads"]
    return None


def split_variant(variant: str) -> tuple[str, int | None]:
    """`"B/16"` -> `("B", 16)`, `"B"` -> `("B", None)`: the one parser of
    variant strings (the size checked against `VARIANTS`)."""
    if not isinstance(variant, str):
        raise ValueError(f"variant must be a string like 'B/16', got {variant!r}.")
    size, _, patch = variant.partition("/")
    if size not in VARIANTS:
        raise ValueError(
            f"Unknown ViT variant {variant!r}; valid sizes are "
            f"{', '.join(VARIANTS)}, written like 'B/16' (size/patch size)."
        )
    if not patch:
        return size, None
    if not patch.isdigit() or int(patch) < 1:
        raise ValueError(
            f"Bad patch size {patch!r} in variant {variant!r}; expected a "
            "positive integer such as 'B/16'."
        )
    return size, int(patch)


def parse_variant(variant: str, **overrides) -> dict:
    """Turns `"B/16"` into the architecture dict; non-None overrides win.

    The patch size may be left out of the string (`"B"`) when `patch_size`
    is passed as an override.
    """
    size, patch = split_variant(variant)
    arch = dict(VARIANTS[size])
    if patch:
        arch["patch_size"] = patch
    unknown = set(overrides) - set(ARCHITECTURE_KEYS)
    if unknown:
        raise ValueError(
            f"Unknown architecture keys {sorted(unknown)}; valid keys are "
            f"{list(ARCHITECTURE_KEYS)}."
        )
    arch.update({k: int(v) for k, v in overrides.items() if v is not None})
    if "patch_size" not in arch:
        raise ValueError(
            f"Variant {variant!r} has no patch size; write it like "
            f"'{size}/16' or pass patch_size=."
        )
    for key in ARCHITECTURE_KEYS:
        if arch[key] < 1:
            raise ValueError(f"`{key}` must be >= 1, got {arch[key]}.")
    if arch["hidden_dim"] % arch["num_heads"]:
        raise ValueError(
            f"hidden_dim {arch['hidden_dim']} is not divisible by num_heads "
            f"{arch['num_heads']}."
        )
    return arch


def model_architecture(model: keras.Model) -> dict:
    """The `ARCHITECTURE_KEYS` of a built ViT or HybridViT, read off its
    stable layer names (`patches`, `patch_encoder`, `block_0`...): what an
    export records (a hybrid's patches are 1x1 cells of its stem's features,
    `patch_size` 1)."""
    layers = {layer.name: layer for layer in model.layers}
    found = dict.fromkeys(ARCHITECTURE_KEYS)
    if "patches" in layers:
        found["patch_size"] = layers["patches"].patch_size
    if "patch_encoder" in layers:
        found["hidden_dim"] = layers["patch_encoder"].hidden_dim
    found["num_layers"] = sum(1 for name in layers if name.startswith("block_"))
    if "block_0" in layers:
        config = layers["block_0"].get_config()
        found["num_heads"] = config["num_heads"]
        found["mlp_dim"] = config["mlp_dim"]
    return found


def image_hw(image_size: int | tuple[int, int]) -> tuple[int, int]:
    """Normalises `224` or `(224, 320)` to `(height, width)`."""
    if isinstance(image_size, int) and not isinstance(image_size, bool):
        image_size = (image_size, image_size)
    try:
        height, width = (int(s) for s in image_size)
    except (TypeError, ValueError):
        raise ValueError(
            f"image_size must be an int or (height, width), got {image_size!r}."
        ) from None
    if height < 1 or width < 1:
        raise ValueError(f"image_size must be positive, got {image_size!r}.")
    return height, width


def split_architecture(options: dict) -> tuple[dict, dict]:
    """`options` split into the architecture overrides (the keys in
    `ARCHITECTURE_KEYS`) and everything else."""
    overrides = {k: v for k, v in options.items() if k in ARCHITECTURE_KEYS}
    rest = {k: v for k, v in options.items() if k not in ARCHITECTURE_KEYS}
    return overrides, rest


def resolve_architecture(variant: str, image_size, options: dict):
    """`(arch, (height, width), other options)` for `ViT`'s arguments: the
    variant with the architecture keys of `options` applied, and the image
    size, checked against its patch size."""
    overrides, rest = split_architecture(options)
    arch = parse_variant(variant, **overrides)
    height, width = image_hw(image_size)
    p = arch["patch_size"]
    if height % p or width % p:
        raise ValueError(
            f"image_size {height}x{width} is not divisible by patch_size {p}."
        )
    return arch, (height, width), rest


def image_input(height: int | None, width: int | None, num_channels: int):
    """The builders' `keras.Input` named `images` (None sides: any size)."""
    if (
        isinstance(num_channels, bool)
        or not isinstance(num_channels, int)
        or num_channels < 1
    ):
        raise ValueError(
            f"`num_channels` must be a positive int, got {num_channels!r}."
        )
    return keras.Input((height, width, num_channels), name="images")


def build_transformer(
    inputs,
    patches,
    grid_size: tuple[int, int],
    *,
    hidden_dim: int,
    num_layers: int,
    num_heads: int,
    mlp_dim: int,
    num_classes: int = 1000,
    include_top: bool = True,
    pooling: str | None = "token",
    representation_size: int | None = None,
    distilled: bool = False,
    class_token: bool | None = None,
    position_embedding: str = "learned",
    position_resample: str = "bicubic",
    patch_norm: bool = False,
    pool_norm: bool = False,
    pool_include_prefix: bool = True,
    dropout_rate: float = 0.0,
    attention_dropout_rate: float = 0.0,
    drop_path_rate: float = 0.0,
    qkv_bias: bool = True,
    layer_scale_init: float | None = None,
    layer_norm_epsilon: float = 1e-6,
    classifier_activation: str | None = None,
    num_register_tokens: int = 0,
    remat: bool = False,
    norm_type: str = "layernorm",
    norm_pre: bool = False,
    final_norm: bool = True,
    embed_norm: bool = False,
    qk_norm: bool = False,
    proj_bias: bool = True,
    mlp_activation: str = "gelu",
    gated_mlp: bool = False,
    mlp_norm: bool = False,
    rope: dict | None = None,
    name: str = "vit",
) -> keras.Model:
    """Patch embedding, encoder, pooling and head on top of `patches`.

    Shared by `ViT` (pixels cut into patches) and `HybridViT` (a CNN feature
    map cut into 1x1 patches), so both have exactly the same transformer.
    """
    class_token = _check_pooling(
        pooling, include_top, num_classes, class_token, distilled, pool_norm
    )
    if not 0.0 <= drop_path_rate < 1.0:
        raise ValueError(f"`drop_path_rate` must be in [0, 1), got {drop_path_rate!r}.")
    encoder = PatchEncoder(
        hidden_dim,
        class_token=class_token,
        distillation_token=distilled,
        position_embedding=position_embedding,
        position_resample=position_resample,
        grid_size=grid_size,
        patch_norm=patch_norm,
        dropout_rate=dropout_rate,
        layer_norm_epsilon=layer_norm_epsilon,
        num_register_tokens=num_register_tokens,
        projection_norm=norm_type if embed_norm else None,
        name="patch_encoder",
    )
    x, prefix = encoder(patches), encoder.num_prefix_tokens
    if norm_pre:
        # CLIP's LayerNorm on the embedded tokens, before the first block.
        x = make_norm(norm_type, layer_norm_epsilon, "norm_pre")(x)
    rope_table = None
    if rope is not None:
        # From the images when their size is fixed, so that a model rebuilt
        # at another size (`with_image_size`) gets that size's tables.
        height, width = inputs.shape[1], inputs.shape[2]
        fixed = height is not None and width is not None
        stride = (height // grid_size[0], width // grid_size[1]) if fixed else None
        rope_table = RotaryEmbedding(
            hidden_dim // num_heads, stride=stride, name="rope", **rope
        )(inputs if fixed else patches)
    x = _encoder_blocks(
        x,
        num_layers,
        drop_path_rate,
        last_queries=prefix if pooling == "token" else None,
        rope=rope_table,
        num_heads=num_heads,
        mlp_dim=mlp_dim,
        dropout_rate=dropout_rate,
        attention_dropout_rate=attention_dropout_rate,
        qkv_bias=qkv_bias,
        layer_scale_init=layer_scale_init,
        layer_norm_epsilon=layer_norm_epsilon,
        remat=remat,
        **_block_options(
            norm_type, qk_norm, proj_bias, mlp_activation, gated_mlp, mlp_norm
        ),
    )
    x = _norm_pool_and_head(
        x,
        prefix,
        num_heads=num_heads,
        mlp_dim=mlp_dim,
        num_classes=num_classes,
        include_top=include_top,
        pooling=pooling,
        representation_size=representation_size,
        distilled=distilled,
        pool_norm=pool_norm,
        pool_include_prefix=pool_include_prefix,
        qkv_bias=qkv_bias,
        layer_norm_epsilon=layer_norm_epsilon,
        classifier_activation=classifier_activation,
        norm_type=norm_type,
        final_norm=final_norm,
        mlp_activation=mlp_activation,
    )
    return keras.Model(inputs, x, name=name)


def _block_options(norm_type, qk_norm, proj_bias, mlp_activation, gated_mlp, mlp_norm):
    """The block options that differ from the plain ViT's: a plain model's
    blocks get none, so its config reads as before."""
    options = dict(
        norm_type=norm_type,
        qk_norm=qk_norm,
        proj_bias=proj_bias,
        mlp_activation=mlp_activation,
        gated_mlp=gated_mlp,
        mlp_norm=mlp_norm,
    )
    plain = dict(
        norm_type="layernorm",
        qk_norm=False,
        proj_bias=True,
        mlp_activation="gelu",
        gated_mlp=False,
        mlp_norm=False,
    )
    return {k: v for k, v in options.items() if v != plain[k]}


def _encoder_blocks(
    x, num_layers, drop_path_rate, last_queries, rope=None, **block_options
):
    """`num_layers` `TransformerBlock`s named `block_{i}` on the tokens `x`.

    With `last_queries`, only that many leading tokens attend and go through
    the MLP in the last block: all a class-token head reads, 6-7% of the
    encoder's FLOPs saved, outputs unchanged.
    """
    remat = block_options.pop("remat", False)
    # Checked here too: a one-block model has no block that recomputes.
    check_remat(
        remat,
        block_options.get("dropout_rate", 0.0),
        block_options.get("attention_dropout_rate", 0.0),
    )
    for i in range(num_layers):
        block = TransformerBlock(
            # Linear stochastic-depth schedule: 0 for the first block.
            drop_path_rate=drop_path_rate * i / max(num_layers - 1, 1),
            # The last block's activations are the first the backward pass
            # needs: recomputing them would cost its forward pass again and
            # lower no peak (B/16 at 384, batch 32, bfloat16: 1.34x -> 1.32x
            # the plain step time, peak RSS 4,228 -> 4,227 MiB).
            remat=remat and i < num_layers - 1,
            name=f"block_{i}",
            **block_options,
        )
        queries = last_queries if i == num_layers - 1 else None
        # The rotary tables only where there are some: a plain block's call
        # is the one it always was.
        if rope is None:
            x = block(x, num_query_tokens=queries)
        else:
            x = block(x, num_query_tokens=queries, rope=rope)
    return x


def _check_pooling(
    pooling, include_top, num_classes, class_token, distilled, pool_norm
) -> bool:
    """Validates the pooling options; returns whether there is a class token."""
    if pooling not in POOLING_MODES:
        raise ValueError(
            "`pooling` must be 'token', 'gap', 'token_gap', 'map' or None, got "
            f"{pooling!r}."
        )
    if pooling is None and include_top:
        raise ValueError("`pooling=None` is only valid with `include_top=False`.")
    if include_top and (not isinstance(num_classes, int) or num_classes < 1):
        raise ValueError(f"`num_classes` must be a positive int, got {num_classes!r}.")
    if class_token is None:
        class_token = pooling not in ("gap", "map") or distilled
    if pooling in ("token", "token_gap") and not class_token:
        raise ValueError(f"`pooling={pooling!r}` needs `class_token=True`.")
    if distilled and pooling != "token":
        raise ValueError(
            f"`distilled=True` pools the class and distillation tokens; it needs "
            f"pooling='token', got {pooling!r}."
        )
    if pool_norm and pooling in (None, "token_gap"):
        raise ValueError(
            f"`pool_norm=True` needs a pooling mode of hidden_dim features, got "
            f"pooling={pooling!r}."
        )
    return class_token


def _norm_pool_and_head(
    x,
    prefix,
    *,
    num_heads,
    mlp_dim,
    num_classes,
    include_top,
    pooling,
    representation_size,
    distilled,
    pool_norm,
    pool_include_prefix,
    qkv_bias,
    layer_norm_epsilon,
    classifier_activation,
    norm_type="layernorm",
    final_norm=True,
    mlp_activation="gelu",
):
    """The final LayerNorm (after pooling with `pool_norm`), pooling, optional
    pre-logits and the float32 head on the encoded tokens `x`; the pooled
    features when `include_top=False`, the normed tokens with no pooling."""
    encoder_norm = make_norm(norm_type, layer_norm_epsilon, "encoder_norm")
    if not final_norm:
        # timm's final_norm=False: the tokens go to pooling as they are.
        encoder_norm = None
        if pool_norm:
            raise ValueError("`pool_norm=True` needs `final_norm=True`.")
    if not pool_norm and encoder_norm is not None:
        x = encoder_norm(x)
    if pooling is None:
        return x
    if pooling == "map":
        # timm >= 1.0.16 leaves the prefix tokens out by default
        # (`pool_include_prefix=False`); big_vision has none.
        pool = MAPHead(
            num_heads,
            mlp_dim,
            qkv_bias=qkv_bias,
            layer_norm_epsilon=layer_norm_epsilon,
            num_skipped_tokens=0 if pool_include_prefix else prefix,
            # timm's AttentionPoolLatent and transformers' SigLIP head use
            # the blocks' activation.
            activation=mlp_activation,
            name="map_head",
        )
    else:
        pool = TokenPooling(pooling, prefix, name="pooling")
    features = [pool(x)]
    if distilled:
        features.append(TokenPooling("distillation", prefix, name="dist_pooling")(x))
    if pool_norm:
        features = [encoder_norm(f) for f in features]
    if representation_size:
        pre_logits = keras.layers.Dense(
            representation_size, activation="tanh", name="pre_logits"
        )
        features = [pre_logits(f) for f in features]
    if not include_top:
        return features[0]

    def head(f, head_name):
        # float32 logits whatever the global mixed-precision policy.
        return keras.layers.Dense(
            num_classes, kernel_initializer="zeros", dtype="float32", name=head_name
        )(f)

    logits = head(features[0], "head")
    if distilled:
        logits = keras.layers.Average(name="head_average", dtype="float32")(
            [logits, head(features[1], "head_dist")]
        )
    if classifier_activation is not None:
        logits = keras.layers.Activation(
            classifier_activation, dtype="float32", name="predictions"
        )(logits)
    return logits


def ViT(
    variant: str = "B/16",
    image_size: int | tuple[int, int] = 224,
    num_classes: int = 1000,
    *,
    num_channels: int = 3,
    name: str | None = None,
    dynamic_size: bool = False,
    **options,
) -> keras.Model:
    """Builds a Vision Transformer as a functional `keras.Model`.

    Args:
        variant: `"<size>/<patch>"` with size in `VARIANTS` (Ti, S, B, L, H),
            e.g. `"B/16"`.
        image_size: int or `(height, width)`; both divisible by the patch size.
            With `dynamic_size=True`, the size the position embedding is made
            for (its weights are those of a fixed model of this size).
        num_classes: int, size of the classification head.
        num_channels: int, image channels.
        name: model name; defaults to e.g. `"vit_b16"`.
        dynamic_size: bool, accept images of any height and width that are
            multiples of the patch size, `(batch, None, None, num_channels)`.
            At another size than `image_size` the learned position embedding
            is resampled in the graph exactly as `with_image_size` resamples
            it offline (bicubic), a sin-cos one computed for the actual grid;
            at `image_size` the model computes what the fixed one does. Under
            XLA (`jit_compile=True`) every new input shape (size or batch)
            traces and compiles the function once more; a shape seen before
            reuses its compiled program.
        **options: the `ARCHITECTURE_KEYS` (`patch_size`, `hidden_dim`,
            `num_layers`, `num_heads`, `mlp_dim`) override the variant's
            table entry; the others go to `build_transformer`: `include_top`,
            `pooling` (`"token"`, `"gap"`, `"token_gap"` (class token and
            patch mean concatenated, `2 * hidden_dim` features: DINOv2's
            classifier), `"map"` (a learned probe attends over the tokens,
            `MAPHead`), or None for the token sequence without top),
            `num_register_tokens` (registers after the class token, no
            position embedding, skipped by pooling),
            `representation_size` (pre-logits Dense + tanh), `distilled`
            (DeiT class + distillation heads, averaged), `class_token`,
            `position_embedding` (`"learned"` or `"sincos"`),
            `position_resample` (the kernel that resamples the learned
            table at another size: `"bicubic"`, `"bilinear"`, or the
            source library's `"timm"`, `"hf"`, `"big_vision"`), `patch_norm`,
            `pool_norm` (LayerNorm after pooling, timm's `fc_norm`),
            `shifted_patches` (each patch with its four half-patch
            diagonal shifts, SPT: locality for small data, see `Patches`),
            `pool_include_prefix` (whether `"map"` pooling attends to the
            class and register tokens too; timm's flag),
            `dropout_rate`, `attention_dropout_rate`, `drop_path_rate`
            (linear over blocks), `qkv_bias`, `layer_scale_init`,
            `layer_norm_epsilon`, `classifier_activation`, `remat`
            (gradient checkpointing of every block but the last, whose
            activations the backward pass needs first: training keeps only each
            block's branch inputs and recomputes the rest in the backward
            pass; needs `dropout_rate=0` and `attention_dropout_rate=0`, see
            `TransformerBlock`); the options of the newer families:
            `norm_type` (`"layernorm"`, or `"rmsnorm"` everywhere, AIMv2),
            `norm_pre` (a norm on the embedded tokens before the first
            block, CLIP), `final_norm` (False: no norm
            after the last block), `embed_norm` (a norm on the projected
            patches, AIMv2), `qk_norm`, `proj_bias` (False: no bias in the
            attention output projection and the MLP), `mlp_activation`
            (`"gelu"`, `"gelu_tanh"`, `"quick_gelu"`, `"silu"`), `gated_mlp`
            (SwiGLU with `"silu"`), `mlp_norm` (a norm inside the MLP,
            EVA-02), `position_embedding="none"` (no absolute table),
            `rope` (None, or the `RotaryEmbedding` options as a dict:
            2-D rotary position embedding on the patch tokens' queries and
            keys in every block, `keras_vit.models.rope`).

    Returns:
        A `keras.Model` from images `(batch, height, width, num_channels)` to
        float32 logits `(batch, num_classes)`, or to features without top.
    """
    arch, (height, width), options = resolve_architecture(variant, image_size, options)
    p = arch.pop("patch_size")
    if name is None:
        name = f"vit_{split_variant(variant)[0].lower()}{p}"
    if not isinstance(dynamic_size, bool):
        raise ValueError(f"`dynamic_size` must be True or False, got {dynamic_size!r}.")
    # Patches on their grid tell the encoder each image's grid.
    spatial = (None, None) if dynamic_size else (height, width)
    inputs = image_input(*spatial, num_channels)
    shifted = options.pop("shifted_patches", False)
    check_transformer_options("ViT", options)
    patches = Patches(p, flatten=not dynamic_size, shifted=shifted, name="patches")(
        inputs
    )
    return build_transformer(
        inputs,
        patches,
        (height // p, width // p),
        num_classes=num_classes,
        name=name,
        **arch,
        **options,
    )


def check_transformer_options(model: str, options: dict, hint: str = "") -> None:
    """Refuses keyword options that neither the model builder nor
    `build_transformer` takes, naming them (not Python's TypeError about an
    internal function). A TypeError, as Python's own for an unexpected
    keyword argument."""
    taken = set(inspect.signature(build_transformer).parameters)
    taken -= {"inputs", "patches", "grid_size"}
    unknown = sorted(set(options) - taken)
    if unknown:
        raise TypeError(
            f"{model} does not take {', '.join(map(repr, unknown))}{hint}; its "
            f"transformer options are: {', '.join(sorted(taken))}."
        )


def distillation_heads(model: keras.Model) -> keras.Model:
    """The two DeiT heads of a `distilled=True` model, for training.

    The distilled model itself returns the average of both heads (inference);
    this returns a model sharing its layers whose outputs are
    `(class_logits, distillation_logits)`.
    """
    try:
        head = model.get_layer("head")
        head_dist = model.get_layer("head_dist")
    except ValueError:
        raise ValueError(
            f"Model {model.name!r} has no distillation head; build it with "
            "distilled=True."
        ) from None
    return keras.Model(
        model.input, [head.output, head_dist.output], name=f"{model.name}_heads"
    )
