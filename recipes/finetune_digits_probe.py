"""Linear probe of a pretrained ViT on the digits: only a new head trains.

    keras-vit train digits          # pretrains: runs/digits/model.keras
    keras-vit train finetune_digits_probe
    keras-vit train finetune_digits_probe --model.pretrained ckpt_dir \\
        --data.source folder --data.path my_images --data.num_channels 3

`model.pretrained` is a keras_vit `.keras` file of this recipe's architecture
(the digits recipe's), or any checkpoint `keras_vit.pretrained.convert_checkpoint`
reads (timm / Hugging Face `model.safetensors` + `config.json`, AugReg `.npz`),
whose own architecture is then used (three-channel checkpoints need
three-channel data). Every layer but `head` is frozen; the head starts at zero
and learns at a probe's usual high rate with no weight decay.

Measured on 2 CPU cores: from the digits recipe's model (0.9778 held out;
its head fits the 10 classes, so it is kept and re-fitted) 0.9806 after the
200 steps. From the random-weight timm fixture in tests/fixtures/ (a new
head) the loss falls from 2.31 to 2.20 in 60 steps: random features are weak
ones (tests/test_finetune_recipes.py).
"""

import dataclasses

from keras_vit.training.recipes import base_recipe


def get_config():
    config = base_recipe("finetune_digits")
    return dataclasses.replace(
        config,
        name="finetune_digits_probe",
        total_steps=200,
        model=dataclasses.replace(config.model, image_size=16, freeze_backbone=True),
        optim=dataclasses.replace(
            config.optim, learning_rate=1e-2, warmup_steps=0, layer_decay=1.0
        ),
    )
