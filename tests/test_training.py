"""The trainer: config validation and overrides, optimizer and schedule,
mixed precision, resuming, artifacts."""

import dataclasses
import json

import keras
import numpy as np
import pytest
from helpers import FLOAT32_PARITY, assert_close

from keras_vit.training import trainer as training
from keras_vit.training.config import (
    DataConfig,
    ModelConfig,
    OptimConfig,
    TrainConfig,
    config_keys,
    override,
    validate,
)
from keras_vit.training.optimizer import learning_rate_schedule, make_optimizer
from keras_vit.training.overrides import parse_overrides


def tiny(tmp_path, **changes) -> TrainConfig:
    config = TrainConfig(
        name="tiny",
        run_dir=str(tmp_path / "run"),
        batch_size=8,
        eval_batch_size=8,
        total_steps=2,
        checkpoint_every=1,
        verbose=0,
        model=ModelConfig(
            variant="Ti/4",
            image_size=8,
            hidden_dim=32,
            num_layers=1,
            num_heads=2,
            mlp_dim=64,
        ),
        data=DataConfig(source="synthetic", num_classes=4, synthetic_size=16),
        optim=OptimConfig(learning_rate=1e-3),
    )
    return override(config, **changes)


def test_unknown_key_lists_the_valid_keys():
    with pytest.raises(ValueError, match="Unknown config key 'optim.lr'") as error:
        override(TrainConfig(), **{"optim.lr": "1e-3"})
    for key in ("optim.learning_rate", "data.source", "model.variant", "total_steps"):
        assert key in str(error.value)
    assert set(config_keys()) >= {"model.resize_at", "model.pretrained", "precision"}


@pytest.mark.parametrize(
    "key, value, message",
    [
        (
            "precision",
            "float16",
            r"precision must be one of \['float32', 'mixed_bfloat16'",
        ),
        (
            "optim.learning_rate",
            "-1",
            r"optim.learning_rate must be in \[1e-12, 10.0\]",
        ),
        (
            "model.drop_path_rate",
            "1.5",
            r"model.drop_path_rate must be in \[0.0, 0.99\]",
        ),
        ("batch_size", "0", r"batch_size must be in >= 1, got 0"),
        (
            "total_steps",
            "150",
            r"total_steps \(150\) must be a multiple of checkpoint_every",
        ),
        ("optim.warmup_steps", "5000", "optim.warmup_steps must be < total_steps=1000"),
        # Accumulation that never completes: no optimizer update at all.
        (
            "optim.gradient_accumulation_steps",
            "2000",
            r"total_steps \(1000\) must be a multiple of optim.gradient_accumulation"
            r"_steps \(2000\): 1000 step\(s\) would never reach the optimizer \(0 ",
        ),
        (
            "optim.gradient_accumulation_steps",
            "3",
            r"1 step\(s\) would never reach the optimizer \(333 update\(s\)\); "
            "e.g. total_steps=999",
        ),
        ("strategy", "horovod", r"strategy must be one of \['default', 'mirrored'"),
        ("model.resize_at", "((2000, 32),)", "model.resize_at steps must increase"),
        ("data.randaugment_ops", "20", r"data.randaugment_ops must be in \[0, 11\]"),
    ],
)
def test_bad_values_name_the_valid_range(key, value, message):
    with pytest.raises(ValueError, match=message):
        validate(override(TrainConfig(), **{key: value}))


def test_overrides_parse_to_the_keys_type():
    values = parse_overrides(
        [
            "--set",
            "optim.learning_rate=3e-4",
            "--model.resize_at",
            "((400, 32),)",
            "--smoke",
            "--batch_size=128",
            "--data.flip",
            "false",
        ]
    )
    config = override(TrainConfig(), **values)
    assert config.optim.learning_rate == 3e-4
    assert config.model.resize_at == ((400, 32),)
    assert (
        config.smoke is True and config.batch_size == 128 and config.data.flip is False
    )
    with pytest.raises(ValueError, match="batch_size must be a int, got 'big'"):
        override(TrainConfig(), batch_size="big")
    with pytest.raises(ValueError, match="--set needs key=value"):
        parse_overrides(["--set", "batch_size"])


def test_warmup_then_cosine_and_batch_scaled_learning_rate():
    config = override(
        TrainConfig(),
        **{
            "optim.learning_rate": "5e-4",
            "optim.lr_base_batch_size": "512",
            "batch_size": "1024",
            "optim.warmup_steps": "100",
            "total_steps": "1100",
            "optim.end_lr_fraction": "0.0",
        },
    )
    schedule = learning_rate_schedule(config)
    peak = 1e-3  # 5e-4 * 1024 / 512
    got = [float(schedule(s)) for s in (0, 50, 100, 600, 1100)]
    # float32 schedule arithmetic: a few epsilons of the peak rate.
    assert_close(got, [0.0, peak / 2, peak, peak / 2, 0.0], 1e-6)


def test_optimizer_skips_decay_for_biases_norms_tokens_and_positions(tmp_path):
    config = tiny(
        tmp_path, **{"optim.use_ema": "true", "optim.gradient_accumulation_steps": "2"}
    )
    model = training.build_model(config, num_classes=4)
    optimizer = make_optimizer(config, model)
    decayed = {
        v.path for v in model.trainable_variables if optimizer._use_weight_decay(v)
    }
    # Only the matrices: no bias, LayerNorm, class token or position embedding.
    assert decayed == {
        "patch_encoder/projection/kernel",
        "block_0/attention/qkv/kernel",
        "block_0/attention/proj/kernel",
        "block_0/mlp/fc1/kernel",
        "block_0/mlp/fc2/kernel",
        "head/kernel",
    }
    assert optimizer.use_ema and optimizer.gradient_accumulation_steps == 2
    assert optimizer.clipnorm == 1.0 and optimizer.weight_decay == 0.05


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_runs_with_float32_variables(tmp_path, precision):
    metadata = training.train(tiny(tmp_path, precision=precision))
    model = metadata["model"]
    history = (tmp_path / "run" / "history.csv").read_text().splitlines()
    losses = [float(row.split(",")[2]) for row in history[1:]]
    assert len(losses) == 2 and np.isfinite(losses).all()
    assert np.isfinite(metadata["eval_loss"])
    assert {v.dtype for v in model.trainable_variables} == {"float32"}
    assert model.get_layer("block_0").compute_dtype == precision.split("_")[1]
    assert model.get_layer("head").compute_dtype == "float32"
    scaled = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert scaled == (precision == "mixed_float16")
    assert keras.mixed_precision.global_policy().name == "float32"  # restored


@pytest.mark.slow
def test_rerun_resumes_from_the_last_checkpoint(tmp_path):
    first = training.train(tiny(tmp_path))
    assert first["steps"] == 2 and first["optimizer_iterations"] == 2
    longer = training.train(tiny(tmp_path, total_steps="4"))
    # Steps 3 and 4 only: the history holds four intervals, none repeated.
    rows = (tmp_path / "run" / "history.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == [0, 1, 2, 3]
    assert longer["optimizer_iterations"] == 4
    run = tmp_path / "run"
    metadata = json.loads((run / "metadata.json").read_text())
    assert metadata["steps"] == 4 and metadata["preprocessing"]["image_size"] == [8, 8]
    for name in ("model.keras", "config.json", "history.csv", "curves.png"):
        assert (run / name).is_file(), name
    reloaded = keras.saving.load_model(run / "model.keras")
    x = np.zeros((1, 8, 8, 3), "float32")
    assert_close(reloaded(x), longer["model"](x), FLOAT32_PARITY)


@pytest.mark.slow
def test_progressive_resizing_and_pretrained_init(tmp_path):
    config = tiny(tmp_path, total_steps="4", **{"model.resize_at": "((2, 16),)"})
    metadata = training.train(config)
    assert metadata["model"].input_shape == (None, 16, 16, 3)
    assert metadata["optimizer_iterations"] == 4  # the schedule carried on
    assert metadata["preprocessing"]["image_size"] == [16, 16]
    # A new run initialised from it at another size and class count.
    finetune = tiny(
        tmp_path / "ft",
        **{
            "model.pretrained": str(tmp_path / "run" / "model.keras"),
            "data.num_classes": "3",
        },
    )
    model = training.build_model(finetune, num_classes=3)
    source = metadata["model"].get_layer("block_0").get_weights()
    np.testing.assert_array_equal(
        model.get_layer("block_0").get_weights()[0], source[0]
    )
    assert not np.any(model.get_layer("head").get_weights()[0])  # fresh head


def test_smoke_version_is_two_steps(tmp_path):
    from keras_vit.training.recipes import smoke_version

    config = smoke_version(
        override(
            TrainConfig(),
            **{
                "model.resize_at": "((500, 32),)",
                "batch_size": "512",
                "export_name": "x",
            },
        )
    )
    validate(config)
    assert (config.total_steps, config.checkpoint_every, config.batch_size) == (2, 1, 8)
    assert config.model.resize_at == ((1, 32),) and config.export_name == ""
    assert config.model.image_size == 32  # from 224: ViT-Ti/16 on 2x2 patches
    assert config.model.num_layers == 2
    assert dataclasses.asdict(config)["smoke"] is True
