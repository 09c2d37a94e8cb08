"""Image files read from disk (and encoded images held in records), checked
before they are read and before any decoder sees them: plain Python, a few
header bytes first.

- The entry must be a regular file: a folder, FIFO, device or socket is named
  as what it is, from `os.stat`, and never opened (reading a FIFO blocks
  until a writer comes; a device can be endless).
- The file may be at most `encoded_bound` bytes: a generous multiple of the
  raw pixels its header declares plus a fixed allowance for metadata. A
  3 GiB file that starts with a 16 x 16 PNG is refused from its size alone.
- What the decoder gets is what it needs: a PNG up to its IEND chunk, a GIF
  up to the end of its first image (an animation longer than the bound is
  refused like any other file: only its first frame would be used).
- A PNG's compressed stream is inflated here with a bounded output
  (`zlib.decompressobj(...).decompress(data, max_length)`): one that
  inflates past its declared size is refused after at most that many bytes
  of work (TensorFlow's decoder inflates the whole stream, ~2 s per GiB).
- A JPEG's markers are walked to its first scan: two frame (SOF) markers,
  or none, is refused in one line (libjpeg's own message is not).

Every refusal is a ValueError of one line that names the file (`what`).
"""

from __future__ import annotations

import errno
import os
import stat
import struct
import zlib

from keras_vit.models.image_bytes import (
    BMP,
    FILE_ALLOWANCE,
    FILE_MAX_PIXELS,
    FORMAT_NAMES,
    GIF,
    JPEG,
    PNG,
    encoded_bound,
    gif_first_frame,
)

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# PNG colour type -> samples per pixel (the PNG specification's table).
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
# Adam7 passes: (first column, first row, column step, row step).
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4))
_ADAM7 += ((1, 0, 2, 2), (0, 1, 1, 2))
# JPEG frame markers (SOF0..SOF15 except DHT, JPG and DAC).
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE}
_SOF |= {0xCF}
# A real JPEG has a few dozen segments before its first scan; a file of
# thousands of tiny ones is made to make this walk slow.
_MAX_JPEG_SEGMENTS = 4096
_TOO_MANY_SEGMENTS = (
    f" holds more than {_MAX_JPEG_SEGMENTS} marker segments before its first "
    "scan (a damaged or hostile file)"
)
_TWO_FRAMES = (
    " holds two SOF (frame header) markers, which JPEG does not allow (a damaged file)"
)


def image_format(head: bytes) -> int:
    """`JPEG`, `PNG`, `GIF`, `BMP` by magic bytes, else 0."""
    if head[:3] == b"\xff\xd8\xff":
        return JPEG
    if head[:8] == _PNG_MAGIC:
        return PNG
    if head[:4] == b"GIF8":
        return GIF
    if head[:2] == b"BM":
        return BMP
    return 0


def entry_problem(path, expected: str = "an image file") -> str | None:
    """Why `path` cannot be read as `expected` ("is a FIFO (named pipe), not
    an image file"), from `os.stat` alone; None for a regular file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            return f"is a link to {os.readlink(path)!r}, which does not exist"
        return "does not exist"
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "is a link that loops back on itself"
        return f"cannot be read ({error.strerror})"
    return _mode_problem(mode, expected)


def _mode_problem(mode: int, expected: str = "an image file") -> str | None:
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return f"is a folder, not {expected}"
    kinds = (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    return f"is {kind}, not {expected}; it is not opened"


def png_stream_size(width: int, height: int, depth: int, color: int, interlace: int):
    """Bytes of a PNG's inflated image data: each row of each pass is a
    filter byte and its packed samples."""
    bits = depth * _PNG_CHANNELS.get(color, 4)
    passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
    total = 0
    for x0, y0, dx, dy in passes:
        cols = (width - x0 + dx - 1) // dx
        rows = (height - y0 + dy - 1) // dy
        if cols > 0 and rows > 0:
            total += rows * (1 + (cols * bits + 7) // 8)
    return total


def _header(fmt: int, data: bytes, read_at) -> tuple[int, int, int, str]:
    """`(width, height, bytes_per_pixel, problem)` a header declares; `read_at
    (offset, count)` reads further bytes (JPEG segments may run past the
    first block read)."""
    if fmt == PNG:
        if len(data) < 33 or data[12:16] != b"IHDR":
            return 0, 0, 1, " is a PNG without an IHDR header (truncated or damaged)"
        width, height, depth, color, _, _, interlace = struct.unpack(
            ">IIBBBBB", data[16:29]
        )
        if depth not in _PNG_DEPTHS.get(color, ()):
            return (
                width,
                height,
                1,
                f" declares bit depth {depth} with PNG colour type {color}, which "
                "PNG does not allow (a damaged file)",
            )
        per_pixel = _PNG_CHANNELS[color] * (2 if depth == 16 else 1)
        return width, height, per_pixel, ""
    if fmt == GIF:
        if len(data) < 10:
            return 0, 0, 1, " is a GIF without a whole header (truncated)"
        width, height = struct.unpack("<HH", data[6:10])
        return width, height, 1, ""
    if fmt == BMP:
        if len(data) < 30:
            return 0, 0, 1, " is a BMP without a whole header (truncated)"
        width, height = struct.unpack("<ii", data[18:26])
        bits = struct.unpack("<H", data[28:30])[0]
        return abs(width), abs(height), max(1, min(4, (bits + 7) // 8)), ""
    return _jpeg_header(read_at)


def _jpeg_header(read_at) -> tuple[int, int, int, str]:
    """The JPEG frame header, found by walking the marker segments to the
    first scan (SOS)."""
    pos, frame = 2, None
    for _ in range(_MAX_JPEG_SEGMENTS):
        marker = read_at(pos, 4)
        if marker[:1] != b"\xff":
            # libjpeg skips stray bytes before a marker (with a warning).
            skip = read_at(pos, 1 << 16).find(b"\xff")
            if skip < 0:
                break
            pos += skip
            continue
        if len(marker) < 4:
            break
        code = marker[1]
        if code == 0xFF:  # fill byte before a marker
            pos += 1
            continue
        if 0xD0 <= code <= 0xD8 or code == 0x01:  # markers without a length
            pos += 2
            continue
        if code == 0xD9:  # EOI before any scan
            break
        length = struct.unpack(">H", marker[2:4])[0]
        if code in _SOF:
            if frame is not None:
                return 0, 0, 1, _TWO_FRAMES
            body = read_at(pos + 4, 6)
            if len(body) < 6:
                break
            height, width = struct.unpack(">HH", body[1:5])
            frame = (width, height, max(1, body[5]))
        if code == 0xDA:  # start of scan: the header is over
            if frame is None:
                break
            return (*frame, "")
        pos += 2 + length
    else:
        return 0, 0, 1, _TOO_MANY_SEGMENTS
    if frame is not None:
        return (*frame, " is a JPEG without image data (truncated or damaged)")
    return 0, 0, 1, " is a JPEG without a frame (SOF) header (truncated or damaged)"


def _png_up_to_iend(data: bytes, width, height, what: str) -> bytes:
    """`data` up to the end of its IEND chunk, after inflating its IDAT
    stream with a bounded output: a stream that inflates past the declared
    size is refused once it passes it by one byte."""
    depth, color, interlace = data[24], data[25], data[28]
    expected = png_stream_size(width, height, depth, color, interlace)
    inflater = zlib.decompressobj()
    inflated, pos, view = 0, 8, memoryview(data)
    while pos + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        end = pos + 12 + length
        if end > len(data):
            break  # a torn chunk: the decoder says what is wrong
        if kind == b"IDAT" and not inflater.eof:
            try:
                room = expected + 1 - inflated
                out = inflater.decompress(view[pos + 8 : end - 4], room)
            except zlib.error:
                break  # damaged data: the decoder refuses it by name
            inflated += len(out)
            if inflated > expected:
                raise ValueError(
                    f"{what}: its image data inflates past the {expected:,} bytes "
                    f"its {width} x {height} header declares (a decompression "
                    "bomb or a damaged file); refused before decoding"
                )
        if kind == b"IEND":
            return data[:end]
        pos = end
    return data


def check_encoded(
    data: bytes,
    what: str,
    size: int | None = None,
    read_at=None,
    max_pixels: int = FILE_MAX_PIXELS,
    allowance: int = FILE_ALLOWANCE,
    with_kind: bool = True,
) -> bytes:
    """The bytes a decoder needs of an encoded image `data` (or of its first
    bytes, when `read_at(offset, count)` reads the rest of a file of `size`
    bytes); a ValueError of one line naming `what` when the header declares
    more than `max_pixels`, the file is larger than `encoded_bound`, a PNG
    inflates past its declared size or a JPEG's markers are damaged. Other
    damage is left to the decoder (whose error names `what` too). Messages
    name `what` and (`with_kind`) the format: "image 'x.png' (PNG) ..."."""
    size = len(data) if size is None else size
    if read_at is None:

        def read_at(offset, count):
            return data[offset : offset + count]

    fmt = image_format(data[:8])
    if not fmt:
        raise ValueError(
            f"cannot decode {what}: its {size} bytes are not a JPEG, PNG, GIF or "
            "BMP file"
        )
    if with_kind:
        what = f"{what} ({FORMAT_NAMES[fmt]})"
    width, height, per_pixel, problem = _header(fmt, data, read_at)
    if problem:
        raise ValueError(f"{what}{problem}")
    if width * height > max_pixels:
        raise ValueError(
            f"{what} declares {width} x {height} (width x height) pixels, more "
            f"than the limit of {max_pixels}; refused before decoding"
        )
    bound = encoded_bound(height, width, per_pixel, allowance)
    if size > bound:
        raise ValueError(
            f"{what} is {size:,} bytes, more than the {bound:,} bytes an image "
            f"that declares {width} x {height} pixels may take; refused before "
            "reading it (a damaged file, or data after the image)"
        )
    if len(data) < min(size, bound):
        data = data + read_at(len(data), min(size, bound) - len(data))
    if fmt == PNG:
        return _png_up_to_iend(data, width, height, what)
    if fmt == GIF:
        # The first image and a trailer: later frames never reach the decoder.
        end = gif_first_frame(data)[0]
        return data[:end] + b";" if end >= 0 else data
    return data


def read_image_file(
    path,
    what: str | None = None,
    max_pixels: int = FILE_MAX_PIXELS,
    with_kind: bool = True,
) -> bytes:
    """The checked bytes of the image file `path` (see the module docstring):
    a regular file, at most `encoded_bound` bytes for what its header
    declares; reads only what the decoder needs."""
    what = what or f"image {str(path)!r}"
    problem = entry_problem(path)
    if problem == "is a folder, not an image file":
        raise IsADirectoryError(
            f"{what} is a folder; pass image files (e.g. "
            f"{os.path.join(str(path), '*.jpg')!r} expanded by the shell)"
        )
    if problem == "does not exist":
        raise FileNotFoundError(f"{what} does not exist")
    if problem:
        raise ValueError(f"{what} {problem}")
    # O_NONBLOCK: should the entry be swapped for a FIFO after the stat, the
    # open returns at once and the fstat below refuses it.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        problem = _mode_problem(info.st_mode)
        if problem:
            raise ValueError(f"{what} {problem}")

        def read_at(offset, count):
            file.seek(offset)
            return file.read(count)

        head = file.read(1 << 16)
        return check_encoded(
            head, what, info.st_size, read_at, max_pixels, with_kind=with_kind
        )


__all__ = [
    "check_encoded",
    "entry_problem",
    "image_format",
    "png_stream_size",
    "read_image_file",
]
