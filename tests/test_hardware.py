"""precision="auto" / jit_compile="auto": the rule per machine kind, and what
the trainer and predict record and print."""

import dataclasses
import json

import keras
import pytest

from keras_vit import hardware
from keras_vit.hardware import SMALL_MODEL_MACS, choose_settings

AVX512_BF16 = frozenset({"avx2", "fma", "avx512f", "avx512_bf16"})
AMX = frozenset({"avx2", "fma", "avx512f", "amx_tile", "amx_bf16"})
AVX2 = frozenset({"avx2", "fma"})
TI16 = 1.25e9  # ViT-Ti/16 at 224
DIGITS = 5.3e6  # the digits recipe's model


@pytest.mark.parametrize(
    "macs, flags, gpus, expected",
    [
        # Measured side by side (README, Performance): bfloat16 matmuls run on
        # oneDNN's native kernels, which XLA's CPU dots do not use.
        (TI16, AVX512_BF16, [], ("mixed_bfloat16", False)),
        (TI16, AMX, [], ("mixed_bfloat16", False)),
        # No native bfloat16: emulated and slower; XLA fuses float32 best.
        (TI16, AVX2, [], ("float32", True)),
        # Overhead-bound models: no casts, no compile.
        (DIGITS, AVX512_BF16, [], ("float32", False)),
        (DIGITS, AVX2, [], ("float32", False)),
        (TI16, AVX2, [(9, 0)], ("mixed_bfloat16", True)),
        (DIGITS, AVX2, [(7, 5)], ("mixed_float16", True)),
    ],
)
def test_auto_rule_per_machine_kind(macs, flags, gpus, expected):
    choice = choose_settings(macs, "auto", "auto", gpus=gpus, flags=flags)
    assert (choice["precision"], choice["jit_compile"]) == expected
    assert choice["auto"] == ["precision", "jit_compile"]
    assert choice["reason"]


def test_explicit_settings_are_kept_and_xla_follows_the_given_precision():
    # Float32 follows the CPU: oneDNN on AVX-512, XLA on AVX2.
    choice = choose_settings(TI16, "float32", "auto", gpus=[], flags=AVX512_BF16)
    assert (choice["precision"], choice["jit_compile"]) == ("float32", False)
    assert choice["auto"] == ["jit_compile"]
    choice = choose_settings(TI16, "float32", "auto", gpus=[], flags=AVX2)
    assert (choice["precision"], choice["jit_compile"]) == ("float32", True)
    choice = choose_settings(TI16, "auto", False, gpus=[], flags=AVX2)
    assert (choice["precision"], choice["jit_compile"]) == ("float32", False)
    assert choice["auto"] == ["precision"]
    assert SMALL_MODEL_MACS > DIGITS * 10 and SMALL_MODEL_MACS < TI16 / 10
    # The reason names only what was chosen: a small model trained in a given
    # bfloat16 is not said to run in float32.
    choice = choose_settings(DIGITS, "mixed_bfloat16", "auto", gpus=[], flags=AVX2)
    assert choice["reason"].endswith("per-op overhead dominates, without XLA")
    choice = choose_settings(DIGITS, "auto", "auto", gpus=[], flags=AVX2)
    assert choice["reason"].endswith("dominates, float32 without XLA")


def test_bad_values_name_what_is_valid():
    with pytest.raises(ValueError, match="precision must be 'auto' or one of"):
        choose_settings(TI16, "bfloat16", "auto", gpus=[], flags=AVX2)
    with pytest.raises(ValueError, match="jit_compile must be 'auto', true or false"):
        choose_settings(TI16, "auto", "yes", gpus=[], flags=AVX2)


def test_describe_records_the_cpu_flags_that_decide():
    facts = hardware.describe()
    assert set(facts) == {"cpu", "cpu_flags", "onednn_max_cpu_isa", "cpu_count", "gpus"}
    assert set(facts["cpu_flags"]) <= set(hardware.CPU_FEATURES)
    assert set(facts["cpu_flags"]) == hardware.cpu_flags() & set(hardware.CPU_FEATURES)


@pytest.mark.parametrize(
    "cap, flags, expected",
    [
        # The AVX2 stand-in on an AVX-512 bfloat16 CPU: the AVX2 rule.
        ("AVX2", AVX512_BF16, ("float32", True)),
        ("avx512_core", AMX, ("float32", False)),
        ("AVX512_CORE_BF16", AMX | AVX512_BF16, ("mixed_bfloat16", False)),
        ("DEFAULT", AMX, ("mixed_bfloat16", False)),
        ("", AVX512_BF16, ("mixed_bfloat16", False)),
    ],
)
def test_a_onednn_isa_cap_is_the_cpu_the_rule_sees(monkeypatch, cap, flags, expected):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    usable = hardware.usable_cpu_flags(flags)
    choice = choose_settings(TI16, "auto", "auto", gpus=[], flags=usable)
    assert (choice["precision"], choice["jit_compile"]) == expected
    assert hardware.cpu_has_fast_bfloat16(usable) == (expected[0] != "float32")
    named = cap.upper() not in ("", "DEFAULT")
    assert hardware.onednn_isa_cap() == (cap.upper() if named else None)


def test_config_takes_auto_from_the_command_line():
    from keras_vit.training.overrides import parse_overrides
    from keras_vit.training.recipes import load_recipe

    config = load_recipe(
        "digits", parse_overrides(["--precision", "auto", "--jit_compile", "auto"])
    )
    assert (config.precision, config.jit_compile) == ("auto", "auto")
    # A recipe whose jit_compile is "auto" takes a bool from the command line.
    for text, value in (("false", False), ("true", True), ("0", False)):
        config = load_recipe("digits", parse_overrides(["--jit_compile", text]))
        assert config.jit_compile is value
    with pytest.raises(ValueError, match="jit_compile must be one of"):
        load_recipe("digits", {"jit_compile": "sometimes"})


def test_trainer_resolves_prints_and_records_the_choice(tmp_path, capsys):
    from keras_vit.training.recipes import load_recipe
    from keras_vit.training.trainer import train

    config = load_recipe("digits", {"smoke": True, "run_dir": str(tmp_path / "run")})
    assert (config.precision, config.jit_compile) == ("auto", "auto")
    metadata = train(config)
    expected = choose_settings(metadata["settings"]["macs_per_image"], "auto", "auto")
    settings = metadata["settings"]
    assert (settings["precision"], settings["jit_compile"]) == (
        expected["precision"],
        expected["jit_compile"],
    )
    assert metadata["precision"] == settings["precision"]
    on_disk = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert (
        on_disk["settings"]["hardware"]["cpu_flags"] == hardware.describe()["cpu_flags"]
    )
    printed = capsys.readouterr().out
    assert f"precision={settings['precision']}" in printed
    assert "(auto: " in printed
    fixed = dataclasses.replace(config, precision="float32", jit_compile=False)
    from keras_vit.training.trainer import resolve_settings

    assert resolve_settings(fixed)[1]["auto"] == []


def test_automatic_settings_count_a_hybrids_stem():
    # The ViT formula leaves a hybrid's convolutional stem out; the settings
    # are chosen from the whole model's count.
    from keras_vit.analysis.flops import count_macs
    from keras_vit.training.model_kinds import build_kind
    from keras_vit.training.recipes import load_recipe
    from keras_vit.training.trainer import resolve_settings

    for recipe in ("mnist5k_hybrid", "mnist5k_cnn"):
        config = load_recipe(recipe, {})
        _, settings = resolve_settings(config)
        expected = count_macs(build_kind(config, 10, config.model.image_size))
        assert settings["macs_per_image"] == expected
    assert keras.config.dtype_policy().name == "float32"


def test_automatic_settings_count_the_vit_the_trainer_builds():
    # The ViT's formula gets the same options as the model: a distillation
    # token, shifted patches and their norms all count.
    from keras_vit.analysis.flops import count_macs
    from keras_vit.training.recipes import load_recipe
    from keras_vit.training.trainer import build_model, resolve_settings

    small_data = {"model.shifted_patches": True, "model.position_embedding": "sincos"}
    for recipe, overrides in [
        ("mnist5k", {}),
        ("mnist5k_deit", {}),
        ("mnist5k_deit", small_data),
    ]:
        config = load_recipe(recipe, overrides)
        _, settings = resolve_settings(config)
        model = build_model(config, 10)
        assert settings["macs_per_image"] == count_macs(model)
    # The keys reach the model.
    assert model.get_layer("patches").shifted
    assert model.get_layer("patch_encoder").position_embedding == "sincos"
    assert model.get_layer("patch_encoder").patch_norm


def test_bfloat16_under_a_onednn_cap_below_it_is_refused_in_one_line(monkeypatch):
    # What TensorFlow would abort on (a bfloat16 CPU, oneDNN capped at AVX2).
    monkeypatch.setattr(hardware, "cpu_flags", lambda: AVX512_BF16)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert hardware.bfloat16_refused_by_onednn()
    with pytest.raises(ValueError, match="'mixed_bfloat16' cannot run here: ONEDNN"):
        choose_settings(TI16, "mixed_bfloat16", "auto", gpus=[])
    assert choose_settings(TI16, "auto", "auto", gpus=[])["precision"] == "float32"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert not hardware.bfloat16_refused_by_onednn()
    choice = choose_settings(TI16, "mixed_bfloat16", "auto", gpus=[])
    assert choice["precision"] == "mixed_bfloat16"
