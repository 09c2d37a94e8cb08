"""One record of the architecture: the variant table and its overrides
(`keras_vit.models.vit`), read by the training config, the trainer, the FLOP
counter and the export (which records `model_architecture` of the model it
writes), which must all agree on the same numbers."""

import pytest

from keras_vit.analysis.flops import vit_macs
from keras_vit.models.vit import (
    ARCHITECTURE_KEYS,
    VARIANTS,
    model_architecture,
    parse_variant,
    split_variant,
    variant_heads,
)
from keras_vit.training.config import ModelConfig
from keras_vit.training.recipes import load_recipe
from keras_vit.training.trainer import build_model


def test_variant_strings_have_one_parser():
    assert split_variant("S/16") == ("S", 16)
    assert split_variant("B") == ("B", None)
    for bad in ("X/16", "B/0", "B/x", 16):
        with pytest.raises(ValueError, match="variant"):
            split_variant(bad)
    assert variant_heads(384) == VARIANTS["S"]["num_heads"] == 6
    assert variant_heads(100) is None


def test_config_trainer_flops_and_export_read_the_same_architecture():
    overrides = {
        "model.variant": "Ti/4",
        "model.num_layers": "3",
        "model.mlp_dim": "96",
    }
    overrides.update({"model.hidden_dim": "0", "model.num_heads": "0"})
    config = load_recipe("digits", overrides)
    arch = config.model.architecture()
    assert arch == parse_variant("Ti/4", num_layers=3, mlp_dim=96)
    assert set(arch) == set(ARCHITECTURE_KEYS)
    model = build_model(config, num_classes=10)
    assert model_architecture(model) == arch
    # The FLOP counter from the config equals the count for the explicit dict.
    size = config.model.image_size
    channels = config.data.num_channels
    explicit = vit_macs(
        f"Ti/{arch['patch_size']}",
        size,
        10,
        num_channels=channels,
        **{k: v for k, v in arch.items() if k != "patch_size"},
    )
    from_config = vit_macs(
        config.model.variant,
        size,
        10,
        num_channels=channels,
        **config.model.architecture_overrides(),
    )
    assert from_config == explicit


def test_smoke_runs_shrink_the_recorded_architecture():
    full = load_recipe("vit_ti16_imagefolder", {"data.path": "photos"})
    smoke = load_recipe(
        "vit_ti16_imagefolder", {"data.path": "photos", "smoke": "true"}
    )
    assert full.model.architecture()["num_layers"] == 12
    assert smoke.model.architecture() == dict(full.model.architecture(), num_layers=2)
    # The smoke image size stays a multiple of the recorded patch size.
    assert smoke.model.image_size % smoke.model.architecture()["patch_size"] == 0


def test_a_hybrid_variant_without_patch_reads_the_default_stem_stride():
    model = ModelConfig(kind="hybrid", variant="Ti", num_layers=1)
    assert model.architecture() == parse_variant("Ti", patch_size=16, num_layers=1)
