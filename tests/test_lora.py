"""LoRA fine-tuning: `keras_vit.enable_lora` trains low-rank adapters on the
blocks' projections and the head only; `keras_vit.merge_lora` folds them in
for export; `model.lora_rank` does both in a recipe."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import FLOAT32_PARITY, assert_parity, check_reloads_in_fresh_process

import keras_vit
from keras_vit.models.lora import restart_lora_adapters
from keras_vit.training import trainer as training
from keras_vit.training.config import validate
from keras_vit.training.recipes import load_recipe

HIDDEN, MLP_DIM, LAYERS, CLASSES = 32, 64, 2, 10
# (in, out) of each targetable Dense of a block.
SHAPES = {
    "qkv": (HIDDEN, 3 * HIDDEN),
    "proj": (HIDDEN, HIDDEN),
    "fc1": (HIDDEN, MLP_DIM),
    "fc2": (MLP_DIM, HIDDEN),
}
HEAD_PARAMS = HIDDEN * CLASSES + CLASSES


def small_vit(**options):
    keras.utils.set_random_seed(0)
    return keras_vit.ViT(
        "Ti/4",
        image_size=16,
        num_classes=CLASSES,
        num_channels=1,
        hidden_dim=HIDDEN,
        num_layers=LAYERS,
        num_heads=2,
        mlp_dim=MLP_DIM,
        **options,
    )


def batch(size=8):
    rng = np.random.default_rng(0)
    return rng.normal(size=(size, 16, 16, 1)).astype("float32"), np.arange(size) % 10


def params(variables) -> int:
    return int(sum(np.prod(v.shape) for v in variables))


def fit(model, steps, learning_rate=1e-2):
    x, y = batch()
    model.compile(
        keras.optimizers.AdamW(learning_rate),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(x, y, batch_size=len(x), epochs=steps, verbose=0)


@pytest.mark.parametrize(
    "rank, targets",
    [(4, ("qkv", "proj")), (1, ("qkv",)), (8, ("qkv", "proj", "fc1", "fc2"))],
)
def test_trainable_parameters_are_the_adapters_and_the_head(rank, targets):
    model = small_vit()
    if targets == ("qkv", "proj"):
        keras_vit.enable_lora(model, rank)  # the default targets
    else:
        keras_vit.enable_lora(model, rank, targets=targets)
    adapters = LAYERS * sum(rank * sum(SHAPES[t]) for t in targets)
    assert params(model.trainable_weights) == adapters + HEAD_PARAMS
    expected = [
        f"block_{i}/{'attention' if t in ('qkv', 'proj') else 'mlp'}/{t}/{name}"
        for i in range(LAYERS)
        for t in SHAPES
        if t in targets
        for name in ("lora_kernel_a", "lora_kernel_b")
    ]
    assert [v.path for v in model.trainable_weights] == [
        *expected,
        "head/kernel",
        "head/bias",
    ]


def test_fit_moves_only_the_adapters_and_the_head():
    model = small_vit()
    keras_vit.enable_lora(model, 4)
    before = {v.path: np.array(v) for v in model.weights}
    fit(model, steps=2)
    moved = [v.path for v in model.weights if not np.array_equal(before[v.path], v)]
    # B starts at zero, so A gets its first gradient in the second step.
    assert moved == [v.path for v in model.trainable_weights]
    assert len(moved) == 4 * LAYERS + 2


def test_merged_model_is_ordinary_and_computes_the_same(tmp_path):
    model = small_vit()
    keras_vit.enable_lora(model, 4, targets=("qkv", "proj", "fc1", "fc2"))
    fit(model, steps=3)
    merged = keras_vit.merge_lora(model)
    plain = small_vit()
    assert [v.path for v in merged.weights] == [v.path for v in plain.weights]
    trainable = [v.path for v in plain.trainable_weights]
    assert [v.path for v in merged.trainable_weights] == trainable
    x, _ = batch()
    logits = np.asarray(model(x))
    # The same product (x @ (W + A @ B)) with the sum folded once instead of per
    # call: float32 rounding relative to the logits' scale, as for any
    # re-association of the same network (helpers.FLOAT32_PARITY).
    assert_parity(merged(x), logits, logits, FLOAT32_PARITY, "merged vs LoRA")
    # The adapters did change the function: merging is not a no-op.
    assert np.max(np.abs(logits - np.asarray(small_vit()(x)))) > 1e-3
    check_reloads_in_fresh_process(merged, x, tmp_path)


def test_export_model_exports_a_lora_model_merged(tmp_path):
    from keras_vit.deploy.export import export_model

    model = small_vit()
    keras_vit.enable_lora(model, 4)
    fit(model, steps=2)
    preprocessing = {
        "image_size": (16, 16),
        "channels": 1,
        "mean": [0.5],
        "std": [0.5],
        "pixel_scale": 255.0,
    }
    export_model(model, "lora", tmp_path, tflite=(), preprocessing=preprocessing)
    saved = tf.saved_model.load(str(tmp_path / "lora" / "1"))
    assert not [v.name for v in saved.variables if "lora" in v.name]
    pixels = np.random.default_rng(1).uniform(0, 255, (4, 16, 16, 1)).astype("float32")
    x = (pixels / 255.0 - 0.5) / 0.5
    served = saved.signatures["serving_default"](pixels=tf.constant(pixels))
    logits = np.asarray(model(x))
    # One float32 graph against another: FLOAT32_PARITY of the logits' scale.
    assert_parity(served["logits"], logits, logits, FLOAT32_PARITY, "export")


def test_lora_model_saves_merged_and_restarts_after_a_checkpoint(tmp_path):
    """Keras saves a LoRA Dense with its adapters merged into the kernel and
    zeroes them on load; `restart_lora_adapters` gives a reloaded model
    adapters that learn again."""
    model = small_vit()
    keras_vit.enable_lora(model, 4)
    fit(model, steps=2)
    x, _ = batch()
    model.save_weights(tmp_path / "ckpt.weights.h5")
    reloaded = keras_vit.enable_lora(small_vit(), 4)
    reloaded.load_weights(tmp_path / "ckpt.weights.h5")
    logits = np.asarray(model(x))
    assert_parity(reloaded(x), logits, logits, FLOAT32_PARITY, "checkpoint")
    qkv = reloaded.get_layer("block_0").attention.qkv
    assert not np.any(qkv.lora_kernel_a) and not np.any(qkv.lora_kernel_b)
    assert restart_lora_adapters(reloaded, seed=1) == 2 * LAYERS
    assert np.any(qkv.lora_kernel_a) and not np.any(qkv.lora_kernel_b)
    assert_parity(reloaded(x), logits, logits, FLOAT32_PARITY, "restarted")
    fit(reloaded, steps=2)
    assert np.any(qkv.lora_kernel_b)


def test_hybrid_stem_is_frozen_as_a_whole():
    keras.utils.set_random_seed(0)
    model = keras_vit.HybridViT(
        "Ti",
        32,
        CLASSES,
        stem=(1,),
        stem_width=16,
        norm_groups=8,
        hidden_dim=HIDDEN,
        num_layers=LAYERS,
        num_heads=2,
        mlp_dim=MLP_DIM,
    )
    keras_vit.enable_lora(model, 2)
    rank_params = LAYERS * 2 * (sum(SHAPES["qkv"]) + sum(SHAPES["proj"]))
    assert params(model.trainable_weights) == rank_params + HEAD_PARAMS
    frozen = [layer.name for layer in model.layers if not layer.trainable]
    assert "stem_conv" in frozen and "patch_encoder" in frozen


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rank": 0}, "LoRA `rank` must be a positive int, got 0"),
        ({"rank": 2.0}, "LoRA `rank` must be a positive int, got 2.0"),
        ({"rank": True}, "LoRA `rank` must be a positive int, got True"),
        (
            {"rank": 2, "targets": ("qkv", "mlp")},
            r"Unknown LoRA targets \['mlp'\]; valid targets are qkv, proj, fc1, fc2",
        ),
        ({"rank": 2, "targets": ()}, r"Unknown LoRA targets \[\]"),
    ],
)
def test_bad_arguments_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.enable_lora(small_vit(), **kwargs)


def test_models_lora_cannot_apply_to_are_refused():
    model = keras_vit.enable_lora(small_vit(), 2)
    with pytest.raises(ValueError, match="LoRA is already enabled on"):
        keras_vit.enable_lora(model, 2)
    with pytest.raises(ValueError, match="has none of the layers"):
        keras_vit.enable_lora(small_vit(include_top=False, pooling="token"), 2)
    cnn = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="head")])
    with pytest.raises(ValueError, match="has no TransformerBlock"):
        keras_vit.enable_lora(cnn, 2)


def test_recipe_option_trains_two_steps_and_saves_merged(tmp_path):
    config = load_recipe(
        "digits",
        {
            "smoke": "true",
            "model.lora_rank": "2",
            "run_dir": str(tmp_path / "run"),
            "verbose": "0",
        },
    )
    built = training.build_model(config, num_classes=10)
    hidden = config.model.hidden_dim
    # Two blocks in smoke mode, QKV (hidden -> 3 hidden) and projection.
    adapters = 2 * 2 * (4 * hidden + 2 * hidden)
    assert params(built.trainable_weights) == adapters + hidden * 10 + 10
    metadata = training.train(config)
    assert metadata["steps"] == 2
    model = metadata["model"]
    assert not [v.path for v in model.weights if "lora" in v.path]
    saved = keras.saving.load_model(tmp_path / "run" / "model.keras")
    x = np.random.default_rng(0).normal(size=(2, 16, 16, 1)).astype("float32")
    np.testing.assert_array_equal(saved(x), model(x))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model.lora_rank": "-1"}, "model.lora_rank must be in >= 0, got -1"),
        (
            {"model.lora_rank": "4", "model.freeze_backbone": "true"},
            "model.lora_rank=4 applies to model.kind='vit' without freeze_backbone",
        ),
    ],
)
def test_recipe_option_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        validate(load_recipe("digits", overrides))
