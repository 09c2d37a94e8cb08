"""Image files are checked before they are read, on every path that reads
them: a 3 GiB (sparse) file behind a valid 16 x 16 header is refused from
its size in bounded time and memory; a FIFO is named as one and never
opened; a PNG whose stream inflates past its declared size is refused after
inflating at most that much; a JPEG with two frame headers is one line."""

import io
import os
import struct
import time
import zlib

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from test_image_lies import growth, run_measured

from keras_vit.training import data as data_lib
from keras_vit.training.config import DataConfig

# Files checked before they are read: the entry's type from `os.stat`, the
# size on disk against what the header declares, a PNG's stream inflated to
# its declared size at most. Sparse files cost no disk.


def small_png(side=16) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((side, side), 7, "uint8")).save(buffer, "PNG")
    return buffer.getvalue()


def small_jpeg(side=16) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((side, side), 7, "uint8")).save(buffer, "JPEG")
    return buffer.getvalue()


def sparse(path, head: bytes, size: int):
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def two_sof_jpeg() -> bytes:
    data = small_jpeg()
    sof = data.index(b"\xff\xc0")
    segment = data[sof : sof + 2 + int.from_bytes(data[sof + 2 : sof + 4], "big")]
    return data[:sof] + segment + data[sof:]


def png_inflating_to(side: int, inflated: int) -> bytes:
    """A PNG declaring side x side grey pixels whose one IDAT stream holds
    the image's rows and then `inflated` more zero bytes (zlib squeezes
    them ~1000x)."""
    compressor = zlib.compressobj(9)
    data = compressor.compress(b"\0" * (side * (side + 1)))
    block = b"\0" * (1 << 20)
    for _ in range(inflated >> 20):
        data += compressor.compress(block)
    data += compressor.flush()

    def chunk(kind, body):
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", data)
        + chunk(b"IEND", b"")
    )


HUGE_FILES = """
import os, resource, sys, time
import tensorflow as tf
from keras_vit.deploy import serving
from keras_vit.training import data
from keras_vit.training.config import DataConfig
pre = {"num_channels": 1, "pixel_scale": 255.0, "image_size": [16, 16],
       "mean": [0.5], "std": [0.5], "resize_method": "bilinear"}
serving.load_pixels(sys.argv[2], pre)  # warm-up: an honest file
config = DataConfig(source="folder", path=sys.argv[3], num_channels=1)
BASE = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
for path in sys.argv[1].split(","):
    start = time.perf_counter()
    try:
        serving.load_pixels(path, pre)
    except ValueError as error:
        print(f"refused in {time.perf_counter() - start:.3f}:", error)
# The pipeline is traced anew each time it is made: the huge file's cost is
# what it adds to an honest pass (the file is renamed in between).
honest = time.perf_counter()
list(data.make_eval_dataset(config, 16, 8))
honest = time.perf_counter() - honest
os.rename(sys.argv[4] + ".off", sys.argv[4])
start = time.perf_counter()
try:
    list(data.make_eval_dataset(config, 16, 8))
except tf.errors.InvalidArgumentError as error:
    text = error.message.split("assertion failed:")[1].split("\\n")[0]
    print(f"folder refused in {time.perf_counter() - start - honest:.3f}:", text)
"""


def test_huge_files_behind_small_headers_are_refused_from_their_size(tmp_path):
    # 3 GiB behind a valid 16 x 16 PNG, JPEG, BMP and GIF: read whole before,
    # 10 GB and a segfault in predict, 3.9 GB in a training folder.
    heads = {"png": small_png(), "jpg": small_jpeg()}
    for fmt in ("BMP", "GIF"):
        buffer = io.BytesIO()
        Image.fromarray(np.zeros((16, 16), "uint8")).save(buffer, fmt)
        heads[fmt.lower()] = buffer.getvalue()
    huge = [sparse(tmp_path / f"huge.{k}", v, 3 << 30) for k, v in heads.items()]
    (tmp_path / "ok.png").write_bytes(small_png())
    for split in ("train", "val"):
        for name in ("a", "b"):
            (tmp_path / "data" / split / name).mkdir(parents=True)
            (tmp_path / "data" / split / name / "0.png").write_bytes(small_png())
    in_folder = tmp_path / "data" / "val" / "b" / "huge.png"
    sparse(f"{in_folder}.off", small_png(), 3 << 30)
    paths = ",".join(map(str, huge))
    out = run_measured(
        HUGE_FILES, paths, tmp_path / "ok.png", tmp_path / "data", in_folder
    )
    lines = [line for line in out.splitlines() if "refused" in line]
    assert len(lines) == 5, out
    for line, path in zip(lines, [*huge, "val/b/huge.png"], strict=True):
        assert str(path) in line
        assert "is 3,221,225,472 bytes, more than the 16,7" in line
        assert "bytes an image that declares 16 x 16 pixels may take" in line
        assert float(line.split("refused in ")[1].split(":")[0]) < 2.0, line
    assert growth(out) < 200, out


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.png"
    os.mkfifo(path)
    return path


def test_a_fifo_is_named_as_one_and_never_opened(fifo, tmp_path):
    from keras_vit.deploy import serving

    pre = {"num_channels": 1, "pixel_scale": 255.0, "image_size": [16, 16]}
    # Opening a FIFO for reading would block this test until a writer came.
    with pytest.raises(ValueError, match=r"pipe.png' is a FIFO \(named pipe\), not"):
        serving.load_pixels(str(fifo), pre)
    for split in ("train", "val"):
        for name in ("a", "b"):
            (tmp_path / split / name).mkdir(parents=True)
            (tmp_path / split / name / "0.png").write_bytes(small_png())
    os.rename(fifo, tmp_path / "val" / "a" / "pipe.png")
    config = DataConfig(source="folder", path=str(tmp_path), num_channels=1)
    with pytest.raises(ValueError, match=r"pipe.png' is a FIFO \(named pipe\)"):
        list(data_lib.make_eval_dataset(config, 16, 8))
    records = tmp_path / "records"
    records.mkdir()
    os.mkfifo(records / "val-00000-of-00001.tfrecord")
    config = DataConfig(source="tfrecord", path=str(records), num_classes=2)
    with pytest.raises(ValueError, match=r"is a FIFO \(named pipe\), not a TFRecord"):
        data_lib.make_eval_dataset(config, 16, 8)


def test_a_jpeg_with_two_frame_headers_is_one_line(tmp_path):
    from keras_vit.deploy import serving

    path = tmp_path / "two_sof.jpg"
    path.write_bytes(two_sof_jpeg())
    pre = {"num_channels": 3, "pixel_scale": 255.0, "image_size": [16, 16]}
    with pytest.raises(ValueError) as error:
        serving.load_pixels(str(path), pre)
    message = str(error.value)
    assert "two_sof.jpg' (JPEG) holds two SOF (frame header) markers" in message
    assert "\n" not in message and "Detected at node" not in message


def test_a_png_that_inflates_past_its_size_is_refused_in_every_reader(tmp_path):
    from keras_vit.deploy import serving

    bomb = png_inflating_to(16, 1 << 30)  # ~1 MB inflating to 1 GiB
    assert len(bomb) < 1_100_000
    path = tmp_path / "bomb.png"
    path.write_bytes(bomb)
    pre = {"num_channels": 1, "pixel_scale": 255.0, "image_size": [16, 16]}
    start = time.perf_counter()
    with pytest.raises(ValueError) as error:
        serving.load_pixels(str(path), pre)
    # TF's decoder takes 2-5 s of CPU for it; bounded inflating, ~1 ms.
    assert time.perf_counter() - start < 0.5
    assert "bomb.png' (PNG): its image data inflates past the 272 bytes its 16 x " in (
        str(error.value)
    )
    # Within its declared size the same stream is an ordinary image.
    path.write_bytes(png_inflating_to(16, 0))
    assert serving.load_pixels(str(path), pre).shape == (1, 16, 16, 1)
    # A TFRecord holding the bomb is refused by its record name.
    records = tmp_path / "records"
    data_lib_files = records / "val-00000-of-00001.tfrecord"
    records.mkdir()
    feature = {
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bomb])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[0])),
        "image/filename": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[b"cat/bomb.png"])
        ),
    }
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    with tf.io.TFRecordWriter(str(data_lib_files)) as writer:
        writer.write(example.SerializeToString())
    config = DataConfig(source="tfrecord", path=str(records), num_classes=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="inflates past the 272"):
        list(data_lib.make_eval_dataset(config, 16, 4))
