"""A small convolutional network: the baseline a ViT is measured against on
small images (its inductive bias, locality and translation equivariance, is
what the paper says a ViT lacks on little data)."""

from __future__ import annotations

import keras

from keras_vit.models.vit import image_hw


def SmallCNN(
    image_size: int | tuple[int, int] = 28,
    num_classes: int = 10,
    *,
    widths: tuple[int, ...] = (32, 64, 128),
    num_channels: int = 1,
    dropout_rate: float = 0.0,
    name: str = "small_cnn",
) -> keras.Model:
    """Builds a VGG-style CNN as a functional `keras.Model` of plain
    `keras.layers`.

    Stage `s` is two 3x3 convolutions of `widths[s]` filters (each with batch
    normalisation and ReLU) followed, except after the last stage, by 2x2 max
    pooling; then global average pooling, dropout and a linear head.

    Args:
        image_size: int or `(height, width)`.
        num_classes: int, size of the head.
        widths: filters per stage; the feature map halves between stages.
        num_channels: int, image channels.
        dropout_rate: float, dropout before the head.
        name: model name.

    Returns:
        A `keras.Model` from images `(batch, height, width, num_channels)` to
        float32 logits `(batch, num_classes)`.
    """
    height, width = image_hw(image_size)
    inputs = keras.Input((height, width, num_channels), name="images")
    x = conv_stages(inputs, widths)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    x = keras.layers.Dropout(dropout_rate, name="dropout")(x)
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="head")(x)
    return keras.Model(inputs, outputs, name=name)


def check_widths(widths) -> tuple[int, ...]:
    if (
        not isinstance(widths, tuple | list)
        or not widths
        or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths)
    ):
        raise ValueError(f"`widths` must be positive ints, got {widths!r}.")
    return tuple(widths)


def conv_stages(x, widths: tuple[int, ...]):
    """SmallCNN's body on the tensor `x`: stage `s` is two 3x3 convolutions of
    `widths[s]` filters, each with batch normalisation and ReLU, and 2x2 max
    pooling between stages, so the output stride is `2 ** (len(widths) - 1)`.
    Layers are named `stage{s}_conv{c}`, `stage{s}_norm{c}`, `stage{s}_pool`."""
    for s, filters in enumerate(check_widths(widths)):
        for c in range(2):
            x = keras.layers.Conv2D(
                filters, 3, padding="same", use_bias=False, name=f"stage{s}_conv{c}"
            )(x)
            x = keras.layers.BatchNormalization(name=f"stage{s}_norm{c}")(x)
            x = keras.layers.ReLU(name=f"stage{s}_relu{c}")(x)
        if s < len(widths) - 1:
            x = keras.layers.MaxPooling2D(2, padding="same", name=f"stage{s}_pool")(x)
    return x
