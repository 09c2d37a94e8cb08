"""NaN and Inf never pass as results: held-out or training images that hold
them are named before anything runs on them (train and evaluate), a model
whose weights hold them gives an error, not "accuracy 0.1000" or `nan`
probabilities, and `convert` refuses a checkpoint holding them by tensor."""

import json
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import load_file, save_file

from keras_vit.analysis import evaluation
from keras_vit.cli.main import main as cli_main
from keras_vit.errors import CheckpointError
from keras_vit.pretrained.convert import convert_checkpoint
from keras_vit.training import data as data_lib
from keras_vit.training.config import DataConfig

FIXTURES = Path(__file__).parent / "fixtures"
PRE = {
    "image_size": [8, 8],
    "num_channels": 1,
    "mean": [0.5],
    "std": [0.5],
    "pixel_scale": 255.0,
    "resize_method": "nearest",
}


def arrays(bad_split=None, index=3, value=np.inf):
    rng = np.random.default_rng(0)
    split = {
        "x_train": rng.uniform(0, 255, (20, 8, 8, 1)).astype("float32"),
        "y_train": np.arange(20) % 2,
        "x_eval": rng.uniform(0, 255, (10, 8, 8, 1)).astype("float32"),
        "y_eval": np.arange(10) % 2,
    }
    if bad_split:
        split[bad_split][index, 2, 5, 0] = value
    return split


@pytest.mark.parametrize(
    "split, value", [("x_eval", np.inf), ("x_train", np.nan), ("x_eval", -np.inf)]
)
def test_non_finite_pixels_are_named_where_they_enter(tmp_path, split, value):
    path = tmp_path / "data.npz"
    np.savez(path, **arrays(split, 7, value))
    config = DataConfig(source="arrays", path=str(path), num_channels=1)
    make = (
        (lambda: data_lib.make_train_dataset(config, 8, 4, seed=0))
        if split == "x_train"
        else (lambda: data_lib.make_eval_dataset(config, 8, 4))
    )
    with pytest.raises(ValueError, match=rf"{split} of data.path .*data.npz.*image 7"):
        make()


def small_model(nan_weights=False):
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Flatten()(inputs)
    outputs = keras.layers.Dense(2, activation="softmax", name="head")(x)
    model = keras.Model(inputs, outputs)
    if nan_weights:
        kernel, bias = model.get_layer("head").get_weights()
        kernel[3, 1] = np.nan
        model.get_layer("head").set_weights([kernel, bias])
    return model


def test_evaluation_refuses_non_finite_images_and_scores():
    x, y = arrays()["x_eval"], arrays()["y_eval"]
    bad = x.copy()
    bad[4, 0, 0, 0] = np.inf
    with pytest.raises(ValueError, match="held-out example 4 .*NaN or Inf pixels"):
        evaluation.evaluate(small_model(), (bad, y), batch_size=3)
    with pytest.raises(ValueError, match="held-out example 0 .*NaN or Inf scores"):
        evaluation.evaluate(small_model(nan_weights=True), (x, y), batch_size=3)
    assert 0.0 <= evaluation.evaluate(small_model(), (x, y)).accuracy <= 1.0


def saved(model, folder):
    folder.mkdir()
    model.save(folder / "model.keras")
    metadata = {"labels": ["a", "b"], "preprocessing": PRE}
    (folder / "metadata.json").write_text(json.dumps(metadata))
    return folder / "model.keras"


def test_cli_evaluate_names_the_inf_image_and_exits_2(tmp_path, capsys):
    model = saved(small_model(), tmp_path / "run")
    np.savez(tmp_path / "data.npz", **arrays("x_eval", 2))
    argv = ["evaluate", str(model), "--data", "arrays"]
    argv += ["--data-path", str(tmp_path / "data.npz"), "--out", str(tmp_path / "e")]
    code = cli_main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and "accuracy" not in out
    (line,) = err.strip().splitlines()
    assert "x_eval of data.path" in line and "image 2 (of 10)" in line


def test_cli_predict_refuses_nan_probabilities(tmp_path, capsys):
    model = saved(small_model(nan_weights=True), tmp_path / "run")
    image = tmp_path / "x.png"
    Image.fromarray(np.full((8, 8), 9, "uint8")).save(image)
    code = cli_main(["predict", str(model), str(image)])
    out, err = capsys.readouterr()
    assert code == 2 and "nan" not in out.lower()
    # stderr: predict's note on its XLA choice, then the one error line.
    (line,) = [text for text in err.splitlines() if "error:" in text]
    assert "NaN or Inf probabilities for image 0" in line and "model.keras" in line


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_convert_refuses_non_finite_weights_by_tensor(tmp_path, capsys, value):
    folder = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "timm_deit3", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    name = sorted(k for k in tensors if k.endswith("attn.qkv.weight"))[0]
    tensors[name][0, :2] = value
    save_file(tensors, str(folder / "model.safetensors"))
    out = tmp_path / "out.keras"
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' .* holds 2 NaN"):
        convert_checkpoint(folder / "model.safetensors", out)
    assert not out.exists()
    code = cli_main(["convert", str(folder / "model.safetensors"), str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and name in err
    assert not out.exists()
