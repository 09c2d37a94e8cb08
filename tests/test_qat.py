"""Quantization-aware training: fake-quant layers, ranges, gradients, the
trainer path and the full-int8 `.tflite` it writes."""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_vit.deploy.qat import int8_tflite
from keras_vit.models import qat
from keras_vit.models.vit import ViT
from keras_vit.training.config import validate
from keras_vit.training.recipes import load_recipe
from keras_vit.training.trainer import build_model, train


def tiny_vit():
    keras.utils.set_random_seed(0)
    return ViT(
        "Ti/4",
        image_size=8,
        num_classes=4,
        num_channels=1,
        hidden_dim=16,
        num_layers=1,
        num_heads=2,
        mlp_dim=32,
    )


def test_activation_quantizer_is_identity_within_half_a_step_and_tracks_ranges():
    quantizer = qat.ActivationQuantizer(ema_decay=0.5)
    x = np.linspace(-1.0, 3.0, 101, dtype="float32")
    y = np.asarray(quantizer(x, training=True))
    # The first training batch sets the range outright.
    assert float(quantizer.range_min.numpy()) == -1.0
    assert float(quantizer.range_max.numpy()) == 3.0
    step = 4.0 / 255
    # Rounding to the nearest of 256 levels moves a value by at most half a
    # step (plus float32 rounding of values of size ~3).
    assert np.max(np.abs(y - x)) <= step / 2 + 1e-6
    quantizer(np.float32([-3.0, 1.0]), training=True)
    # Later batches: a moving average, 0.5 * old + 0.5 * batch.
    assert float(quantizer.range_min.numpy()) == pytest.approx(-2.0)
    assert float(quantizer.range_max.numpy()) == pytest.approx(2.0)
    quantizer(np.float32([-9.0, 9.0]), training=False)
    assert float(quantizer.range_max.numpy()) == pytest.approx(2.0)


def test_kernel_is_rounded_per_channel_with_straight_through_gradients():
    values = np.random.default_rng(0).normal(size=(8, 3)) * [1, 10, 100]
    kernel = keras.Variable(values.astype("float32"))
    weights = tf.constant(np.arange(24, dtype="float32").reshape(8, 3))
    with tf.GradientTape() as tape:
        tape.watch(kernel.value)
        rounded = qat.fake_quantize_kernel(kernel)
        loss = tf.reduce_sum(rounded * weights)
    steps = np.max(np.abs(kernel.numpy()), axis=0) / 127
    error = np.abs(rounded.numpy() - kernel.numpy())
    # Each channel on its own grid: half of its own step, whatever the scale.
    assert np.all(error <= steps / 2 * (1 + 1e-5))
    np.testing.assert_allclose(np.abs(rounded.numpy()).max(0), steps * 127, 1e-6)
    # Straight-through: d(sum(q(k) * w))/dk is w inside the range.
    np.testing.assert_allclose(tape.gradient(loss, kernel.value), weights.numpy())


def test_qat_copy_trains_every_weight_updates_ranges_and_writes_back():
    model = tiny_vit()
    # The fresh head is zero, which would stop every gradient below it.
    head = model.get_layer("head").kernel
    head.assign(np.random.default_rng(2).normal(size=head.shape).astype("float32"))
    qat_model = qat.quantize_aware(model)
    quantizers = qat.activation_quantizers(qat_model)
    assert "block_0/attention/qkv/input_quantizer" in quantizers
    assert "block_0/attention/logits_quantizer" in quantizers
    assert "head/output_quantizer" in quantizers
    assert all(not w.trainable for q in quantizers.values() for w in q.weights)
    x = np.random.default_rng(1).normal(size=(8, 8, 8, 1)).astype("float32")
    labels = tf.one_hot(np.arange(8) % 4, 4)
    with tf.GradientTape() as tape:
        logits = qat_model(x, training=True)
        loss = keras.losses.categorical_crossentropy(labels, logits, from_logits=True)
    grads = tape.gradient(loss, qat_model.trainable_variables)
    variables = qat_model.trainable_variables
    assert not [v.path for v, g in zip(variables, grads, strict=True) if g is None]
    assert all(float(tf.reduce_max(tf.abs(g))) > 0 for g in grads)
    for path, quantizer in quantizers.items():
        tracked = quantizer.fixed_range is None
        assert float(quantizer.observed_batches.numpy()) == float(tracked), path
        assert quantizer.range_max.numpy() > quantizer.range_min.numpy(), path
    probs = quantizers["block_0/attention/probs_quantizer"]
    assert float(probs.range_max.numpy()) == 255 / 256
    # Rounding to int8 moves the logits a little, not a lot: the QAT model is
    # the float model plus quantization noise.
    reference = np.asarray(model(x))
    rounded = np.asarray(qat_model(x))
    assert np.max(np.abs(rounded - reference)) < 0.1 * np.max(np.abs(reference))

    float_model = tiny_vit()
    qat_model.layers[-1].kernel.assign(qat_model.layers[-1].kernel + 1.0)
    qat.copy_float_weights(qat_model, float_model)
    assert len(float_model.weights) == len(model.weights)
    np.testing.assert_array_equal(
        float_model.get_layer("head").kernel.numpy(),
        qat_model.get_layer("head").kernel.numpy(),
    )
    assert type(model.get_layer("head")) is keras.layers.Dense


def test_qat_refuses_a_model_without_dense_layers():
    cnn = keras.Sequential(
        [keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3)], name="only_convs"
    )
    with pytest.raises(ValueError, match="model 'only_convs' has no Dense layers"):
        qat.quantize_aware(cnn)


def test_config_checks_the_qat_switch():
    config = load_recipe("qat_digits")
    with pytest.raises(ValueError, match="qat must be true or false, got 'yes'"):
        validate(dataclasses.replace(config, qat="yes"))
    teacher = dataclasses.replace(config.distill, teacher="cnn.keras")
    with pytest.raises(ValueError, match="got distill.teacher 'cnn.keras'"):
        validate(dataclasses.replace(config, distill=teacher))
    # Its int8 .tflite is converted from the float32 QAT model.
    with pytest.raises(ValueError, match="got precision='mixed_bfloat16'"):
        validate(dataclasses.replace(config, precision="mixed_bfloat16"))
    validate(dataclasses.replace(config, precision="auto"))


@pytest.mark.bfloat16
def test_a_low_precision_qat_model_is_refused_by_its_policy():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    qat_model = qat.quantize_aware(tiny_vit())
    keras.mixed_precision.set_global_policy("float32")
    calibration = np.random.default_rng(1).uniform(0, 255, (8, 8, 8, 1))
    with pytest.raises(ValueError, match="computes in mixed_bfloat16"):
        int8_tflite(qat_model, calibration.astype("float32"))


@pytest.mark.slow
def test_trainer_writes_a_full_int8_tflite_with_the_trained_ranges(tmp_path):
    from ai_edge_litert.interpreter import Interpreter

    from keras_vit.deploy.tflite import operators

    smoke = {"smoke": "true", "model.pretrained": "", "verbose": "0"}
    pretrained = tmp_path / "pretrained.keras"
    build_model(load_recipe("qat_digits", smoke), num_classes=10).save(pretrained)
    config = load_recipe(
        "qat_digits",
        {**smoke, "model.pretrained": str(pretrained), "run_dir": str(tmp_path / "r")},
    )
    metadata = train(config)
    result = metadata["qat"]
    # The file agrees with the QAT Keras model it was converted from (int8
    # rounding happens in both; only calibrated tensors differ).
    assert result["top1_agreement_with_qat_model"] >= 0.95
    content = (tmp_path / "r" / "model_qat_int8.tflite").read_bytes()
    assert "FULLY_CONNECTED" in operators(content)
    interpreter = Interpreter(model_content=content)
    tensors = interpreter.get_tensor_details()
    # Full integer as post-training int8 is: float32 only at the interface
    # (raw pixels in; logits and probabilities out) and in LayerNorm's NEG,
    # which has no int8 kernel (the PTQ `int8` kind keeps it float too).
    interface = ("serving_default", "StatefulPartitionedCall", "tfl.dequantize")
    floats = [t["name"] for t in tensors if t["dtype"] == np.float32]
    odd = [n for n in floats if not (n.startswith(interface) or n.endswith("/Neg"))]
    assert not odd
    scales = np.array(
        [s for t in tensors for s in t["quantization_parameters"]["scales"]]
    )
    qat_model = metadata["qat_model"]
    for path, quantizer in qat.activation_quantizers(qat_model).items():
        trained = (quantizer.range_max.numpy() - quantizer.range_min.numpy()) / 255
        # The converter stores the trained range's step as that tensor's
        # scale (float32 arithmetic on both sides).
        assert np.min(np.abs(scales / trained - 1)) < 1e-5, path
    # model.keras is an ordinary float model holding the fine-tuned weights.
    saved = keras.saving.load_model(tmp_path / "r" / "model.keras")
    np.testing.assert_array_equal(
        saved.get_layer("head").kernel.numpy(),
        qat_model.get_layer("head").kernel.numpy(),
    )
