"""The preprocessing contract between a model and everything that feeds it:
the training pipeline, the export signatures, `predict` and the CLI.

Clients send raw pixels in `[0, pixel_scale]` (255 for 8-bit images); the
model sees `(pixels / pixel_scale - mean) / std` at `image_size`. Images of
another size are resized first with `resize_method` (`tf.image.resize`, no
antialiasing), the same call in training and serving. The dict that carries
these constants is recorded in every `metadata.json` the package writes.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from keras_vit.models.vit import image_hw

PREPROCESSING_KEYS = (
    "image_size",
    "num_channels",
    "mean",
    "std",
    "pixel_scale",
    "resize_method",
)
# Every method `tf.image.resize` takes; the data pipeline and the serving
# graph both resize with it.
RESIZE_METHODS = ("bilinear", "nearest", "bicubic", "area", "lanczos3", "mitchellcubic")


def normalize_preprocessing(model: keras.Model, preprocessing: dict | None) -> dict:
    """Checks `preprocessing` against the model and fills in the defaults.

    Keys: `image_size` (h, w), `num_channels` (alias `channels`), `mean` and
    `std` (one value per channel, or one for all), `pixel_scale` (255: clients
    send 0..255) and `resize_method` (for the bytes signature). Defaults: the
    model's input size and channels, mean 0, std 1, pixel_scale 255, bilinear.
    """
    height, width, channels = (int(d) for d in model.inputs[0].shape[1:])
    given = dict(preprocessing or {})
    if "channels" in given:
        given.setdefault("num_channels", given.pop("channels"))
    unknown = set(given) - set(PREPROCESSING_KEYS)
    if unknown:
        raise ValueError(
            f"Unknown preprocessing keys {sorted(unknown)}; valid keys are "
            f"{list(PREPROCESSING_KEYS)} (or 'channels')."
        )
    size = list(image_hw(given.get("image_size", (height, width))))
    if size != [height, width]:
        raise ValueError(
            f"preprocessing image_size {size} does not match the model's input "
            f"size {[height, width]}."
        )
    if int(given.get("num_channels", channels)) != channels:
        raise ValueError(
            f"preprocessing num_channels {given['num_channels']!r} does not match "
            f"the model's {channels} input channels."
        )
    result = {"image_size": size, "num_channels": channels}
    for key, default in (("mean", 0.0), ("std", 1.0)):
        values = np.atleast_1d(np.asarray(given.get(key, default), dtype="float64"))
        if values.ndim != 1 or len(values) not in (1, channels):
            raise ValueError(
                f"preprocessing {key} must be one number or {channels} (one per "
                f"channel), got {given.get(key)!r}."
            )
        values = np.broadcast_to(values, (channels,))
        if not np.all(np.isfinite(values)) or (key == "std" and np.any(values <= 0)):
            raise ValueError(
                f"preprocessing {key} must be finite (std > 0), got {given[key]!r}."
            )
        result[key] = [float(v) for v in values]
    scale = float(given.get("pixel_scale", 255.0))
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"preprocessing pixel_scale must be > 0, got {scale!r}.")
    result["pixel_scale"] = scale
    method = given.get("resize_method", "bilinear")
    if method not in RESIZE_METHODS:
        raise ValueError(
            f"preprocessing resize_method {method!r} is not one of {RESIZE_METHODS}."
        )
    result["resize_method"] = method
    return result


def normalize_pixels(pixels, preprocessing: dict):
    """Raw pixels -> model input, `(pixels / pixel_scale - mean) / std`.
    Works on numpy arrays and tensors; the serving graph uses it too."""
    mean = np.asarray(preprocessing["mean"], dtype="float32")
    std = np.asarray(preprocessing["std"], dtype="float32")
    return (pixels / np.float32(preprocessing["pixel_scale"]) - mean) / std


def resize_pixels(pixels, preprocessing: dict):
    """Resizes a `(batch, h, w, c)` pixel batch to the model size as the training
    pipeline does (`tf.image.resize` with `resize_method`, no antialiasing);
    an image already at the model size is passed through untouched."""
    pixels = tf.convert_to_tensor(pixels, tf.float32)
    size = preprocessing["image_size"]
    same_size = tf.reduce_all(tf.equal(tf.shape(pixels)[1:3], size))
    return tf.cond(
        same_size,
        lambda: pixels,
        lambda: tf.cast(
            tf.image.resize(pixels, size, method=preprocessing["resize_method"]),
            tf.float32,
        ),
    )


def preprocessing_dict(
    image_size,
    num_channels: int,
    mean,
    std,
    pixel_scale: float = 255.0,
    resize_method: str = "bilinear",
) -> dict:
    """The contract's dict, as written into metadata.json."""
    height, width = image_hw(image_size)
    return {
        "image_size": [height, width],
        "num_channels": int(num_channels),
        "mean": [float(v) for v in np.atleast_1d(mean)],
        "std": [float(v) for v in np.atleast_1d(std)],
        "pixel_scale": float(pixel_scale),
        "resize_method": resize_method,
    }


__all__ = [
    "PREPROCESSING_KEYS",
    "RESIZE_METHODS",
    "normalize_pixels",
    "normalize_preprocessing",
    "preprocessing_dict",
    "resize_pixels",
]
