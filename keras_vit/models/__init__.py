"""The network: patch and token layers, the encoder block, the ViT and hybrid
builders, resolution change and the preprocessing contract. Imports nothing
else of keras_vit; importing it registers every layer for `.keras` loading."""

from keras_vit.models.blocks import MultiHeadSelfAttention, TransformerBlock
from keras_vit.models.features import PatchTokens, feature_extractor
from keras_vit.models.hybrid import HybridViT, StdConv2D
from keras_vit.models.layers import PatchEncoder, Patches, TokenPooling
from keras_vit.models.lora import enable_lora, merge_lora
from keras_vit.models.pooling import MAPHead
from keras_vit.models.resolution import resample_position_embedding, with_image_size
from keras_vit.models.sublayers import MLP, DropPath, LayerScale
from keras_vit.models.vit import (
    ARCHITECTURE_KEYS,
    VARIANTS,
    ViT,
    distillation_heads,
    image_hw,
    parse_variant,
)

__all__ = [
    "ARCHITECTURE_KEYS",
    "MLP",
    "VARIANTS",
    "DropPath",
    "HybridViT",
    "LayerScale",
    "MAPHead",
    "MultiHeadSelfAttention",
    "PatchEncoder",
    "PatchTokens",
    "Patches",
    "StdConv2D",
    "TokenPooling",
    "TransformerBlock",
    "ViT",
    "distillation_heads",
    "enable_lora",
    "feature_extractor",
    "image_hw",
    "merge_lora",
    "parse_variant",
    "resample_position_embedding",
    "with_image_size",
]
