"""Writes the checkpoint-parity fixtures in tests/fixtures/ with timm and
Hugging Face transformers, so that CI can check keras_vit's converters
without installing torch.

Run once, with torch, timm and transformers in a virtual environment outside
the repository (never in the project's own environment):

    python -m venv ../venv-timm
    ../venv-timm/bin/pip install torch==2.14.1 torchvision==0.29.1 \
        timm transformers safetensors numpy pillow scikit-learn
    ../venv-timm/bin/python scripts/make_fixtures.py

Every parameter of every model is overwritten with seeded random values
(biases and norm scales included, so a swapped or dropped tensor shows in the
logits), the checkpoint is written the way its ecosystem writes it, and
`parity.npz` holds a batch of NHWC images and the logits the source library
computes for them. Fixtures:

- `timm_vit_tiny_patch16_224/`: timm's `vit_tiny_patch16_224`, the full
  architecture (12 blocks, 224x224, 1000 classes). Its 23 MB checkpoint is
  not committed: `spec.json` lists timm's tensor names and shapes and the
  seed; `random_state_dict` rebuilds exactly the same values, with numpy
  alone, in the test.
- `timm_vit_avg/`: a small timm ViT with a non-square image size, patch size
  8, 7 classes and `global_pool="avg"` (fc_norm), written by timm's
  `save_for_hf` (model.safetensors + config.json).
- `timm_vit_r26/`: timm's hybrid `vit_small_r26_s32_224` layout (ResNet-v2
  R26 stem with `StdConv2dSame`, GroupNorm, (2, 2, 2, 2) blocks, stride 32)
  at reduced widths (stem 8, GroupNorm with 8 groups) and a 2-block ViT.
- `timm_deit_distilled/`: timm's `deit_tiny_distilled_patch16_224` layout
  (class and distillation tokens, two heads averaged) at small dims.
- `timm_deit3/`: timm's `deit3_small_patch16_224` layout (LayerScale, no
  position embedding on the class token) at small dims.
- `hf_vit/`: a small `transformers.ViTForImageClassification`
  (`save_pretrained`: model.safetensors + config.json).
- `hf_vit_model/`: a small `transformers.ViTModel` with its pooler; the
  expected values are its `pooler_output`.
- `hf_vit_model_options/`: a small `transformers.ViTModel` with
  `hidden_act="gelu_new"` and a 16-wide pooler (`pooler_output_size`); the
  expected values are its `pooler_output`.
- `hf_deit/`: a small `transformers.DeiTForImageClassificationWithTeacher`
  (distillation token, class and distillation heads averaged).
- `timm_vit_reg/`: timm's `vit_base_patch16_reg4_gap_256` layout (four
  register tokens, no class token, mean pooling with fc_norm) at small dims;
  `timm.json` holds timm's parameter count.
- `timm_vit_map/`: timm's SigLIP image tower `vit_base_patch16_siglip_224`
  layout (MAP head: `AttentionPoolLatent`) with a 5-class head, small dims;
  `timm.json` holds timm's parameter count.
- `big_vision_map/`: a big_vision `.npz` with a `MAPHead_0`, read by timm's
  own `.npz` reader into the SigLIP layout for the expected logits.
- `timm_deit_china/`: a DeiT-style timm model (ImageNet mean / std, bicubic,
  crop 0.875, 64x64, ten named classes) and, in `china.npz`, what timm's own
  data config and eval transforms make of scikit-learn's `china.jpg`
  (`input`, NHWC) and the logits of the model on it (`logits`).
- `hf_vit_china/`: a small `transformers.ViTForImageClassification` with ten
  named classes and a DeiT-style image processor (squash to 73x73 bicubic,
  centre crop 64, ImageNet mean / std) in `preprocessor_config.json`;
  `china.npz` holds the processor's `input` for `china.jpg` and the logits.
- `augreg_vit/`: an AugReg / vit_jax `.npz` (per-block names, class token),
  loaded into timm by timm's own `.npz` reader for the expected logits.
- `big_vision_vit/`: a big_vision `.npz` (`params/` prefix, scanned blocks
  with a leading depth axis, mean pooling, no class token), also read by
  timm's reader.

`--large DIR` instead writes a full-size random `vit_base_r50_s16_224`
(~395 MB) to DIR for a one-off check, never committed:

    ../venv-timm/bin/python scripts/make_fixtures.py --large ../r50

then convert `../r50` with `keras_vit.pretrained.convert_checkpoint` and
compare its logits on `parity.npz["images"]` with `parity.npz["logits"]`
(measured: max difference 2.4e-5 on logits up to 2.2).
"""

from __future__ import annotations

import json
import sys
import tempfile
from functools import partial
from pathlib import Path

import numpy as np
from fixture_common import (
    digest,
    images,
    jax_vit_tensors,
    random_state_dict,
    randomize,
    randomize_scaled,
    torch_logits,
    write_parity,
)

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


def timm_vit_tiny(folder: Path) -> None:
    import timm
    import torch

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    spec = [(k, list(v.shape)) for k, v in model.state_dict().items()]
    seed = 1
    values = random_state_dict(spec, seed)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in values.items()})
    x = images((2, 224, 224, 3), seed=11)
    write_parity(folder, x, torch_logits(model, x))
    (folder / "spec.json").write_text(
        json.dumps(
            {
                "architecture": "vit_tiny_patch16_224",
                "timm_version": timm.__version__,
                "seed": seed,
                "sha256": digest(values),
                "tensors": spec,
            },
            indent=1,
        )
    )


def timm_vit_avg(folder: Path) -> None:
    import timm
    from timm.models import save_for_hf

    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=(32, 48),
        patch_size=8,
        embed_dim=64,
        depth=2,
        num_heads=4,
        mlp_ratio=3.0,
        num_classes=7,
        global_pool="avg",
    )
    randomize(model, seed=2)
    x = images((2, 32, 48, 3), seed=12)
    write_parity(folder, x, torch_logits(model, x))
    save_for_hf(model, str(folder), safe_serialization=True)


def timm_vit_r26(folder: Path) -> None:
    import timm
    from timm.layers import GroupNormAct, HybridEmbed, StdConv2dSame
    from timm.models import save_for_hf
    from timm.models.resnetv2 import ResNetV2

    model = timm.create_model(
        "vit_small_r26_s32_224",
        pretrained=False,
        img_size=96,
        embed_dim=64,
        depth=2,
        num_heads=4,
        num_classes=5,
    )
    # timm's R26 layout at an eighth of its width; everything else as in
    # timm's `_resnetv2` helper for hybrid ViTs.
    backbone = ResNetV2(
        layers=(2, 2, 2, 2),
        channels=(32, 64, 128, 256),
        stem_chs=8,
        num_classes=0,
        global_pool="",
        preact=False,
        stem_type="same",
        conv_layer=partial(StdConv2dSame, eps=1e-8),
        norm_layer=partial(GroupNormAct, num_groups=8),
    )
    model.patch_embed = HybridEmbed(backbone, img_size=96, embed_dim=64)
    randomize(model, seed=3)
    x = images((2, 96, 96, 3), seed=13)
    write_parity(folder, x, torch_logits(model, x))
    save_for_hf(model, str(folder), safe_serialization=True)


def timm_deit(folder: Path, distilled: bool) -> None:
    import timm
    from timm.models import save_for_hf

    # DeiT distilled: class + distillation tokens and two heads, averaged in
    # eval. DeiT III: LayerScale and no position embedding on the class token.
    architecture = (
        "deit_tiny_distilled_patch16_224" if distilled else "deit3_small_patch16_224"
    )
    model = timm.create_model(
        architecture,
        pretrained=False,
        img_size=32,
        patch_size=8,
        embed_dim=64,
        depth=2,
        num_heads=4,
        num_classes=4,
    )
    randomize(model, seed=8 if distilled else 9)
    x = images((2, 32, 32, 3), seed=18 if distilled else 19)
    write_parity(folder, x, torch_logits(model, x))
    save_for_hf(model, str(folder), safe_serialization=True)


# transformers' ViT / DeiT fixtures: 16-pixel images of 4-pixel patches.
TINY_HF = dict(
    hidden_size=32,
    num_attention_heads=2,
    intermediate_size=64,
    image_size=16,
    patch_size=4,
)


def hf_vit_model(folder: Path) -> None:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(**TINY_HF, num_hidden_layers=1)
    model = ViTModel(config)  # with its Dense + tanh pooler on the class token
    randomize(model, seed=10)
    _write_pooled(model, folder, images((2, 16, 16, 3), seed=20))


def _write_pooled(model, folder: Path, x: np.ndarray) -> None:
    """A `ViTModel`'s `pooler_output` as the parity values, and the model."""
    import torch

    model.eval()
    with torch.no_grad():
        pooled = model(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).pooler_output
    write_parity(folder, x, pooled.numpy())
    model.save_pretrained(str(folder), safe_serialization=True)


def hf_vit_model_options(folder: Path) -> None:
    """ViTModel options beyond the defaults: GELU-tanh (`gelu_new`) and a
    pooler narrower than the encoder (`pooler_output_size`). Weights scaled
    so that the activation works away from zero and a wrong one shows."""
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        **TINY_HF,
        num_hidden_layers=2,
        hidden_act="gelu_new",
        pooler_output_size=16,
        layer_norm_eps=1e-6,
    )
    model = ViTModel(config)
    randomize_scaled(model, seed=23)
    _write_pooled(model, folder, images((2, 16, 16, 3), seed=24))


def hf_deit(folder: Path) -> None:
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher

    config = DeiTConfig(**TINY_HF, num_hidden_layers=2, num_labels=3)
    model = DeiTForImageClassificationWithTeacher(config)
    randomize(model, seed=21)
    x = images((2, 16, 16, 3), seed=22)
    write_parity(folder, x, torch_logits(model, x))
    model.save_pretrained(str(folder), safe_serialization=True)


def hf_vit(folder: Path) -> None:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=32,
        patch_size=8,
        num_channels=3,
        num_labels=5,
    )
    model = ViTForImageClassification(config)
    randomize(model, seed=4)
    x = images((2, 32, 32, 3), seed=14)
    write_parity(folder, x, torch_logits(model, x))
    model.save_pretrained(str(folder), safe_serialization=True)


def jax_npz(folder: Path, big_vision: bool) -> None:
    import timm
    from timm.models.vision_transformer import _load_weights

    hidden, depth, heads, mlp, patch, size, classes = 64, 2, 4, 128, 8, 32, 6
    class_token = not big_vision
    tokens = (size // patch) ** 2 + int(class_token)
    spec = jax_vit_tensors(
        "params/" if big_vision else "",
        hidden,
        depth,
        heads,
        mlp,
        patch,
        tokens,
        classes,
        big_vision,
        class_token,
    )
    values = random_state_dict(spec, seed=5 if big_vision else 6)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.npz"
    np.savez(path, **values)
    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=size,
        patch_size=patch,
        embed_dim=hidden,
        depth=depth,
        num_heads=heads,
        mlp_ratio=mlp / hidden,
        num_classes=classes,
        class_token=class_token,
        global_pool="token" if class_token else "avg",
        fc_norm=False,
    )
    _load_weights(model, str(path))
    x = images((2, size, size, 3), seed=15 if big_vision else 16)
    write_parity(folder, x, torch_logits(model, x))


def large_r50(folder: Path) -> None:
    """Full-size timm vit_base_r50_s16_224 (98.7M parameters, ~395 MB), for a
    one-off check outside the repository; never committed."""
    import timm
    from timm.models import save_for_hf

    model = timm.create_model(
        "vit_base_r50_s16_224", pretrained=False, num_classes=1000
    )
    randomize(model, seed=7)
    x = images((1, 224, 224, 3), seed=17)
    write_parity(folder, x, torch_logits(model, x))
    save_for_hf(model, str(folder), safe_serialization=True)


def whole_model_fixtures() -> dict:
    """Register, MAP and preprocessing fixtures (scripts/fixtures_whole.py)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import fixtures_whole

    return fixtures_whole.BUILDERS


def main(argv: list[str]) -> None:
    if argv[:1] == ["--large"]:
        if len(argv) != 2:
            raise SystemExit("usage: make_fixtures.py --large DIR (outside the repo)")
        large_r50(Path(argv[1]))
        print(f"vit_base_r50_s16_224 written to {argv[1]}")
        return
    builders = {
        "timm_vit_tiny_patch16_224": timm_vit_tiny,
        "timm_vit_avg": timm_vit_avg,
        "timm_vit_r26": timm_vit_r26,
        "timm_deit_distilled": partial(timm_deit, distilled=True),
        "timm_deit3": partial(timm_deit, distilled=False),
        "hf_vit": hf_vit,
        "hf_vit_model": hf_vit_model,
        "hf_vit_model_options": hf_vit_model_options,
        "hf_deit": hf_deit,
        **whole_model_fixtures(),
        "augreg_vit": partial(jax_npz, big_vision=False),
        "big_vision_vit": partial(jax_npz, big_vision=True),
    }
    names = argv or list(builders)
    unknown = set(names) - set(builders)
    if unknown:
        raise SystemExit(f"Unknown fixtures {sorted(unknown)}; valid: {list(builders)}")
    import torch

    torch.manual_seed(0)
    for name in names:
        folder = FIXTURES / name
        with tempfile.TemporaryDirectory() as tmp:
            # Build in a scratch folder and swap it in whole.
            scratch = Path(tmp) / name
            builders[name](scratch)
            if folder.exists():
                for old in folder.iterdir():
                    old.unlink()
            folder.mkdir(parents=True, exist_ok=True)
            for new in scratch.iterdir():
                new.replace(folder / new.name)
        size = sum(f.stat().st_size for f in folder.iterdir())
        print(f"{name}: {size / 1e6:.2f} MB in {folder}")


if __name__ == "__main__":
    main(sys.argv[1:])
