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

import numpy as np
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
# The most bytes an encoded image may take: ENCODED_FACTOR x the raw bytes of
# the pixels its header declares (no JPEG, PNG, GIF or BMP encoder needs
# more than ~1.5x, even for noise), plus a fixed allowance for metadata
# (EXIF, ICC profiles, XMP). Files (`predict`, folders, TFRecords) allow
# 16 MiB. A serving request allows 256 KiB: its graph cannot inflate a PNG
# with a bounded output, and TensorFlow's decoder inflates all of a stream
# (~2 s per GiB), so what bounds a zlib bomb there is its length (zlib
# inflates at most ~1032x), i.e. ~260 MB of work beyond the declared image.
ENCODED_FACTOR = 4
FILE_ALLOWANCE = 16 << 20
REQUEST_ALLOWANCE = 256 << 10


def encoded_bound(height, width, bytes_per_pixel, allowance):
    """The most bytes an image declaring `height` x `width` pixels of
    `bytes_per_pixel` may take encoded (ints or int64 tensors): 8 bytes a row
    on top of the pixels cover PNG filter bytes and Adam7 passes and BMP row
    padding."""
    raw = height * width * bytes_per_pixel + 8 * height
    return ENCODED_FACTOR * raw + allowance


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
    for an unknown format (see `declared_layout`)."""
    return declared_layout(contents, fmt)[:2]


def declared_layout(contents: tf.Tensor, fmt: tf.Tensor) -> tf.Tensor:
    """int64 `[height, width, bytes_per_pixel]` the header of a `fmt` file
    declares; `[0, 0, 1]` for an unknown format. JPEG reads its SOF marker
    (`extract_jpeg_shape`, which fails on a JPEG without one: components);
    PNG the IHDR chunk (bytes 16..26, big-endian: samples of its colour type
    times 2 for 16-bit depth, 8 for a colour type PNG does not have); GIF the
    logical screen (bytes 6..10, little-endian; one palette index a pixel);
    BMP the info header (bytes 18..30, signed little-endian; negative heights
    mean top-down rows)."""

    def jpeg():
        shape = tf.image.extract_jpeg_shape(contents, output_type=tf.int64)
        return tf.concat([shape[:2], tf.maximum(shape[2:], 1)], 0)

    def png():
        b = _header_bytes(contents, 16, 10)
        samples = tf.gather(
            tf.constant([1, 8, 3, 1, 2, 8, 4, 8], tf.int64), tf.minimum(b[9], 7)
        )
        per_pixel = tf.where(b[8] > 8, 2 * samples, samples)
        return tf.stack([_big_endian(b, 4, 4), _big_endian(b, 0, 4), per_pixel])

    def gif():
        b = _header_bytes(contents, 6, 4)
        return tf.stack(
            [_little_endian(b, 2, 2), _little_endian(b, 0, 2), tf.constant(1, tf.int64)]
        )

    def bmp():
        b = _header_bytes(contents, 18, 12)
        width, height = _little_endian(b, 0, 4), _little_endian(b, 4, 4)
        signed = tf.where(height >= 2**31, height - 2**32, height)
        per_pixel = tf.clip_by_value((_little_endian(b, 10, 2) + 7) // 8, 1, 4)
        return tf.stack(
            [
                tf.abs(signed),
                tf.where(width >= 2**31, width - 2**32, width),
                per_pixel,
            ]
        )

    return tf.switch_case(
        tf.convert_to_tensor(fmt, tf.int32),
        [lambda: tf.constant([0, 0, 1], tf.int64), jpeg, png, gif, bmp],
    )


def gif_first_frame(data: bytes) -> tuple[int, int, int, int, int]:
    """Walks a GIF's blocks to the end of its first image: `(end, left, top,
    width, height)`, `end` the offset just after that image's data (-1: the
    file holds no whole image), the rest from its image descriptor.

    TF's decoder does not allocate the logical screen of the header: it
    decodes every frame, each at the size its own descriptor gives. So the
    frame is read here and the file cut after it (`inspect`). One step per
    block or sub-block (up to 255 bytes each); no pixel data is read. Plain
    Python (a graph loop took ~0.7 ms a step, 36 s for a hostile 100 KB file
    of 1-byte sub-blocks; this takes milliseconds)."""
    length = len(data)
    if length < 13:
        return -1, 0, 0, 0, 0
    flags = data[10]
    pos = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    while pos < length:
        intro = data[pos]
        if intro == 0x21:  # extension: label byte, then a sub-block chain
            pos += 2
        elif intro == 0x2C and pos + 10 <= length:  # image descriptor
            left, top, width, height = (
                int.from_bytes(data[pos + k : pos + k + 2], "little")
                for k in (1, 3, 5, 7)
            )
            packed = data[pos + 9]
            # 10 descriptor bytes, local color table, LZW minimum code size.
            pos += 11 + (3 << ((packed & 7) + 1) if packed & 0x80 else 0)
        else:  # a trailer before any image, or not a block at all
            return -1, 0, 0, 0, 0
        while pos < length and data[pos]:
            pos += 1 + data[pos]
        pos += 1  # the chain's 0 terminator
        if intro == 0x2C:
            return (pos if pos <= length else -1), left, top, width, height
    return -1, 0, 0, 0, 0


def _gif_first_frame(contents: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """`gif_first_frame` as graph ops (a `numpy_function`: not for graphs that
    are saved, so the serving signature, which takes JPEG and PNG only,
    never builds it): `(end, [left, top, width, height])`."""
    found = tf.numpy_function(
        # Eager calls pass a 0-d object array, graphs the bytes themselves.
        lambda data: np.array(gif_first_frame(np.asarray(data).item()), np.int64),
        [contents],
        tf.int64,
        stateful=False,
    )
    found = tf.ensure_shape(found, [5])
    return found[0], found[1:]


def inspect(contents: tf.Tensor, fmt: tf.Tensor, with_gif: bool = True):
    """`(height_width, problem, contents)` of a file of format `fmt`: the
    int64 `[height, width]` its header declares (`declared_size`), a string
    scalar naming what is wrong with the header beyond its size (empty when
    nothing is), and the bytes to decode. For a GIF those are the bytes up to
    the end of its first image and a trailer, so the decoder sees (and
    allocates) one frame whatever the file holds after it; a GIF whose first
    frame does not lie inside its logical screen, or that holds no whole
    image, has a problem. `with_gif=False` leaves GIFs as they are (for
    graphs that are saved, which refuse GIFs before)."""
    fmt = tf.convert_to_tensor(fmt, tf.int32)
    height_width = declared_size(contents, fmt)

    def gif_checks():
        end, frame = _gif_first_frame(contents)
        inside = tf.logical_and(
            frame[0] + frame[2] <= height_width[1],
            frame[1] + frame[3] <= height_width[0],
        )
        text = tf.strings.as_string(tf.concat([frame, height_width[::-1]], 0))
        outside = tf.strings.join(
            [
                " holds a ",
                text[2],
                " x ",
                text[3],
                " frame at (",
                text[0],
                ", ",
                text[1],
                ") outside its ",
                text[4],
                " x ",
                text[5],
                " logical screen (a damaged or hostile GIF; refused before decoding)",
            ]
        )
        problem = tf.where(
            end < 0,
            " is a GIF without one whole image (truncated or damaged)",
            tf.where(inside, "", outside),
        )
        cut = tf.strings.join(
            [tf.strings.substr(contents, 0, tf.cast(tf.maximum(end, 0), tf.int32)), ";"]
        )
        return problem, tf.where(end < 0, contents, cut)

    if not with_gif:
        return height_width, tf.constant(""), contents
    return (height_width,) + tuple(
        tf.cond(tf.equal(fmt, GIF), gif_checks, lambda: (tf.constant(""), contents))
    )


def check_declared_size(
    contents: tf.Tensor,
    what,
    max_pixels: int,
    formats=(JPEG, PNG, GIF, BMP),
    allowance: int = FILE_ALLOWANCE,
) -> tf.Tensor:
    """`contents` after checks that it is one of `formats`, declares at most
    `max_pixels` pixels, is at most `encoded_bound(..., allowance)` bytes
    long (a GIF: up to the end of its first image) and (a GIF) has its first
    frame inside its screen; `InvalidArgumentError`s that name `what` (a
    string tensor or str: the file, or the input name), the length or the
    declared size, never the bytes. Returns `(contents, format)`: the bytes
    to decode (`inspect`).

    What a graph cannot check: how far a PNG's zlib stream inflates (no
    graph op inflates with a bounded output; `image_files` does it for
    files). The length bound limits that work to ~1032x the bytes beyond
    what the declared image needs."""
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
        height_width, problem, decodable = inspect(
            contents, tf.where(known, fmt, 0), with_gif=GIF in formats
        )
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
    frame_check = tf.debugging.Assert(
        tf.equal(problem, ""), [tf.strings.join([what, problem])]
    )
    layout = tf.cast(declared_layout(contents, tf.where(known, fmt, 0)), tf.float64)
    # In float64: a lying header's height x width overflows int64.
    bound = encoded_bound(layout[0], layout[1], layout[2], float(allowance))
    encoded = tf.cast(tf.strings.length(decodable), tf.int64)
    with tf.control_dependencies([size_check, frame_check]):
        length_check = tf.debugging.Assert(
            tf.cast(encoded, tf.float64) <= bound,
            [
                tf.strings.join(
                    [
                        what,
                        " holds ",
                        tf.strings.as_string(encoded),
                        " bytes, more than the ",
                        tf.strings.as_string(tf.cast(bound, tf.int64)),
                        " bytes an image that declares ",
                        size[1],
                        " x ",
                        size[0],
                        " pixels may take; refused before decoding",
                    ]
                )
            ],
        )
    checks = [format_check, size_check, frame_check, length_check]
    with tf.control_dependencies(checks):
        return tf.identity(decodable), fmt


def _to_gray(rgb: tf.Tensor) -> tf.Tensor:
    gray = tf.image.rgb_to_grayscale(tf.cast(rgb, tf.float32))
    return tf.cast(tf.round(gray), tf.uint8)


def is_cmyk_jpeg(contents: tf.Tensor) -> tf.Tensor:
    """bool scalar: a JPEG with four components (CMYK or YCCK, as print
    workflows write). libjpeg converts those to RGB but not to grey, so a
    1-channel decode goes through RGB."""
    return tf.equal(tf.image.extract_jpeg_shape(contents)[2], 4)


def decode_jpeg(contents: tf.Tensor, channels: int, **options) -> tf.Tensor:
    """`tf.io.decode_jpeg` to 1 or 3 channels (`options` pass through) that
    also takes a CMYK JPEG to grey (through RGB, as `decode_to_channels`)."""
    if channels != 1:
        return tf.io.decode_jpeg(contents, channels=channels, **options)
    return tf.cond(
        is_cmyk_jpeg(contents),
        lambda: _to_gray(tf.io.decode_jpeg(contents, channels=3, **options)),
        lambda: tf.io.decode_jpeg(contents, channels=1, **options),
    )


def decode_to_channels(contents: tf.Tensor, channels: int, fmt=None) -> tf.Tensor:
    """uint8 `(height, width, channels)` of a JPEG / PNG / GIF / BMP file
    (first frame of an animation: pass the bytes `inspect` returns, so the
    decoder sees only that frame). TF's GIF decoder gives 3 channels only,
    its BMP decoder 3 or 4 and its JPEG decoder 1 or 3 (and a CMYK JPEG 3
    only), so those are decoded to RGB and converted (to grey as
    `rgb_to_grayscale` weighs, or with an opaque alpha)."""
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
            return _to_gray(rgb)
        if channels == 4:
            alpha = tf.fill(
                tf.concat([tf.shape(rgb)[:2], [1]], 0), tf.constant(255, tf.uint8)
            )
            return tf.concat([rgb, alpha], -1)
        return rgb

    if channels == 3:
        image = native()
    elif channels == 1:
        needs_rgb = tf.cond(
            tf.equal(fmt, JPEG),
            lambda: is_cmyk_jpeg(contents),
            lambda: tf.reduce_any(tf.equal(fmt, [GIF, BMP])),
        )
        image = tf.cond(needs_rgb, via_rgb, native)
    else:
        image = tf.cond(tf.reduce_any(tf.equal(fmt, [GIF, JPEG])), via_rgb, native)
    return tf.ensure_shape(image, [None, None, channels])


__all__ = [
    "BMP",
    "DEFAULT_MAX_PIXELS",
    "FILE_MAX_PIXELS",
    "gif_first_frame",
    "GIF",
    "JPEG",
    "PNG",
    "check_declared_size",
    "declared_layout",
    "declared_size",
    "encoded_bound",
    "ENCODED_FACTOR",
    "FILE_ALLOWANCE",
    "REQUEST_ALLOWANCE",
    "decode_jpeg",
    "decode_to_channels",
    "image_format",
    "inspect",
    "is_cmyk_jpeg",
]
