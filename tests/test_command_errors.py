"""predict / evaluate / visualize errors a user causes are one line naming
the file or value: damaged or foreign model files, metadata without labels,
folders where files belong, models that take no images, ANSI escapes in
Keras messages, a batch size of 0."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_vit.cli.common import user_error_line
from keras_vit.cli.main import main as cli_main
from keras_vit.deploy import serving

PRE = {
    "image_size": [8, 8],
    "num_channels": 1,
    "mean": [0.5],
    "std": [0.5],
    "pixel_scale": 255.0,
    "resize_method": "nearest",
}


def image_model():
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Flatten()(inputs)
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))


@pytest.fixture
def run_folder(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    image_model().save(folder / "model.keras")
    (folder / "metadata.json").write_text(
        json.dumps({"labels": ["a", "b", "c"], "preprocessing": PRE})
    )
    image = tmp_path / "x.png"
    Image.fromarray(np.full((8, 8), 9, "uint8")).save(image)
    return folder, image


def one_error_line(capsys, argv):
    code = cli_main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_metadata_without_labels_or_with_too_few(run_folder, capsys):
    folder, image = run_folder
    metadata = folder / "metadata.json"
    metadata.write_text(json.dumps({"preprocessing": PRE}))
    line = one_error_line(capsys, ["predict", str(folder / "model.keras"), str(image)])
    assert "metadata.json' has no labels" in line
    metadata.write_text(json.dumps({"labels": ["a"], "preprocessing": PRE}))
    line = one_error_line(capsys, ["predict", str(folder / "model.keras"), str(image)])
    assert "names 1 labels but the model scores 3 classes" in line
    metadata.write_text("{not json")
    line = one_error_line(capsys, ["predict", str(folder / "model.keras"), str(image)])
    assert "metadata.json' is not valid JSON" in line


def test_damaged_saved_model_and_foreign_tflite(tmp_path, run_folder, capsys):
    _, image = run_folder
    damaged = tmp_path / "sm"
    damaged.mkdir()
    (damaged / "saved_model.pb").write_bytes(b"\x08\x01garbage" * 10)
    (damaged / "metadata.json").write_text(
        json.dumps({"labels": ["a", "b", "c"], "preprocessing": PRE})
    )
    line = one_error_line(capsys, ["predict", str(damaged), str(image)])
    assert "cannot run SavedModel" in line and str(damaged) in line
    garbage = tmp_path / "garbage.tflite"
    garbage.write_bytes(b"TFL3" + b"\0" * 60)
    (tmp_path / "metadata.json").write_text(
        json.dumps({"labels": ["a", "b", "c"], "preprocessing": PRE})
    )
    line = one_error_line(capsys, ["predict", str(garbage), str(image)])
    assert "cannot run .tflite file" in line and "garbage.tflite" in line
    # A real .tflite file that keras_vit did not write (its input is not
    # `pixels`).
    function = tf.function(
        lambda x: {"scores": tf.nn.softmax(tf.reshape(x, (-1, 64))[:, :3])},
        input_signature=[tf.TensorSpec((1, 8, 8, 1), tf.float32, name="x")],
    )
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [function.get_concrete_function()], function
    )
    foreign = tmp_path / "foreign.tflite"
    foreign.write_bytes(converter.convert())
    line = one_error_line(capsys, ["predict", str(foreign), str(image)])
    assert "foreign.tflite" in line and "not written by keras_vit" in line


def test_truncated_keras_file_is_called_damaged(run_folder, capsys):
    folder, image = run_folder
    model = folder / "model.keras"
    model.write_bytes(model.read_bytes()[:3000])
    for argv in (
        ["evaluate", str(model), "--out", str(folder / "e")],
        ["visualize", str(model), str(image), "--out", str(folder / "v")],
    ):
        line = one_error_line(capsys, argv)
        assert "the file is damaged" in line and "File not found" not in line


def test_folders_where_files_belong(tmp_path, run_folder, capsys):
    folder, image = run_folder
    line = one_error_line(capsys, ["predict", str(folder / "model.keras"), str(folder)])
    assert "is a folder; pass image files" in line and "does not exist" not in line
    (tmp_path / "dir.keras").mkdir()
    line = one_error_line(capsys, ["evaluate", str(tmp_path / "dir.keras")])
    assert "is a folder, not a .keras file" in line


def test_model_without_an_image_input(tmp_path, capsys):
    inputs = keras.Input((10,))
    keras.Model(inputs, keras.layers.Dense(3)(inputs)).save(tmp_path / "dense.keras")
    line = one_error_line(capsys, ["evaluate", str(tmp_path / "dense.keras")])
    assert "takes inputs of shape (None, 10), not one batch of images" in line
    assert "unpack" not in line


def test_evaluate_batch_size_zero(run_folder, capsys):
    folder, _ = run_folder
    line = one_error_line(
        capsys, ["evaluate", str(folder / "model.keras"), "--batch-size", "0"]
    )
    assert "--batch-size 0" in line


def test_ansi_escapes_and_assert_escapes_are_removed():
    error = ValueError("\x1b[1mLayer 'head'\x1b[0m expected \x1b[31m2\x1b[0m inputs")
    assert user_error_line(error) == "Layer 'head' expected 2 inputs"

    # As the data pipeline's checks fail: a graph Assert, which C-escapes.
    @tf.function
    def check():
        tf.debugging.Assert(False, [tf.constant("image 'caf\u00e9.png' is bad")])

    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        check()
    assert user_error_line(raised.value) == "image 'caf\u00e9.png' is bad"


def test_load_keras_file_names_a_damaged_file(tmp_path):
    path = tmp_path / "m.keras"
    image_model().save(path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match="m.keras': the file is damaged, its 100"):
        serving.load_keras_file(path)
