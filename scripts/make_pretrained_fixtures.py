"""Writes the fixtures of timm's MAP-pooling flag and of resolution changes
run through the source libraries' own dynamic-size paths.

Same environment and rules as `scripts/make_fixtures.py` (torch, timm and
transformers in a virtual environment outside the project; every parameter
seeded random):

    <torch-venv>/bin/python scripts/make_pretrained_fixtures.py [NAME ...]

Fixtures:

- `timm_reg_map/`: a timm ViT with four register tokens, no class token and
  a MAP head (`global_pool="map"`), saved by `save_for_hf` without
  `pool_include_prefix` (timm's default, False). `parity.npz` holds the
  images, timm's logits with the default (`logits`) and with
  `pool_include_prefix=True` (`logits_prefix`), same weights.
- `timm_resize/`: a classic timm ViT made at 64 px (8x8 grid) with
  `dynamic_img_size=True`; `parity.npz` holds images and timm's logits at
  64, 48 (the grid shrinks: antialiased bicubic), 96 and 48x80 px.
- `hf_vit_resize/`: a `transformers.ViTForImageClassification` made at
  64 px; its logits at 64, 48, 96 and 48x80 px with
  `interpolate_pos_encoding=True`.
- `resample_kernels.npz`: a random (1, 8, 8, 16) grid and torch's
  `F.interpolate` of it, bicubic with and without antialias, at several
  sizes: the kernels of timm and of Hugging Face, checked alone.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from make_fixtures import FIXTURES, images, randomize  # noqa: E402

SIZES = {"48": (48, 48), "64": (64, 64), "96": (96, 96), "48x80": (48, 80)}


def logits(model, x_nhwc: np.ndarray, **call) -> np.ndarray:
    import torch

    model.eval()
    with torch.no_grad():
        out = model(torch.from_numpy(x_nhwc.transpose(0, 3, 1, 2).copy()), **call)
    return getattr(out, "logits", out).numpy().astype("float32")


def timm_reg_map(folder: Path) -> None:
    import timm
    from timm.models import save_for_hf

    def make(**extra):
        return timm.create_model(
            "vit_base_patch16_224",
            pretrained=False,
            img_size=32,
            patch_size=8,
            embed_dim=64,
            depth=2,
            num_heads=4,
            mlp_ratio=2.0,
            num_classes=5,
            class_token=False,
            reg_tokens=4,
            no_embed_class=True,
            global_pool="map",
            **extra,
        )

    model = make()
    randomize(model, seed=31)
    prefixed = make(pool_include_prefix=True)
    prefixed.load_state_dict(model.state_dict())
    x = images((2, 32, 32, 3), seed=41)
    folder.mkdir(parents=True)
    np.savez(
        folder / "parity.npz",
        images=x,
        logits=logits(model, x),
        logits_prefix=logits(prefixed, x),
    )
    save_for_hf(model, str(folder), safe_serialization=True)
    (folder / "timm.json").write_text(
        json.dumps({"timm_version": timm.__version__}, indent=1)
    )


def write_sizes(folder: Path, model, seed: int, **call) -> None:
    arrays = {}
    for i, (name, size) in enumerate(SIZES.items()):
        x = images((1, *size, 3), seed=seed + i)
        arrays[f"images_{name}"] = x
        arrays[f"logits_{name}"] = logits(model, x, **call)
    folder.mkdir(parents=True)
    np.savez(folder / "parity.npz", **arrays)


def timm_resize(folder: Path) -> None:
    import timm
    from timm.models import save_for_hf

    model = timm.create_model(
        "vit_base_patch16_224",
        pretrained=False,
        img_size=64,
        patch_size=8,
        embed_dim=64,
        depth=2,
        num_heads=4,
        mlp_ratio=2.0,
        num_classes=5,
        dynamic_img_size=True,
    )
    randomize(model, seed=32)
    write_sizes(folder, model, seed=50)
    save_for_hf(model, str(folder), safe_serialization=True)


def hf_vit_resize(folder: Path) -> None:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=64,
        patch_size=8,
        num_labels=5,
    )
    model = ViTForImageClassification(config)
    randomize(model, seed=33)
    write_sizes(folder, model, seed=60, interpolate_pos_encoding=True)
    model.save_pretrained(str(folder), safe_serialization=True)


def resample_kernels(path: Path) -> None:
    import torch
    import torch.nn.functional as F

    grid = images((1, 8, 8, 16), seed=70)
    nchw = torch.from_numpy(grid.transpose(0, 3, 1, 2).copy())
    arrays = {"grid": grid}
    for size in [(6, 6), (3, 3), (5, 11), (12, 12), (16, 7), (1, 1)]:
        for kind, antialias in (("timm", True), ("hf", False)):
            out = F.interpolate(
                nchw,
                size=size,
                mode="bicubic",
                align_corners=False,
                antialias=antialias,
            )
            arrays[f"{kind}_{size[0]}x{size[1]}"] = out.numpy().transpose(0, 2, 3, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)


BUILDERS = {
    "timm_reg_map": timm_reg_map,
    "timm_resize": timm_resize,
    "hf_vit_resize": hf_vit_resize,
}


def main(argv: list[str]) -> None:
    names = argv or [*BUILDERS, "resample_kernels"]
    unknown = set(names) - {*BUILDERS, "resample_kernels"}
    if unknown:
        raise SystemExit(f"Unknown fixtures {sorted(unknown)}; valid: {list(BUILDERS)}")
    import torch

    torch.manual_seed(0)
    for name in names:
        if name == "resample_kernels":
            resample_kernels(FIXTURES / "resample_kernels.npz")
            continue
        folder = FIXTURES / name
        with tempfile.TemporaryDirectory() as tmp:
            scratch = Path(tmp) / name
            BUILDERS[name](scratch)
            folder.mkdir(exist_ok=True)
            for old in folder.iterdir():
                old.unlink()
            for new in scratch.iterdir():
                (folder / new.name).write_bytes(new.read_bytes())
        print(f"wrote {folder}")


if __name__ == "__main__":
    main(sys.argv[1:])
