"""Seeded fuzzing of the two image readers a user reaches: `predict`'s file
reader and the serving signature's decode. 200 mutations of a real photo
crop as PNG and JPEG (bytes flipped, files truncated, chunk and segment
lengths changed, header sizes changed, chunks or segments repeated, data
appended): each is decoded to the pixels TensorFlow's own decoder gives for
the same bytes (the checks never change an answer), or refused with one
line, never a traceback, and quickly."""

import io
import struct
import time
import zlib

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from sklearn.datasets import load_sample_image

from keras_vit.cli.common import user_error_line
from keras_vit.deploy import images
from keras_vit.deploy.signatures import Graphs
from keras_vit.models.preprocessing import resize_pixels

SIDE = 16
MUTATIONS_PER_FORMAT = 100


def originals() -> dict[str, bytes]:
    """A 16 x 16 grey crop of scikit-learn's china.jpg photo, as PNG and as
    JPEG (quality 90)."""
    photo = load_sample_image("china.jpg")[100 : 100 + SIDE, 200 : 200 + SIDE]
    grey = Image.fromarray(photo).convert("L")
    found = {}
    for fmt in ("PNG", "JPEG"):
        buffer = io.BytesIO()
        grey.save(buffer, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
        found[fmt] = buffer.getvalue()
    return found


def png_chunks(data: bytes) -> list[tuple[int, int]]:
    """(offset, total length) of each whole chunk."""
    found, pos = [], 8
    while pos + 12 <= len(data):
        length = struct.unpack(">I", data[pos : pos + 4])[0]
        found.append((pos, 12 + length))
        pos += 12 + length
    return found


def jpeg_segments(data: bytes) -> list[tuple[int, int]]:
    """(offset, total length) of each marker segment before the scan data."""
    found, pos = [], 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        length = struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        found.append((pos, 2 + length))
        if data[pos + 1] == 0xDA:
            break
        pos += 2 + length
    return found


PRE = {
    "image_size": [SIDE, SIDE],
    "num_channels": 1,
    "pixel_scale": 255.0,
    "resize_method": "bilinear",
}
SIZES = (0, 1, 15, 17, 300, 4000, 70000, 2**31 - 1, 2**32 - 1)


def with_png_crc(data: bytearray, offset: int, length: int) -> None:
    body = bytes(data[offset + 4 : offset + length - 4])
    data[offset + length - 4 : offset + length] = struct.pack(
        ">I", zlib.crc32(body) & 0xFFFFFFFF
    )


def mutate(data: bytes, fmt: str, rng: np.random.Generator) -> bytes:
    out = bytearray(data)
    parts = png_chunks(data) if fmt == "PNG" else jpeg_segments(data)
    kind = rng.integers(7)
    if kind == 0:  # flip bytes
        for i in rng.integers(0, len(out), rng.integers(1, 9)):
            out[i] ^= 1 << rng.integers(8)
    elif kind == 1:  # truncate
        out = out[: rng.integers(0, len(out))]
    elif kind == 2:  # a chunk's or segment's length changed
        offset, _ = parts[rng.integers(len(parts))]
        if fmt == "PNG":
            out[offset : offset + 4] = struct.pack(">I", int(rng.integers(2**32)))
        else:
            out[offset + 2 : offset + 4] = struct.pack(">H", int(rng.integers(2**16)))
    elif kind == 3:  # header sizes changed (PNG: with a valid CRC)
        width, height = (int(rng.choice(SIZES)) for _ in range(2))
        if fmt == "PNG":
            out[16:24] = struct.pack(">II", width, height)
            with_png_crc(out, 8, 25)
        else:
            sof = next(o for o, _ in parts if out[o + 1] in (0xC0, 0xC2))
            out[sof + 5 : sof + 9] = struct.pack(">HH", height & 0xFFFF, width & 0xFFFF)
    elif kind == 4:  # a chunk or segment repeated (two IHDR / SOF...)
        offset, length = parts[rng.integers(len(parts))]
        out[offset:offset] = out[offset : offset + length]
    elif kind == 5:  # data appended
        out += rng.integers(0, 256, rng.integers(1, 5000), dtype=np.uint8).tobytes()
    else:  # PNG: an extra zlib stream of zeros; JPEG: a segment's body garbled
        if fmt == "PNG":
            body = zlib.compress(b"\0" * int(rng.integers(1, 4 << 20)), 9)
            chunk = struct.pack(">I", len(body)) + b"IDAT" + body
            chunk += struct.pack(">I", zlib.crc32(b"IDAT" + body) & 0xFFFFFFFF)
            out[-12:-12] = chunk
        else:
            offset, length = parts[rng.integers(len(parts))]
            garbage = rng.integers(0, 256, max(0, length - 4), dtype=np.uint8)
            out[offset + 4 : offset + length] = garbage.tobytes()
    return bytes(out)


def reference(data: bytes, fmt: str):
    """TensorFlow's own decode of `data` to grey, without keras_vit's checks;
    None when it refuses."""
    try:
        if fmt == "PNG":
            return tf.io.decode_png(data, channels=1).numpy()
        return tf.io.decode_jpeg(
            data, channels=1, dct_method="INTEGER_ACCURATE"
        ).numpy()
    except tf.errors.OpError:
        return None


def check_one_line(message: str, what: str) -> None:
    assert message and "\n" not in message, (what, message)
    for sign in ("Traceback", "Detected at node", 'File "', "{{node"):
        assert sign not in message, (what, message)


@pytest.fixture(scope="module")
def serving_decode():
    """The `classify_images` decode of a 16 x 16 grey model, as exported
    (max_pixels at its default), traced once."""
    graphs = Graphs.__new__(Graphs)
    graphs.max_pixels = 4096 * 4096
    graphs.shape = [SIDE, SIDE, 1]
    graphs.pre = PRE
    return tf.function(graphs.decode, input_signature=[tf.TensorSpec([], tf.string)])


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_mutated_images_decode_as_tensorflow_does_or_are_one_line(
    fmt, tmp_path, serving_decode
):
    original = originals()[fmt]
    rng = np.random.default_rng(20240 + len(fmt))
    path = tmp_path / f"mutant.{fmt.lower()}"
    outcomes = {"decoded": 0, "refused": 0}
    path.write_bytes(original)  # both paths traced before the clock runs
    np.testing.assert_array_equal(
        images._decode_file(path, 1).numpy(), reference(original, fmt)
    )
    serving_decode(tf.constant(original))
    for index in range(MUTATIONS_PER_FORMAT):
        mutant = mutate(original, fmt, rng)
        what = f"{fmt} mutation {index}"
        want = reference(mutant, fmt)
        path.write_bytes(mutant)
        start = time.perf_counter()
        try:
            got = images._decode_file(path, 1).numpy()
        except (ValueError, OSError) as error:
            check_one_line(str(error), what)
            assert str(path) in str(error), (what, str(error))
            outcomes["refused"] += 1
        else:
            assert want is not None, what
            np.testing.assert_array_equal(got, want, err_msg=what)
            outcomes["decoded"] += 1
        try:
            served = serving_decode(tf.constant(mutant)).numpy()
        except tf.errors.InvalidArgumentError as error:
            line = user_error_line(error)
            assert line is not None, (what, error.message)
            check_one_line(line, what)
        else:
            assert want is not None, what
            # Another size than the model's is resized, as the graph does.
            resized = resize_pixels(want[None].astype("float32"), PRE)[0]
            np.testing.assert_array_equal(served, resized, what)
        # Refusals take milliseconds; a decode of a lying size a little more.
        assert time.perf_counter() - start < 5.0, what
    # The mutations reach both outcomes.
    assert outcomes["decoded"] >= 5 and outcomes["refused"] >= 20, outcomes


def test_the_originals_decode_like_pil():
    for fmt, data in originals().items():
        decoded = reference(data, fmt)
        with Image.open(io.BytesIO(data)) as image:
            want = np.asarray(image)[..., None]
        if fmt == "PNG":
            np.testing.assert_array_equal(decoded, want)
        else:
            assert np.abs(decoded.astype(int) - want).max() <= 1
