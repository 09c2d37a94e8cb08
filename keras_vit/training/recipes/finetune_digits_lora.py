"""LoRA fine-tune of a pretrained ViT on the digits: low-rank adapters on
every block's QKV and attention projection, and the head, train.

    python recipes/train.py digits          # pretrains: runs/digits/model.keras
    python recipes/train.py finetune_digits_lora
    python recipes/train.py finetune_digits_lora --model.lora_rank 4

The linear probe's base and steps (`finetune_digits_probe`: the digits
recipe's ViT-Ti/4 at 16x16, 200 steps, no augmentation) with
`model.lora_rank=8` (`keras_vit.enable_lora`) instead of a frozen backbone:
every other weight stays frozen. The run saves and exports the model with the
adapters merged into the kernels (`keras_vit.merge_lora`).

MEASUREMENT
"""

import dataclasses

from keras_vit.training.recipes import base_recipe


def get_config():
    config = base_recipe("finetune_digits_probe")
    return dataclasses.replace(
        config,
        name="finetune_digits_lora",
        model=dataclasses.replace(config.model, freeze_backbone=False, lora_rank=8),
        optim=dataclasses.replace(config.optim, learning_rate=1e-2),
    )
