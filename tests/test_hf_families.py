"""transformers' DINOv2, DINOv2 with registers, DINOv3, SigLIP and CLIP
vision layouts converted into keras_vit give transformers' outputs.

Fixtures (tests/fixtures/hf_family_*/) are random-weight small models made
and saved by transformers itself (scripts/make_hf_family_fixtures.py);
`parity.npz` holds their outputs (logits, pooled features or image
embeddings) at the native size and one smaller and one larger size, through
the class's own dynamic-size path. No test here needs torch. The checks are
family_checks.py's, shared with test_families.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from family_checks import (
    PARITY,
    check,
    check_quantize_lora_and_grids,
    check_saved_model_and_tflite,
    images_at,
    parity_data,
    size_cases,
    sizes,
)
from helpers import parity_bound
from safetensors.numpy import load_file, save_file

from keras_vit.errors import CheckpointError
from keras_vit.models.resolution import with_image_size
from keras_vit.pretrained.convert import convert_checkpoint
from keras_vit.pretrained.detect import detect_architecture
from keras_vit.pretrained.readers import read_checkpoint

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = sorted(p.name.removeprefix("hf_family_") for p in FIXTURES.glob("hf_family_*"))


def folder(name: str) -> Path:
    return FIXTURES / f"hf_family_{name}"


def source(name: str) -> dict:
    return json.loads((folder(name) / "source.json").read_text())


def test_every_class_the_converter_reads_has_a_fixture():
    classes = {source(name)["class"] for name in NAMES}
    assert classes == {
        "Dinov2Model",
        "Dinov2ForImageClassification",
        "Dinov2WithRegistersModel",
        "Dinov2WithRegistersForImageClassification",
        "DINOv3ViTModel",
        "SiglipVisionModel",
        "SiglipForImageClassification",
        "SiglipModel",
        "CLIPVisionModel",
        "CLIPVisionModelWithProjection",
        "CLIPForImageClassification",
        "CLIPModel",
    }


@pytest.mark.parametrize(
    ("name", "size"), list(size_cases({n: folder(n) for n in NAMES}))
)
def test_converted_model_gives_the_source_outputs(name, size):
    # At another size the position table is resampled with the kernel of
    # the class's interpolate_pos_encoding, recorded in the model.
    model = convert_checkpoint(folder(name), image_size=size)
    check(model, folder(name), size, f"{name} at {size}")


@pytest.fixture(scope="module", params=NAMES)
def converted(request):
    return request.param, convert_checkpoint(folder(request.param))


def test_saved_model_and_float32_tflite_give_the_source_outputs(converted, tmp_path):
    name, model = converted
    check_saved_model_and_tflite(model, folder(name), tmp_path)


def test_quantizes_takes_lora_and_gives_grids(converted):
    name, model = converted
    images = images_at(folder(name), sizes(folder(name))[0])
    check_quantize_lora_and_grids(model, convert_checkpoint(folder(name)), images)


@pytest.mark.parametrize(
    ("name", "kernel"),
    [("dinov2", "hf"), ("dinov2_reg_cls", "timm"), ("siglip_vision", "hf")],
)
def test_with_image_size_uses_the_recorded_kernel(name, kernel):
    model = convert_checkpoint(folder(name))
    assert model.get_layer("patch_encoder").position_resample == kernel
    data = parity_data(folder(name))
    small = sizes(folder(name))[1]
    check(with_image_size(model, small), folder(name), small, f"{name} resized")
    # TensorFlow's own bicubic is another kernel: it misses the source's
    # outputs by more than the parity bound, so the recorded one matters.
    other = with_image_size(model, small, method="bilinear")
    key = f"{small[0]}x{small[1]}"
    expected = data[f"logits_{key}"]
    missed = np.max(np.abs(np.asarray(other(data[f"images_{key}"])) - expected))
    assert missed > parity_bound(expected, PARITY)
    # A dynamic-size model resamples in the graph with the same kernel.
    dynamic = convert_checkpoint(folder(name), dynamic_size=True)
    for size in sizes(folder(name)):
        check(dynamic, folder(name), size, f"{name} dynamic at {size}")


def test_dinov2_classifier_reads_class_token_and_patch_mean():
    model = convert_checkpoint(folder("dinov2_swiglu_cls"))
    assert model.get_layer("pooling").mode == "token_gap"
    assert model.get_layer("head").kernel.shape == (128, 4)
    assert model.get_layer("block_0").get_config()["gated_mlp"]


def test_two_tower_checkpoints_list_the_text_tower_as_ignored():
    for name in ("siglip_model", "clip_model"):
        tensors, config = read_checkpoint(folder(name))
        plan = detect_architecture(tensors, config)
        text = {k for k in tensors if k.startswith("text_model.")}
        assert text and text <= set(plan.ignored)
        assert "logit_scale" in plan.ignored
        assert all("text tower" in plan.ignored[k] for k in text)
        used = {s for sources, _ in plan.assign.values() for s in sources}
        assert not used & set(plan.ignored)
        assert set(tensors) == used | set(plan.ignored)


def test_siglip_classifier_leaves_the_unused_map_head_out_by_name():
    tensors, config = read_checkpoint(folder("siglip_cls"))
    plan = detect_architecture(tensors, config)
    head = [k for k in tensors if k.startswith("vision_model.head.")]
    assert head and all("MAP head" in plan.ignored[k] for k in head)


def copy_fixture(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(folder(name), target)
    return target


def edit_config(path: Path, **changes) -> None:
    config = json.loads((path / "config.json").read_text())
    vision = config.get("vision_config", config)
    vision.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def test_older_checkpoints_position_ids_buffer_is_accepted(tmp_path):
    path = copy_fixture("siglip_vision", tmp_path)
    tensors = load_file(path / "model.safetensors")
    tensors["embeddings.position_ids"] = np.arange(16, dtype="int64")[None]
    save_file(tensors, path / "model.safetensors")
    model = convert_checkpoint(path)
    check(model, folder("siglip_vision"), (32, 32), "with position_ids")


def test_an_unknown_tensor_is_still_refused(tmp_path):
    path = copy_fixture("dinov2", tmp_path)
    tensors = load_file(path / "model.safetensors")
    tensors["encoder.layer.0.attention.rel_bias"] = np.zeros(4, "float32")
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match="rel_bias"):
        convert_checkpoint(path)


# One case per kind of refusal: an activation keras_vit does not have, a
# config that contradicts the tensors, an option with no counterpart, a
# family transformers has that the converter does not read.
REFUSALS = [
    ("dinov2", dict(hidden_act="relu"), "hidden_act='relu' is not supported"),
    ("siglip_vision", dict(hidden_act="gelu_fast"), "hidden_act='gelu_fast'"),
    ("clip_cls", dict(layer_norm_eps=-1.0), "layer_norm_eps=-1.0"),
    ("dinov2", dict(use_swiglu_ffn=True), "use_swiglu_ffn=True contradicts"),
    ("dinov2_reg_cls", dict(num_register_tokens=2), "num_register_tokens=2"),
    ("dinov2", dict(patch_size=16), "patch_size=16 contradicts the tensors"),
    ("clip_projection", dict(num_channels=1), "num_channels=1 contradicts the tensors"),
    ("siglip_model", dict(head_dim=16), "head_dim=16"),
    ("siglip_vision", dict(vision_use_head=False), "vision_use_head=False"),
    ("dinov3", dict(proj_bias=False), "proj_bias=False contradicts"),
    ("dinov3", dict(key_bias=True), "key_bias=True contradicts"),
    ("dinov3", dict(rope_theta=0), "rope_theta=0"),
    ("dinov3", dict(rope_scaling={"type": "linear"}), "rope_scaling="),
    ("siglip_vision", dict(model_type="siglip2_vision_model"), "model_type="),
]


@pytest.mark.parametrize(("name", "changes", "message"), REFUSALS)
def test_refuses_what_it_cannot_reproduce_by_name(name, changes, message, tmp_path):
    path = copy_fixture(name, tmp_path)
    edit_config(path, **changes)
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(")):
        convert_checkpoint(path)


def test_dinov3_with_different_attention_and_mlp_biases_is_refused(tmp_path):
    path = copy_fixture("dinov3", tmp_path)
    tensors = load_file(path / "model.safetensors")
    tensors = {k: v for k, v in tensors.items() if not k.endswith("mlp.up_proj.bias")}
    save_file(tensors, path / "model.safetensors")
    edit_config(path, mlp_bias=None)
    with pytest.raises(CheckpointError, match="one switch"):
        convert_checkpoint(path)


def test_keras_vit_convert_reads_a_save_pretrained_folder(tmp_path, capsys):
    import keras

    from keras_vit.cli.main import main

    out = tmp_path / "clip.keras"
    code = main(["convert", str(folder("clip_projection")), str(out)])
    assert code == 0, capsys.readouterr().err
    model = keras.saving.load_model(out)
    images = images_at(folder("clip_projection"), (32, 32))
    check(model.predict(images, verbose=0), folder("clip_projection"), (32, 32), "CLI")
    metadata = json.loads((tmp_path / "clip" / "metadata.json").read_text())
    assert metadata["source"]["layout"] == "huggingface"


def test_a_sharded_save_pretrained_folder_converts(tmp_path):
    # save_pretrained above max_shard_size: model-0000k-of-n shards and the
    # index whose weight_map names each tensor's shard.
    tensors = load_file(folder("dinov2") / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2]}
    shards["model-00002-of-00002.safetensors"] = names[len(names) // 2 :]
    for shard, part in shards.items():
        save_file({n: tensors[n] for n in part}, tmp_path / shard)
    weight_map = {n: shard for shard, part in shards.items() for n in part}
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shutil.copy(folder("dinov2") / "config.json", tmp_path / "config.json")
    model = convert_checkpoint(tmp_path)
    check(model, folder("dinov2"), (32, 32), "sharded")
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        convert_checkpoint(tmp_path)
