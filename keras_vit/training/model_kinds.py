"""The models besides a plain ViT that a recipe can train (`model.kind`):
the hybrid CNN-stem ViT and a small CNN, the baselines of
`bench/accuracy.py`, built from the same config and trained by the same
trainer."""

from __future__ import annotations

import keras

from keras_vit.models.cnn import SmallCNN
from keras_vit.models.hybrid import HybridViT
from keras_vit.models.vit import split_variant
from keras_vit.training.config import TrainConfig


def build_kind(config: TrainConfig, num_classes: int, image_size: int) -> keras.Model:
    """`model.kind="hybrid"`: `HybridViT` with a ResNet-v2 stem of `model.stem`
    blocks per stage, `model.stem_width` wide (`model.stem_kind="resnet"`) or
    SmallCNN's stages `model.cnn_widths` (`"cnn"`), and the transformer of
    `model.variant` / `hidden_dim` / ... (with DeiT's distillation token when
    `model.distilled`); `"cnn"`: `SmallCNN(model.cnn_widths)` with
    `model.dropout_rate` before its head. `model.pretrained` (a `.keras`
    file: weights copied by layer name, e.g. a hybrid's stem from the SmallCNN
    of the same `cnn_widths`) and `freeze_backbone` are the caller's
    (`trainer.build_model`)."""
    m = config.model
    if m.pretrained and not m.pretrained.endswith(".keras"):
        raise ValueError(
            f"model.pretrained {m.pretrained!r}: a timm / Hugging Face / big_vision "
            f"checkpoint converts to a plain ViT (model.kind='vit'); a "
            f"{m.kind!r} model starts from a .keras file only."
        )
    if m.distilled and m.kind == "cnn":
        raise ValueError(
            "model.distilled adds DeiT's distillation token to a transformer; "
            "it applies to model.kind 'vit' or 'hybrid', got kind='cnn'."
        )
    if m.kind == "cnn":
        return SmallCNN(
            image_size,
            num_classes,
            widths=tuple(m.cnn_widths),
            num_channels=config.data.num_channels,
            dropout_rate=m.dropout_rate,
        )
    stem_width = m.stem_width or 64
    # The stem sets the patches: the variant's size and the other overrides.
    overrides = m.architecture_overrides()
    del overrides["patch_size"]
    return HybridViT(
        split_variant(m.variant)[0],
        image_size,
        num_classes,
        stem="cnn" if m.stem_kind == "cnn" else (tuple(m.stem) or "R50"),
        stem_width=stem_width,
        cnn_widths=tuple(m.cnn_widths),
        # GroupNorm's 32 groups need 32 channels; a narrow stem gets fewer.
        norm_groups=min(32, stem_width),
        num_channels=config.data.num_channels,
        **overrides,
        pooling=m.pooling,
        position_embedding=m.position_embedding,
        dropout_rate=m.dropout_rate,
        attention_dropout_rate=m.attention_dropout_rate,
        drop_path_rate=m.drop_path_rate,
        remat=m.remat,
        distilled=m.distilled,
    )
