"""Fine-tuning a (converted) ViT: linear probe, layer-wise learning-rate
decay; DeiT hard-label distillation from a frozen teacher is
`keras_vit.training.distill.HardDistillation` (importable from here too)."""

from __future__ import annotations

import re

import keras
from keras import ops

from keras_vit.models.vit import HEAD_LAYERS
from keras_vit.training.distill import HardDistillation  # noqa: F401  public here too

register = keras.saving.register_keras_serializable(package="keras_vit")

# Layers after the last block: they learn at the full rate, like the head.
TOP_LAYERS = ("encoder_norm", "pooling", "dist_pooling", "pre_logits", *HEAD_LAYERS)


def freeze_backbone(model: keras.Model, trainable=HEAD_LAYERS) -> keras.Model:
    """Linear probe: every layer but those named in `trainable` is frozen.

    Re-compile the model afterwards for the change to take effect in `fit`.
    """
    names = {layer.name for layer in model.layers}
    missing = [n for n in trainable if n not in names]
    if not set(trainable) & names:
        raise ValueError(
            f"Model {model.name!r} has none of the layers {list(trainable)} to keep "
            f"trainable (missing: {missing}); build it with include_top=True."
        )
    for layer in model.layers:
        layer.trainable = layer.name in trainable
    return model


def layer_decay_multipliers(model: keras.Model, decay: float) -> dict[str, float]:
    """Learning-rate multiplier of each trainable variable, by its path.

    As in BEiT / MAE fine-tuning: with `L` blocks, block `i` gets
    `decay ** (L - i)`, everything before the first block (patch embedding,
    tokens, position embedding, a hybrid's CNN stem) `decay ** (L + 1)`, and
    the final norm, pooling and head 1.
    """
    if not 0.0 < float(decay) <= 1.0:
        raise ValueError(f"`decay` must be in (0, 1], got {decay!r}.")
    block_index = {}
    for layer in model.layers:
        match = re.fullmatch(r"block_(\d+)", layer.name)
        if match:
            block_index[layer.name] = int(match.group(1))
    if not block_index:
        raise ValueError(
            f"Model {model.name!r} has no block_<i> layers; layer-wise decay needs "
            "a keras_vit ViT or HybridViT."
        )
    depth = max(block_index.values()) + 1
    multipliers = {}
    seen_first_block = False
    for layer in model.layers:
        if layer.name in block_index:
            seen_first_block = True
            scale = decay ** (depth - block_index[layer.name])
        elif layer.name in TOP_LAYERS or seen_first_block:
            scale = 1.0
        else:
            scale = decay ** (depth + 1)
        for variable in layer.trainable_variables:
            multipliers[variable.path] = float(scale)
    return multipliers


@register
class LayerDecayAdamW(keras.optimizers.AdamW):
    """AdamW whose learning rate (and so its decoupled weight decay) is
    scaled per variable, e.g. by `layer_decay_multipliers`.

    With no multipliers it computes exactly what `keras.optimizers.AdamW`
    does. Multipliers are looked up by variable path when the optimizer is
    built; variables not listed keep the full rate.

    Args:
        lr_multipliers: dict from variable path to learning-rate multiplier.
        **kwargs: as for `keras.optimizers.AdamW`.
    """

    def __init__(self, *args, lr_multipliers: dict[str, float] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        multipliers = dict(lr_multipliers or {})
        for path, scale in multipliers.items():
            if not float(scale) >= 0.0:
                raise ValueError(
                    f"lr_multipliers[{path!r}] must be >= 0, got {scale!r}."
                )
        self.lr_multipliers = {k: float(v) for k, v in multipliers.items()}

    def build(self, var_list):
        super().build(var_list)
        self._scales = [self.lr_multipliers.get(v.path, 1.0) for v in var_list]
        self._decays = [self._use_weight_decay(v) for v in var_list]

    def _apply_weight_decay(self, variables):
        # Applied per variable in update_step instead, at the scaled rate.
        return

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        scale = self._scales[index]
        learning_rate = ops.cast(learning_rate, variable.dtype) * scale
        if self.weight_decay and self._decays[index]:
            decay = ops.cast(self.weight_decay, variable.dtype)
            self.assign_sub(variable, variable * decay * learning_rate)
        super().update_step(gradient, variable, learning_rate)

    def get_config(self):
        return {**super().get_config(), "lr_multipliers": dict(self.lr_multipliers)}


def layer_decay_optimizer(
    model: keras.Model, decay: float = 0.75, **adamw_kwargs
) -> LayerDecayAdamW:
    """`LayerDecayAdamW` with `layer_decay_multipliers(model, decay)`."""
    return LayerDecayAdamW(
        lr_multipliers=layer_decay_multipliers(model, decay), **adamw_kwargs
    )
