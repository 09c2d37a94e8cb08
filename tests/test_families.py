"""The newer ViT families converted from timm give timm's logits.

Fixtures (tests/fixtures/family_*/) are random-weight small models made by
timm itself (scripts/make_family_fixtures.py); `parity.npz` holds timm's
outputs at the native size and one smaller and one larger size, computed
through timm's own dynamic-size path. No test here needs torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from helpers import assert_parity

from keras_vit.deploy import tflite
from keras_vit.models.features import feature_extractor
from keras_vit.models.lora import enable_lora, lora_layers
from keras_vit.models.quantization import quantized_copy
from keras_vit.pretrained.convert import convert_checkpoint
from keras_vit.pretrained.timm_options import timm_arguments

FIXTURES = Path(__file__).parent / "fixtures"
FAMILIES = sorted(p.name.removeprefix("family_") for p in FIXTURES.glob("family_*"))
# Relative to max(1, max |logits|): float32 through a different framework.
PARITY = 1e-4


def parity_data(family: str) -> dict:
    with np.load(FIXTURES / f"family_{family}" / "parity.npz") as data:
        return dict(data)


def sizes(family: str) -> list[tuple[int, int]]:
    """Native first, then the smaller and the larger size."""
    keys = [k.removeprefix("images_") for k in parity_data(family) if "images" in k]
    return [tuple(int(v) for v in k.split("x")) for k in keys]


def has_position_table(family: str) -> bool:
    """Whether timm resamples a learned table at another size."""
    config = json.loads((FIXTURES / f"family_{family}" / "config.json").read_text())
    args = timm_arguments(config)[1]
    return args.get("pos_embed", "learn") == "learn" and args.get(
        "use_abs_pos_emb", True
    )


def cases():
    for family in FAMILIES:
        native, *others = sizes(family)
        yield pytest.param(family, native, id=f"{family}-native")
        for size in others:
            # Resized through timm's own kernel (antialiased bicubic,
            # recorded as position_resample="timm") where a table is learned.
            yield pytest.param(family, size, id=f"{family}-{size[0]}x{size[1]}")


def check(model, family: str, size, what: str) -> float:
    data = parity_data(family)
    key = f"{size[0]}x{size[1]}"
    expected = data[f"logits_{key}"]
    actual = model(data[f"images_{key}"]) if callable(model) else model
    return assert_parity(np.asarray(actual), expected, expected, PARITY, what)


@pytest.mark.parametrize(("family", "size"), list(cases()))
def test_converted_family_gives_timm_logits(family, size):
    model = convert_checkpoint(FIXTURES / f"family_{family}", image_size=size)
    check(model, family, size, f"{family} at {size}")


@pytest.fixture(scope="module", params=FAMILIES)
def converted(request):
    family = request.param
    return family, convert_checkpoint(FIXTURES / f"family_{family}")


def test_saved_model_and_float32_tflite_give_timm_logits(converted, tmp_path):
    family, model = converted
    size = sizes(family)[0]
    images = parity_data(family)[f"images_{size[0]}x{size[1]}"]
    path = tmp_path / "saved_model"
    model.export(str(path), format="tf_saved_model", verbose=False)
    served = tf.saved_model.load(str(path)).signatures["serving_default"]
    outputs = list(served(tf.constant(images)).values())
    check(outputs[0].numpy(), family, size, f"{family} SavedModel")

    flatbuffer = tflite.convert(path, "float32")
    ops = tflite.check_builtin_only(flatbuffer)
    assert "FULLY_CONNECTED" in ops
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=flatbuffer)
    runner = interpreter.get_signature_runner("serving_default")
    (result,) = runner(**{runner.get_input_details().popitem()[0]: images}).values()
    check(result, family, size, f"{family} float32 .tflite")


def test_converted_family_quantizes_takes_lora_and_gives_grids(converted):
    family, model = converted
    size = sizes(family)[0]
    images = parity_data(family)[f"images_{size[0]}x{size[1]}"]
    reference = np.asarray(model(images))

    quantized = quantized_copy(model, "int8")
    kernels = [
        w for w in quantized.weights if w.path.endswith(("qkv/kernel", "fc1/kernel"))
    ]
    assert kernels and all(w.dtype == "int8" for w in kernels)
    # int8 weights: the logits move by about a percent of their scale.
    assert_parity(quantized(images), reference, reference, 0.1, "int8")

    adapted = convert_checkpoint(FIXTURES / f"family_{family}")
    targets = ("qkv", "proj", "fc1", "fc2")
    # A features-only model (DINOv2) has no head to keep trainable.
    trainable = ("head",) if "head" in [la.name for la in adapted.layers] else ()
    enable_lora(
        adapted, rank=2, targets=targets, trainable=trainable or ("encoder_norm",)
    )
    dense = lora_layers(adapted, targets)
    assert all(d.lora_enabled for d in dense)
    # LoRA starts as the identity (B = 0): the converted model's outputs.
    np.testing.assert_allclose(adapted(images), reference, atol=1e-5)
    frozen = {w.path for w in adapted.weights if not w.trainable}
    assert {f"{d.path}/kernel" for d in dense} <= frozen
    assert {w.path for w in adapted.trainable_weights} >= {
        f"{d.path}/lora_kernel_a" for d in dense
    }

    grids = feature_extractor(model, blocks=(0, -1))(images)
    patch = model.get_layer("patches").patch_size
    for grid in grids.values():
        hidden_dim = model.get_layer("patch_encoder").hidden_dim
        assert grid.shape == (2, size[0] // patch, size[1] // patch, hidden_dim)
        assert np.all(np.isfinite(np.asarray(grid)))


def test_refuses_what_it_cannot_reproduce(tmp_path):
    from keras_vit.errors import CheckpointError

    folder = tmp_path / "clip"
    folder.mkdir()
    source = FIXTURES / "family_clip_quickgelu"
    (folder / "model.safetensors").write_bytes(
        (source / "model.safetensors").read_bytes()
    )
    config = json.loads((source / "config.json").read_text())
    for key, value, message in (
        ("act_layer", "hard_swish", "act_layer='hard_swish' is not supported"),
        ("block_fn", "ParallelScalingBlock", "block_fn='ParallelScalingBlock'"),
        ("scale_attn_norm", True, "scale_attn_norm=True is not supported"),
        ("some_new_option", 1, r"argument\(s\) \['some_new_option'\]"),
    ):
        edited = dict(config, model_args={**config["model_args"], key: value})
        (folder / "config.json").write_text(json.dumps(edited))
        with pytest.raises(CheckpointError, match=message):
            convert_checkpoint(folder)
