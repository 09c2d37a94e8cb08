"""The network: patch and token layers, the encoder block, the ViT and hybrid
builders, resolution change and the preprocessing contract. Imports nothing
else of keras_vit.

Each name is imported from the module that defines it
(`keras_vit.models.vit.ViT`); the package root `keras_vit` holds the public
API. Importing this package registers every layer for `.keras` loading."""

from keras_vit.models import (  # noqa: F401  modules, imported to register their layers
    blocks,
    features,
    hybrid,
    layers,
    pooling,
    qat,
    sublayers,
)
