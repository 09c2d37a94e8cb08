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


def _bytes_at(contents: tf.Tensor, pos: tf.Tensor, count: int) -> tf.Tensor:
    """`count` bytes from int64 `pos` (a tensor) as int64, zero past the end."""
    length = tf.strings.length(contents)
    start = tf.minimum(tf.cast(pos, tf.int32), length)
    part = tf.strings.join([tf.strings.substr(contents, start, count), "\0" * count])
    raw = tf.io.decode_raw(tf.strings.substr(part, 0, count), tf.uint8)
    return tf.cast(raw, tf.int64)


def _gif_first_frame(contents: tf.Tensor):
    """Walks a GIF's blocks to the end of its first image: `(end, frame)` with
    `end` the offset just after that image's data (or -1: no whole image) and
    `frame` int64 `[left, top, width, height]` from its image descriptor.

    The logical screen in the header is not what TF's decoder allocates: it
    decodes every frame at the size its own descriptor gives. So the frame
    is read here and the file is cut after it (`_cut_after`). The walk is one
    loop step per block or sub-block (at most 255 bytes of a file of N bytes
    each, N steps for a hostile one); it never touches pixel data."""
    length = tf.cast(tf.strings.length(contents), tf.int64)
    flags = _bytes_at(contents, 10, 1)[0]
    color_table = tf.where(
        flags >= 128,
        3 * tf.bitwise.left_shift(tf.constant(2, tf.int64), flags % 8),
        tf.constant(0, tf.int64),
    )
    # Loop state: position, inside a sub-block chain, that chain is image data,
    # end (-1 until the first image's data ends), the descriptor, failed.
    start = (
        13 + color_table,
        tf.constant(False),
        tf.constant(False),
        tf.constant(-1, tf.int64),
        tf.zeros([4], tf.int64),
        tf.constant(False),
    )

    def more(pos, chain, image, end, frame, failed):
        return tf.logical_and(
            tf.logical_and(end < 0, tf.logical_not(failed)), pos < length
        )

    def step(pos, chain, image, end, frame, failed):
        b = _bytes_at(contents, pos, 10)
        # Inside a chain: a size byte, then that many bytes; 0 ends the chain.
        chain_pos = pos + 1 + b[0]
        chain_over = tf.logical_and(chain, tf.equal(b[0], 0))
        # Between blocks: 0x21 extension (label, then a chain) or 0x2C image
        # descriptor (9 bytes, local color table, LZW code size, a chain).
        is_ext = tf.equal(b[0], 0x21)
        is_image = tf.equal(b[0], 0x2C)
        local = tf.where(
            b[9] >= 128,
            3 * tf.bitwise.left_shift(tf.constant(2, tf.int64), b[9] % 8),
            tf.constant(0, tf.int64),
        )
        block_pos = tf.where(is_ext, pos + 2, pos + 11 + local)
        descriptor = tf.stack(
            [b[1] + 256 * b[2], b[3] + 256 * b[4], b[5] + 256 * b[6], b[7] + 256 * b[8]]
        )
        in_block = tf.logical_not(chain)
        new_frame = tf.logical_and(in_block, is_image)
        return (
            tf.where(chain, chain_pos, block_pos),
            tf.where(chain, tf.logical_not(chain_over), True),
            tf.where(chain, image, is_image),
            tf.where(tf.logical_and(chain_over, image), pos + 1, end),
            tf.where(new_frame, descriptor, frame),
            tf.logical_and(in_block, tf.logical_not(tf.logical_or(is_ext, is_image))),
        )

    _, _, _, end, frame, _ = tf.while_loop(more, step, start)
    # An image whose data runs past the end of the file has no end either.
    return tf.where(end <= length, end, -1), frame


def inspect(contents: tf.Tensor, fmt: tf.Tensor):
    """`(height_width, problem, contents)` of a file of format `fmt`: the
    int64 `[height, width]` its header declares (`declared_size`), a string
    scalar naming what is wrong with the header beyond its size (empty when
    nothing is), and the bytes to decode. For a GIF those are the bytes up to
    the end of its first image and a trailer, so the decoder sees (and
    allocates) one frame whatever the file holds after it; a GIF whose first
    frame does not lie inside its logical screen, or that holds no whole
    image, has a problem."""
    fmt = tf.convert_to_tensor(fmt, tf.int32)
    height_width = declared_size(contents, fmt)

    def gif():
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

    return (height_width,) + tuple(
        tf.cond(tf.equal(fmt, GIF), gif, lambda: (tf.constant(""), contents))
    )


def check_declared_size(
    contents: tf.Tensor, what, max_pixels: int, formats=(JPEG, PNG, GIF, BMP)
) -> tf.Tensor:
    """`contents` after checks that it is one of `formats`, declares at most
    `max_pixels` pixels and (a GIF) has its first frame inside its screen;
    `InvalidArgumentError`s that name `what` (a string tensor or str: the
    file, or the input name), the length or the declared size, never the
    bytes. Returns `(contents, format)`: the bytes to decode (`inspect`)."""
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
        height_width, problem, decodable = inspect(contents, tf.where(known, fmt, 0))
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
    with tf.control_dependencies([format_check, size_check, frame_check]):
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
    "GIF",
    "JPEG",
    "PNG",
    "check_declared_size",
    "declared_size",
    "decode_jpeg",
    "decode_to_channels",
    "image_format",
    "inspect",
    "is_cmyk_jpeg",
]
