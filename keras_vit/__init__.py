"""keras_vit: Vision Transformers for Keras 3 on TensorFlow."""

from keras_vit.hybrid import HybridViT, StdConv2D
from keras_vit.layers import (
    MLP,
    DropPath,
    LayerScale,
    MultiHeadSelfAttention,
    PatchEncoder,
    Patches,
    TokenPooling,
    TransformerBlock,
)
from keras_vit.vit import VARIANTS, ViT, distillation_heads, parse_variant

__version__ = "0.1.0"

__all__ = [
    "MLP",
    "VARIANTS",
    "DropPath",
    "HybridViT",
    "LayerScale",
    "MultiHeadSelfAttention",
    "PatchEncoder",
    "Patches",
    "StdConv2D",
    "TokenPooling",
    "TransformerBlock",
    "ViT",
    "distillation_heads",
    "parse_variant",
]
