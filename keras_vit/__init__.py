"""keras_vit: Vision Transformers for Keras 3 on TensorFlow.

The top level holds the network (`keras_vit.models`); the jobs around it live
in subpackages: `pretrained` (checkpoint import), `training`, `deploy`
(SavedModel, TFLite, serving) and `analysis` (FLOPs, evaluation, attention).
"""

from keras_vit.logs import quiet_native_logs_for_command

# Before TensorFlow loads (below), or the level cannot change any more.
quiet_native_logs_for_command()

from keras_vit.models.blocks import MultiHeadSelfAttention, TransformerBlock  # noqa: E402
from keras_vit.models.features import PatchTokens, feature_extractor  # noqa: E402
from keras_vit.models.hybrid import HybridViT, StdConv2D  # noqa: E402
from keras_vit.models.layers import PatchEncoder, Patches, TokenPooling  # noqa: E402
from keras_vit.models.lora import enable_lora, merge_lora  # noqa: E402
from keras_vit.models.pooling import MAPHead  # noqa: E402
from keras_vit.models.resolution import resample_position_embedding, with_image_size  # noqa: E402
from keras_vit.models.sublayers import MLP, DropPath, LayerScale  # noqa: E402
from keras_vit.models.vit import (  # noqa: E402
    ARCHITECTURE_KEYS,
    VARIANTS,
    ViT,
    distillation_heads,
    parse_variant,
)
from keras_vit.version import __version__  # noqa: E402


def from_pretrained(name: str, out_path=None, **options):
    """A named checkpoint (short alias such as `"vit-b16"`, Hugging Face Hub
    id, or local path) converted into a keras_vit model; see
    `keras_vit.pretrained.from_pretrained`."""
    # Imported here: the package root stays the network alone.
    from keras_vit.pretrained.convert import from_pretrained as convert_named

    return convert_named(name, out_path, **options)


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
    "MAPHead",
    "TokenPooling",
    "TransformerBlock",
    "ViT",
    "__version__",
    "distillation_heads",
    "enable_lora",
    "feature_extractor",
    "from_pretrained",
    "merge_lora",
    "parse_variant",
    "resample_position_embedding",
    "with_image_size",
]
