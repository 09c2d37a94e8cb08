"""A checkpoint's config is a contract: every number a converter reads from
it is validated, and one that contradicts the tensors is refused naming both
values, never settled in favour of the tensors. Files beside a checkpoint
that are not regular files are refused, not skipped."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from helpers import REPO, edited_checkpoint, read_json
from safetensors.numpy import load_file, save_file

from keras_vit.cli.main import main as cli_main
from keras_vit.errors import CheckpointError
from keras_vit.pretrained.convert import convert_checkpoint

FIXTURES = REPO / "tests" / "fixtures"


def timm_args(name: str, **changes) -> dict:
    """The fixture's `model_args` with `changes`, for `edited_checkpoint`."""
    config = read_json(FIXTURES / name / "config.json")
    return {"model_args": {**config["model_args"], **changes}}


def refused(src, match: str, **options) -> str:
    """The one-line message of the CheckpointError converting `src` raises."""
    with pytest.raises(CheckpointError, match=match) as error:
        convert_checkpoint(src, **options)
    message = str(error.value)
    assert "\n" not in message, message
    return message


def without_block(name: str, tmp_path, block: str):
    """A copy of fixture `name` whose tensors lack every `block` tensor."""
    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    kept = {k: v for k, v in tensors.items() if block not in k}
    assert len(kept) < len(tensors)
    save_file(kept, str(folder / "model.safetensors"))
    return folder


CONTRADICTIONS = [
    ("hf_vit", dict(num_hidden_layers=12), "vit num_hidden_layers=12 contradicts "
     "the tensors, which have 2 block"),
    ("hf_vit", dict(hidden_size=32), "hidden_size=32 .* a hidden width of 64"),
    ("hf_vit", dict(intermediate_size=256), "intermediate_size=256 .* "
     "MLP width of 128"),
    ("hf_vit", dict(num_attention_heads=3), "num_attention_heads=3 does not divide "
     "the hidden width 64"),
    ("hf_vit", dict(patch_size=16), "patch_size=16 contradicts .* 8x8"),
    ("hf_vit", dict(image_size=64), "17 tokens .* does not fit the checkpoint's "
     "64x64 images"),
    ("hf_vit", dict(num_channels=1), "num_channels=1 .* 3 input channel"),
    ("hf_vit", dict(qkv_bias=False), "qkv_bias=False contradicts"),
    ("hf_family_dinov2", dict(num_hidden_layers=3), "dinov2 num_hidden_layers=3 "
     "contradicts the tensors, which have 2 block"),
    ("hf_family_dinov2", dict(mlp_ratio=2.0), "mlp_ratio=2.0 makes the MLP 128 wide"),
    ("hf_family_dinov2_swiglu_cls", dict(mlp_ratio=2), "mlp_ratio=2 makes the MLP"),
    ("hf_family_dinov3", dict(intermediate_size=7), "intermediate_size=7"),
    ("hf_family_clip_vision", dict(num_hidden_layers=1), "num_hidden_layers=1"),
    ("hf_family_clip_projection", dict(projection_dim=5), "projection_dim=5 .* "
     "projected output"),
    ("hf_family_siglip_vision", dict(hidden_size=8), "hidden_size=8"),
    ("timm_vit_map", timm_args("timm_vit_map", depth=12), "timm depth=12 "
     "contradicts the tensors, which have 2 block"),
    ("timm_vit_map", timm_args("timm_vit_map", embed_dim=64), "embed_dim=64 .* "
     "hidden width of 32"),
    ("timm_vit_map", timm_args("timm_vit_map", num_heads=3), "num_heads=3 does not "
     "divide"),
    ("timm_vit_map", timm_args("timm_vit_map", mlp_ratio=2.0), "mlp_ratio=2.0 makes "
     "the MLP 64 wide"),
    ("timm_vit_map", timm_args("timm_vit_map", patch_size=16), "patch_size=16 .* "
     "8-pixel patches"),
    ("timm_vit_map", timm_args("timm_vit_map", img_size=64), "does not fit the "
     "checkpoint's 64x64 images"),
    ("timm_vit_map", timm_args("timm_vit_map", in_chans=1), "in_chans=1"),
    ("timm_vit_map", dict(num_classes=7), "num_classes=7 .* 5 head class"),
    ("timm_vit_map", dict(num_features=8), "num_features=8"),
    ("timm_vit_reg", timm_args("timm_vit_reg", reg_tokens=2), "reg_tokens=2 .* "
     "4 register token"),
    ("family_eva02", timm_args("family_eva02", depth=5), "timm depth=5"),
    ("family_eva02", timm_args("family_eva02", embed_dim=16), "embed_dim=16"),
]  # fmt: skip


@pytest.mark.parametrize(
    "name,changes,match", CONTRADICTIONS, ids=lambda v: str(v)[:40]
)
def test_config_contradicting_the_tensors_is_refused(tmp_path, name, changes, match):
    refused(edited_checkpoint(FIXTURES / name, tmp_path, **changes), match)


def test_the_registered_architecture_is_part_of_the_config(tmp_path):
    """A depth the config leaves to timm's registered architecture counts."""
    config = read_json(FIXTURES / "timm_vit_map" / "config.json")
    del config["model_args"]["depth"]
    folder = edited_checkpoint(FIXTURES / "timm_vit_map", tmp_path, **config)
    refused(folder, r"depth=12 \(registered for 'vit_base_patch16_siglip_224'\)")


@pytest.mark.parametrize(
    "name,block,match",
    [
        ("timm_vit_map", "blocks.1.", "timm depth=2 contradicts the tensors, which "
         "have 1 block"),
        ("hf_vit", "encoder.layer.1.", "vit num_hidden_layers=2 contradicts the "
         "tensors, which have 1 block"),
        ("hf_family_dinov2", "encoder.layer.1.", "num_hidden_layers=2"),
    ],
)  # fmt: skip
def test_a_missing_block_is_refused_not_converted_smaller(tmp_path, name, block, match):
    refused(without_block(name, tmp_path, block), match)


NUMBERS = [
    ("hf_vit", "layer_norm_eps", float("nan")),
    ("hf_vit", "layer_norm_eps", float("inf")),
    ("hf_vit", "layer_norm_eps", 1e300),
    ("hf_vit", "layer_norm_eps", 0),
    ("hf_vit", "layer_norm_eps", -1e-6),
    ("hf_vit", "layer_norm_eps", True),
    ("hf_vit", "layer_norm_eps", "1e-6"),
    ("hf_vit", "num_attention_heads", 2.5),
    ("hf_vit", "num_attention_heads", 0),
    ("hf_vit", "num_attention_heads", True),
    ("hf_vit", "num_attention_heads", "4"),
    ("hf_vit", "num_attention_heads", 4.0),
    ("hf_vit", "num_hidden_layers", 2.0),
    ("hf_vit", "image_size", 32.5),
    ("hf_vit", "image_size", 10**9),
    ("hf_vit", "patch_size", "8"),
    ("hf_family_dinov2", "mlp_ratio", float("nan")),
    ("hf_family_dinov2", "num_register_tokens", -1),
    ("hf_family_dinov3", "rope_theta", float("inf")),
    ("hf_family_dinov3", "rope_theta", 0.5),
    ("hf_family_clip_vision", "layer_norm_eps", 1.0),
    ("hf_family_siglip_vision", "layer_norm_eps", None),  # valid: the default
]


@pytest.mark.parametrize("name,key,value", NUMBERS, ids=repr)
def test_config_numbers_are_validated_by_name(tmp_path, name, key, value):
    folder = edited_checkpoint(FIXTURES / name, tmp_path, **{key: value})
    if value is None:
        convert_checkpoint(folder)
        return
    message = refused(folder, f"{key}=")
    assert f"{key}={value!r}" in message and "expected" in message, message


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("num_heads", 2.5, r"num_heads=2\.5 is not valid; expected an int "
         r"in \[1, 32\]"),
        ("num_heads", 0, r"num_heads=0 is not valid"),
        ("depth", True, "depth=True is not valid"),
        ("mlp_ratio", float("nan"), "mlp_ratio=nan is not valid"),
        ("norm_layer", {"layer": "LayerNorm", "eps": 1e300}, "norm_layer.eps=1e"),
        ("img_size", [32, "32"], "img_size=.* is not valid"),
    ],
)  # fmt: skip
def test_timm_numbers_are_validated_by_name(tmp_path, key, value, match):
    changes = timm_args("timm_vit_map", **{key: value})
    refused(edited_checkpoint(FIXTURES / "timm_vit_map", tmp_path, **changes), match)


def test_eva_rope_numbers_are_validated(tmp_path):
    for key, value in (("rope_temperature", float("nan")), ("ref_feat_shape", 0)):
        changes = timm_args("family_eva02", **{key: value})
        folder = edited_checkpoint(FIXTURES / "family_eva02", tmp_path / key, **changes)
        refused(folder, f"timm Eva {key}=")


def test_overrides_are_validated_like_config_numbers():
    with pytest.raises(ValueError, match="num_heads= must be a positive int, got 2.5"):
        convert_checkpoint(FIXTURES / "hf_vit", num_heads=2.5)
    with pytest.raises(ValueError, match="layer_norm_epsilon= must be a finite"):
        convert_checkpoint(FIXTURES / "hf_vit", layer_norm_epsilon=float("nan"))


def replaced_config(tmp_path, make) -> object:
    """A copy of hf_vit whose config.json is replaced by `make(path)`."""
    folder = tmp_path / "hf_vit"
    shutil.copytree(FIXTURES / "hf_vit", folder)
    (folder / "config.json").unlink()
    make(folder / "config.json")
    return folder


@pytest.mark.parametrize(
    "make,kind",
    [
        (lambda p: p.mkdir(), "is a folder"),
        (os.mkfifo, r"is a FIFO \(named pipe\)"),
        (lambda p: p.symlink_to("/dev/null"), "is a link to /dev/null, a character"),
        (lambda p: p.symlink_to(p.parent / "gone.json"), "is a link to a missing"),
        (lambda p: p.write_text("[1, 2]"), "holds a JSON list; expected an object"),
        (lambda p: p.write_text("{"), "is not valid JSON"),
        (lambda p: p.write_bytes(b'{"a": "\xff"}'), "is not UTF-8 text"),
    ],
    ids=["folder", "fifo", "dev-null", "dangling", "list", "broken", "latin-1"],
)
def test_a_config_that_is_not_a_regular_json_file_is_refused(tmp_path, make, kind):
    folder = replaced_config(tmp_path, make)
    message = refused(folder, kind)
    assert str(folder / "config.json") in message


def test_deeply_nested_config_is_one_line(tmp_path):
    deep = "[" * 200_000 + "]" * 200_000

    def make(path):
        path.write_text('{"model_type": "vit", "x": ' + deep + "}")

    refused(
        replaced_config(tmp_path, make), "nests JSON 200001 levels deep; at most 64"
    )


def test_fifo_checkpoint_is_named_not_missing(tmp_path, capsys):
    os.mkfifo(tmp_path / "model.safetensors")
    for src in (tmp_path / "model.safetensors", tmp_path):
        refused(src, r"model.safetensors is a FIFO \(named pipe\), not a checkpoint")
    out = tmp_path / "out.keras"
    assert cli_main(["convert", str(tmp_path / "model.safetensors"), str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a FIFO (named pipe)" in err[0], err
    assert not out.exists()


def test_cli_convert_reports_a_contradiction_in_one_line(tmp_path, capsys):
    folder = edited_checkpoint(FIXTURES / "hf_vit", tmp_path, num_hidden_layers=12)
    out = tmp_path / "out.keras"
    assert cli_main(["convert", str(folder), str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "keras-vit convert: error: vit num_hidden_layers=12 contradicts the "
        "tensors, which have 2 block(s); the config and the weights describe "
        "different models."
    ]
    assert not out.exists()


def test_many_unknown_tensors_are_listed_capped(tmp_path):
    folder = tmp_path / "timm_vit_avg"
    shutil.copytree(FIXTURES / "timm_vit_avg", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    one = np.zeros(1, "float32")
    tensors.update({f"extra.{i:06d}": one for i in range(100_000)})
    save_file(tensors, str(folder / "model.safetensors"))
    message = refused(folder, "100000 unknown tensor")
    assert "'extra.000009', ... and 99990 more" in message
    assert "extra.000010" not in message and len(message) < 2000
