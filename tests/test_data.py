"""tf.data pipelines: sources, determinism, resuming, augmentation, errors."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import assert_close
from PIL import Image

from keras_vit.training import config as config_lib
from keras_vit.training import data, sources

TINY = dict(source="synthetic", num_channels=3, num_classes=4, synthetic_size=24)
MIXED = dict(TINY, crop_scale_min=0.3, flip=True, mixup_alpha=0.8, cutmix_alpha=1.0)


def batches(dataset, n):
    iterator = iter(dataset)
    return [tuple(t.numpy() for t in next(iterator)) for _ in range(n)]


def write_folder(root, split, per_class=3, size=(20, 28), fmt="PNG"):
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (root / split / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
            suffix = "png" if fmt == "PNG" else "jpg"
            Image.fromarray(pixels).save(root / split / name / f"{i}.{suffix}", fmt)


def test_digits_split_is_stratified_and_covers_every_digit_once():
    from sklearn.datasets import load_digits

    digits = load_digits()
    split = sources.digits_arrays()
    assert split["x_train"].shape == (1437, 8, 8, 1)
    assert split["x_eval"].shape == (360, 8, 8, 1)
    assert split["x_train"].dtype == np.float32 and split["x_eval"].max() == 255.0
    # Every digit lands on exactly one side, pixels scaled from 0..16 ink.
    together = np.concatenate([split["x_train"], split["x_eval"]])[..., 0]
    original = (digits.images * (255.0 / 16.0)).astype("float32")
    order = np.lexsort(together.reshape(len(together), -1).T)
    expected_order = np.lexsort(original.reshape(len(original), -1).T)
    np.testing.assert_array_equal(together[order], original[expected_order])
    # Stratified: each class's held-out share is 20% of it, give or take one.
    counts = np.bincount(digits.target, minlength=10)
    eval_counts = np.bincount(split["y_eval"], minlength=10)
    assert np.all(np.abs(eval_counts - 0.2 * counts) <= 1)
    np.testing.assert_array_equal(sources.digits_arrays()["y_eval"], split["y_eval"])


def test_digits_eval_split_is_the_shared_fixture_convention():
    config = config_lib.DataConfig(
        source="digits", num_channels=1, resize_method="nearest"
    )
    images, labels = zip(*data.make_eval_dataset(config, 16, 100), strict=True)
    images, labels = np.concatenate(images), np.concatenate(labels)
    # tests/conftest.py's digits_model: the package's split, each pixel 2x2.
    split = sources.digits_arrays()
    pixels = np.kron(split["x_eval"][..., 0], np.ones((2, 2)))[..., None]
    x_test, y_test = (pixels / 255.0 - 0.5) / 0.5, split["y_eval"]
    assert images.shape == (360, 16, 16, 1)
    # tf.image.resize and normalisation in float32 against float64 numpy.
    assert_close(images, x_test, 1e-6)
    np.testing.assert_array_equal(labels.argmax(-1), y_test)
    assert data.preprocessing(config, 16) == {
        "image_size": [16, 16],
        "num_channels": 1,
        "mean": [0.5],
        "std": [0.5],
        "pixel_scale": 255.0,
        "resize_method": "nearest",
        "crop_fraction": 1.0,
        "keep_aspect_ratio": False,
        "antialias": False,
    }


def test_train_stream_is_deterministic_and_resumes_at_any_step():
    config = config_lib.DataConfig(**MIXED)
    # 5 batches of 8 cross the 24-image epoch boundary.
    first = batches(data.make_train_dataset(config, 16, 8, seed=3), 5)
    resumed = batches(data.make_train_dataset(config, 16, 8, seed=3, start_step=3), 2)
    other_seed = batches(data.make_train_dataset(config, 16, 8, seed=4), 1)
    for a, b in zip(first[3:], resumed, strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(first[0][0], other_seed[0][0])
    images, labels = first[0]
    assert images.shape == (8, 16, 16, 3) and images.dtype == np.float32
    assert labels.shape == (8, 4)
    # Mixed one-hot rows: float32 sums of values of order one.
    assert_close(labels.sum(-1), 1.0, 1e-5)
    assert np.any((labels > 0.01) & (labels < 0.99)), "MixUp/CutMix give soft labels"


def test_epoch_is_a_permutation_of_the_training_set():
    config = config_lib.DataConfig(source="digits", num_channels=1)
    ((images, labels),) = batches(data.make_train_dataset(config, 8, 1437, seed=0), 1)
    train = sources.digits_arrays()
    # One epoch holds every training image once: the same label counts and
    # the same set of images, in another order.
    np.testing.assert_array_equal(
        np.bincount(labels.argmax(-1), minlength=10), np.bincount(train["y_train"])
    )
    assert not np.array_equal(labels.argmax(-1), train["y_train"])
    pixels = images.reshape(1437, -1) * 0.5 + 0.5
    expected = tf.image.resize(train["x_train"], (8, 8)).numpy().reshape(1437, -1) / 255
    # Sums of 64 pixels in float32, in another order: 1e-6 of their scale.
    assert_close(np.sort(pixels.sum(-1)), np.sort(expected.sum(-1)), 1e-6)


def test_randaugment_is_seeded_per_element_and_stays_in_range():
    plain = config_lib.DataConfig(**TINY)
    heavy = config_lib.DataConfig(
        **dict(TINY, randaugment_ops=2, randaugment_magnitude=0.9)
    )
    ((a, _),) = batches(data.make_train_dataset(plain, 16, 4, seed=0), 1)
    b = batches(data.make_train_dataset(heavy, 16, 4, seed=0), 2)
    resumed = batches(data.make_train_dataset(heavy, 16, 4, seed=0, start_step=1), 1)
    np.testing.assert_array_equal(b[1][0], resumed[0][0])
    assert np.abs(a - b[0][0]).mean() > 0.05
    assert b[0][0].min() >= -1.0 - 1e-5 and b[0][0].max() <= 1.0 + 1e-5


def test_image_folder_reads_classes_and_center_crops(tmp_path):
    write_folder(tmp_path, "train")
    write_folder(tmp_path, "val", per_class=2, fmt="JPEG")
    config = config_lib.DataConfig(source="folder", path=str(tmp_path), eval_crop=0.875)
    assert data.class_names(config) == ["cat", "dog"]
    ((images, labels),) = batches(data.make_train_dataset(config, 16, 4, seed=0), 1)
    assert images.shape == (4, 16, 16, 3) and labels.shape == (4, 2)
    evaluated = list(data.make_eval_dataset(config, 16, 3))
    assert [len(x) for x, _ in evaluated] == [3, 1]
    assert evaluated[0][1].numpy().argmax(-1).tolist() == [0, 0, 1]


def test_corrupt_image_error_names_the_file(tmp_path):
    write_folder(tmp_path, "train")
    bad = tmp_path / "train" / "dog" / "broken.jpg"
    good = (tmp_path / "train" / "dog" / "0.png").read_bytes()
    bad.write_bytes(good[: len(good) // 2])  # a truncated download
    (tmp_path / "train" / "cat" / "notes.png").write_text("not an image")
    config = config_lib.DataConfig(source="folder", path=str(tmp_path))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="cannot decode image file"
    ):
        batches(data.make_train_dataset(config, 8, 8, seed=0), 1)
    try:
        batches(data.make_train_dataset(config, 8, 8, seed=0), 1)
    except tf.errors.InvalidArgumentError as error:
        assert str(bad) in str(error) or str(tmp_path / "train/cat/notes.png") in str(
            error
        )

    skipping = config_lib.DataConfig(
        source="folder", path=str(tmp_path), on_error="skip"
    )
    dataset = data.make_train_dataset(skipping, 8, 6, seed=0)
    # Two batches of 6 need more than one epoch of the 6 good files, so both
    # bad files have been read whatever order the shuffle gave (one batch was
    # flaky: it can fill before the second bad file comes up).
    for images, _ in batches(dataset, 2):
        assert np.isfinite(images).all()
    assert int(dataset.skipped_images.numpy()) >= 2


def test_tfrecords_round_trip_the_schema(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    labels = np.array([0, 1, 2, 0, 1, 2])
    files = sources.write_tfrecords(images, labels, tmp_path, "val", num_shards=2)
    sources.write_tfrecords(images, labels, tmp_path, "train")
    assert [f.rsplit("/", 1)[1] for f in files] == [
        "val-00000-of-00002.tfrecord",
        "val-00001-of-00002.tfrecord",
    ]
    config = config_lib.DataConfig(
        source="tfrecord", path=str(tmp_path), num_classes=3, mean=(0.0,), std=(1.0,)
    )
    got = np.concatenate([x for x, _ in data.make_eval_dataset(config, 8, 6)])
    # Shards interleave by file: examples 0, 2, 4 then 1, 3, 5.
    # Whole pixel levels divided by 255 and multiplied back in float32.
    assert_close(got * 255.0, images[[0, 2, 4, 1, 3, 5]], 1e-6)
    ((train_images, train_labels),) = batches(
        data.make_train_dataset(config, 8, 6, 0), 1
    )
    assert train_images.shape == (6, 8, 8, 3) and train_labels.sum() == 6


def test_arrays_from_npz(tmp_path):
    x = np.random.default_rng(0).uniform(0, 255, (10, 8, 8, 1)).astype("float32")
    y = np.arange(10) % 5
    np.savez(tmp_path / "a.npz", x_train=x, y_train=y, x_eval=x[:4], y_eval=y[:4])
    config = config_lib.DataConfig(
        source="arrays", path=str(tmp_path / "a.npz"), num_channels=1
    )
    ((images, labels),) = list(data.make_eval_dataset(config, 8, 4))
    # float32 against float64 normalisation of the same pixels.
    assert_close(images, (x[:4] / 255.0 - 0.5) / 0.5, 1e-6)
    assert labels.shape == (4, 5)


def test_tfds_without_the_package_is_a_clear_error():
    try:
        import tensorflow_datasets  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="pip install tensorflow-datasets"):
            data.make_eval_dataset(
                config_lib.DataConfig(source="tfds", path="cifar10"), 32, 8
            )
    else:
        with pytest.raises(ValueError, match="not available locally"):
            data.make_eval_dataset(
                config_lib.DataConfig(source="tfds", path="no_such_dataset_xyz"), 32, 8
            )


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"source": "csv"}, r"data.source must be one of \['digits', 'synthetic'"),
        ({"mixup_alpha": -1.0}, r"data.mixup_alpha must be in >= 0.0, got -1.0"),
        ({"crop_scale_min": 0.0}, r"data.crop_scale_min must be in \[1e-06, 1.0\]"),
        ({"on_error": "ignore"}, r"data.on_error must be one of \['raise', 'skip'\]"),
        ({"mean": (0.5, 0.5)}, "data.mean and data.std need 1 or num_channels"),
        ({"source": "folder"}, "source='folder' needs data.path"),
    ],
)
def test_bad_data_config_names_the_key_and_valid_values(changes, message):
    with pytest.raises(ValueError, match=message):
        config_lib.validate_data_config(config_lib.DataConfig(**changes))


def test_missing_folder_says_what_layout_is_expected(tmp_path):
    config = config_lib.DataConfig(source="folder", path=str(tmp_path))
    with pytest.raises(ValueError, match="one folder per split"):
        data.make_train_dataset(config, 8, 2, seed=0)


def test_rand_augment_runs_the_drawn_operations_deterministically():
    """Per element: the same seed gives the same image, another seed another
    one; pixels stay in range and the shape is kept."""
    import tensorflow as tf

    from keras_vit.training.augment import Augmenter

    augmenter = Augmenter((24, 24), randaugment_ops=2, randaugment_magnitude=0.9)
    image = tf.random.stateless_uniform((24, 24, 3), (1, 2), 0, 255)
    outputs = [augmenter.element(image, tf.constant(i)).numpy() for i in (0, 0, 1, 2)]
    np.testing.assert_array_equal(outputs[0], outputs[1])
    assert not np.array_equal(outputs[0], outputs[2]) or not np.array_equal(
        outputs[0], outputs[3]
    )
    for out in outputs:
        assert out.shape == (24, 24, 3) and out.dtype == np.float32
        assert out.min() >= 0.0 and out.max() <= 255.0 + 1e-3
