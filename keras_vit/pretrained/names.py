"""Short names for the popular ViT checkpoints on the Hugging Face Hub.

One line per checkpoint: the Hub repository, the file keras_vit reads, its
preprocessing as timm's `pretrained_cfg` states it (the values of timm
1.0.31's table; Hugging Face repositories say theirs in
`preprocessor_config.json`, which wins over the table's copy), the classes
of its head and, when pinned, the file's sha256. Without a pinned digest
the download is checked against the sha256 the Hub stores the file under. A
name not in the table may still be any Hub id (`timm/<model>.<tag>`,
`facebook/dinov2-small`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

INCEPTION = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}
IMAGENET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
OPENAI = {
    "mean": (0.48145466, 0.4578275, 0.40821073),
    "std": (0.26862954, 0.26130258, 0.27577711),
}

# The image processors of the transformers repositories, in timm's keys:
# DINOv2's BitImageProcessor resizes the shorter side to 256 (bicubic) and
# crops 224; DINOv3's resizes to 224x224 (bilinear); SigLIP's to 224x224
# (bicubic); CLIP's shorter side to 224 (bicubic), then crops 224.
DINOV2 = {**IMAGENET, "interpolation": "bicubic", "crop_pct": 0.875}
DINOV3 = {
    **IMAGENET,
    "interpolation": "bilinear",
    "crop_pct": 1.0,
    "crop_mode": "squash",
}
SIGLIP = {
    **INCEPTION,
    "interpolation": "bicubic",
    "crop_pct": 1.0,
    "crop_mode": "squash",
}
CLIP = {**OPENAI, "interpolation": "bicubic", "crop_pct": 1.0}


@dataclass(frozen=True)
class NamedCheckpoint:
    """A checkpoint known by a short name.

    Attributes:
        repo_id: the Hub repository.
        image_size: the size it was trained at.
        labels: the label set of its head (`"imagenet-1k"`, ...), or None
            for a feature backbone (no head).
        preprocessing: timm `pretrained_cfg` keys (`mean`, `std`,
            `interpolation`, `crop_pct`, `crop_mode`), used when the
            downloaded files state none.
        filename: the file read (safetensors; never a pickle).
        revision: a Hub revision (commit, tag) to pin, or None for main.
        sha256: the digest the file must have, or None (the Hub's own).
    """

    repo_id: str
    image_size: int
    labels: str | None
    preprocessing: dict | None = field(default=None)
    filename: str = "model.safetensors"
    revision: str | None = None
    sha256: str | None = None


def _timm(model: str, size: int, labels, norm: dict, crop: float) -> NamedCheckpoint:
    cfg = {**norm, "interpolation": "bicubic", "crop_pct": crop}
    return NamedCheckpoint(f"timm/{model}", size, labels, cfg)


ALIASES: dict[str, NamedCheckpoint] = {
    # timm: AugReg ("How to train your ViT"), fine-tuned on ImageNet-1k.
    "vit-ti16": _timm(
        "vit_tiny_patch16_224.augreg_in21k_ft_in1k", 224, "imagenet-1k", INCEPTION, 0.9
    ),
    "vit-s16": _timm(
        "vit_small_patch16_224.augreg_in21k_ft_in1k", 224, "imagenet-1k", INCEPTION, 0.9
    ),
    "vit-b16": _timm(
        "vit_base_patch16_224.augreg2_in21k_ft_in1k", 224, "imagenet-1k", INCEPTION, 0.9
    ),
    "vit-l16": _timm(
        "vit_large_patch16_224.augreg_in21k_ft_in1k", 224, "imagenet-1k", INCEPTION, 0.9
    ),
    "vit-b16-in21k": _timm(
        "vit_base_patch16_224.augreg_in21k", 224, "imagenet-21k", INCEPTION, 0.9
    ),
    "vit-b16-r50": _timm(
        "vit_base_r50_s16_384.orig_in21k_ft_in1k", 384, "imagenet-1k", INCEPTION, 1.0
    ),
    # timm: DeiT and DeiT III.
    "deit-s16": _timm(
        "deit_small_patch16_224.fb_in1k", 224, "imagenet-1k", IMAGENET, 0.9
    ),
    "deit-b16-distilled": _timm(
        "deit_base_distilled_patch16_224.fb_in1k", 224, "imagenet-1k", IMAGENET, 0.9
    ),
    "deit3-b16": _timm(
        "deit3_base_patch16_224.fb_in1k", 224, "imagenet-1k", IMAGENET, 0.9
    ),
    # timm: self-supervised and image-text backbones (features, no head).
    "dinov2-s14": _timm("vit_small_patch14_dinov2.lvd142m", 518, None, IMAGENET, 1.0),
    "dinov2-s14-reg": _timm(
        "vit_small_patch14_reg4_dinov2.lvd142m", 518, None, IMAGENET, 1.0
    ),
    "dinov3-s16": _timm("vit_small_patch16_dinov3.lvd1689m", 256, None, IMAGENET, 1.0),
    "siglip-b16": _timm("vit_base_patch16_siglip_224.webli", 224, None, INCEPTION, 0.9),
    "clip-b16": _timm("vit_base_patch16_clip_224.openai", 224, None, OPENAI, 0.9),
    "eva02-b14": _timm("eva02_base_patch14_224.mim_in22k", 224, None, OPENAI, 0.9),
    # Hugging Face transformers repositories. Their preprocessor_config.json
    # is read when the repository has one; the table's entry (the same
    # values) fills in otherwise.
    "hf-vit-b16": NamedCheckpoint("google/vit-base-patch16-224", 224, "imagenet-1k"),
    "hf-dinov2-s14": NamedCheckpoint("facebook/dinov2-small", 518, None, DINOV2),
    "hf-dinov2-b14": NamedCheckpoint("facebook/dinov2-base", 518, None, DINOV2),
    "hf-dinov2-s14-reg": NamedCheckpoint(
        "facebook/dinov2-with-registers-small", 518, None, DINOV2
    ),
    # A gated repository: accept its licence on the Hub once, then log in.
    "hf-dinov3-s16": NamedCheckpoint(
        "facebook/dinov3-vits16-pretrain-lvd1689m", 224, None, DINOV3
    ),
    # Two-tower checkpoints: the image tower converts (image embeddings).
    "hf-siglip-b16": NamedCheckpoint(
        "google/siglip-base-patch16-224", 224, None, SIGLIP
    ),
    "hf-clip-b32": NamedCheckpoint("openai/clip-vit-base-patch32", 224, None, CLIP),
}


def lookup(name: str) -> NamedCheckpoint | None:
    """The table's entry for a short name (case-insensitive), else None."""
    return ALIASES.get(name.lower()) if isinstance(name, str) else None


def alias_preprocessing(entry: NamedCheckpoint | None) -> dict | None:
    """The entry's preprocessing as the `config.json` shape timm writes
    (`{"pretrained_cfg": {...}}`), or None."""
    if entry is None or entry.preprocessing is None:
        return None
    return {"pretrained_cfg": dict(entry.preprocessing)}
