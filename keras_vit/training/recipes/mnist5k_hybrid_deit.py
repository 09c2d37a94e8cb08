"""The mnist5k hybrid (`mnist5k_hybrid`) with DeiT's distillation token,
hard-distilled from the `mnist5k_cnn` teacher; it predicts with the mean of
its class and distillation heads.

    keras-vit train mnist5k_hybrid_deit --train-teacher
    keras-vit train mnist5k_hybrid_deit --smoke --train-teacher

MEASURED
"""

import dataclasses

from keras_vit.training.recipes import base_recipe


def get_config():
    config = base_recipe("mnist5k_hybrid")
    teacher = base_recipe("mnist5k_deit").distill
    return dataclasses.replace(
        config,
        name="mnist5k_hybrid_deit",
        export_name="vit_mnist5k_hybrid_deit",
        model=dataclasses.replace(config.model, distilled=True),
        distill=teacher,
    )
