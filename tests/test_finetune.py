from pathlib import Path

import keras
import numpy as np
import pytest
from helpers import FLOAT32_PARITY, assert_close
from sklearn.datasets import load_digits

from keras_vit import ViT
from keras_vit.pretrained.convert import convert_checkpoint
from keras_vit.training.finetune import (
    HardDistillation,
    LayerDecayAdamW,
    freeze_backbone,
    layer_decay_multipliers,
    layer_decay_optimizer,
)

FIXTURES = Path(__file__).parent / "fixtures"


def tiny(**kwargs):
    options = dict(
        image_size=16,
        num_classes=4,
        hidden_dim=32,
        num_layers=2,
        num_heads=4,
        mlp_dim=64,
    )
    options.update(kwargs)
    return ViT("Ti/8", **options)


def digits_rgb(size=(32, 48), count=256):
    """scikit-learn digits resized to `size`, three channels, in [-1, 1]."""
    digits = load_digits()
    images = digits.images[:count, :, :, None] / 16.0 * 2.0 - 1.0
    images = keras.ops.image.resize(
        images.astype("float32"), size, interpolation="bilinear"
    )
    return np.repeat(np.asarray(images), 3, axis=-1), digits.target[:count]


def test_layer_decay_multipliers_follow_block_depth():
    model = tiny()
    scales = layer_decay_multipliers(model, 0.5)
    assert scales["head/kernel"] == 1.0
    assert scales["encoder_norm/gamma"] == 1.0
    assert scales["block_1/attention/qkv/kernel"] == 0.5
    assert scales["block_0/mlp/fc2/bias"] == 0.25
    assert scales["patch_encoder/pos_embedding"] == 0.125
    assert scales["patch_encoder/cls_token"] == 0.125
    assert set(scales) == {v.path for v in model.trainable_variables}
    with pytest.raises(ValueError, match=r"`decay` must be in \(0, 1\], got 1.5"):
        layer_decay_multipliers(model, 1.5)


def test_without_multipliers_it_is_exactly_adamw():
    rng = np.random.default_rng(0)
    shapes = [(4, 3), (3,), (2, 2, 5)]
    start = [rng.standard_normal(s).astype("float32") for s in shapes]
    grads = [
        [rng.standard_normal(s).astype("float32") for s in shapes] for _ in range(3)
    ]
    results = []
    for optimizer in (
        keras.optimizers.AdamW(1e-2, weight_decay=0.1),
        LayerDecayAdamW(1e-2, weight_decay=0.1),
    ):
        variables = [keras.Variable(v, name=f"v{i}") for i, v in enumerate(start)]
        for step in grads:
            optimizer.apply(step, variables)
        results.append([v.numpy() for v in variables])
    for a, b in zip(*results, strict=True):
        # Two optimizers' element-wise updates: a few epsilons of the weights.
        assert_close(a, b, 1e-6)
        assert not np.allclose(a, start[0].ravel()[0])


def test_multipliers_scale_the_update_and_the_weight_decay():
    a = keras.Variable(np.ones(3, "float32"), name="a")
    b = keras.Variable(np.ones(3, "float32"), name="b")
    optimizer = LayerDecayAdamW(
        0.1, weight_decay=0.5, lr_multipliers={a.path: 0.25}, epsilon=1e-12
    )
    zero = np.zeros(3, "float32")
    optimizer.apply([zero, zero], [a, b])
    # Zero gradients: only the decoupled weight decay moves the weights.
    np.testing.assert_allclose(a.numpy(), 1 - 0.1 * 0.25 * 0.5, rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), 1 - 0.1 * 0.5, rtol=1e-6)
    before_a, before_b = a.numpy(), b.numpy()
    optimizer.apply([np.ones(3, "float32")] * 2, [a, b])
    step_a = before_a * (1 - 0.025 * 0.5) - a.numpy()
    step_b = before_b * (1 - 0.1 * 0.5) - b.numpy()
    np.testing.assert_allclose(step_a / step_b, 0.25, rtol=1e-4)
    config = optimizer.get_config()
    assert config["lr_multipliers"] == {a.path: 0.25}
    assert LayerDecayAdamW.from_config(config).get_config() == config


def test_converted_model_fine_tunes_on_digits_by_linear_probe_and_in_full():
    keras.utils.set_random_seed(0)
    x, y = digits_rgb()
    probe = convert_checkpoint(FIXTURES / "timm_vit_avg", num_classes=10)
    frozen_before = probe.get_layer("block_0").get_weights()
    freeze_backbone(probe)
    assert {v.path for v in probe.trainable_variables} == {"head/kernel", "head/bias"}
    probe.compile(
        keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(True)
    )
    history = probe.fit(x, y, batch_size=32, epochs=8, verbose=0).history["loss"]
    # Random-weight features: the probe's loss falls steadily, not fast.
    assert all(b < a for a, b in zip(history, history[1:], strict=False)), history
    assert history[-1] < 0.9 * history[0], history
    for a, b in zip(
        frozen_before, probe.get_layer("block_0").get_weights(), strict=True
    ):
        np.testing.assert_array_equal(a, b)

    full = convert_checkpoint(FIXTURES / "timm_vit_avg", num_classes=10)
    optimizer = layer_decay_optimizer(full, 0.75, learning_rate=3e-3, weight_decay=0.05)
    full.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(True))
    history = full.fit(x, y, batch_size=32, epochs=8, verbose=0).history["loss"]
    assert history[-1] < 0.9 * history[0], history


def test_hard_distillation_trains_the_student_not_the_teacher():
    keras.utils.set_random_seed(1)
    x = np.random.default_rng(1).standard_normal((32, 16, 16, 3)).astype("float32")
    y = np.arange(32) % 4
    teacher = tiny(name="teacher", num_layers=1)
    teacher.get_layer("head").kernel.assign(
        np.random.default_rng(2).standard_normal((32, 4)).astype("float32")
    )
    teacher_weights = [w.numpy() for w in teacher.weights]
    student = tiny(distilled=True, name="student")
    distiller = HardDistillation(student, teacher, label_smoothing=0.1)

    class_logits, dist_logits = distiller(x[:8], training=True)
    teacher_labels = np.argmax(np.asarray(teacher(x[:8])), axis=-1)
    smoothed = keras.ops.one_hot(y[:8], 4) * 0.9 + 0.1 / 4
    expected = 0.5 * np.mean(
        keras.losses.categorical_crossentropy(smoothed, class_logits, from_logits=True)
    ) + 0.5 * np.mean(
        keras.losses.sparse_categorical_crossentropy(
            teacher_labels, dist_logits, from_logits=True
        )
    )
    loss = distiller.compute_loss(x[:8], y[:8], (class_logits, dist_logits))
    np.testing.assert_allclose(loss, expected, rtol=1e-5)

    distiller.compile(keras.optimizers.AdamW(3e-3), metrics=["accuracy"])
    history = distiller.fit(x, y, batch_size=16, epochs=5, verbose=0).history
    assert history["loss"][-1] < history["loss"][0]
    assert "accuracy" in history
    for before, after in zip(teacher_weights, teacher.weights, strict=True):
        np.testing.assert_array_equal(before, after.numpy())
    # Inference is the student: the mean of both heads.
    # The same student in another graph: float32 reassociation.
    assert_close(distiller(x[:4]), student(x[:4]), FLOAT32_PARITY)
    assert set(distiller.evaluate(x, y, verbose=0, return_dict=True)) >= {
        "loss",
        "accuracy",
    }


def test_distillation_argument_errors():
    with pytest.raises(ValueError, match="has no distillation head"):
        HardDistillation(tiny(), tiny())
    with pytest.raises(
        ValueError, match=r"predicts 5 classes, the student \(and its data\) 4"
    ):
        HardDistillation(tiny(distilled=True), tiny(num_classes=5))
    with pytest.raises(ValueError, match="none of the layers"):
        freeze_backbone(tiny(include_top=False))
