"""`keras-vit`: most behaviour in-process through `main([...])`, a couple of
real console-script runs, and the FLOP / parameter counting behind `info`."""

import json
import os
import re
import shutil
import subprocess

import keras
import numpy as np
import pytest
from helpers import FLOAT32_PARITY, REPO, assert_close, near_ties, parity_bound
from PIL import Image

import keras_vit
from keras_vit.analysis import flops, visualize
from keras_vit.cli import main

COMMANDS = ("train", "evaluate", "export", "predict", "convert", "visualize", "bench")
COMMANDS += ("info",)
# TensorFlow's C++ runtime logs a few lines at import, before any of our
# code runs (whatever TF_CPP_MIN_LOG_LEVEL says); they are not ours.
TF_NATIVE_LOG = re.compile(r"^(WARNING: All log messages|[IWE]\d{4} |To enable the)")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_has_help(capsys, command):
    code, out, err = run(capsys, command, "--help")
    assert code == 0, err
    assert out.startswith(f"usage: keras-vit {command}")
    assert err == ""


def test_top_level_help_lists_every_subcommand(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in COMMANDS:
        assert re.search(rf"^\s+{command}\s", out, re.M), command


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["visualize", "missing.keras", "x.png"],
            "model 'missing.keras' does not exist",
        ),
        (["evaluate", "missing.keras"], "model 'missing.keras' does not exist"),
        (["export", "missing.keras", "--name", "m"], "model 'missing.keras' does not"),
        (["predict", "missing_dir", "x.png"], "model 'missing_dir' does not exist"),
        (["convert", "missing.safetensors", "out.keras"], "No checkpoint at"),
        (["info", "missing.keras"], "model 'missing.keras' does not exist"),
        (["info", "Q/16"], "Unknown ViT variant 'Q/16'; valid sizes are Ti, S, B"),
        (["info", "B/16", "--bogus"], "unrecognized arguments: --bogus"),
        (["info", "B/16", "--image-size", "big"], "argument --image-size: invalid int"),
        (["visualize"], "the following arguments are required: model, image"),
        (["train", "no_such_recipe"], "No recipe 'no_such_recipe'; valid recipes"),
        (["train", "--optim.learning_rate", "fast"], "must be a float, got 'fast'"),
        (["train", "--no_such_key", "1"], "Unknown config key 'no_such_key'"),
        (["bench", "--bogus"], "unrecognized arguments: --bogus"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1, err
    command = argv[0] if argv[0] in COMMANDS else None
    prefix = f"keras-vit {command}: error: " if command else "keras-vit: error: "
    assert lines[0].startswith(prefix), lines[0]
    assert message in lines[0]
    assert "Traceback" not in out + err


def test_traceback_flag_shows_the_exception(capsys):
    with pytest.raises(Exception, match="model 'missing.keras' does not exist"):
        main(["--traceback", "info", "missing.keras"])


def test_info_b16_prints_summary_parameters_and_flops(capsys):
    code, out, _ = run(capsys, "info", "B/16")
    assert code == 0
    assert "block_11 (TransformerBlock)" in out  # the model summary
    assert "parameters: 86,567,656" in out
    # 17.56 GMACs: the "about 17.6 GMACs / 35.1 GFLOPs" of the literature.
    assert "17.56 GMACs = 35.13 GFLOPs" in out
    keras.backend.clear_session()


def test_info_hybrid_counts_the_stem(capsys):
    code, out, err = run(
        capsys,
        "info",
        "Ti/32",
        "--hybrid-stem",
        "R26",
        "--image-size",
        "64",
        "--num-classes",
        "10",
        "--no-summary",
    )
    assert code == 0, err
    model = keras_vit.HybridViT("Ti/32", image_size=64, num_classes=10, stem="R26")
    assert f"parameters: {model.count_params():,}" in out
    macs = flops.count_macs(model)
    assert macs > flops.vit_macs("Ti/32", 64, 10)  # the stem's convolutions
    assert f"{macs / 1e9:.2f} GMACs = {2 * macs / 1e9:.2f} GFLOPs" in out
    keras.backend.clear_session()


def digits_png(x_test, index, path):
    """One held-out digit as the 8-bit PNG a user would have."""
    pixels = np.round((x_test[index, ..., 0] * 0.5 + 0.5) * 255).astype("uint8")
    Image.fromarray(pixels, mode="L").save(path)
    return (pixels[..., None] / 255.0 - 0.5) / 0.5


def test_visualize_writes_attention_and_rollout_pngs_for_a_digit(
    capsys, digits_model, tmp_path
):
    model, x_test, _, _ = digits_model
    model.save(tmp_path / "digits.keras")
    image = digits_png(x_test, 3, tmp_path / "digit.png")
    out = tmp_path / "maps"
    code, stdout, err = run(
        capsys,
        "visualize",
        str(tmp_path / "digits.keras"),
        str(tmp_path / "digit.png"),
        "--out",
        str(out),
        "--all",
    )
    assert code == 0, err
    assert "no metadata.json" in stdout  # the default normalisation is said
    pngs = [
        "digit_attention_block0.png",
        "digit_attention_block1.png",
        "digit_rollout.png",
        "digit_attention_distance.png",
        "position_embedding_similarity.png",
    ]
    for name in pngs:
        assert f"wrote {out / name}" in stdout
        with Image.open(out / name) as png:
            png.load()
            assert png.format == "PNG" and min(png.size) > 100
    rollout = np.load(out / "digit_rollout.npy")
    assert rollout.shape == (4, 4)  # the 16x16 digit in 4x4-pixel patches
    assert rollout.sum() == pytest.approx(1.0, abs=1e-9)
    # The command's model is its own reload of the file: reassociation.
    expected = visualize.attention_rollout(model, image.astype("float32"))
    assert_close(rollout, expected, FLOAT32_PARITY)
    assert np.load(out / "digit_attention_distance.npy").shape == (2, 4)

    code, _, err = run(
        capsys,
        "visualize",
        str(tmp_path / "digits.keras"),
        str(tmp_path / "digit.png"),
        "--out",
        str(out),
        "--block",
        "5",
    )
    assert code == 2 and "--block 5 is out of range" in err
    (tmp_path / "not_an_image.png").write_text("hello")
    code, _, err = run(
        capsys,
        "visualize",
        str(tmp_path / "digits.keras"),
        str(tmp_path / "not_an_image.png"),
    )
    assert code == 2 and "cannot decode image" in err and len(err.splitlines()) == 1


def save_with_metadata(model, folder, labels):
    """A model as a training run leaves it: model.keras + metadata.json."""
    folder.mkdir()
    model.save(folder / "model.keras")
    preprocessing = {
        "image_size": [16, 16],
        "num_channels": 1,
        "mean": [0.5],
        "std": [0.5],
        "pixel_scale": 255.0,
        "resize_method": "nearest",
    }
    metadata = {"labels": labels, "preprocessing": preprocessing}
    (folder / "metadata.json").write_text(json.dumps(metadata))
    return folder / "model.keras"


def test_evaluate_on_the_held_out_digits(capsys, digits_model, tmp_path):
    model, x_test, y_test, labels = digits_model
    path = save_with_metadata(model, tmp_path / "run", labels)
    out = tmp_path / "eval"
    code, stdout, err = run(capsys, "evaluate", str(path), "--out", str(out))
    assert code == 0, err
    report = json.loads((out / "evaluation.json").read_text())
    # data.py's digits held-out split is the fixture's x_test, in order.
    logits = model.predict(x_test, verbose=0)
    expected = np.mean(logits.argmax(1) == y_test)
    assert report["num_examples"] == len(y_test) == 360
    # The command reloads the file and batches on its own: a near tie may
    # rank either way (helpers.assert_same_top1).
    ties = near_ties(logits, parity_bound(logits, FLOAT32_PARITY))
    assert abs(report["accuracy"] - expected) <= ties / 360
    assert f"accuracy: {expected:.4f}" in stdout
    assert report["labels"] == labels
    assert np.asarray(report["confusion_matrix"]).sum() == 360
    with Image.open(out / "confusion_matrix.png") as png:
        assert png.format == "PNG"


@pytest.mark.slow
def test_export_then_predict_a_digit(capsys, digits_model, tmp_path):
    model, x_test, _, labels = digits_model
    path = save_with_metadata(model, tmp_path / "run", labels)
    root = tmp_path / "saved_models"
    code, stdout, err = run(
        capsys,
        "export",
        str(path),
        "--name",
        "digits",
        "--root",
        str(root),
        "--tflite",
        "",
    )
    assert code == 0, err
    assert (root / "digits" / "1" / "saved_model.pb").is_file()
    image = digits_png(x_test, 7, tmp_path / "seven.png")
    expected = labels[int(model.predict(image[None], verbose=0).argmax())]
    code, stdout, err = run(
        capsys,
        "predict",
        str(root / "digits"),
        str(tmp_path / "seven.png"),
        "--top-k",
        "3",
    )
    assert code == 0, err
    line = stdout.strip().splitlines()[-1]
    assert line.startswith(f"{tmp_path / 'seven.png'}: {expected} ")
    assert len(line.split(", ")) == 3


def test_convert_a_hugging_face_checkpoint(capsys, tmp_path):
    fixture = REPO / "tests" / "fixtures" / "hf_vit"
    out = tmp_path / "hf.keras"
    code, stdout, err = run(capsys, "convert", str(fixture), str(out))
    assert code == 0, err
    assert f"wrote {out}" in stdout
    parity = np.load(fixture / "parity.npz")
    model = keras.saving.load_model(out)
    # The source library's logits, made by torch on another CPU.
    assert_close(model.predict(parity["images"], verbose=0), parity["logits"], 1e-4)


@pytest.mark.parametrize(
    "argv", [("digits", "--keys"), ("--keys",), ("digits", "--smoke", "--keys")]
)
def test_train_keys_lists_every_key_with_type_and_recipe_value(capsys, argv):
    from keras_vit.training.config import config_keys
    from keras_vit.training.recipes import base_recipe

    code, out, err = run(capsys, "train", *argv)
    assert code == 0, err
    rows = [line.split(None, 2) for line in out.splitlines()]
    assert [row[0] for row in rows] == config_keys()
    table = {key: (kind, value) for key, kind, value in rows}
    assert table["model.variant"][0] == "str"
    assert table["optim.learning_rate"][0] == "float"
    # The recipe's own values; --smoke, like any override, shows in the table.
    recipe = base_recipe("digits")
    assert table["model.image_size"] == ("int", repr(recipe.model.image_size))
    steps = 2 if "--smoke" in argv else recipe.total_steps
    assert table["total_steps"] == ("int", repr(steps))


def test_train_keys_with_a_bad_override_is_one_line(capsys):
    code, out, err = run(capsys, "train", "digits", "--keys", "--optim.lrate", "1")
    assert code == 2 and out == ""
    assert "Unknown config key 'optim.lrate'" in err


@pytest.mark.slow
def test_train_smoke_run(capsys, tmp_path):
    code, stdout, err = run(
        capsys,
        "train",
        "digits",
        "--smoke",
        "--run_dir",
        str(tmp_path / "run"),
        "--export_name",
        "",
    )
    assert code == 0, err
    assert re.search(r"digits: done, held-out accuracy \d\.\d{4}\. It made:", stdout)
    assert f"  keras-vit evaluate {tmp_path / 'run' / 'model.keras'}" in stdout
    assert (tmp_path / "run" / "model.keras").is_file()


@pytest.mark.bfloat16
@pytest.mark.slow
def test_bench_passes_its_options_through(capsys, tmp_path):
    report = tmp_path / "bench.json"
    code, stdout, err = run(
        capsys,
        "bench",
        "--variant",
        "Ti/16",
        "--image-size",
        "32",
        "--batch-size",
        "2",
        "--peers",
        "keras_vit",
        "--modes",
        "infer",
        "--jit",
        "off",
        "--iterations",
        "1",
        "--warmup",
        "1",
        "--rounds",
        "1",
        "--matmul-size",
        "64",
        "--json",
        str(report),
    )
    assert code == 0, err
    assert f"wrote {report}" in stdout
    results = json.loads(report.read_text())["results"]
    assert [(r["mode"], r["peer"]) for r in results] == [("infer", "keras_vit")]


def console_script(*args):
    executable = shutil.which("keras-vit")
    assert executable, "keras-vit is not on PATH; pip install -e . first"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(
        [executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )


@pytest.mark.slow
def test_console_script_info():
    proc = console_script("info", "Ti/16", "--no-summary", "--num-classes", "10")
    assert proc.returncode == 0, proc.stderr
    params = flops.vit_parameter_count("Ti/16", num_classes=10)
    assert f"parameters: {params:,}" in proc.stdout


@pytest.mark.slow
def test_console_script_error_is_one_line_without_traceback(tmp_path):
    proc = console_script("visualize", str(tmp_path / "missing.keras"), "x.png")
    assert proc.returncode == 2
    ours = [line for line in proc.stderr.splitlines() if not TF_NATIVE_LOG.match(line)]
    assert ours == [
        f"keras-vit visualize: error: model '{tmp_path / 'missing.keras'}' does "
        "not exist"
    ]
    assert "Traceback" not in proc.stderr


# --- FLOP and parameter counting (`info`) ---------------------------------

TINY = dict(image_size=16, num_classes=5, hidden_dim=32, num_layers=2, num_heads=4)
TINY["mlp_dim"] = 64


@pytest.mark.parametrize(
    "options",
    [
        {},
        dict(include_top=False),
        dict(pooling="gap", position_embedding="sincos"),
        dict(pooling=None, include_top=False),
        dict(distilled=True, representation_size=24),
        dict(patch_norm=True, qkv_bias=False, layer_scale_init=1e-5),
        dict(shifted_patches=True, patch_norm=True, distilled=True),
        dict(pool_norm=True, pooling="gap", image_size=(16, 24), num_channels=1),
        # DINOv2's classifier: a head over the class token and patch mean.
        dict(pooling="token_gap", num_register_tokens=2, layer_scale_init=1.0),
        dict(pooling="token_gap", representation_size=24),
    ],
)
def test_analytic_counts_match_the_built_model(options):
    kwargs = {**TINY, **options}
    model = keras_vit.ViT("Ti/4", **kwargs)
    assert flops.vit_parameter_count("Ti/4", **kwargs) == model.count_params()
    assert flops.vit_macs("Ti/4", **kwargs) == flops.count_macs(model)


def test_macs_of_a_tiny_vit_by_hand():
    # 16 patches of 4x4x3 -> 32 dims, 17 tokens, 2 blocks, mlp 64, 5 classes.
    patch_embedding = 16 * 48 * 32
    attention = 17 * 32 * 96 + 2 * 17 * 17 * 32 + 17 * 32 * 32
    mlp = 2 * 17 * 32 * 64
    head = 32 * 5
    model = keras_vit.ViT("Ti/4", **TINY)
    assert flops.count_macs(model) == patch_embedding + 2 * (attention + mlp) + head


@pytest.mark.parametrize(
    "variant,options,expected",
    [
        ("Ti/16", dict(include_top=False), 5_524_416),
        ("S/16", dict(include_top=False), 21_665_664),
        ("B/16", dict(include_top=False), 85_798_656),
        ("B/32", dict(include_top=False), 87_455_232),
        ("L/16", dict(include_top=False), 303_301_632),
        ("B/16", {}, 86_567_656),
    ],
)
def test_analytic_parameter_counts_of_the_large_variants(variant, options, expected):
    assert flops.vit_parameter_count(variant, 224, **options) == expected


def test_convolution_macs_by_hand():
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same")(inputs)  # 16x16x8
    x = keras.layers.DepthwiseConv2D(3, padding="same")(x)  # 16x16x8
    x = keras.layers.SeparableConv2D(16, 3, padding="valid")(x)  # 14x14x16
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(10)(x))
    expected = (
        16 * 16 * 9 * 3 * 8 + 16 * 16 * 9 * 8 + 14 * 14 * (9 * 8 + 8 * 16) + 16 * 10
    )
    assert flops.count_macs(model) == expected


def test_hybrid_stem_convolutions_are_counted():
    model = keras_vit.HybridViT(
        "Ti",
        image_size=32,
        num_classes=3,
        stem=(1,),
        stem_width=8,
        norm_groups=4,
        hidden_dim=32,
        num_layers=1,
        num_heads=2,
        mlp_dim=64,
    )
    macs, uncounted = flops.macs_by_layer(model)
    assert uncounted == []
    convs = [layer for layer in model.layers if isinstance(layer, keras_vit.StdConv2D)]
    assert convs
    expected = sum(
        np.prod(layer.output.shape[1:3]) * np.prod(layer.kernel.shape)
        for layer in convs
    )
    assert sum(macs[layer.name] for layer in convs) == expected
    tokens = 1 + 8 * 8
    channels = model.get_layer("patch_encoder").input.shape[-1]
    assert (
        macs["block_0"]
        == 65 * 32 * 96 + 2 * tokens**2 * 32 + 65 * 32 * 32 + 2 * 65 * 32 * 64
    )
    assert macs["patch_encoder"] == 64 * channels * 32


def test_a_layer_without_formula_is_refused():
    class Odd(keras.layers.Layer):
        def build(self, shape):
            self.w = self.add_weight(shape=(shape[-1],))

        def call(self, x):
            return x * self.w

    inputs = keras.Input((4,))
    model = keras.Model(inputs, Odd(name="odd")(inputs))
    with pytest.raises(ValueError, match=r"no formula for layers \['odd'\]"):
        flops.count_macs(model)
