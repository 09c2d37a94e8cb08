"""The newer ViT families converted from timm give timm's logits.

Fixtures (tests/fixtures/family_*/) are random-weight small models made by
timm itself (scripts/make_family_fixtures.py); `parity.npz` holds timm's
outputs at the native size and one smaller and one larger size, computed
through timm's own dynamic-size path. No test here needs torch. The checks
themselves are family_checks.py's, shared with test_hf_families.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from family_checks import (
    check,
    check_quantize_lora_and_grids,
    check_saved_model_and_tflite,
    images_at,
    size_cases,
    sizes,
)

from keras_vit.pretrained.convert import convert_checkpoint
from keras_vit.pretrained.timm_options import timm_arguments

FIXTURES = Path(__file__).parent / "fixtures"
FAMILIES = sorted(p.name.removeprefix("family_") for p in FIXTURES.glob("family_*"))


def folder(family: str) -> Path:
    return FIXTURES / f"family_{family}"


def has_position_table(family: str) -> bool:
    """Whether timm resamples a learned table at another size."""
    config = json.loads((folder(family) / "config.json").read_text())
    args = timm_arguments(config)[1]
    return args.get("pos_embed", "learn") == "learn" and args.get(
        "use_abs_pos_emb", True
    )


@pytest.mark.parametrize(
    ("family", "size"), list(size_cases({f: folder(f) for f in FAMILIES}))
)
def test_converted_family_gives_timm_logits(family, size):
    model = convert_checkpoint(folder(family), image_size=size)
    check(model, folder(family), size, f"{family} at {size}")


@pytest.fixture(scope="module", params=FAMILIES)
def converted(request):
    family = request.param
    return family, convert_checkpoint(folder(family))


def test_saved_model_and_float32_tflite_give_timm_logits(converted, tmp_path):
    family, model = converted
    check_saved_model_and_tflite(model, folder(family), tmp_path)


def test_converted_family_quantizes_takes_lora_and_gives_grids(converted):
    family, model = converted
    images = images_at(folder(family), sizes(folder(family))[0])
    fresh = convert_checkpoint(folder(family))
    check_quantize_lora_and_grids(model, fresh, images)


def test_refuses_what_it_cannot_reproduce(tmp_path):
    from keras_vit.errors import CheckpointError

    edited_folder = tmp_path / "clip"
    edited_folder.mkdir()
    source = folder("clip_quickgelu")
    (edited_folder / "model.safetensors").write_bytes(
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
        (edited_folder / "config.json").write_text(json.dumps(edited))
        with pytest.raises(CheckpointError, match=message):
            convert_checkpoint(edited_folder)


def edited_copy(family: str, tmp_path: Path, **model_args) -> Path:
    """The fixture with its config's `model_args` (and the top-level keys
    timm writes beside them) updated."""
    edited = tmp_path / family
    edited.mkdir()
    source = folder(family)
    (edited / "model.safetensors").write_bytes(
        (source / "model.safetensors").read_bytes()
    )
    config = json.loads((source / "config.json").read_text())
    config["model_args"].update(model_args)
    config.update({k: v for k, v in model_args.items() if k in config})
    (edited / "config.json").write_text(json.dumps(config))
    return edited


def test_null_model_args_keep_the_registered_values(tmp_path):
    # timm.create_model drops arguments given as None: EVA-02 saved with
    # ref_feat_shape=None still rescales its RoPE to the registered 16x16.
    edited = edited_copy("eva02", tmp_path, ref_feat_shape=None, qk_norm=None)
    for size in sizes(folder("eva02"))[:2]:
        model = convert_checkpoint(edited, image_size=size)
        check(model, folder("eva02"), size, f"eva02 with nulls at {size}")


@pytest.mark.parametrize("family", ["clip_quickgelu", "eva02"])
def test_a_head_on_unpooled_tokens_is_refused(family, tmp_path):
    from keras_vit.errors import CheckpointError

    edited = edited_copy(family, tmp_path, global_pool="")
    with pytest.raises(CheckpointError, match="global_pool='' with a 5-class head"):
        convert_checkpoint(edited)
