"""Quantization-aware fine-tuning of the digits recipe's ViT for a full-int8
`.tflite`.

    keras-vit train digits          # the float model: runs/digits/
    keras-vit train qat_digits      # runs/qat_digits/model_qat_int8.tflite
    python bench/qat_digits.py      # the README table (float, PTQ, QAT)

Starts from `runs/digits/model.keras` and fine-tunes 300 steps with every
Dense kernel rounded to per-channel int8 and the Dense inputs and outputs,
queries, attention logits and probabilities to per-tensor int8 (ranges
tracked as moving averages, `keras_vit.models.qat`), at a tenth of the
digits peak rate. `model.keras` holds the fine-tuned float weights; the
`.tflite` is converted with the trained ranges. Measured figures: README,
"Quantization-aware training".
"""

import dataclasses

from keras_vit.training.recipes import base_recipe


def get_config():
    config = base_recipe("digits")
    return dataclasses.replace(
        config,
        name="qat_digits",
        qat=True,
        total_steps=300,
        checkpoint_every=100,
        eval_every=0,
        export_name="",
        model=dataclasses.replace(
            config.model, dropout_rate=0.0, pretrained="runs/digits/model.keras"
        ),
        optim=dataclasses.replace(
            config.optim, learning_rate=2e-4, warmup_steps=20, weight_decay=0.0
        ),
    )
