"""Which layout a checkpoint uses, by its tensor names."""

from __future__ import annotations

from keras_vit.errors import CheckpointError
from keras_vit.pretrained.big_vision import big_vision_plan
from keras_vit.pretrained.config_values import check_config_types
from keras_vit.pretrained.hf_clip import PATCHES, clip_plan, siglip_plan
from keras_vit.pretrained.hf_dinov2 import (
    DINOV2_PATCHES,
    DINOV3_PATCHES,
    dinov2_plan,
    dinov3_plan,
)
from keras_vit.pretrained.huggingface import VIT_LAYOUTS, huggingface_plan
from keras_vit.pretrained.json_files import name_list
from keras_vit.pretrained.layouts import Plan
from keras_vit.pretrained.timm import timm_plan


def detect_architecture(
    tensors: dict, config: dict | None = None, hints: dict | None = None
) -> Plan:
    """Recognises timm, Hugging Face (ViT, DeiT, DINOv2, DINOv3, SigLIP,
    CLIP) and AugReg/big_vision layouts.

    `hints` (`image_size`, `num_heads`) fill in what neither the tensors nor
    the config tell.
    """
    check_config_types(config or {})
    try:
        return _detect(tensors, config or {}, hints or {})
    except CheckpointError:
        raise
    except KeyError as error:
        raise CheckpointError(
            f"The checkpoint lacks tensor {error.args[0]!r}, which its layout "
            "needs to tell the architecture."
        ) from None
    except (ValueError, IndexError) as error:
        raise CheckpointError(
            f"A tensor that tells the architecture has an unexpected shape: {error}"
        ) from None


# transformers' `model_type` of each newer family the converter reads.
HF_FAMILIES = {
    "dinov2": dinov2_plan,
    "dinov2_with_registers": dinov2_plan,
    "dinov3_vit": dinov3_plan,
    "siglip": siglip_plan,
    "siglip_vision_model": siglip_plan,
    "clip": clip_plan,
    "clip_vision_model": clip_plan,
}


def _hf_family(tensors: dict, config: dict):
    """The plan function of a newer transformers family, from the config's
    `model_type` or, without a config, the tensor names; None for others."""
    kind = config.get("model_type")
    if kind in HF_FAMILIES:
        return HF_FAMILIES[kind]

    def ends(suffix: str) -> bool:
        return any(k.endswith(suffix) for k in tensors)

    guess = None
    if ends(DINOV3_PATCHES) and ends("layer_scale1.lambda1"):
        guess = dinov3_plan
    elif ends(DINOV2_PATCHES) and ends("layer_scale1.lambda1"):
        guess = dinov2_plan
    elif ends(PATCHES) and ends("encoder.layers.0.layer_norm1.weight"):
        guess = clip_plan if ends("embeddings.class_embedding") else siglip_plan
    if guess is not None and kind is not None:
        raise CheckpointError(
            f"transformers model_type={kind!r} is not supported; the converter "
            f"reads {sorted(HF_FAMILIES)} (and {list(VIT_LAYOUTS)})."
        )
    return guess


def _detect(tensors: dict, config: dict, hints: dict) -> Plan:
    if "patch_embed.proj.weight" in tensors:
        plan, plan.layout = timm_plan(tensors, config, hints), "timm"
        return plan
    family = _hf_family(tensors, config)
    if family is not None:
        plan, plan.layout = family(tensors, config, hints), "huggingface"
        return plan
    if any(
        k.endswith("embeddings.patch_embeddings.projection.weight") for k in tensors
    ):
        plan, plan.layout = huggingface_plan(tensors, config, hints), "huggingface"
        return plan
    if any(k.endswith("embedding/kernel") for k in tensors):
        plan, plan.layout = big_vision_plan(tensors, config, hints), "big_vision"
        return plan
    kind = config.get("model_type")
    raise CheckpointError(
        "Unrecognised checkpoint layout (expected timm, Hugging Face ViT or "
        f"AugReg/big_vision names){f' of model_type={kind!r}' if kind else ''}; "
        f"first tensors: {name_list(sorted(tensors), 5)}."
    )
