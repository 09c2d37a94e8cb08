"""Fixtures of converted models that arrive whole: register tokens, MAP
heads, and what timm's and Hugging Face's preprocessing make of a real JPEG.
Written by `scripts/make_fixtures.py` (same environment, same rules); see its
docstring for the list."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
from fixture_common import (
    images,
    jax_vit_tensors,
    random_state_dict,
    randomize,
    torch_logits,
    write_parity,
)


def timm_small(architecture: str, seed: int, **kwargs):
    import timm

    model = timm.create_model(
        architecture,
        pretrained=False,
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=5,
        **kwargs,
    )
    randomize(model, seed=seed)
    return model


def timm_with_count(folder: Path, architecture: str, seed: int) -> None:
    """A small timm model of `architecture`'s layout, its logits and timm's
    parameter count (what `keras-vit info` must print)."""
    from timm.models import save_for_hf

    model = timm_small(architecture, seed)
    x = images((2, 32, 32, 3), seed=seed + 10)
    write_parity(folder, x, torch_logits(model, x))
    save_for_hf(model, str(folder), safe_serialization=True)
    count = sum(p.numel() for p in model.parameters())
    (folder / "timm.json").write_text(
        json.dumps({"architecture": architecture, "parameters": count}, indent=1)
    )


def big_vision_map(folder: Path) -> None:
    from timm.models.vision_transformer import _load_weights

    hidden, heads, mlp = 32, 2, 128
    spec = jax_vit_tensors(
        "params/", hidden, 2, heads, mlp, 8, 16, 5, True, class_token=False
    )
    hd = hidden // heads
    spec += [
        ("params/MAPHead_0/probe", (1, 1, hidden)),
        *[
            (
                f"params/MAPHead_0/MultiHeadDotProductAttention_0/{n}/kernel",
                (hidden, heads, hd),
            )
            for n in ("query", "key", "value")
        ],
        *[
            (f"params/MAPHead_0/MultiHeadDotProductAttention_0/{n}/bias", (heads, hd))
            for n in ("query", "key", "value")
        ],
        (
            "params/MAPHead_0/MultiHeadDotProductAttention_0/out/kernel",
            (heads, hd, hidden),
        ),
        ("params/MAPHead_0/MultiHeadDotProductAttention_0/out/bias", (hidden,)),
        ("params/MAPHead_0/LayerNorm_0/scale", (hidden,)),
        ("params/MAPHead_0/LayerNorm_0/bias", (hidden,)),
        ("params/MAPHead_0/MlpBlock_0/Dense_0/kernel", (hidden, mlp)),
        ("params/MAPHead_0/MlpBlock_0/Dense_0/bias", (mlp,)),
        ("params/MAPHead_0/MlpBlock_0/Dense_1/kernel", (mlp, hidden)),
        ("params/MAPHead_0/MlpBlock_0/Dense_1/bias", (hidden,)),
    ]
    values = random_state_dict(spec, seed=24)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.npz"
    np.savez(path, **values)
    model = timm_small("vit_base_patch16_siglip_224", seed=24)
    _load_weights(model, str(path))
    x = images((2, 32, 32, 3), seed=34)
    write_parity(folder, x, torch_logits(model, x))


def china_jpg() -> Path:
    import sklearn

    return Path(sklearn.__file__).parent / "datasets" / "images" / "china.jpg"


def timm_deit_china(folder: Path) -> None:
    """What timm's eval transforms make of a real JPEG, for a model whose
    config asks for ImageNet mean / std, bicubic and crop 0.875."""
    import timm
    import torch
    from PIL import Image
    from timm.models import save_for_hf

    model = timm.create_model(
        "deit_small_patch16_224",
        pretrained=False,
        img_size=64,
        patch_size=16,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=10,
        pretrained_cfg_overlay=dict(crop_pct=0.875, input_size=(3, 64, 64)),
    )
    randomize(model, seed=25)
    with torch.no_grad():
        # Logits of a few units rather than ~0.1, so that 1e-3 tells a
        # resize or normalisation mistake from float rounding.
        model.head.weight.mul_(50.0)
    config = timm.data.resolve_data_config({}, model=model)
    transform = timm.data.create_transform(**config)
    pixels = transform(Image.open(china_jpg()).convert("RGB"))[None]
    model.eval()
    with torch.no_grad():
        logits = model(pixels).numpy()
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(
        folder / "china.npz",
        input=pixels.numpy().transpose(0, 2, 3, 1),
        logits=logits,
    )
    labels = [f"class_{i}" for i in range(10)]
    save_for_hf(
        model,
        str(folder),
        model_config={"label_names": labels},
        safe_serialization=True,
    )


def hf_vit_china(folder: Path) -> None:
    """What a Hugging Face image processor makes of a real JPEG."""
    import torch
    from PIL import Image
    from transformers import DeiTImageProcessor, ViTConfig, ViTForImageClassification

    labels = [f"class_{i}" for i in range(10)]
    config = ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=64,
        patch_size=16,
        num_labels=10,
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
    )
    model = ViTForImageClassification(config)
    randomize(model, seed=26)
    with torch.no_grad():
        model.classifier.weight.mul_(50.0)  # logits of a few units, as above
    processor = DeiTImageProcessor(
        size={"height": 73, "width": 73},
        crop_size={"height": 64, "width": 64},
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    )
    pixels = processor(
        images=Image.open(china_jpg()).convert("RGB"), return_tensors="pt"
    ).pixel_values
    model.eval()
    with torch.no_grad():
        logits = model(pixels).logits.numpy()
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(
        folder / "china.npz", input=pixels.numpy().transpose(0, 2, 3, 1), logits=logits
    )
    model.save_pretrained(str(folder), safe_serialization=True)
    processor.save_pretrained(str(folder))


BUILDERS = {
    "timm_vit_reg": partial(
        timm_with_count, architecture="vit_base_patch16_reg4_gap_256", seed=22
    ),
    "timm_vit_map": partial(
        timm_with_count, architecture="vit_base_patch16_siglip_224", seed=23
    ),
    "big_vision_map": big_vision_map,
    "timm_deit_china": timm_deit_china,
    "hf_vit_china": hf_vit_china,
}
