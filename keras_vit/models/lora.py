"""LoRA fine-tuning (Hu et al. 2021) through Keras' own `Dense.enable_lora`.

Keras adds the low-rank adapters to one `Dense` at a time and freezes only
that layer's kernel. What a ViT needs on top: choosing which projections of
the encoder blocks get adapters, freezing everything else but the head
(biases, norms, embeddings included), and folding the trained adapters back
into the kernels so the exported model is an ordinary one.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_vit.models.blocks import TransformerBlock
from keras_vit.models.vit import HEAD_LAYERS

# The Dense sub-layers of a `TransformerBlock` that can take adapters, as
# (sub-layer, Dense) attribute names.
LORA_TARGETS = {
    "qkv": ("attention", "qkv"),
    "proj": ("attention", "proj"),
    "fc1": ("mlp", "fc1"),
    "fc2": ("mlp", "fc2"),
}
# The paper's choice (it adapts the attention projections only).
DEFAULT_LORA_TARGETS = ("qkv", "proj")


def _check_rank(rank) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"LoRA `rank` must be a positive int, got {rank!r}.")
    return rank


def _check_targets(targets) -> tuple[str, ...]:
    if isinstance(targets, str):
        targets = (targets,)
    targets = tuple(targets)
    unknown = [t for t in targets if t not in LORA_TARGETS]
    if unknown or not targets:
        raise ValueError(
            f"Unknown LoRA targets {unknown or list(targets)!r}; valid targets are "
            f"{', '.join(LORA_TARGETS)}."
        )
    return targets


def lora_layers(model: keras.Model, targets=DEFAULT_LORA_TARGETS) -> list:
    """The `Dense` layers named by `targets` in every `TransformerBlock` of
    `model`, block by block."""
    targets = _check_targets(targets)
    blocks = [
        layer
        for layer in model._flatten_layers(include_self=False)
        if isinstance(layer, TransformerBlock)
    ]
    if not blocks:
        raise ValueError(
            f"Model {model.name!r} has no TransformerBlock; LoRA targets the "
            "encoder blocks of a keras_vit ViT or HybridViT."
        )
    found = []
    for block in blocks:
        for target in targets:
            owner, dense = LORA_TARGETS[target]
            found.append(getattr(getattr(block, owner), dense))
    return found


def enable_lora(
    model: keras.Model,
    rank: int,
    targets=DEFAULT_LORA_TARGETS,
    alpha: float | None = None,
    trainable=HEAD_LAYERS,
) -> keras.Model:
    """Adds rank-`rank` adapters to the targeted projections of every encoder
    block and freezes every other weight but the head's, in place.

    Each targeted `Dense` computes `x @ (W + alpha / rank * A @ B)` with `W`
    frozen, `A` (`(in, rank)`, He-uniform) and `B` (`(rank, out)`, zeros) trained,
    so the model starts out computing what it did. Trainable parameters:
    `rank * (in + out)` per targeted layer plus the head. Re-compile the model
    afterwards; do not set `layer.trainable = True` on a block (that unfreezes
    its kernels). `merge_lora` folds the adapters in for export.

    Args:
        model: a keras_vit `ViT` or `HybridViT` (any model with
            `TransformerBlock`s), built.
        rank: int >= 1, the adapters' rank.
        targets: names among `"qkv"`, `"proj"` (the attention's input and
            output projections, the default) and `"fc1"`, `"fc2"` (the MLP).
        alpha: float or None; the update is scaled by `alpha / rank`. None
            means `rank` (scale 1), Keras' default.
        trainable: names of the top-level layers that stay fully trainable.

    Returns:
        `model`.
    """
    rank = _check_rank(rank)
    layers = lora_layers(model, targets)
    names = {layer.name for layer in model.layers}
    if not set(trainable) & names:
        raise ValueError(
            f"Model {model.name!r} has none of the layers {list(trainable)} to keep "
            "trainable; build it with include_top=True or pass `trainable`."
        )
    enabled = [dense.path for dense in layers if dense.lora_enabled]
    if enabled:
        raise ValueError(
            f"LoRA is already enabled on {enabled[:3]}...; merge it first "
            "(`merge_lora`) to add new adapters."
        )
    for dense in layers:
        dense.enable_lora(rank, lora_alpha=alpha)
    adapters = {
        id(v) for dense in layers for v in (dense.lora_kernel_a, dense.lora_kernel_b)
    }
    holders = {id(layer) for dense in layers for layer in _ancestors(model, dense)}
    for layer in model.layers:
        if layer.name in trainable:
            layer.trainable = True
        elif id(layer) in holders:
            # The layer stays trainable (so its adapters are), its own weights
            # do not. Freezing by layer would freeze the adapters too.
            layer.trainable = True
            for variable in layer.weights:
                variable.trainable = id(variable) in adapters
        else:
            # Whole layers (a hybrid's stem): normalisation in inference mode.
            layer.trainable = False
    return model


def _ancestors(model: keras.Model, dense) -> list:
    """The top-level layers of `model` that contain `dense`."""
    return [
        layer
        for layer in model.layers
        if any(sub is dense for sub in layer._flatten_layers(include_self=False))
    ]


def has_lora(model: keras.Model) -> bool:
    """Whether any `Dense` of `model` carries LoRA adapters."""
    return any(
        getattr(layer, "lora_enabled", False)
        for layer in model._flatten_layers(include_self=False)
    )


def merged_kernel(dense: keras.layers.Dense):
    """`W + alpha / rank * A @ B` of a float LoRA `Dense`, in float32 (Keras'
    own `kernel` property casts it to the compute dtype)."""
    delta = ops.matmul(dense.lora_kernel_a, dense.lora_kernel_b)
    return ops.add(
        ops.cast(dense._kernel, "float32"), (dense.lora_alpha / dense.lora_rank) * delta
    )


def restart_lora_adapters(model: keras.Model, seed: int | None = None) -> int:
    """Fresh adapters (`A` He-uniform, `B` zeros) on every LoRA `Dense` of
    `model`, which keeps computing what it did; returns how many layers.

    Keras saves a LoRA `Dense` with the adapters merged into its kernel and
    zeroes them on load, and with `A = B = 0` neither gets a gradient: after
    loading a checkpoint, LoRA training continues only from fresh adapters.
    """
    layers = [
        layer
        for layer in model._flatten_layers(include_self=False)
        if getattr(layer, "lora_enabled", False)
    ]
    generator = keras.random.SeedGenerator(seed)
    for layer in layers:
        init = keras.initializers.HeUniform(seed=generator)
        layer.lora_kernel_a.assign(init(layer.lora_kernel_a.shape, "float32"))
        layer.lora_kernel_b.assign(ops.zeros(layer.lora_kernel_b.shape, "float32"))
    return len(layers)


def _strip_lora(config):
    """The config with every Dense's `lora_rank` / `lora_alpha` removed, and
    every layer's `trainable`: a layer built frozen makes its variables
    non-trainable for good, and the merged model starts unfrozen."""
    if isinstance(config, dict):
        return {
            key: _strip_lora(value)
            for key, value in config.items()
            if key not in ("lora_rank", "lora_alpha", "trainable")
        }
    if isinstance(config, list):
        return [_strip_lora(value) for value in config]
    return config


def merge_lora(model: keras.Model) -> keras.Model:
    """A copy of the functional `model` with every LoRA adapter folded into
    its kernel: same outputs, no LoRA variables, all layers trainable; it
    saves, exports and converts like a model that never had adapters.

    Quantized layers are merged by Keras' own serialisation (dequantize, add,
    requantize). `model` itself is unchanged.
    """
    if not isinstance(model, keras.Model) or not hasattr(model, "_nodes_by_depth"):
        raise ValueError(
            f"merge_lora needs a functional keras.Model, got {type(model).__name__}."
        )
    copy = model.__class__.from_config(_strip_lora(model.get_config()))
    sources = list(model._flatten_layers(include_self=False))
    targets = list(copy._flatten_layers(include_self=False))
    if [layer.path for layer in sources] != [layer.path for layer in targets]:
        raise ValueError(
            f"Model {model.name!r} does not rebuild from its config with the same "
            "layers; merge_lora cannot map its weights."
        )
    for source, target in zip(sources, targets, strict=True):
        store = {}
        # Keras' Dense writes its LoRA-merged kernel here, as `.keras` does.
        source.save_own_variables(store)
        if getattr(source, "lora_enabled", False) and not source.quantization_mode:
            store["0"] = merged_kernel(source)
        target.load_own_variables(store)
    return copy


__all__ = [
    "DEFAULT_LORA_TARGETS",
    "LORA_TARGETS",
    "enable_lora",
    "has_lora",
    "lora_layers",
    "merge_lora",
    "merged_kernel",
    "restart_lora_adapters",
]
