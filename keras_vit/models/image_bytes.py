"""Encoded image files (JPEG, PNG, GIF, BMP) before and while decoding: the
format from the magic bytes, the size the header declares, and decoding to
any channel count, as graph ops (the serving signature and the data pipeline
use them) that read a few header bytes and never the pixel data.

The declared size is what a decoder allocates, so checking it bounds the work
before decoding: a 389 KB PNG can declare 20000 x 20000 pixels (1.2 GB as
RGB). Error messages built here hold sizes and lengths only, never request
bytes (which may not be text, and are the client's data).
"""

from __future__ import annotations

import tensorflow as tf

JPEG, PNG, GIF, BMP = 1, 2, 3, 4
FORMAT_NAMES = {JPEG: "JPEG", PNG: "PNG", GIF: "GIF", BMP: "BMP"}
# What the exported `classify_images` signature decodes by default: a 4096 x
# 4096 image (16.8 M pixels) holds every 12-MP phone photo (4032 x 3024);
# decoded it is at most 64 MB of uint8 and 256 MB as float32 for one request.
DEFAULT_MAX_PIXELS = 4096 * 4096
# Image files read for training or `predict`: large enough for any camera
# (268 M pixels); larger declared sizes are damaged or hostile files.
FILE_MAX_PIXELS = 16384 * 16384


def image_format(contents: tf.Tensor) -> tf.Tensor:
    """int32 scalar: `JPEG`, `PNG`, `GIF`, `BMP` by magic bytes, else 0."""
    head = tf.strings.substr(contents, 0, 8)
    checks = [
        (JPEG, tf.equal(tf.strings.substr(head, 0, 3), b"\xff\xd8\xff")),
        (PNG, tf.equal(head, b"\x89PNG\r\n\x1a\n")),
        (GIF, tf.equal(tf.strings.substr(head, 0, 4), b"GIF8")),
        (BMP, tf.equal(tf.strings.substr(head, 0, 2), b"BM")),
    ]
    found = tf.constant(0, tf.int32)
    for code, matches in reversed(checks):
        found = tf.where(matches, code, found)
    return found


def _header_bytes(contents: tf.Tensor, start: int, length: int) -> tf.Tensor:
    """`length` bytes from `start` as int64, zero-padded when the file is
    shorter (a short header then declares size 0 and the decoder rejects it)."""
    padded = tf.strings.join(
        [tf.strings.substr(contents, 0, start + length), "\0" * (start + length)]
    )
    raw = tf.io.decode_raw(tf.strings.substr(padded, start, length), tf.uint8)
    return tf.cast(raw, tf.int64)


def _big_endian(b, first, count):
    value = tf.constant(0, tf.int64)
    for i in range(first, first + count):
        value = value * 256 + b[i]
    return value


def _little_endian(b, first, count):
    value = tf.constant(0, tf.int64)
    for i in reversed(range(first, first + count)):
        value = value * 256 + b[i]
    return value


def declared_size(contents: tf.Tensor, fmt: tf.Tensor) -> tf.Tensor:
    """int64 `[height, width]` the header of a `fmt` file declares; `[0, 0]`
    for an unknown format. JPEG reads its SOF marker (`extract_jpeg_shape`,
    which fails on a JPEG without one); PNG the IHDR chunk (bytes 16..24,
    big-endian); GIF the logical screen (bytes 6..10, little-endian); BMP the
    info header (bytes 18..26, signed little-endian; negative heights mean
    top-down rows)."""

    def jpeg():
        shape = tf.image.extract_jpeg_shape(contents, output_type=tf.int64)
        return shape[:2]

    def png():
        b = _header_bytes(contents, 16, 8)
        return tf.stack([_big_endian(b, 4, 4), _big_endian(b, 0, 4)])

    def gif():
        b = _header_bytes(contents, 6, 4)
        return tf.stack([_little_endian(b, 2, 2), _little_endian(b, 0, 2)])

    def bmp():
        b = _header_bytes(contents, 18, 8)
        width, height = _little_endian(b, 0, 4), _little_endian(b, 4, 4)
        signed = tf.where(height >= 2**31, height - 2**32, height)
        return tf.stack(
            [tf.abs(signed), tf.where(width >= 2**31, width - 2**32, width)]
        )

    return tf.switch_case(
        tf.convert_to_tensor(fmt, tf.int32),
        [lambda: tf.zeros([2], tf.int64), jpeg, png, gif, bmp],
    )


def check_declared_size(
    contents: tf.Tensor, what, max_pixels: int, formats=(JPEG, PNG, GIF, BMP)
) -> tf.Tensor:
    """`contents` after checks that it is one of `formats` and declares at
    most `max_pixels` pixels; `InvalidArgumentError`s that name `what` (a
    string tensor or str: the file, or the input name), the length or the
    declared size, never the bytes. Returns `(contents, format)`."""
    fmt = image_format(contents)
    known = tf.reduce_any(tf.equal(fmt, list(formats)))
    names = " or ".join(FORMAT_NAMES[f] for f in formats)
    length = tf.strings.as_string(tf.strings.length(contents))
    format_check = tf.debugging.Assert(
        known,
        [
            tf.strings.join(
                [what, " holds ", length, f" bytes that are not a {names} file"]
            )
        ],
    )
    with tf.control_dependencies([format_check]):
        height_width = declared_size(contents, tf.where(known, fmt, 0))
    size = tf.strings.as_string(height_width)
    declared = tf.strings.join([what, " declares ", size[1], " x ", size[0]])
    size_check = tf.debugging.Assert(
        tf.logical_and(
            height_width[0] * height_width[1] <= max_pixels,
            tf.reduce_all(height_width >= 0),
        ),
        [
            tf.strings.join(
                [
                    declared,
                    f" (width x height) pixels, more than the limit of {max_pixels}; "
                    "refused before decoding",
                ]
            )
        ],
    )
    with tf.control_dependencies([format_check, size_check]):
        return tf.identity(contents), fmt


def decode_to_channels(contents: tf.Tensor, channels: int, fmt=None) -> tf.Tensor:
    """uint8 `(height, width, channels)` of a JPEG / PNG / GIF / BMP file
    (first frame of an animation). TF's GIF decoder gives 3 channels only and
    its BMP decoder 3 or 4 (JPEG 1 or 3), so those are decoded to RGB and converted (to
    grey as `rgb_to_grayscale` weighs, or with an opaque alpha)."""
    fmt = image_format(contents) if fmt is None else fmt

    def decode(wanted):
        if wanted not in (1, 3):  # JPEG has no other channel counts
            return tf.io.decode_image(
                contents, channels=wanted, expand_animations=False
            )
        # JPEGs with the accurate integer IDCT (libjpeg's ISLOW, PIL's
        # default), as the serving signature and `predict` decode them:
        # TF's default fast IDCT moves pixels by a level or two.
        return tf.cond(
            tf.equal(fmt, JPEG),
            lambda: tf.io.decode_jpeg(
                contents, channels=wanted, dct_method="INTEGER_ACCURATE"
            ),
            lambda: tf.io.decode_image(
                contents, channels=wanted, expand_animations=False
            ),
        )

    def native():
        return decode(channels)

    def via_rgb():
        rgb = decode(3)
        if channels == 1:
            gray = tf.image.rgb_to_grayscale(tf.cast(rgb, tf.float32))
            return tf.cast(tf.round(gray), tf.uint8)
        if channels == 4:
            return tf.concat(
                [
                    rgb,
                    tf.fill(
                        tf.concat([tf.shape(rgb)[:2], [1]], 0),
                        tf.constant(255, tf.uint8),
                    ),
                ],
                -1,
            )
        return rgb

    if channels == 3:
        image = native()
    else:
        rgb_only = (GIF, BMP) if channels == 1 else (GIF, JPEG)
        needs_rgb = tf.reduce_any(tf.equal(fmt, list(rgb_only)))
        image = tf.cond(needs_rgb, via_rgb, native)
    return tf.ensure_shape(image, [None, None, channels])


__all__ = [
    "BMP",
    "DEFAULT_MAX_PIXELS",
    "FILE_MAX_PIXELS",
    "GIF",
    "JPEG",
    "PNG",
    "check_declared_size",
    "declared_size",
    "decode_to_channels",
    "image_format",
]
