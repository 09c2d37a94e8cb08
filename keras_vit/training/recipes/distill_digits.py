"""The digits ViT distilled from a small CNN teacher (DeiT hard distillation).

    python bench/distill_digits.py        # trains the teacher, then the table
    keras-vit train distill_digits        # needs runs/digits_cnn/model.keras

The teacher is `keras_vit.training.distill.small_cnn` trained on the same
digits split (`train_teacher`, seed 0, 600 steps). The student is the digits
recipe's ViT-Ti/4 with a distillation token (`model.distilled`), trained
for 300 steps: its class head on the labels, its distillation head on the
teacher's argmax, half the loss each. Measured figures (with vs without the
teacher, same steps, three seeds): README, "Smaller and faster models".
"""

import dataclasses

from keras_vit.training.config import DistillConfig
from keras_vit.training.recipes import base_recipe


def get_config():
    config = base_recipe("digits")
    return dataclasses.replace(
        config,
        name="distill_digits",
        total_steps=300,
        checkpoint_every=100,
        eval_every=0,
        export_name="",
        model=dataclasses.replace(config.model, distilled=True),
        optim=dataclasses.replace(config.optim, warmup_steps=30),
        distill=DistillConfig(
            teacher="runs/digits_cnn/model.keras",
            teacher_recipe="digits_cnn",
            kind="hard",
            weight=0.5,
        ),
    )
