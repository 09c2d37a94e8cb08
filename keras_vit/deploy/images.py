"""Image files and arrays as the raw pixel batches `predict` runs: each file
checked before it is read (`models.image_files`), its header checked and
decoded in one graph traced once, resized as the bytes signature does."""

from __future__ import annotations

import codecs
import functools
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

from keras_vit.models import image_bytes, image_files
from keras_vit.models.preprocessing import resize_pixels, resizes_every_image


def _to_pixels(item, preprocessing: dict) -> np.ndarray:
    """One image (a file path or an `(h, w)` / `(h, w, c)` array of raw pixels)
    as float32 `(h, w, c)`."""
    channels = preprocessing["num_channels"]
    if isinstance(item, str | os.PathLike):
        decoded = _decode_file(Path(item), channels)
        return decoded.numpy().astype("float32") * (
            preprocessing["pixel_scale"] / 255.0
        )
    array = np.asarray(item, dtype="float32")
    if array.ndim == 2:
        array = array[..., None]
    if array.ndim != 3 or array.shape[-1] != channels:
        raise ValueError(
            f"an image array must be (height, width, {channels}) raw pixels, got "
            f"shape {array.shape}."
        )
    return array


@functools.cache
def _file_decoder(channels: int):
    """The header checks and the decode of one file as one graph, traced once
    per channel count: the file and its name are tensors (a Python string
    argument would trace a new graph, and keep it, for every file)."""

    def decode(contents, what):
        contents, fmt = image_bytes.check_declared_size(
            contents, what, image_bytes.FILE_MAX_PIXELS
        )
        # JPEGs with the accurate IDCT, as the bytes signature decodes them.
        return image_bytes.decode_to_channels(contents, channels, fmt)

    spec = tf.TensorSpec([], tf.string)
    return tf.function(decode, input_signature=[spec, spec], autograph=False)


def _decode_file(path: Path, channels: int) -> tf.Tensor:
    """A JPEG / PNG / GIF / BMP file as uint8 `(h, w, channels)`. The entry
    and the file are checked before they are read (`image_files`: a regular
    file, a size its header allows, a PNG that inflates to its declared
    size); a file that fails, declares more than `FILE_MAX_PIXELS`, whose
    header lies (a GIF frame outside its screen) or that cannot be decoded
    is a one-line ValueError naming it and why. Only a GIF's first frame is
    decoded."""
    contents = image_files.read_image_file(path)
    kind = image_bytes.FORMAT_NAMES[image_files.image_format(contents)]
    what = f"image {str(path)!r} ({kind})"
    try:
        return _file_decoder(channels)(tf.constant(contents), tf.constant(what))
    except tf.errors.InvalidArgumentError as error:
        if "assertion failed:" in error.message:  # the checks name the file
            raise ValueError(op_error_line(error.message)) from None
        raise ValueError(
            f"cannot decode {what} file (damaged?): {op_error_line(error.message)}"
        ) from None


def op_error_line(text: str) -> str:
    """The one line of a TensorFlow op error: a graph `Assert`'s strings
    (printed C-escaped: unescaped here), or the op's own message without the
    node names and the Python stack TF adds to errors inside a graph."""
    if "assertion failed:" in text:
        text = text.split("assertion failed:", 1)[1].split("\n")[0]
        text = text.replace("] [", " ").strip(" []")
        return codecs.escape_decode(text.encode())[0].decode("utf-8", "replace")
    text = text.split("\n\t [[")[0].split(" [Op:")[0]
    # "Graph execution error: Detected at node ... defined at (most recent
    # call last): File ...": the op's message is the last line.
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else text.strip()


def image_items(images_or_paths) -> list:
    if isinstance(images_or_paths, str | os.PathLike):
        items = [images_or_paths]
    elif isinstance(images_or_paths, np.ndarray) and images_or_paths.ndim == 4:
        items = list(images_or_paths)
    elif isinstance(images_or_paths, np.ndarray):
        items = [images_or_paths]
    else:
        items = list(images_or_paths)
    if not items:
        raise ValueError("no images given")
    return items


def load_pixels(images_or_paths, preprocessing: dict, first: int = 0) -> np.ndarray:
    """Files or arrays -> a float32 raw pixel batch `(n, H, W, C)` at the model
    size, resized as the bytes signature does (a resized image is clipped to
    `[0, pixel_scale]`, which bicubic kernels overshoot). Raises ValueError on
    NaN / Inf (a `.tflite` file would not catch them), naming the image by
    its position counted from `first`."""
    batch = []
    for index, item in enumerate(image_items(images_or_paths), first):
        pixels = _to_pixels(item, preprocessing)
        if not np.all(np.isfinite(pixels)):
            raise ValueError(f"image {index} holds NaN or Inf pixels.")
        # An image at the model size passes through untouched unless the
        # preprocessing resizes it anyway (a centre crop, as in training-time
        # evaluation or the model's source library).
        if (
            resizes_every_image(preprocessing)
            or list(pixels.shape[:2]) != preprocessing["image_size"]
        ):
            pixels = resize_pixels(pixels[None], preprocessing).numpy()[0]
            # Bicubic / Lanczos resizing overshoots the range a little.
            pixels = np.clip(pixels, 0.0, preprocessing["pixel_scale"])
        batch.append(pixels)
    return np.stack(batch).astype("float32")


__all__ = ["image_items", "load_pixels", "op_error_line"]
