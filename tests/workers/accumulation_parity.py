"""Gradient accumulation over 4 steps on MirroredStrategy with two logical
CPUs against the gradient of one step on the whole batch, on one device.
Prints one JSON line of measured differences.

Logical devices must be set before TensorFlow initialises its devices, so
this runs as its own process: `python accumulation_parity.py --jit 0|1`."""

import argparse
import json
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from common import BATCH, batch, tiny_vit  # noqa: E402

from keras_vit.training.distribute import compile_model, get_strategy  # noqa: E402

STEPS = 4

parser = argparse.ArgumentParser()
parser.add_argument("--jit", type=int, default=0)
args = parser.parse_args()

loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
images, labels = zip(*(batch(k) for k in range(STEPS)), strict=True)
full_images, full_labels = tf.concat(images, 0), tf.concat(labels, 0)


def model_with_head():
    """The tiny ViT with a random head: its zero-initialised head would give
    every weight below it a zero gradient."""
    model = tiny_vit()
    head = model.get_layer("head")
    kernel = np.random.default_rng(0).normal(0, 0.5, head.kernel.shape)
    head.kernel.assign(kernel.astype("float32"))
    return model


# The reference: one gradient on all STEPS * BATCH examples, one device.
reference = model_with_head()
with tf.GradientTape() as tape:
    loss = loss_fn(full_labels, reference(full_images, training=True))
full_gradient = tape.gradient(loss, reference.trainable_weights)
start = [np.asarray(w) for w in reference.trainable_weights]

mirrored = get_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
with mirrored.scope():
    model = model_with_head()
    # SGD at learning rate 1: the update is minus the applied gradient.
    compile_model(
        model,
        strategy=mirrored,
        jit_compile=bool(args.jit),
        optimizer=keras.optimizers.SGD(1.0, gradient_accumulation_steps=STEPS),
        loss=loss_fn,
    )
data = tf.data.Dataset.from_tensor_slices((full_images, full_labels)).batch(BATCH)
model.fit(data.take(STEPS - 1), verbose=0)
early = [np.asarray(w) for w in model.trainable_weights]
model.fit(data.skip(STEPS - 1), verbose=0)
update = [
    s - np.asarray(w) for s, w in zip(start, model.trainable_weights, strict=True)
]

# Relative to the largest gradient entry: float32 sums over differently
# split batches agree to a few ulps of the largest term.
gradient_scale = max(float(np.abs(np.asarray(g)).max()) for g in full_gradient)
difference = max(
    float(np.abs(u - np.asarray(g)).max())
    for u, g in zip(update, full_gradient, strict=True)
)
report = {
    "replicas": mirrored.num_replicas_in_sync,
    "xla_mode": model.xla_mode,
    "optimizer_steps": int(model.optimizer.iterations.numpy()),
    "moved_before_last_step": max(
        float(np.abs(s - e).max()) for s, e in zip(start, early, strict=True)
    ),
    "gradient_scale": gradient_scale,
    # The smallest weight's largest gradient entry: every weight is tested.
    "smallest_weight_gradient": min(
        float(np.abs(np.asarray(g)).max()) for g in full_gradient
    ),
    "relative_diff": difference / gradient_scale,
}
print("REPORT " + json.dumps(report))
