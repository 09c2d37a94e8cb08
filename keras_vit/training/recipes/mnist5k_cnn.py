"""The CNN teacher of the mnist5k DeiT recipes: the small CNN
(`keras_vit.models.cnn.SmallCNN`, 3x3 convolutions 32-64-128 with batch
norm, 289k parameters) on the mnist5k recipe's data and augmentation.

    keras-vit train mnist5k_cnn             # writes runs/mnist5k_cnn/model.keras
    keras-vit train mnist5k_cnn --smoke     # two steps

MEASURED
"""

import dataclasses

from keras_vit.training.recipes import base_recipe


def get_config():
    config = base_recipe("mnist5k")
    return dataclasses.replace(
        config,
        name="mnist5k_cnn",
        total_steps=1500,
        eval_every=0,
        export_name="",
        model=dataclasses.replace(config.model, kind="cnn", cnn_widths=(32, 64, 128)),
    )
