"""Tiny model, deterministic stream and probes shared by the worker scripts
that the distribution and resume tests start as subprocesses."""

from __future__ import annotations

import os

import keras
import numpy as np
import tensorflow as tf

import keras_vit

BATCH = 8
IMAGE = 8
CLASSES = 10


def tiny_vit(dropout_rate: float = 0.0) -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras_vit.ViT(
        "Ti/4",
        image_size=IMAGE,
        num_classes=CLASSES,
        num_channels=1,
        hidden_dim=32,
        num_layers=1,
        num_heads=2,
        mlp_dim=64,
        dropout_rate=dropout_rate,
    )


def batch(step, nan_at=-1):
    """Global batch number `step` (0-based): the same for any process."""
    step = tf.cast(step, tf.int32)
    images = tf.random.stateless_normal(
        (BATCH, IMAGE, IMAGE, 1), seed=tf.stack([step, 1])
    )
    labels = tf.random.stateless_uniform(
        (BATCH,), seed=tf.stack([step, 2]), maxval=CLASSES, dtype=tf.int32
    )
    images = tf.where(step == nan_at, images * np.nan, images)
    return images, labels


def stream(start_step: int = 0, nan_at: int = -1) -> tf.data.Dataset:
    """The infinite, deterministic training stream, started at `start_step`."""
    return tf.data.Dataset.range(start_step, 2**62).map(lambda k: batch(k, nan_at))


def fingerprint(labels) -> np.ndarray:
    """Identity of a batch from its labels (exact in float32)."""
    labels = np.asarray(labels).reshape(-1)
    return ((labels + 1) * 7 ** np.arange(labels.size)).sum()


class LabelFingerprint(keras.metrics.Metric):
    """Reports the fingerprint of the last batch the train step saw."""

    def __init__(self, name="fingerprint", **kwargs):
        super().__init__(name=name, **kwargs)
        self.value = self.add_variable(
            shape=(), initializer="zeros", dtype="int32", name="value"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        labels = keras.ops.cast(keras.ops.reshape(y_true, (-1,)), "int32")
        powers = keras.ops.power(7, keras.ops.arange(keras.ops.shape(labels)[0]))
        powers = keras.ops.cast(powers, "int32")
        self.value.assign(keras.ops.sum((labels + 1) * powers))

    def result(self):
        return self.value


class StepLog(keras.callbacks.Callback):
    """Appends `step fingerprint loss` per optimizer step to `path`."""

    def __init__(self, path, sleep=0.0):
        super().__init__()
        self.path, self.sleep = path, sleep

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        step = self.epoch * self.params["steps"] + batch + 1
        fingerprint = int(np.mean(logs["fingerprint"]))
        line = f"{step} {fingerprint} {float(np.mean(logs['loss'])):.9g}\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        if self.sleep:
            import time

            time.sleep(self.sleep)


def compile_tiny(model, strategy=None, jit_compile=False, learning_rate=1e-3):
    from keras_vit.training.distribute import compile_model

    return compile_model(
        model,
        strategy=strategy,
        jit_compile=jit_compile,
        optimizer=keras.optimizers.AdamW(learning_rate, weight_decay=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[LabelFingerprint()],
    )
