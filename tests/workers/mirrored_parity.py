"""MirroredStrategy over two logical CPUs against one device, on the same
global batches. Prints one JSON line of measured differences.

Logical devices must be set before TensorFlow initialises its devices, so
this runs as its own process: `python mirrored_parity.py --jit 0|1`."""

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
from common import compile_tiny, stream, tiny_vit  # noqa: E402

from keras_vit.training.distribute import get_strategy  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--jit", type=int, default=0)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()


class Losses(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.values = []

    def on_train_batch_end(self, batch, logs=None):
        self.values.append(float(np.mean(logs["loss"])))


def train(strategy, jit_compile, extra_layer=None):
    with strategy.scope():
        model = tiny_vit()
        if extra_layer is not None:
            model = keras.Model(model.input, extra_layer(model.output))
        compile_tiny(model, strategy, jit_compile=jit_compile)
    losses = Losses()
    model.fit(
        stream(),
        steps_per_epoch=args.steps,
        epochs=args.epochs,
        verbose=0,
        callbacks=[losses],
    )
    return model, [np.asarray(w) for w in model.get_weights()], losses.values


def max_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def relative_diff(reference, other):
    """max |difference| over the largest entry of `reference`: rounding in
    another summation order scales with the values (the suite's rule)."""
    scale = max(float(np.abs(x).max()) for x in reference)
    return max_diff(reference, other) / scale


class HostRoundTrip(keras.layers.Layer):
    """Adds zero computed on the host (a PyFunc): XLA cannot compile it."""

    def call(self, x):
        host = tf.numpy_function(lambda a: a * 0, [x], tf.float32, stateful=False)
        return x + tf.stop_gradient(tf.reshape(host, tf.shape(x)))


mirrored = get_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
single = get_strategy("default")
_, ref_weights, ref_losses = train(single, False)
model, weights, losses = train(mirrored, bool(args.jit))
report = {
    "replicas": mirrored.num_replicas_in_sync,
    "xla_mode": model.xla_mode,
    "steps": len(losses),
    "weight_diff": relative_diff(ref_weights, weights),
    "loss_diff": relative_diff([np.asarray(ref_losses)], [np.asarray(losses)]),
    "weights_moved": max_diff(
        ref_weights, [np.asarray(w) for w in tiny_vit().get_weights()]
    ),
}
if args.jit:
    _, xla_weights, xla_losses = train(single, True)
    report["weight_diff_vs_single_xla"] = relative_diff(xla_weights, weights)
    report["loss_diff_vs_single_xla"] = relative_diff(
        [np.asarray(xla_losses)], [np.asarray(losses)]
    )
    try:
        train(mirrored, True, HostRoundTrip())
        report["pyfunc_under_xla"] = "trained"
    except Exception as error:  # noqa: BLE001  the message is the result
        report["pyfunc_under_xla"] = f"{type(error).__name__}: {error}"[:2000]
    train(mirrored, False, HostRoundTrip())
    report["pyfunc_without_xla"] = "trained"
print("REPORT " + json.dumps(report), flush=True)
