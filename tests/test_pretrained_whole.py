"""Converted models arrive whole: register tokens and MAP heads load with
the source's logits, the checkpoint's preprocessing and class names travel
into metadata.json beside the `.keras`, and what keras_vit cannot build is
refused by name. Expected values come from timm / transformers
(scripts/make_fixtures.py), so no test here needs torch."""

import json
import re
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
from helpers import FLOAT32_PARITY, assert_close, check_config_round_trip
from safetensors.numpy import load_file, save_file

from keras_vit import MAPHead, ViT
from keras_vit.analysis import flops, visualize
from keras_vit.cli import main
from keras_vit.deploy import serving
from keras_vit.errors import CheckpointError
from keras_vit.models import preprocessing as preprocessing_lib
from keras_vit.pretrained.convert import convert_checkpoint

FIXTURES = Path(__file__).parent / "fixtures"
CHINA = Path(__import__("sklearn").__file__).parent / "datasets/images/china.jpg"


def check_keras_save_load(model, x, tmp_path):
    path = tmp_path / "model.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(np.asarray(reloaded(x)), np.asarray(model(x)))


def assert_logits_match(model, name):
    data = np.load(FIXTURES / name / "parity.npz")
    out = np.asarray(model(data["images"], training=False))
    expected = data["logits"]
    # 1e-4 of the logits' scale: these random-weight logits are ~0.1, so a
    # plain 1e-4 would let a 0.1% error through. Float32 rounding is ~1e-7.
    assert_close(out, expected, 1e-4)


# --- registers and MAP in the builder ----------------------------------------


def test_register_tokens_are_prefix_tokens_without_position_embedding():
    model = ViT("Ti/8", image_size=32, num_classes=5, num_register_tokens=4)
    encoder = model.get_layer("patch_encoder")
    assert encoder.output.shape == (None, 1 + 4 + 16, 192)
    assert encoder.num_prefix_tokens == 5
    assert encoder.register_tokens.shape == (1, 4, 192)
    # Position rows for the class token and the 16 patches only.
    assert encoder.pos_embedding.shape == (1, 17, 192)
    # The 16 patch rows pooled, registers skipped.
    gap = ViT("Ti/8", image_size=32, pooling="gap", num_register_tokens=2)
    assert gap.get_layer("pooling").num_prefix_tokens == 2
    with pytest.raises(ValueError, match="num_register_tokens` must be an int >= 0"):
        ViT("Ti/8", image_size=32, num_register_tokens=-1)


def test_registers_change_outputs_and_save_and_load(tmp_path):
    # Features: the zero-initialised head would hide any change.
    model = ViT(
        "Ti/8", image_size=16, include_top=False, num_layers=1, num_register_tokens=2
    )
    encoder = model.get_layer("patch_encoder")
    check_config_round_trip(encoder)
    x = np.random.RandomState(0).rand(2, 16, 16, 3).astype("float32")
    before = np.asarray(model(x))
    # Not a constant shift, which the blocks' LayerNorm would remove.
    encoder.register_tokens.assign(np.random.RandomState(5).randn(1, 2, 192))
    assert np.abs(np.asarray(model(x)) - before).max() > 1e-3
    check_keras_save_load(model, x, tmp_path)


def test_map_head_pools_every_token_with_one_probe(tmp_path):
    model = ViT("Ti/8", image_size=16, num_classes=3, num_layers=1, pooling="map")
    head = model.get_layer("map_head")
    assert isinstance(head, MAPHead)
    assert not model.get_layer("patch_encoder").class_token  # SigLIP's default
    assert head.output.shape == (None, 192)
    check_config_round_trip(head)
    x = np.random.RandomState(1).rand(2, 16, 16, 3).astype("float32")
    check_keras_save_load(model, x, tmp_path)
    valid = "'token', 'gap', 'token_gap', 'map' or None"
    with pytest.raises(ValueError, match=f"{valid}, got 'max'"):
        ViT("Ti/8", image_size=16, pooling="max")


def test_map_head_matches_attention_written_out_in_numpy():
    layer = MAPHead(num_heads=2, mlp_dim=8)
    x = np.random.RandomState(2).randn(3, 5, 4).astype("float32")
    out = np.asarray(layer(x))
    w = {v.path.split("/", 1)[1]: v.numpy() for v in layer.weights}
    q = (w["probe"] @ w["query/kernel"] + w["query/bias"]).reshape(2, 2)
    kv = x @ w["key_value/kernel"] + w["key_value/bias"]
    k, v = kv[..., :4].reshape(3, 5, 2, 2), kv[..., 4:].reshape(3, 5, 2, 2)
    logits = np.einsum("hd,bnhd->bhn", q, k) / np.sqrt(2)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    y = np.einsum("bhn,bnhd->bhd", probs, v).reshape(3, 4)
    y = y @ w["proj/kernel"] + w["proj/bias"]
    n = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-6)
    n = n * w["norm/gamma"] + w["norm/beta"]
    h = n @ w["mlp/fc1/kernel"] + w["mlp/fc1/bias"]
    h = 0.5 * h * (1 + np.vectorize(__import__("math").erf)(h / np.sqrt(2)))
    expected = y + h @ w["mlp/fc2/kernel"] + w["mlp/fc2/bias"]
    # float32 matmuls over widths of 4-8 against numpy: a few epsilons.
    assert_close(out, expected, FLOAT32_PARITY)


@pytest.mark.parametrize(
    "options",
    [
        dict(num_register_tokens=4),
        dict(pooling="map"),
        dict(pooling="map", qkv_bias=False),
    ],
)
def test_counts_without_building_match_the_built_model(options):
    model = ViT("Ti/8", image_size=32, num_classes=5, num_layers=2, **options)
    args = ("Ti/8", 32, 5)
    assert flops.vit_parameter_count(*args, num_layers=2, **options) == (
        model.count_params()
    )
    assert flops.vit_macs(*args, num_layers=2, **options) == flops.count_macs(model)


def test_map_head_macs_are_counted():
    gap = ViT("Ti/8", image_size=32, num_layers=1, pooling="gap", class_token=False)
    map_ = ViT("Ti/8", image_size=32, num_layers=1, pooling="map")
    d, m, tokens = 192, 768, 16
    head = 2 * d * d + tokens * d * 2 * d + 2 * tokens * d + 2 * d * m
    assert flops.count_macs(map_) - flops.count_macs(gap) == head


# --- the converter -----------------------------------------------------------


@pytest.mark.parametrize("name", ["timm_vit_reg", "timm_vit_map", "big_vision_map"])
def test_register_and_map_checkpoints_give_the_source_logits(name):
    source = FIXTURES / name
    model = convert_checkpoint(source / "model.npz" if "big" in name else source)
    assert_logits_match(model, name)
    if name == "timm_vit_reg":
        assert model.get_layer("patch_encoder").num_register_tokens == 4
        assert not model.get_layer("patch_encoder").class_token
    else:
        assert model.get_layer("map_head").num_heads == 2


def test_a_position_table_over_the_registers_is_folded_into_them(tmp_path):
    # timm's no_embed_class=False covers the registers with position rows;
    # a constant added to a learned constant is the same thing.
    folder = shutil.copytree(FIXTURES / "timm_vit_reg", tmp_path / "reg")
    tensors = load_file(str(folder / "model.safetensors"))
    rows = np.random.RandomState(3).randn(1, 4, 32).astype("float32") * 0.5
    tensors["pos_embed"] = np.concatenate([rows, tensors["pos_embed"]], axis=1)
    tensors["reg_token"] = tensors["reg_token"] - rows
    save_file(tensors, str(folder / "model.safetensors"))
    model = convert_checkpoint(folder)
    assert_logits_match(model, "timm_vit_reg")


@pytest.mark.parametrize("name", ["timm_vit_reg", "timm_vit_map"])
def test_info_counts_parameters_as_timm(name, tmp_path, capsys):
    out_path = tmp_path / f"{name}.keras"
    convert_checkpoint(FIXTURES / name, out_path)
    assert main(["info", str(out_path), "--no-summary"]) == 0
    printed = capsys.readouterr().out
    count = int(re.search(r"parameters: ([\d,]+)", printed).group(1).replace(",", ""))
    timm_count = json.loads((FIXTURES / name / "timm.json").read_text())["parameters"]
    assert count == timm_count


def test_unsupported_features_are_refused_by_name(tmp_path):
    folder = shutil.copytree(FIXTURES / "timm_vit_reg", tmp_path / "reg")
    tensors = load_file(str(folder / "model.safetensors"))
    for i in range(2):
        tensors[f"blocks.{i}.attn.q_bias"] = np.ones(32, "float32")
        tensors[f"blocks.{i}.attn.v_bias"] = np.ones(32, "float32")
    tensors["blocks.0.attn.relative_position_bias_table"] = np.ones((9, 2), "float32")
    save_file(tensors, str(folder / "model.safetensors"))
    out = tmp_path / "never.keras"
    with pytest.raises(CheckpointError) as caught:
        convert_checkpoint(folder, out)
    message = str(caught.value)
    assert "uses 2 feature(s) keras_vit's ViT does not have" in message
    assert "separate query / value biases (BEiT) (blocks.0.attn.q_bias" in message
    assert "relative position bias (blocks.0.attn.relative_position" in message
    assert not out.exists()


# --- preprocessing and labels travel ---------------------------------------


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Both china fixtures converted with `keras-vit convert`."""
    root = tmp_path_factory.mktemp("converted")
    for name in ("timm_deit_china", "hf_vit_china"):
        code = main(["convert", str(FIXTURES / name), str(root / f"{name}.keras")])
        assert code == 0
    return root


def test_convert_writes_the_checkpoints_preprocessing_and_labels(converted):
    timm = json.loads((converted / "timm_deit_china" / "metadata.json").read_text())
    assert timm["preprocessing"] == {
        "image_size": [64, 64],
        "num_channels": 3,
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
        "pixel_scale": 255.0,
        "resize_method": "bicubic",
        "crop_fraction": 0.875,
        "keep_aspect_ratio": True,
        "antialias": True,
    }
    assert timm["labels"] == [f"class_{i}" for i in range(10)]
    assert timm["source"]["layout"] == "timm"
    hf = json.loads((converted / "hf_vit_china" / "metadata.json").read_text())
    assert hf["preprocessing"]["crop_fraction"] == pytest.approx(64 / 73)
    assert hf["preprocessing"]["keep_aspect_ratio"] is False  # squashes to 73x73
    assert hf["labels"][:2] == ["class_0", "class_1"]
    assert serving.find_metadata(converted / "hf_vit_china.keras").parent.name == (
        "hf_vit_china"
    )


def test_keras_vit_predict_gives_timms_logits_for_a_real_jpeg(converted, capsys):
    """timm's data config + eval transforms on china.jpg, then its model:
    the whole path, JPEG decode, resize, crop and normalisation included."""
    code = main(
        [
            "predict",
            str(converted / "timm_deit_china.keras"),
            str(CHINA),
            "--logits",
            "--top-k",
            "10",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out.strip().split(": ", 1)[1]
    logits = {
        label: float(value)
        for label, value in (pair.rsplit(" ", 1) for pair in printed.split(", "))
    }
    expected = np.load(FIXTURES / "timm_deit_china" / "china.npz")["logits"][0]
    got = np.array([logits[f"class_{i}"] for i in range(10)])
    # The conversion bound, 1e-4 of the logits' scale; measured 2.4e-6 on
    # logits up to 8.4 (timm on torch against keras_vit on TensorFlow).
    assert_close(got, expected, 1e-4)


def preprocessed(converted, name):
    metadata = json.loads((converted / name / "metadata.json").read_text())
    pre = metadata["preprocessing"]
    pixels = serving.load_pixels(CHINA, pre)
    return np.asarray(preprocessing_lib.normalize_pixels(pixels, pre))


def test_preprocessing_of_a_jpeg_matches_timm_exactly(converted):
    expected = np.load(FIXTURES / "timm_deit_china" / "china.npz")["input"]
    got = preprocessed(converted, "timm_deit_china")
    # PIL's 8-bit bicubic resize reproduced pass by pass: the same pixels,
    # normalised in float32 (one rounding of values up to ~2.6).
    assert_close(got, expected, 1e-6)


def test_preprocessing_of_a_jpeg_matches_hugging_face(converted):
    data = np.load(FIXTURES / "hf_vit_china" / "china.npz")
    got = preprocessed(converted, "hf_vit_china")
    # transformers 5 resizes with torchvision's uint8 antialiasing kernel,
    # which rounds a few pixels to the neighbouring 8-bit value of PIL's:
    # at most one level (1 / 255 / std = 0.0175 here), on under 1% of them.
    diff = np.abs(got - data["input"])
    assert diff.max() <= 1.01 / 255 / 0.224
    assert np.mean(diff > 1e-6) < 0.01
    model = keras.saving.load_model(converted / "hf_vit_china.keras")
    # The pixels differ by up to a level (above), which moves the logits:
    # measured 4.1e-4 on logits up to 8.0, 5e-5 of their scale.
    assert_close(model(got), data["logits"], 1.5e-4)


def test_a_crop_resizes_an_image_already_at_the_model_size():
    pre = {"image_size": [8, 8], "num_channels": 1, "mean": [0.0], "std": [1.0]}
    pre.update(pixel_scale=255.0, resize_method="bilinear", crop_fraction=0.5)
    image = np.zeros((8, 8, 1), "float32")
    image[2:6, 2:6] = 255.0  # the centre half
    out = serving.load_pixels(image, pre)[0, ..., 0]
    # 8 -> 16 (8 / 0.5), then the centre 8x8: the bright square fills it.
    assert out.shape == (8, 8)
    assert out[2:6, 2:6].min() == 255.0
    with pytest.raises(ValueError, match=r"crop_fraction must be a number in \(0, 1\]"):
        preprocessing_lib.normalize_preprocessing(
            ViT("Ti/4", image_size=8, num_classes=2, num_layers=1, num_channels=1),
            {**pre, "crop_fraction": 1.5},
        )


def test_visualize_leaves_registers_out_of_maps_and_rollout():
    model = ViT("Ti/8", image_size=32, num_layers=2, num_register_tokens=3)
    image = np.random.RandomState(4).rand(32, 32, 3).astype("float32")
    maps = visualize.attention_maps(model, image)
    assert maps.shape == (3, 4, 4)
    rollout = visualize.attention_rollout(model, image)
    assert rollout.shape == (4, 4)
    np.testing.assert_allclose(rollout.sum(), 1.0)
    # The class row of block 0 over the patches, registers' columns dropped.
    scores = visualize.attention_scores(model, image[None])[-1][0]
    np.testing.assert_allclose(maps, scores[:, 0, 4:].reshape(3, 4, 4), rtol=1e-6)
    # Rollout from matrices without register rows and columns: a one-block
    # rollout is that block's renormalised class row.
    one = ViT("Ti/8", image_size=32, num_layers=1, num_register_tokens=3)
    a = visualize.attention_scores(one, image[None])[0][0].astype("float64").mean(0)
    keep = [0, *range(4, 20)]
    a = a[np.ix_(keep, keep)]
    a = a / a.sum(-1, keepdims=True) + np.eye(17)
    a = a / a.sum(-1, keepdims=True)
    expected = a[0, 1:] / a[0, 1:].sum()
    np.testing.assert_allclose(
        visualize.attention_rollout(one, image).ravel(), expected, rtol=1e-9
    )
