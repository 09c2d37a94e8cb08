"""The preprocessing contract between a model and everything that feeds it:
the training pipeline, the export signatures, `predict` and the CLI.

Clients send raw pixels in `[0, pixel_scale]` (255 for 8-bit images); the
model sees `(pixels / pixel_scale - mean) / std` at `image_size`. Images of
another size are resized first with `resize_method` (`tf.image.resize`, no
antialiasing), the same call in training-time evaluation and serving. The
dict that carries these constants (`resolve_preprocessing`, every key) is
recorded in every `metadata.json` the package writes.

A recipe that evaluates on centre crops (`data.eval_crop`, 0.875 for the
ImageNet-style folder recipe) records it as `crop_fraction`: training-time
evaluation, `keras-vit evaluate`, the SavedModel's image-bytes signature and
`predict` (before it feeds the pixel signature, a `.tflite` or a `.keras`
model) all resize to `image_size / crop_fraction` and take the centre
`image_size`, with this module's `resize_pixels`.

Converted checkpoints bring the resize of the library they were trained in
(timm, Hugging Face: PIL): `antialias` resizes as PIL does an 8-bit image
(antialiased, width then height, each pass rounded to whole pixel values),
`keep_aspect_ratio` scales the shorter side (torchvision's `Resize(int)`)
instead of both, and `crop_fraction < 1` resizes to `image_size /
crop_fraction` and takes the centre `image_size` crop (timm's `crop_pct`).
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from keras_vit.models.resolution import nominal_image_size
from keras_vit.models.vit import image_hw

PREPROCESSING_KEYS = (
    "image_size",
    "num_channels",
    "mean",
    "std",
    "pixel_scale",
    "resize_method",
    "crop_fraction",
    "keep_aspect_ratio",
    "antialias",
)
# Every method `tf.image.resize` takes; the data pipeline and the serving
# graph both resize with it.
RESIZE_METHODS = ("bilinear", "nearest", "bicubic", "area", "lanczos3", "mitchellcubic")


# The one default normalisation: pixels mapped to [-1, 1] (big_vision's
# `value_range(-1, 1)`), what every recipe here trains with unless it says
# otherwise. The training config, export and the command line all read it.
DEFAULT_MEAN = (0.5,)
DEFAULT_STD = (0.5,)
DEFAULTS = {
    "pixel_scale": 255.0,
    "resize_method": "bilinear",
    "crop_fraction": 1.0,
    "keep_aspect_ratio": False,
    "antialias": False,
}


def resolve_preprocessing(preprocessing: dict | None, image_size, num_channels) -> dict:
    """The preprocessing contract, checked and complete: the one resolver that
    training, export, `predict` and the command line go through.

    Keys: `image_size` (h, w), `num_channels` (alias `channels`), `mean` and
    `std` (one value per channel, or one for all), `pixel_scale` (255: clients
    send 0..255), `resize_method`, `crop_fraction`, `keep_aspect_ratio` and
    `antialias` (see the module docstring). A key left out takes its default:
    `image_size` and `num_channels` as given here (a given one must match),
    `DEFAULT_MEAN` / `DEFAULT_STD`, then `DEFAULTS`. The result holds every
    key of `PREPROCESSING_KEYS`, so metadata records the contract whole;
    metadata written before a key existed reads with that key's default.
    """
    height, width = image_hw(image_size)
    channels = int(num_channels)
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
    for key, default in (("mean", DEFAULT_MEAN), ("std", DEFAULT_STD)):
        result[key] = _per_channel(key, given.get(key, default), channels)
    scale = float(given.get("pixel_scale", DEFAULTS["pixel_scale"]))
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"preprocessing pixel_scale must be > 0, got {scale!r}.")
    result["pixel_scale"] = scale
    method = given.get("resize_method", DEFAULTS["resize_method"])
    if method not in RESIZE_METHODS:
        raise ValueError(
            f"preprocessing resize_method {method!r} is not one of {RESIZE_METHODS}."
        )
    result["resize_method"] = method
    crop = given.get("crop_fraction", DEFAULTS["crop_fraction"])
    if isinstance(crop, bool) or not isinstance(crop, int | float) or not 0 < crop <= 1:
        raise ValueError(
            f"preprocessing crop_fraction must be a number in (0, 1], got {crop!r}."
        )
    result["crop_fraction"] = float(crop)
    for key in ("keep_aspect_ratio", "antialias"):
        flag = given.get(key, DEFAULTS[key])
        if not isinstance(flag, bool):
            raise ValueError(
                f"preprocessing {key} must be true or false, got {flag!r}."
            )
        result[key] = flag
    return result


def _per_channel(key: str, value, channels: int) -> list[float]:
    values = np.atleast_1d(np.asarray(value, dtype="float64"))
    if values.ndim != 1 or len(values) not in (1, channels):
        raise ValueError(
            f"preprocessing {key} must be one number or {channels} (one per "
            f"channel), got {value!r}."
        )
    values = np.broadcast_to(values, (channels,))
    if not np.all(np.isfinite(values)) or (key == "std" and np.any(values <= 0)):
        raise ValueError(
            f"preprocessing {key} must be finite (std > 0), got {value!r}."
        )
    return [float(v) for v in values]


def normalize_preprocessing(model: keras.Model, preprocessing: dict | None) -> dict:
    """`resolve_preprocessing` for `model`: its input size (a dynamic-size
    model's nominal size, that of its position embedding) and channels."""
    return resolve_preprocessing(
        preprocessing, nominal_image_size(model), int(model.inputs[0].shape[-1])
    )


def pixel_affine(preprocessing: dict) -> tuple[np.ndarray, np.ndarray]:
    """`(scale, shift)`, float32 per channel: the model sees
    `pixels * scale + shift`, which is `(pixels / pixel_scale - mean) / std`.
    The one place that formula is written; its inverse and the map between
    two models' inputs (distillation) are derived from it."""
    mean = np.asarray(preprocessing["mean"], dtype="float64")
    std = np.asarray(preprocessing["std"], dtype="float64")
    scale = 1.0 / (float(preprocessing["pixel_scale"]) * std)
    return scale.astype("float32"), (-mean / std).astype("float32")


def normalize_pixels(pixels, preprocessing: dict):
    """Raw pixels -> model input (`pixel_affine`). Works on numpy arrays and
    tensors; the training pipeline and the serving graph use it."""
    scale, shift = pixel_affine(preprocessing)
    return pixels * scale + shift


def denormalize_pixels(inputs, preprocessing: dict):
    """Model input -> raw pixels in `[0, pixel_scale]`: `normalize_pixels`
    undone."""
    scale, shift = pixel_affine(preprocessing)
    return (inputs - shift) / scale


def resizes_every_image(preprocessing: dict) -> bool:
    """Whether `resize_pixels` resizes even an image at the model size (a
    centre crop, a kept aspect ratio, PIL's antialiasing)."""
    return (
        preprocessing.get("crop_fraction", 1.0) < 1.0
        or preprocessing.get("keep_aspect_ratio", False)
        or preprocessing.get("antialias", False)
    )


def resize_pixels(pixels, preprocessing: dict):
    """Resizes a `(batch, h, w, c)` pixel batch to the model size as the
    preprocessing says. With the defaults, as the training pipeline does
    (`tf.image.resize` with `resize_method`, no antialiasing), and an image
    already at the model size is passed through untouched; with `antialias`,
    `keep_aspect_ratio` or `crop_fraction < 1`, as timm / torchvision or
    Hugging Face resize with PIL (see the module docstring)."""
    pixels = tf.convert_to_tensor(pixels, tf.float32)
    size = preprocessing["image_size"]
    if resizes_every_image(preprocessing):
        return _resize_and_crop(pixels, preprocessing)
    same_size = tf.reduce_all(tf.equal(tf.shape(pixels)[1:3], size))
    return tf.cond(
        same_size,
        lambda: pixels,
        lambda: tf.cast(
            tf.image.resize(pixels, size, method=preprocessing["resize_method"]),
            tf.float32,
        ),
    )


def _scaled_size(height, width, preprocessing: dict):
    """The size before the centre crop, as timm's eval transform computes it."""
    target_h, target_w = preprocessing["image_size"]
    crop = preprocessing.get("crop_fraction", 1.0)
    # floor(size / crop) as timm; the epsilon keeps a fraction derived from
    # two integers (Hugging Face's 224 / 256) from landing just below them.
    scaled_h = math.floor(target_h / crop + 1e-6)
    scaled_w = math.floor(target_w / crop + 1e-6)
    if not preprocessing.get("keep_aspect_ratio", False):
        return tf.constant(scaled_h), tf.constant(scaled_w)
    height, width = tf.cast(height, tf.float64), tf.cast(width, tf.float64)
    if scaled_h == scaled_w:
        # torchvision Resize(int): the shorter side becomes `scaled`, the
        # longer one int(scaled * long / short).
        short, long_ = tf.minimum(height, width), tf.maximum(height, width)
        other = tf.cast(tf.math.floor(scaled_h * long_ / short), tf.int32)
        portrait = height > width
        return (
            tf.where(portrait, other, scaled_h),
            tf.where(portrait, scaled_w, other),
        )
    # timm's ResizeKeepRatio: the side that needs the smaller scale fits.
    ratio = tf.minimum(height / scaled_h, width / scaled_w)
    return (
        tf.cast(tf.round(height / ratio), tf.int32),
        tf.cast(tf.round(width / ratio), tf.int32),
    )


def _resize_and_crop(pixels, preprocessing: dict):
    shape = tf.shape(pixels)
    new_h, new_w = _scaled_size(shape[1], shape[2], preprocessing)
    method = preprocessing["resize_method"]
    if preprocessing.get("antialias", False):
        # PIL resizes an 8-bit image width first, then height, and stores
        # each pass as whole pixel values: the same rounding here.
        step = np.float32(preprocessing["pixel_scale"] / 255.0)

        def whole(x):
            return tf.clip_by_value(tf.round(x / step), 0.0, 255.0) * step

        x = whole(tf.image.resize(pixels, (shape[1], new_w), method, antialias=True))
        x = whole(tf.image.resize(x, (new_h, new_w), method, antialias=True))
    else:
        x = tf.cast(tf.image.resize(pixels, (new_h, new_w), method), tf.float32)
    target_h, target_w = preprocessing["image_size"]
    # torchvision's CenterCrop offset: round((size - crop) / 2), half to even.
    top = tf.cast(tf.round(tf.cast(new_h - target_h, tf.float32) / 2), tf.int32)
    left = tf.cast(tf.round(tf.cast(new_w - target_w, tf.float32) / 2), tf.int32)
    return x[:, top : top + target_h, left : left + target_w, :]


__all__ = [
    "DEFAULTS",
    "DEFAULT_MEAN",
    "DEFAULT_STD",
    "PREPROCESSING_KEYS",
    "RESIZE_METHODS",
    "denormalize_pixels",
    "normalize_pixels",
    "normalize_preprocessing",
    "pixel_affine",
    "resize_pixels",
    "resizes_every_image",
    "resolve_preprocessing",
]
