"""transformers' ViT layout (`vit`, `deit` and the model types saved like
it): options beyond the defaults convert with parity, and what keras_vit's
ViT cannot compute is refused by name. Fixtures from
scripts/make_fixtures.py."""

from pathlib import Path

import numpy as np
import pytest
from helpers import assert_parity, edited_checkpoint
from safetensors.numpy import load_file, save_file

from keras_vit.errors import CheckpointError
from keras_vit.pretrained.convert import convert_checkpoint

FIXTURES = Path(__file__).parent / "fixtures"


def test_gelu_new_and_a_narrower_pooler_give_transformers_outputs():
    folder = FIXTURES / "hf_vit_model_options"
    model = convert_checkpoint(folder)
    assert model.get_layer("pre_logits").units == 16
    assert model.get_layer("block_0").mlp_activation == "gelu_tanh"
    data = np.load(folder / "parity.npz")
    # Relative to max(1, |outputs|): float32 through another framework; exact
    # GELU instead of GELU-tanh misses by 2.5e-4 of that scale.
    assert_parity(model(data["images"]), data["logits"], data["logits"], 1e-4)


@pytest.mark.parametrize(
    ("name", "changes", "message"),
    [
        ("hf_vit_model", dict(pooler_act="relu"), "pooler_act='relu'"),
        ("hf_vit", dict(model_type="beit"), "model_type='beit' is not supported"),
        ("hf_vit", dict(hidden_act="relu"), "hidden_act='relu' is not supported"),
    ],
)
def test_refuses_options_by_name(name, changes, message, tmp_path):
    folder = edited_checkpoint(FIXTURES / name, tmp_path, **changes)
    with pytest.raises(CheckpointError, match=message):
        convert_checkpoint(folder)


def test_deit_classifying_the_class_token_alone_is_refused(tmp_path):
    # DeiTForImageClassification: one classifier on the class token, though
    # the distillation token is in the sequence.
    folder = edited_checkpoint(FIXTURES / "hf_deit", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors = {
        k.replace("cls_classifier", "classifier"): v
        for k, v in tensors.items()
        if not k.startswith("distillation_classifier")
    }
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="DeiTForImageClassification"):
        convert_checkpoint(folder)
