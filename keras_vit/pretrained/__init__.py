"""Pretrained weights from other ecosystems: file readers (safetensors, npz),
the timm / Hugging Face / big_vision layouts, and conversion into keras_vit
models."""

from keras_vit.errors import CheckpointError, UnsafeCheckpointError
from keras_vit.pretrained.convert import (
    convert_checkpoint,
    from_pretrained,
    resolve_source,
    save_atomically,
)
from keras_vit.pretrained.detect import detect_architecture
from keras_vit.pretrained.hub import HubUnavailableError, download_checkpoint
from keras_vit.pretrained.layouts import Plan
from keras_vit.pretrained.names import ALIASES, NamedCheckpoint
from keras_vit.pretrained.readers import read_checkpoint

__all__ = [
    "ALIASES",
    "CheckpointError",
    "HubUnavailableError",
    "NamedCheckpoint",
    "Plan",
    "UnsafeCheckpointError",
    "convert_checkpoint",
    "detect_architecture",
    "download_checkpoint",
    "from_pretrained",
    "read_checkpoint",
    "resolve_source",
    "save_atomically",
]
