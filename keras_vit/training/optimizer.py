"""The optimizer of a training run: AdamW with warm-up and cosine decay, the
learning rate scaled by batch size, clipping, gradient accumulation, EMA and
layer-wise decay, as the config says."""

from __future__ import annotations

import keras

from keras_vit.training.config import TrainConfig
from keras_vit.training.finetune import LayerDecayAdamW, layer_decay_multipliers

# Variables that get no weight decay besides every 1-D one (biases, norms,
# layer scales): timm's and big_vision's choice.
NO_DECAY_NAMES = ("pos_embedding", "cls_token", "dist_token")


def scaled_learning_rate(config: TrainConfig) -> float:
    optim = config.optim
    if not optim.lr_base_batch_size:
        return optim.learning_rate
    batch = config.batch_size * optim.gradient_accumulation_steps
    return optim.learning_rate * batch / optim.lr_base_batch_size


def learning_rate_schedule(config: TrainConfig):
    """Linear warmup from 0 to the (scaled) peak, then cosine decay to
    `end_lr_fraction * peak` at `total_steps`."""
    optim = config.optim
    peak = scaled_learning_rate(config)
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if optim.warmup_steps else peak,
        decay_steps=config.total_steps - optim.warmup_steps,
        alpha=optim.end_lr_fraction,
        warmup_target=peak if optim.warmup_steps else None,
        warmup_steps=optim.warmup_steps,
    )


def make_optimizer(config: TrainConfig, model: keras.Model, start_step: int = 0):
    """AdamW with the schedule, clipping, accumulation and EMA of the config;
    wrapped in a `LossScaleOptimizer` under `mixed_float16`."""
    optim = config.optim
    extra = {}
    if optim.layer_decay < 1.0:
        # A Distiller trains its student's variables (same paths): the decay
        # follows the student's blocks.
        student = getattr(model, "student", model)
        extra["lr_multipliers"] = layer_decay_multipliers(student, optim.layer_decay)
    optimizer = (LayerDecayAdamW if extra else keras.optimizers.AdamW)(
        **extra,
        learning_rate=learning_rate_schedule(config),
        weight_decay=optim.weight_decay,
        beta_1=optim.beta_1,
        beta_2=optim.beta_2,
        clipnorm=optim.clipnorm or None,
        gradient_accumulation_steps=(
            optim.gradient_accumulation_steps
            if optim.gradient_accumulation_steps > 1
            else None
        ),
        use_ema=optim.use_ema,
        ema_momentum=optim.ema_momentum,
    )
    optimizer.exclude_from_weight_decay(
        var_list=[
            v
            for v in model.trainable_variables
            if len(v.shape) <= 1 or v.name in NO_DECAY_NAMES
        ]
    )
    if start_step:
        # A rebuilt stage continues the schedule where the last one stopped.
        optimizer.iterations.assign(start_step)
    if config.precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


__all__ = [
    "NO_DECAY_NAMES",
    "learning_rate_schedule",
    "make_optimizer",
    "scaled_learning_rate",
]
