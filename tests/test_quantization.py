"""`model.quantize` on keras_vit models: right after building, through a
fresh-process `.keras` reload, and through the SavedModel export."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import assert_close, check_reloads_in_fresh_process
from PIL import Image

import keras_vit
from keras_vit.cli import main
from keras_vit.deploy.export import export_model
from keras_vit.models.preprocessing import normalize_preprocessing
from keras_vit.models.quantization import quantized_copy
from keras_vit.training import outputs
from keras_vit.training.recipes import load_recipe

SMALL = dict(hidden_dim=32, num_layers=2, num_heads=2, mlp_dim=64)


def vit():
    return keras_vit.ViT("Ti/8", image_size=32, num_classes=5, **SMALL)


def hybrid():
    return keras_vit.HybridViT(
        "Ti", 32, 5, stem=(1, 1), stem_width=8, norm_groups=4, **SMALL
    )


def with_random_head(model):
    # The head starts at zero; random weights make the logits worth comparing.
    head = model.get_layer("head")
    rng = np.random.default_rng(1)
    head.set_weights([rng.standard_normal(w.shape) * 0.5 for w in head.get_weights()])
    return model


@pytest.mark.parametrize(
    "build,mode",
    [(vit, "int8"), (vit, "int4"), (vit, "float8"), (hybrid, "int8")],
    ids=["vit-int8", "vit-int4", "vit-float8", "hybrid-int8"],
)
def test_quantize_right_after_building_reloads_in_fresh_process(build, mode, tmp_path):
    keras.utils.set_random_seed(0)
    model = with_random_head(build())
    x = np.random.default_rng(0).random((2, 32, 32, 3)).astype("float32")
    float_logits = np.asarray(model(x))
    model.quantize(mode)
    quantized = [layer for layer in model._flatten_layers() if layer.quantization_mode]
    assert {layer.name for layer in quantized} >= {"qkv", "proj", "fc1", "fc2"}
    assert all(layer.quantization_mode == mode for layer in quantized)
    logits = np.asarray(model(x))
    # The quantized kernels are in use. How close a quantized model stays to
    # the float one is measured on a trained model (the export test below);
    # on random weights int4's 16 levels per channel move logits by ~30%.
    assert not np.array_equal(logits, float_logits)
    check_reloads_in_fresh_process(model, x, tmp_path, relative=0.0)


def test_quantized_copy_leaves_the_original_float():
    model = vit()
    copy = quantized_copy(model, "int8")
    assert copy.get_layer("block_0").attention.qkv.quantization_mode == "int8"
    assert model.get_layer("block_0").attention.qkv.quantization_mode is None


def test_unknown_mode_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="'int2'.*int8, int4, float8"):
        quantized_copy(vit(), "int2")


def test_int8_export_serves_both_signatures_with_parity(digits_model, tmp_path):
    model, x_test, _, labels = digits_model
    pixels = (x_test * 0.5 + 0.5) * 255.0
    preprocessing = {"mean": [0.5], "std": [0.5], "resize_method": "nearest"}
    metadata = export_model(
        model,
        "digits_quantized",
        tmp_path,
        labels=labels,
        preprocessing=preprocessing,
        tflite=(),
        verify_images=pixels,
        quantize="int8",
    )
    assert metadata["quantization"] == "int8"
    parity = metadata["parity"]
    assert parity["quantized_vs_float"]["top1_agreement"] >= 0.99
    reloaded = keras.saving.load_model(tmp_path / "digits_quantized.keras")
    assert reloaded.get_layer("head").quantization_mode == "int8"
    expected = reloaded.predict(x_test, verbose=0)
    # The SavedModel normalises pixels in its graph; a one-ulp difference in
    # an activation can cross an int8 rounding step of the on-the-fly input
    # quantization, so logits agree to a few percent of their scale, not ulps.
    scale = np.abs(expected).max()
    assert parity["saved_model"]["max_abs_diff_logits"] < 0.05 * scale
    assert parity["saved_model"]["top1_agreement"] >= 0.99

    served = tf.saved_model.load(str(tmp_path / "digits_quantized" / "1"))
    logits = served.signatures["serving_default"](pixels=pixels[:8])["logits"]
    assert_close(logits, expected[:8], 0.05, scale=scale)
    png = tmp_path / "digit.png"
    Image.fromarray(np.round(pixels[0, ..., 0]).astype("uint8"), mode="L").save(png)
    top = served.signatures["classify_images"](images=tf.constant([png.read_bytes()]))
    assert int(top["class_ids"][0, 0]) == int(np.argmax(logits[0]))


def test_cli_export_quantize(digits_model, tmp_path, capsys):
    model, _, _, labels = digits_model
    (tmp_path / "run").mkdir()
    model.save(tmp_path / "run" / "model.keras")
    preprocessing = {"mean": [0.5], "std": [0.5], "resize_method": "nearest"}
    (tmp_path / "run" / "metadata.json").write_text(
        json.dumps({"labels": labels, "preprocessing": preprocessing})
    )
    root = tmp_path / "saved"
    argv = [str(tmp_path / "run" / "model.keras"), "--name", "d", "--root", str(root)]
    assert main(["export", *argv, "--tflite", "", "--quantize", "int4"]) == 0
    metadata = json.loads((root / "d" / "metadata.json").read_text())
    assert metadata["quantization"] == "int4"
    assert "quantized_vs_float" in metadata["parity"]
    capsys.readouterr()
    assert main(["export", *argv, "--quantize", "int2"]) == 2
    assert "invalid choice: 'int2'" in capsys.readouterr().err
    # Without --tflite: the SavedModel alone, said in one line.
    assert main(["export", *argv, "--quantize", "int8"]) == 0
    assert "no .tflite files: a --quantize int8 export" in capsys.readouterr().out
    assert not list(root.glob("*.tflite"))
    # With TFLite kinds named: refused before any work, naming the way out.
    assert main(["export", *argv, "--quantize", "int8", "--tflite", "float32"]) == 2
    assert "pass tflite=() with it" in capsys.readouterr().err


def test_a_recipe_with_export_quantize_exports_its_savedmodel(digits_model, tmp_path):
    model, _, _, labels = digits_model
    overrides = {"export_quantize": "int8", "export_name": "dq"}
    config = load_recipe("digits", {**overrides, "export_root": str(tmp_path)})
    preprocessing = normalize_preprocessing(
        model, {"mean": [0.5], "std": [0.5], "resize_method": "nearest"}
    )
    metadata = outputs._export(model, config, labels, preprocessing)
    assert metadata["quantization"] == "int8"
    assert (tmp_path / "dq" / "1" / "saved_model.pb").is_file()
    assert not list(tmp_path.glob("*.tflite"))


def test_training_config_export_quantize_is_validated():
    import dataclasses

    from keras_vit.training.config import validate
    from keras_vit.training.recipes import load_recipe

    config = load_recipe("digits", {})
    assert validate(dataclasses.replace(config, export_quantize="int8"))
    with pytest.raises(ValueError, match="export_quantize must be one of .*'int2'"):
        validate(dataclasses.replace(config, export_quantize="int2"))
