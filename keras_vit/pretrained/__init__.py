"""Pretrained weights from other ecosystems: file readers (safetensors, npz),
the timm / Hugging Face / big_vision layouts, and conversion into keras_vit
models."""

from keras_vit.errors import CheckpointError, UnsafeCheckpointError
from keras_vit.pretrained.convert import (
    convert_checkpoint,
    download_checkpoint,
    resolve_source,
    save_atomically,
)
from keras_vit.pretrained.detect import detect_architecture
from keras_vit.pretrained.layouts import Plan
from keras_vit.pretrained.readers import read_checkpoint

__all__ = [
    "CheckpointError",
    "Plan",
    "UnsafeCheckpointError",
    "convert_checkpoint",
    "detect_architecture",
    "download_checkpoint",
    "read_checkpoint",
    "resolve_source",
    "save_atomically",
]
