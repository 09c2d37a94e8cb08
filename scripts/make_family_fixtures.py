"""Writes the parity fixtures of the newer ViT families (DINOv2, CLIP,
SigLIP, AIMv2, ...) in tests/fixtures/family_*/ with timm, and the table of
timm's registered architectures that the converter reads its defaults from
(keras_vit/pretrained/timm_architectures.json).

Run with torch and timm in a virtual environment outside the repository:

    <venv>/bin/python scripts/make_family_fixtures.py

Each fixture is a small model of its family's timm architecture (depth 2,
width 64) with seeded random weights scaled so that every nonlinearity works
away from zero (a wrong activation or norm shows in the logits), saved the
way timm's `save_for_hf` saves it: `model.safetensors` and `config.json`,
whose `model_args` hold the arguments given to `timm.create_model`.
`parity.npz` holds, for the native size and one smaller and one larger
size, NHWC images (`images_<h>x<w>`) and what timm computes for them
(`logits_<h>x<w>`: the logits, or the pooled features of a model without a
head) through its own dynamic-size path (`dynamic_img_size=True`).
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
from pathlib import Path

import numpy as np
from fixture_common import randomize_scaled

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
ARCHITECTURES = REPO / "keras_vit" / "pretrained" / "timm_architectures.json"

SMALL = dict(embed_dim=64, depth=2, num_heads=2)
# family: (timm architecture, create_model arguments, native size, sizes).
FAMILIES = {
    "dinov2": (
        "vit_small_patch14_dinov2",
        dict(SMALL, img_size=56, num_classes=0),
        [(56, 56), (42, 42), (70, 84)],
    ),
    "dinov2_reg": (
        "vit_small_patch14_reg4_dinov2",
        dict(SMALL, img_size=56, num_classes=0),
        [(56, 56), (42, 42), (70, 84)],
    ),
    # DINOv2-giant's packed SwiGLU, at the small size.
    "dinov2_swiglu": (
        "vit_giant_patch14_dinov2",
        dict(SMALL, img_size=56, num_classes=4, mlp_ratio=4.0),
        [(56, 56), (42, 42), (70, 84)],
    ),
    "clip_quickgelu": (
        "vit_base_patch16_clip_quickgelu_224",
        dict(SMALL, patch_size=8, img_size=32, num_classes=5),
        [(32, 32), (24, 24), (40, 48)],
    ),
    "siglip": (
        "vit_base_patch16_siglip_224",
        dict(SMALL, patch_size=8, img_size=32, num_classes=5),
        [(32, 32), (24, 24), (40, 48)],
    ),
    # eva.py: RoPE families.
    "dinov3": (
        "vit_small_patch16_dinov3_qkvb",
        dict(SMALL, patch_size=8, img_size=32, num_classes=4),
        [(32, 32), (24, 24), (40, 48)],
    ),
    "dinov3_swiglu": (
        "vit_small_plus_patch16_dinov3",
        dict(SMALL, patch_size=8, img_size=32, num_classes=0),
        [(32, 32), (24, 24), (40, 48)],
    ),
    "eva02": (
        "eva02_tiny_patch14_224",
        dict(SMALL, img_size=56, num_classes=5),
        [(56, 56), (42, 42), (70, 84)],
    ),
    "eva02_split_mlp": (
        "eva02_base_patch14_224",
        dict(SMALL, img_size=56, num_classes=5),
        [(56, 56), (42, 42), (70, 84)],
    ),
    # fc_norm on every token when nothing is pooled (global_pool=""): the
    # unpooled tokens, at width 32.
    "eva02_tokens": (
        "eva02_tiny_patch14_224",
        dict(
            embed_dim=32,
            depth=2,
            num_heads=2,
            img_size=28,
            num_classes=0,
            global_pool="",
            use_fc_norm=True,
        ),
        [(28, 28), (14, 14), (42, 56)],
    ),
    "rope_vit": (
        "vit_small_patch16_rope_224",
        dict(SMALL, patch_size=8, img_size=32, num_classes=5),
        [(32, 32), (24, 24), (40, 48)],
    ),
    "rope_vit_ape": (
        "vit_small_patch16_rope_ape_224",
        dict(SMALL, patch_size=8, img_size=32, num_classes=5),
        [(32, 32), (24, 24), (40, 48)],
    ),
    "aimv2": (
        "aimv2_large_patch14_224",
        dict(SMALL, img_size=56, num_classes=3),
        [(56, 56), (42, 42), (70, 84)],
    ),
}


def describe(value):
    """A JSON-able description of one timm model argument: layers by class
    name, `partial`s as their layer and keywords."""
    if isinstance(value, functools.partial):
        return {
            "layer": describe(value.func),
            **{k: describe(v) for k, v in value.keywords.items()},
        }
    if inspect.isclass(value) or inspect.isfunction(value):
        return value.__name__
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, dict):
        return {k: describe(v) for k, v in value.items()}
    return value


def registered_arguments() -> dict:
    """Every `vit_*` / `eva*` / `aimv2*` architecture's registered model
    arguments, captured without building a model."""
    import timm
    from timm.models import eva, vision_transformer

    table, captured = {}, {}

    def capture(name, pretrained=False, **kwargs):
        captured[name] = kwargs
        raise LookupError  # stop before the model is built

    originals = (vision_transformer._create_vision_transformer, eva._create_eva)
    vision_transformer._create_vision_transformer = capture
    eva._create_eva = capture
    try:
        for module, kind in ((vision_transformer, "VisionTransformer"), (eva, "Eva")):
            for name in timm.list_models(module=module.__name__.split(".")[-1]):
                try:
                    timm.models.model_entrypoint(name)()
                except LookupError:
                    pass
                except Exception:  # builders that need arguments or build parts
                    continue
                if name in captured:
                    table[name] = {
                        "class": kind,
                        "model_args": describe(captured[name]),
                    }
    finally:
        vision_transformer._create_vision_transformer, eva._create_eva = originals
    return table


def write_family(family: str, table: dict) -> None:
    import timm
    import torch
    from timm.models import save_for_hf

    architecture, args, sizes = FAMILIES[family]
    model = timm.create_model(architecture, dynamic_img_size=True, **args)
    randomize_scaled(model, seed=sum(map(ord, family)))
    model.eval()
    folder = FIXTURES / f"family_{family}"
    folder.mkdir(parents=True, exist_ok=True)
    save_for_hf(model, folder, model_args=args, safe_serialization=True)
    parity = {}
    for i, (h, w) in enumerate(sizes):
        x = np.random.RandomState(i).standard_normal((2, h, w, 3)).astype("float32")
        with torch.no_grad():
            out = model(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()))
        parity[f"images_{h}x{w}"] = x
        parity[f"logits_{h}x{w}"] = out.numpy().astype("float32")
    np.savez_compressed(folder / "parity.npz", **parity)
    params = sum(p.numel() for p in model.parameters())
    (folder / "timm.json").write_text(
        json.dumps({"timm": timm.__version__, "parameters": params}) + "\n"
    )
    print(family, architecture, params, "parameters")


def main(argv: list[str]) -> None:
    families = argv or list(FAMILIES)
    table = registered_arguments()
    ARCHITECTURES.write_text(json.dumps(table, sort_keys=True, indent=0) + "\n")
    print(len(table), "architectures in", ARCHITECTURES.name)
    for family in families:
        write_family(family, table)


if __name__ == "__main__":
    main(sys.argv[1:])
