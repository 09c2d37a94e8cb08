"""Which layout a checkpoint uses, by its tensor names."""

from __future__ import annotations

from keras_vit.errors import CheckpointError
from keras_vit.pretrained.big_vision import big_vision_plan
from keras_vit.pretrained.huggingface import huggingface_plan
from keras_vit.pretrained.layouts import Plan
from keras_vit.pretrained.timm import timm_plan


def detect_architecture(
    tensors: dict, config: dict | None = None, hints: dict | None = None
) -> Plan:
    """Recognises timm, Hugging Face and AugReg/big_vision layouts.

    `hints` (`image_size`, `num_heads`) fill in what neither the tensors nor
    the config tell.
    """
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


def _detect(tensors: dict, config: dict, hints: dict) -> Plan:
    if "patch_embed.proj.weight" in tensors:
        plan, plan.layout = timm_plan(tensors, config, hints), "timm"
        return plan
    if any(
        k.endswith("embeddings.patch_embeddings.projection.weight") for k in tensors
    ):
        plan, plan.layout = huggingface_plan(tensors, config, hints), "huggingface"
        return plan
    if any(k.endswith("embedding/kernel") for k in tensors):
        plan, plan.layout = big_vision_plan(tensors, config, hints), "big_vision"
        return plan
    raise CheckpointError(
        "Unrecognised checkpoint layout (expected timm, Hugging Face ViT or "
        f"AugReg/big_vision names); first tensors: {sorted(tensors)[:5]}."
    )
