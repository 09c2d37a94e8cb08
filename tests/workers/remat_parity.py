"""Gradient checkpointing (`ViT(remat=True)`) under MirroredStrategy with two
logical CPUs and XLA: two training steps with and without remat from the
same weights on the same batches. Prints one JSON line of measured
differences.

Logical devices must be set before TensorFlow initialises its devices, so
this runs as its own process: `python remat_parity.py --jit 0|1 --precision P`.
"""

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
from common import CLASSES, IMAGE, stream  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.training.distribute import compile_model, get_strategy  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--jit", type=int, default=0)
parser.add_argument("--precision", default="float32")
args = parser.parse_args()
keras.mixed_precision.set_global_policy(args.precision)


def train(remat: bool):
    strategy = get_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras_vit.ViT(
            "Ti/4",
            image_size=IMAGE,
            num_classes=CLASSES,
            num_channels=1,
            hidden_dim=32,
            num_layers=2,
            num_heads=2,
            mlp_dim=64,
            drop_path_rate=0.1,
            remat=remat,
        )
        head = model.get_layer("head")
        # A random head, so that every weight below it gets a gradient.
        kernel = np.random.default_rng(0).normal(0, 0.5, head.kernel.shape)
        head.kernel.assign(kernel.astype("float32"))
        start = [np.asarray(w) for w in model.trainable_weights]
        compile_model(
            model,
            strategy=strategy,
            jit_compile=bool(args.jit),
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    keras.utils.set_random_seed(1)  # the same drop-path masks in both runs
    history = model.fit(stream(), steps_per_epoch=2, epochs=1, verbose=0)
    weights = model.trainable_weights
    moved = [s - np.asarray(w) for s, w in zip(start, weights, strict=True)]
    return model, moved, history.history["loss"]


plain_model, plain, plain_loss = train(False)
remat_model, remat, remat_loss = train(True)
scale = max(float(np.abs(m).max()) for m in plain)
report = {
    "replicas": 2,
    "xla_mode": remat_model.xla_mode,
    "blocks_remat": [
        layer.remat for layer in remat_model.layers if layer.name.startswith("block_")
    ],
    "update_scale": scale,
    "relative_update_diff": max(
        float(np.abs(a - b).max()) for a, b in zip(plain, remat, strict=True)
    )
    / scale,
    "loss_diff": float(np.abs(np.subtract(plain_loss, remat_loss)).max())
    / float(np.abs(plain_loss).max()),
}
print("REPORT " + json.dumps(report))
