"""keras_vit: Vision Transformers for Keras 3 on TensorFlow.

The top level holds the network (`keras_vit.models`); the jobs around it live
in subpackages: `pretrained` (checkpoint import), `training`, `deploy`
(SavedModel, TFLite, serving) and `analysis` (FLOPs, evaluation, attention).
"""

from keras_vit.models import (
    ARCHITECTURE_KEYS,
    MLP,
    VARIANTS,
    DropPath,
    HybridViT,
    LayerScale,
    MultiHeadSelfAttention,
    PatchEncoder,
    Patches,
    PatchTokens,
    StdConv2D,
    TokenPooling,
    TransformerBlock,
    ViT,
    distillation_heads,
    feature_extractor,
    parse_variant,
    resample_position_embedding,
    with_image_size,
)
from keras_vit.version import __version__

__all__ = [
    "ARCHITECTURE_KEYS",
    "MLP",
    "VARIANTS",
    "DropPath",
    "HybridViT",
    "LayerScale",
    "MultiHeadSelfAttention",
    "PatchEncoder",
    "PatchTokens",
    "Patches",
    "StdConv2D",
    "TokenPooling",
    "TransformerBlock",
    "ViT",
    "__version__",
    "distillation_heads",
    "feature_extractor",
    "parse_variant",
    "resample_position_embedding",
    "with_image_size",
]
