"""Writes the parity fixtures of transformers' newer vision families
(DINOv2, DINOv2 with registers, DINOv3, SigLIP, CLIP) in
tests/fixtures/hf_family_*/ with transformers itself.

Run with torch and transformers in a virtual environment outside the
repository:

    <venv>/bin/python scripts/make_hf_family_fixtures.py [name ...]

Each fixture is a small model of one transformers class (depth 2, width 64,
32-pixel images, 8-pixel patches) with seeded random weights scaled so that
every nonlinearity works away from zero, saved by `save_pretrained`
(`model.safetensors` and `config.json`). `parity.npz` holds, for the native
size, one smaller and one larger (non-square) size, NHWC images
(`images_<h>x<w>`) and what the class computes for them (`logits_<h>x<w>`:
the logits, or the pooled features / image embeddings of a model without a
classifier) through its own dynamic-size path: `interpolate_pos_encoding=
True` (DINOv2 always interpolates; DINOv3 has no position table).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from fixture_common import images, randomize_scaled

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"

VISION = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=32,
    patch_size=8,
)
TEXT = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    vocab_size=64,
    max_position_embeddings=16,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
SIZES = [(32, 32), (24, 24), (40, 48)]
# Width 32: the fixtures that pin one option each stay small.
SLIM = dict(hidden_size=32)


def _dinov2(name, **options):
    import transformers as t

    return getattr(t, name)(t.Dinov2Config(**VISION, **options))


def _dinov2_reg(name, **options):
    import transformers as t

    config = t.Dinov2WithRegistersConfig(
        **{**VISION, "num_register_tokens": 4, **options}
    )
    return getattr(t, name)(config)


def _two_tower(kind, name, **options):
    import transformers as t

    vision = dict(VISION, intermediate_size=128)
    config = getattr(t, f"{kind}Config")(vision_config=vision, text_config=TEXT)
    for key, value in options.items():
        setattr(config, key, value)
    return getattr(t, name)(config)


def _vision(kind, name, **options):
    import transformers as t

    config = getattr(t, f"{kind}VisionConfig")(
        **VISION, intermediate_size=128, **options
    )
    return getattr(t, name)(config)


def _dinov3(**options):
    import transformers as t

    config = t.DINOv3ViTConfig(**{**VISION, "intermediate_size": 128, **options})
    return t.DINOv3ViTModel(config)


# name: (builder, what the parity file holds)
FIXTURE_MODELS = {
    "dinov2": (lambda: _dinov2("Dinov2Model"), "pooler_output"),
    "dinov2_swiglu_cls": (
        lambda: _dinov2(
            "Dinov2ForImageClassification",
            use_swiglu_ffn=True,
            layerscale_value=0.5,
            num_labels=4,
        ),
        "logits",
    ),
    "dinov2_reg_cls": (
        lambda: _dinov2_reg(
            "Dinov2WithRegistersForImageClassification",
            hidden_act="gelu_pytorch_tanh",
            num_labels=3,
        ),
        "logits",
    ),
    "dinov2_reg": (
        lambda: _dinov2_reg("Dinov2WithRegistersModel", layer_norm_eps=1e-5),
        "pooler_output",
    ),
    # num_register_tokens=0 saves an empty (1, 0, width) register table.
    "dinov2_reg0_cls": (
        lambda: _dinov2_reg(
            "Dinov2WithRegistersForImageClassification",
            num_register_tokens=0,
            num_labels=3,
            **SLIM,
        ),
        "logits",
    ),
    "siglip_vision": (lambda: _vision("Siglip", "SiglipVisionModel"), "pooler_output"),
    "siglip_cls": (
        lambda: _two_tower("Siglip", "SiglipForImageClassification", num_labels=5),
        "logits",
    ),
    "siglip_model": (lambda: _two_tower("Siglip", "SiglipModel"), "image_features"),
    "clip_vision": (lambda: _vision("CLIP", "CLIPVisionModel"), "pooler_output"),
    "clip_projection": (
        lambda: _vision("CLIP", "CLIPVisionModelWithProjection", projection_dim=24),
        "image_embeds",
    ),
    "clip_cls": (
        lambda: _two_tower("CLIP", "CLIPForImageClassification", num_labels=5),
        "logits",
    ),
    "clip_model": (
        lambda: _two_tower("CLIP", "CLIPModel", projection_dim=24),
        "image_features",
    ),
    "dinov3": (
        lambda: _dinov3(
            num_register_tokens=2,
            use_gated_mlp=True,
            hidden_act="silu",
            key_bias=False,
            rope_theta=100.0,
        ),
        "pooler_output",
    ),
    # DINOv3ViTConfig's defaults: no registers (an empty table), GELU MLP.
    "dinov3_plain": (
        lambda: _dinov3(**SLIM, intermediate_size=64),
        "pooler_output",
    ),
}


def _outputs(model, what: str, x: np.ndarray) -> np.ndarray:
    import torch

    pixels = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
    resize = {"interpolate_pos_encoding": True}
    if type(model).__name__.startswith(("Dinov2", "DINOv3")):
        resize = {}  # DINOv2 always interpolates; DINOv3 has no table
    with torch.no_grad():
        if what == "image_features":
            out = model.get_image_features(pixel_values=pixels, **resize)
            out = getattr(out, "pooler_output", out)
        else:
            out = getattr(model(pixel_values=pixels, **resize), what)
    return out.numpy().astype("float32")


def write_fixture(name: str) -> None:
    import transformers

    build, what = FIXTURE_MODELS[name]
    model = build()
    randomize_scaled(model, seed=sum(map(ord, name)), scales=("gamma", "lambda1"))
    model.eval()
    folder = FIXTURES / f"hf_family_{name}"
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    parity = {}
    for i, (h, w) in enumerate(SIZES):
        x = images((2, h, w, 3), seed=i)
        parity[f"images_{h}x{w}"] = x
        parity[f"logits_{h}x{w}"] = _outputs(model, what, x)
    np.savez_compressed(folder / "parity.npz", **parity)
    params = sum(p.numel() for p in model.parameters())
    source = {
        "transformers": transformers.__version__,
        "class": type(model).__name__,
        "output": what,
        "parameters": params,
    }
    (folder / "source.json").write_text(json.dumps(source) + "\n")
    print(name, type(model).__name__, params, "parameters")


def main(argv: list[str]) -> None:
    for name in argv or list(FIXTURE_MODELS):
        write_fixture(name)


if __name__ == "__main__":
    main(sys.argv[1:])
