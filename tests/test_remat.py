"""Gradient checkpointing of the encoder blocks (`ViT(remat=True)`,
`model.remat` in a recipe)."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import REPO, check_config_round_trip, check_reloads_in_fresh_process

import keras_vit
from keras_vit.training.config import ModelConfig, TrainConfig, override, validate
from keras_vit.training.trainer import build_model

WORKERS = REPO / "tests" / "workers"


def small_vit(remat: bool, **options) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(
        "Ti/4",
        image_size=16,
        num_classes=5,
        hidden_dim=32,
        num_layers=2,
        num_heads=2,
        mlp_dim=64,
        remat=remat,
        **options,
    )
    # A random head, so that every weight below it gets a gradient.
    head = model.get_layer("head")
    kernel = np.random.default_rng(0).normal(0, 0.5, head.kernel.shape)
    head.kernel.assign(kernel.astype("float32"))
    return model


def gradients(model, mode: str, images=None) -> list[np.ndarray]:
    if images is None:
        images = tf.random.stateless_normal((4, 16, 16, 3), seed=(1, 2))
    labels = tf.constant([0, 1, 2, 3])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        return tape.gradient(loss, model.trainable_weights)

    if mode != "eager":
        step = tf.function(step, jit_compile=mode == "xla")
    return [np.asarray(g, dtype="float32") for g in step()]


def relative_difference(actual, expected) -> float:
    scale = max(float(np.abs(g).max()) for g in expected)
    diff = max(
        float(np.abs(a - e).max()) for a, e in zip(actual, expected, strict=True)
    )
    return diff / scale


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_remat_gives_the_same_float32_gradients(mode):
    expected = gradients(small_vit(False), mode)
    actual = gradients(small_vit(True), mode)
    assert all(np.abs(g).max() > 0 for g in expected)  # every weight is tested
    # The recomputed forward pass is the same float32 arithmetic, possibly
    # fused differently: within 1e-5 of the largest gradient entry (measured
    # 3e-7 to 7e-7).
    assert relative_difference(actual, expected) <= 1e-5


@pytest.mark.parametrize("mode", ["graph", "xla"])
def test_remat_under_bfloat16_differs_no_more_than_another_execution_path(mode):
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        plain_eager = gradients(small_vit(False), "eager")
        plain = gradients(small_vit(False), mode)
        remat = gradients(small_vit(True), mode)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    # A bfloat16 value carries 8 significant bits (2^-8 = 0.4% rounding), and
    # the recomputed forward pass may round at other places than the first:
    # measured 1.0-1.7% of the largest gradient entry, as large as eager vs
    # graph / XLA without remat (1.3-2.5%). Bound: 5%, the two compared.
    assert relative_difference(remat, plain) <= 0.05
    assert relative_difference(plain, plain_eager) <= 0.05


def test_remat_round_trips_and_reloads(tmp_path):
    model = small_vit(True, drop_path_rate=0.1)
    block = model.get_layer("block_0")
    assert block.remat is True
    assert check_config_round_trip(block)["remat"] is True
    inputs = np.random.default_rng(0).normal(size=(2, 16, 16, 3)).astype("float32")
    check_reloads_in_fresh_process(model, inputs, tmp_path)
    path = tmp_path / "again.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path)
    # Every block but the last, whose activations the backward pass needs
    # first (recomputing them lowers no peak).
    assert [reloaded.get_layer(f"block_{i}").remat for i in range(2)] == [True, False]


def test_remat_refuses_dropout_with_the_reason():
    with pytest.raises(ValueError, match="recomputed dropout would draw another"):
        small_vit(True, dropout_rate=0.1)
    with pytest.raises(ValueError, match="`remat` must be True or False"):
        keras_vit.TransformerBlock(2, 64, remat="yes")
    # A one-block model recomputes nothing but still refuses the pair.
    with pytest.raises(ValueError, match="recomputed dropout would draw another"):
        keras_vit.ViT(
            "Ti/16", image_size=16, num_classes=2, num_layers=1, remat=True,
            attention_dropout_rate=0.1,
        )  # fmt: skip


def test_recipe_key_builds_checkpointed_blocks():
    config = TrainConfig(
        model=ModelConfig(
            variant="Ti/4", image_size=8, hidden_dim=32, num_layers=2, num_heads=2
        )
    )
    model = build_model(override(config, **{"model.remat": "true"}), num_classes=3)
    assert [model.get_layer(f"block_{i}").remat for i in range(2)] == [True, False]
    with pytest.raises(ValueError, match="model.remat=True applies to a transformer"):
        validate(
            override(config, **{"model.remat": "true", "model.dropout_rate": "0.1"})
        )


def run_worker(jit: int, precision: str) -> dict:
    proc = subprocess.run(
        [
            sys.executable,
            str(WORKERS / "remat_parity.py"),
            "--jit",
            str(jit),
            "--precision",
            precision,
        ],
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        cwd=REPO,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr[-4000:]
    return json.loads(lines[-1][len("REPORT ") :])


@pytest.mark.slow
@pytest.mark.parametrize(
    "jit, precision, bound",
    # float32: the same arithmetic (measured 3e-7 to 5e-7); bfloat16: a few
    # of its 2^-8 roundings, as for the gradients above.
    [(0, "float32", 1e-5), (1, "float32", 1e-5), (1, "mixed_bfloat16", 0.05)],
)
def test_remat_trains_the_same_on_two_replicas(jit, precision, bound):
    report = run_worker(jit, precision)
    assert report["blocks_remat"] == [True, False]
    assert report["xla_mode"] == ("per_replica" if jit else None)
    assert report["update_scale"] > 1e-3, report  # the weights did move
    assert report["relative_update_diff"] <= bound, report
