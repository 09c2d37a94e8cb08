"""Image files whose headers lie: a GIF whose logical screen says 16 x 16
but whose frame is 12000 x 12000 (107 KB, what TF would decode at ~5 GB) is
refused before decoding on every path that decodes files (predict and
visualize, training folders, TFRecords), in bounded memory; an animation's
later frames never reach the decoder; CMYK JPEGs decode to 1 and 3 channels."""

import io
import resource
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_vit.models import image_bytes
from keras_vit.training import data as data_lib
from keras_vit.training.config import DataConfig

# Peak RSS a refused hostile file may add to the process: the check reads
# the GIF's block structure (107 KB) and never the pixels; decoding the
# frame would take ~5 GB (the measurement), 100x this bound.
MAX_GROWTH_MIB = 50


def gif_bytes(frames, screen=None):
    """An animated GIF of `frames` (each an (h, w) uint8 array of palette
    indices); `screen` overrides the logical screen size in the header."""
    images = []
    for pixels in frames:
        image = Image.fromarray(np.asarray(pixels, "uint8"), "P")
        image.putpalette([v for i in range(256) for v in (i, 255 - i, i // 2)])
        images.append(image)
    buffer = io.BytesIO()
    images[0].save(buffer, "GIF", save_all=len(images) > 1, append_images=images[1:])
    data = bytearray(buffer.getvalue())
    if screen is not None:
        data[6:10] = screen[0].to_bytes(2, "little") + screen[1].to_bytes(2, "little")
    return bytes(data)


HOSTILE = """
import io, sys
from PIL import Image
image = Image.new("P", (12000, 12000), 0)
image.putpalette([0, 0, 0, 255, 255, 255] * 128)
buffer = io.BytesIO()
image.save(buffer, "GIF")
data = bytearray(buffer.getvalue())
data[6:10] = (16).to_bytes(2, "little") * 2  # the logical screen: 16 x 16
open(sys.argv[1], "wb").write(bytes(data))
"""


@pytest.fixture(scope="module")
def hostile_gif(tmp_path_factory):
    # Written in a child process: the 144 MB frame PIL encodes would
    # otherwise count in this process's peak memory.
    path = tmp_path_factory.mktemp("gif") / "screen16_frame12000.gif"
    subprocess.run([sys.executable, "-c", HOSTILE, str(path)], check=True)
    return path


def run_measured(body: str, *args) -> str:
    """Runs `body` in a fresh python after a warm-up, printing the growth of
    peak RSS in MiB as the last line."""
    script = textwrap.dedent(body) + textwrap.dedent(
        """
        import resource
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - BASE
        print(f"grew {grown:.1f}")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def growth(stdout: str) -> float:
    return float(stdout.strip().splitlines()[-1].split()[-1])


def test_hostile_gif_is_107_kb_and_lies_about_its_size(hostile_gif):
    data = hostile_gif.read_bytes()
    assert len(data) < 120_000
    contents = tf.constant(data)
    assert image_bytes.declared_size(contents, image_bytes.GIF).numpy().tolist() == [
        16,
        16,
    ]
    _, problem, _ = image_bytes.inspect(contents, image_bytes.GIF)
    assert b"12000 x 12000 frame at (0, 0) outside its 16 x 16" in problem.numpy()


PREDICT_PATH = """
import resource, sys
from pathlib import Path
import numpy as np
from keras_vit.deploy import serving
pre = {"num_channels": 1, "pixel_scale": 255.0, "image_size": [16, 16],
       "mean": [0.5], "std": [0.5], "resize_method": "bilinear"}
serving.load_pixels(sys.argv[2], pre)  # warm-up: a small honest GIF
BASE = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
try:
    serving.load_pixels(sys.argv[1], pre)
except ValueError as error:
    print("refused:", error)
"""


def test_predict_and_visualize_refuse_the_hostile_gif_in_bounded_memory(
    hostile_gif, tmp_path
):
    small = tmp_path / "small.gif"
    small.write_bytes(gif_bytes([np.full((16, 16), 3)]))
    out = run_measured(PREDICT_PATH, hostile_gif, small)
    assert "refused: image" in out and hostile_gif.name in out
    assert "12000 x 12000 frame at (0, 0) outside its 16 x 16 logical screen" in out
    assert growth(out) < MAX_GROWTH_MIB, out


FOLDER_PATH = """
import resource, sys
import tensorflow as tf
from keras_vit.training import data
from keras_vit.training.config import DataConfig
def first_batch(on_error):
    config = DataConfig(source="folder", path=sys.argv[1], num_channels=1,
                        on_error=on_error)
    dataset = data.make_eval_dataset(config, 16, 8)
    images = [x for x, _ in dataset]
    return sum(len(x) for x in images), dataset
BASE = None
try:
    first_batch("raise")
except tf.errors.InvalidArgumentError as error:
    BASE = BASE or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("raised:", error.message.split("assertion failed:")[1].split("\\n")[0])
count, dataset = first_batch("skip")
print("kept", count, "skipped", int(dataset.skipped_images.numpy()))
"""


def test_training_folder_refuses_or_skips_the_hostile_gif(hostile_gif, tmp_path):
    for split in ("train", "val"):
        for k, name in enumerate(("a", "b")):
            folder = tmp_path / split / name
            folder.mkdir(parents=True)
            for i in range(2):
                Image.fromarray(np.full((8, 8), 40 * k + i, "uint8")).save(
                    folder / f"{i}.png"
                )
    (tmp_path / "val" / "b" / "hostile.gif").write_bytes(hostile_gif.read_bytes())
    out = run_measured(FOLDER_PATH.replace("BASE = None", _folder_base()), tmp_path)
    assert "hostile.gif holds a 12000 x 12000 frame" in out
    assert "kept 4 skipped 1" in out
    assert growth(out) < MAX_GROWTH_MIB, out


def _folder_base() -> str:
    # The baseline is taken after one honest pass through the same pipeline
    # (graph tracing, TF's thread pools), so the growth is the GIF's own.
    return (
        "import shutil, os\n"
        "hostile = os.path.join(sys.argv[1], 'val', 'b', 'hostile.gif')\n"
        "shutil.move(hostile, hostile + '.off')\n"
        "first_batch('raise')\n"
        "shutil.move(hostile + '.off', hostile)\n"
        "BASE = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024"
    )


def test_tfrecord_with_the_hostile_gif_names_the_record(hostile_gif, tmp_path):
    path = tmp_path / "val-00000-of-00001.tfrecord"
    feature = {
        "image/encoded": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[hostile_gif.read_bytes()])
        ),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[0])),
        "image/filename": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[b"cat/liar.gif"])
        ),
    }
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(example.SerializeToString())
    config = DataConfig(source="tfrecord", path=str(tmp_path), num_classes=2)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"liar.gif.{1,3} holds a 12000"
    ):
        list(data_lib.make_eval_dataset(config, 16, 4))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    # Measured in this process (pytest's own growth included): still far
    # below the ~5 GB of a decode.
    assert grown < 4 * MAX_GROWTH_MIB


def test_only_the_first_frame_of_an_animation_reaches_the_decoder():
    rng = np.random.default_rng(0)
    first = rng.integers(0, 200, (20, 30))
    # A second frame bigger than the screen: the decoder never sees it.
    data = gif_bytes([first, rng.integers(0, 200, (40, 60))], screen=(30, 20))
    contents = tf.constant(data)
    checked, fmt = image_bytes.check_declared_size(contents, "x", 10**6)
    assert len(checked.numpy()) < len(data)
    assert tf.io.decode_gif(checked).shape == (1, 20, 30, 3)
    decoded = image_bytes.decode_to_channels(checked, 3, fmt).numpy()
    with Image.open(io.BytesIO(data)) as image:
        assert image.n_frames == 2
        np.testing.assert_array_equal(decoded, np.asarray(image.convert("RGB")))


def test_gif_without_a_whole_image_is_named():
    data = gif_bytes([np.zeros((8, 8))])
    torn = data[:40]
    _, problem, _ = image_bytes.inspect(tf.constant(torn), image_bytes.GIF)
    assert b"without one whole image" in problem.numpy()
    with pytest.raises(tf.errors.InvalidArgumentError, match="torn.gif is a GIF"):
        image_bytes.check_declared_size(tf.constant(torn), "torn.gif", 10**6)


def test_bmp_that_declares_more_than_it_holds_is_refused_cheaply():
    # A 58-byte BMP whose header says 9000 x 9000 (81 M pixels, under the
    # file limit): TF's BMP decoder checks the data length before it
    # allocates, so this costs no memory.
    header = bytearray(54)
    header[0:2] = b"BM"
    header[10:14] = (54).to_bytes(4, "little")
    header[14:18] = (40).to_bytes(4, "little")
    header[18:22] = (9000).to_bytes(4, "little")
    header[22:26] = (9000).to_bytes(4, "little")
    header[26:28] = (1).to_bytes(2, "little")
    header[28:30] = (24).to_bytes(2, "little")
    data = bytes(header) + b"\0" * 4
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with pytest.raises(tf.errors.InvalidArgumentError):
        image_bytes.decode_to_channels(tf.constant(data), 3)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before < 50


def cmyk_jpeg(path):
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (12, 10, 4), dtype=np.uint8)
    Image.fromarray(pixels, "CMYK").save(path, "JPEG", quality=95)
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"), "float32")


@pytest.mark.parametrize("channels", [1, 3])
def test_cmyk_jpeg_decodes_to_grey_and_rgb(tmp_path, channels):
    rgb = cmyk_jpeg(tmp_path / "print.jpg")
    contents = tf.constant((tmp_path / "print.jpg").read_bytes())
    for decoded in (
        image_bytes.decode_to_channels(contents, channels),
        image_bytes.decode_jpeg(contents, channels),
    ):
        assert decoded.shape == (12, 10, channels)
        # PIL and libjpeg convert CMYK -> RGB with the same formula; a few
        # levels of 255 differ by IDCT rounding.
        want = rgb if channels == 3 else rgb @ [0.2989, 0.5870, 0.1140]
        got = decoded.numpy().astype("float32").reshape(want.shape)
        assert np.abs(got - want).mean() < 3.0


def test_cmyk_jpeg_in_a_one_channel_folder_and_predict(tmp_path):
    from keras_vit.deploy import serving

    for split in ("train", "val"):
        for k, name in enumerate(("a", "b")):
            folder = tmp_path / split / name
            folder.mkdir(parents=True)
            Image.fromarray(np.full((8, 8), 40 * k, "uint8")).save(folder / "0.png")
    cmyk_jpeg(tmp_path / "val" / "b" / "print.jpg")
    config = DataConfig(source="folder", path=str(tmp_path), num_channels=1)
    ((images, _),) = list(data_lib.make_eval_dataset(config, 8, 4))
    assert images.shape == (3, 8, 8, 1)
    pre = {
        "num_channels": 1,
        "pixel_scale": 255.0,
        "image_size": [8, 8],
        "resize_method": "bilinear",
    }
    pixels = serving.load_pixels(str(tmp_path / "val" / "b" / "print.jpg"), pre)
    assert pixels.shape == (1, 8, 8, 1) and np.isfinite(pixels).all()


def test_a_gif_of_one_byte_sub_blocks_is_walked_quickly():
    # 100 KB of 1-byte sub-blocks: 50,000 steps of the block walk. A graph
    # loop took 36 s here; the walk must stay a small cost next to decoding.
    data = (
        b"GIF89a\x01\x00\x01\x00\x00\x00\x00"
        + b"\x2c\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02"
        + b"\x01\x00" * 50_000
        + b"\x00;"
    )
    assert image_bytes.gif_first_frame(data) == (len(data) - 1, 0, 0, 1, 1)
    check = tf.function(lambda c: image_bytes.check_declared_size(c, "x", 10**6))
    check(tf.constant(gif_bytes([np.zeros((2, 2))])))  # traced once
    start = time.perf_counter()
    checked, _ = check(tf.constant(data))
    assert time.perf_counter() - start < 5.0  # 0.2 s on a loaded 2-core machine
    assert checked.numpy() == data


def test_the_serving_check_has_no_python_op():
    # The bytes signature takes JPEG and PNG only: its check must stay
    # saveable, without the GIF walk (a Python op TF Serving cannot run).
    check = tf.function(
        lambda c: image_bytes.check_declared_size(
            c, "x", 10**6, (image_bytes.JPEG, image_bytes.PNG)
        )
    )
    graph = check.get_concrete_function(tf.TensorSpec([], tf.string)).graph
    ops = {op.type for op in graph.get_operations()}
    for function in graph.as_graph_def().library.function:
        ops |= {node.op for node in function.node_def}
    assert not ops & {"PyFunc", "EagerPyFunc", "PyFuncStateless"}
    assert "Assert" in ops  # the format and size checks are there
