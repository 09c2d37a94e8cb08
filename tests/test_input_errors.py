"""What users hand in, refused by name: image folders (classes from the
training split, two at least, UTF-8 names, GIF into 1 channel, hostile
headers), config numbers, damaged weight files and `.keras` files."""

import io
import json
import os
import struct

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from test_run_folder import snapshot
from test_training import tiny

from keras_vit.cli.main import main as cli_main
from keras_vit.errors import CheckpointError
from keras_vit.pretrained.readers import read_checkpoint
from keras_vit.training import data as data_lib
from keras_vit.training.config import DataConfig, override, validate
from keras_vit.training.overrides import parse_overrides


def write_image(path, pixels, fmt="PNG"):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.asarray(pixels, "uint8")).save(path, fmt)


def image_folder(root, splits):
    """`splits`: {split: {class: number of images}}; image i of class c is
    filled with 40 * (index of c in its split) + i."""
    for split, classes in splits.items():
        for k, (name, count) in enumerate(classes.items()):
            for i in range(count):
                write_image(
                    root / split / name / f"{i}.png", np.full((8, 8), 40 * k + i)
                )
    return DataConfig(source="folder", path=str(root), num_channels=1)


def labels_of(config, train=False):
    if train:
        dataset = data_lib.make_train_dataset(config, 8, 4, seed=0).take(1)
    else:
        dataset = data_lib.make_eval_dataset(config, 8, 64)
    return np.concatenate([np.argmax(y, -1) for _, y in dataset])


def test_folder_with_one_class_is_refused(tmp_path):
    config = image_folder(tmp_path, {"train": {"cat": 3}, "val": {"cat": 1}})
    with pytest.raises(ValueError, match="1 class folder.*at least two classes") as e:
        data_lib.class_names(config)
    assert str(tmp_path / "train") in str(e.value)


def test_eval_split_is_labelled_by_the_training_classes(tmp_path):
    config = image_folder(
        tmp_path,
        {"train": {"a": 2, "b": 2, "c": 2}, "val": {"a": 1, "c": 1}},
    )
    assert data_lib.class_names(config) == ["a", "b", "c"]
    # val/c is class 2 as in train, not val's second folder.
    assert sorted(labels_of(config)) == [0, 2]


def test_eval_class_the_training_split_lacks_is_named(tmp_path):
    config = image_folder(
        tmp_path, {"train": {"a": 2, "b": 2}, "val": {"a": 1, "z": 1}}
    )
    with pytest.raises(ValueError, match=r"class folder\(s\) \['z'\]") as error:
        labels_of(config)
    assert str(tmp_path / "val") in str(error.value)


def test_gif_and_bmp_in_a_one_channel_training_set(tmp_path):
    config = image_folder(tmp_path, {"train": {"a": 1, "b": 1}})
    rgb = np.zeros((8, 8, 3), "uint8")
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 200, 100, 50
    write_image(tmp_path / "train" / "a" / "x.gif", rgb, "GIF")
    write_image(tmp_path / "train" / "b" / "x.bmp", rgb, "BMP")
    config = DataConfig(**{**vars(config), "mean": (0.0,), "std": (1.0,)})
    config.pixel_scale = 1.0
    images = []
    for batch, _ in data_lib.make_eval_dataset(
        DataConfig(**{**vars(config), "eval_split": "train"}), 8, 8
    ):
        images.append(batch.numpy())
    values = sorted({float(v) for v in np.concatenate(images)[..., 0].ravel()})
    # PIL's grey of (200, 100, 50) is 125.3; TF weighs 0.2989/0.587/0.114.
    grey = 0.2989 * 200 + 0.587 * 100 + 0.114 * 50
    assert any(abs(v - round(grey)) <= 1 for v in values), values


def test_png_declaring_50000_squared_is_named_not_decoded(tmp_path):
    config = image_folder(tmp_path, {"train": {"a": 1, "b": 1}})
    huge = tmp_path / "train" / "b" / "huge.png"
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((4, 4), "uint8")).save(buffer, "PNG")
    png = bytearray(buffer.getvalue())
    png[16:24] = struct.pack(">II", 50000, 50000)
    huge.write_bytes(bytes(png))
    config = DataConfig(**{**vars(config), "eval_split": "train"})
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        labels_of(config)
    assert f"{huge} declares 50000 x 50000" in error.value.message
    # The CLI's one line for it.
    from keras_vit.cli.common import user_error_line

    line = user_error_line(error.value)
    assert "\n" not in line and f"{huge} declares 50000 x 50000" in line


def test_non_utf8_file_name_is_named(tmp_path):
    config = image_folder(tmp_path, {"train": {"a": 1, "b": 1}})
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((4, 4), "uint8")).save(buffer, "PNG")
    raw = os.path.join(os.fsencode(tmp_path / "train" / "a"), b"caf\xe9.png")
    with open(raw, "wb") as f:
        f.write(buffer.getvalue())
    with pytest.raises(ValueError, match=r"caf\\xe9.png' is not a UTF-8 file"):
        labels_of(config, train=True)


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("data.std", "0", "data.std must be positive, got (0,)"),
        ("data.std", "(0.5, float('nan'))", "data.std must be a tuple, got"),
        ("model.resize_at", "5", "model.resize_at must be ((step, image_size), ...)"),
        ("optim.learning_rate", "nan", "optim.learning_rate must be a float"),
        ("data.mixup_alpha", "1e999", "data.mixup_alpha must be a finite number"),
        ("model.position_embedding", "rope", "model.position_embedding must be one"),
    ],
)
def test_config_numbers_are_checked_by_name(tmp_path, option, value, message):
    with pytest.raises(ValueError) as error:
        validate(tiny(tmp_path, **{option: value}))
    assert message in str(error.value)


def test_shifted_patches_are_refused_on_a_hybrid(tmp_path):
    with pytest.raises(ValueError, match='model.shifted_patches .* kind "vit" only'):
        validate(
            tiny(tmp_path, **{"model.kind": "hybrid", "model.shifted_patches": "1"})
        )


def test_one_number_for_a_per_channel_key_means_every_channel(tmp_path):
    config = validate(tiny(tmp_path, **parse_overrides(["--data.mean", "0.5"])))
    assert config.data.mean == (0.5,)
    config = override(tiny(tmp_path), **{"data.std": "0.25"})
    assert validate(config).data.std == (0.25,)
    with pytest.raises(ValueError, match="data.mean must be a finite number, got nan"):
        validate(override(tiny(tmp_path), **{"data.mean": (float("nan"),)}))


def test_cli_floats_must_be_finite(tmp_path, capsys):
    argv = ["export", str(tmp_path / "m.keras"), "--name", "m", "--mean", "nan"]
    code = cli_main(argv)
    assert code == 2
    assert "'nan' is not a finite number" in capsys.readouterr().err


def safetensors_file(path, header):
    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + b"\0" * 16)
    return path


@pytest.mark.parametrize(
    "entry, named",
    [
        ("not a dict", '"not a dict"'),
        ({"dtype": "F32", "shape": [2]}, '"shape": [2]'),
        ({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}, "[8, 0]"),
    ],
)
def test_malformed_safetensors_header_is_one_line(tmp_path, entry, named):
    path = safetensors_file(tmp_path / "model.safetensors", {"w": entry})
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError) as error:
        read_checkpoint(path)
    message = str(error.value)
    assert "malformed safetensors header: entry 'w'" in message and named in message
    assert str(path) in message and "\n" not in message
    assert snapshot(tmp_path) == before


def test_npy_renamed_npz_is_named(tmp_path):
    path = tmp_path / "weights.npz"
    with open(path, "wb") as f:
        np.save(f, np.zeros(3, "float32"))
    with pytest.raises(CheckpointError, match="is a single .npy array, not an .npz"):
        read_checkpoint(path)
    assert path.stat().st_size > 0


def test_keras_file_with_unknown_class_is_one_line(tmp_path, capsys):
    @keras.saving.register_keras_serializable(package="elsewhere")
    class Mystery(keras.layers.Layer):
        def call(self, x):
            return x

    inputs = keras.Input((16, 16, 1))
    path = tmp_path / "m.keras"
    keras.Model(inputs, Mystery()(inputs)).save(path)
    del keras.saving.get_custom_objects()["elsewhere>Mystery"]
    before = snapshot(tmp_path)
    argv = ["export", str(path), "--name", "m", "--root", str(tmp_path / "out")]
    code = cli_main([*argv, "--mean", "0.5", "--std", "0.5"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    (line,) = err.splitlines()
    assert str(path) in line and "'Mystery'" in line
    assert len(line) < 400  # not the whole model config
    assert snapshot(tmp_path) == before
