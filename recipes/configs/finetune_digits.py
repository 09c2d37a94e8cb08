"""Fine-tunes a pretrained ViT on the digits at twice its resolution.

    python recipes/train.py digits          # pretrains: runs/digits/model.keras
    python recipes/train.py finetune_digits
    python recipes/train.py finetune_digits --model.pretrained my_vit.keras

The model is the digits recipe's ViT-Ti/4 with the weights of
`model.pretrained`, rebuilt at 32x32: the 4x4 grid of position embeddings is
resampled bicubically to 8x8 (`keras_vit.weights.with_image_size`), a head of
another class count starts at zero. Full fine-tune with layer-wise learning-
rate decay 0.75, a 10x lower peak rate than pretraining, warmup, no weight
decay and no dropout: the pretrained features should move little.
RESULT
"""

import dataclasses

from keras_vit.train_config import base_recipe


def get_config():
    config = base_recipe("digits")
    return dataclasses.replace(
        config,
        name="finetune_digits",
        total_steps=300,
        checkpoint_every=100,
        export_name="",
        model=dataclasses.replace(
            config.model,
            image_size=32,
            dropout_rate=0.0,
            pretrained="runs/digits/model.keras",
        ),
        optim=dataclasses.replace(
            config.optim,
            learning_rate=2e-4,
            warmup_steps=30,
            weight_decay=0.0,
            layer_decay=0.75,
            label_smoothing=0.0,
        ),
    )
