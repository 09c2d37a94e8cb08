"""One benchmark setting of one peer, in a process of its own.

Run by `bench/peers.py` with each peer's own interpreter (keras_vit: the
project's Python; keras_hub: a venv with keras-hub and the full tensorflow;
timm: a venv with torch and timm). Imports only the standard library until
the peer is chosen, and prints one line `RESULT {json}`: images/s over the
timed steps, the process's peak RSS and its RSS before the first step.

    python bench/peer_worker.py --peer timm --mode train --precision bfloat16 \
        --compile 0 --variant Ti/16 --image-size 224 --batch-size 32
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

PEERS = ("keras_vit", "keras_hub", "timm")
# hidden_dim, num_layers, num_heads, mlp_dim: the paper's table (and keras_vit's
# VARIANTS), repeated here because a peer's venv has no keras_vit.
VARIANTS = {
    "Ti": (192, 12, 3, 768),
    "S": (384, 12, 6, 1536),
    "B": (768, 12, 12, 3072),
    "L": (1024, 24, 16, 4096),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=PEERS, required=True)
    parser.add_argument("--mode", choices=("train", "infer"), default="train")
    parser.add_argument(
        "--precision", choices=("float32", "bfloat16"), default="float32"
    )
    parser.add_argument("--jit", type=int, choices=(0, 1), default=0)
    parser.add_argument("--compile", type=int, choices=(0, 1), default=0)
    parser.add_argument("--remat", type=int, choices=(0, 1), default=0)
    parser.add_argument(
        "--kernels", type=int, choices=(0, 1), default=0,
        help="keras_vit inference within keras_vit.models.fused.inference()",
    )  # fmt: skip
    parser.add_argument("--variant", default="Ti/16")
    parser.add_argument("--num-layers", type=int, default=0, help="0: the variant's")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    if args.kernels and (args.peer, args.mode) != ("keras_vit", "infer"):
        parser.error("--kernels 1 is keras_vit's inference setting")
    size, _, patch = args.variant.partition("/")
    if size not in VARIANTS or not patch.isdigit():
        parser.error(f"--variant {args.variant!r}: expected one of Ti, S, B, L /patch")
    return args


def architecture(args) -> dict:
    hidden, layers, heads, mlp = VARIANTS[args.variant.partition("/")[0]]
    return dict(
        patch_size=int(args.variant.partition("/")[2]),
        hidden_dim=hidden,
        num_layers=args.num_layers or layers,
        num_heads=heads,
        mlp_dim=mlp,
    )


def status_mib(key: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def tf_step(args, arch):
    """keras_vit's or keras-hub's model and one TensorFlow step on it."""
    import keras
    import tensorflow as tf

    if args.precision == "bfloat16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    if args.peer == "keras_vit":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import keras_vit

        model = keras_vit.ViT(
            args.variant,
            image_size=args.image_size,
            num_classes=args.num_classes,
            num_layers=arch["num_layers"],
            remat=bool(args.remat),
        )
    else:
        import keras_hub

        backbone = keras_hub.models.ViTBackbone(
            image_shape=(args.image_size, args.image_size, 3),
            patch_size=arch["patch_size"],
            num_layers=arch["num_layers"],
            num_heads=arch["num_heads"],
            hidden_dim=arch["hidden_dim"],
            mlp_dim=arch["mlp_dim"],
        )
        model = keras_hub.models.ViTImageClassifier(
            backbone=backbone, num_classes=args.num_classes, head_dtype="float32"
        )
    shape = (args.batch_size, args.image_size, args.image_size, 3)
    images = tf.random.stateless_uniform(shape, seed=(0, 1))
    labels = tf.random.stateless_uniform(
        (args.batch_size,), seed=(0, 2), maxval=args.num_classes, dtype=tf.int32
    )
    if args.mode == "infer":
        infer = tf.function(lambda x: model(x, training=False), jit_compile=args.jit)
        if args.kernels:
            from keras_vit.models import fused

            with fused.inference():  # traced here: the function keeps them
                infer = infer.get_concrete_function(images)
        return lambda: infer(images)[0, 0].numpy()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.AdamW(learning_rate=1e-4)
    optimizer.build(model.trainable_variables)

    @tf.function(jit_compile=bool(args.jit))
    def train(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return lambda: train(images, labels).numpy()


def timm_step(args, arch):
    """timm's VisionTransformer of the same dimensions and one PyTorch step."""
    import contextlib

    import timm
    import torch

    model = timm.models.vision_transformer.VisionTransformer(
        img_size=args.image_size,
        patch_size=arch["patch_size"],
        embed_dim=arch["hidden_dim"],
        depth=arch["num_layers"],
        num_heads=arch["num_heads"],
        mlp_ratio=arch["mlp_dim"] / arch["hidden_dim"],
        num_classes=args.num_classes,
    )
    if args.remat:
        model.set_grad_checkpointing(True)
    model.train(args.mode == "train")
    images = torch.rand(args.batch_size, 3, args.image_size, args.image_size)
    labels = torch.randint(0, args.num_classes, (args.batch_size,))

    def autocast():
        if args.precision == "bfloat16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    forward = torch.compile(model) if args.compile else model
    if args.mode == "infer":

        def infer():
            with torch.inference_mode(), autocast():
                forward(images)[0, 0].item()

        return infer
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()

    def train():
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_fn(forward(images).float(), labels)
        loss.backward()
        optimizer.step()
        loss.item()

    return train


def versions(peer: str) -> dict:
    import importlib.metadata as md

    names = {
        "keras_vit": ("tensorflow-cpu", "tensorflow", "keras"),
        "keras_hub": ("keras-hub", "tensorflow", "tensorflow-text", "keras"),
        "timm": ("torch", "timm"),
    }[peer]
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    arch = architecture(args)
    build_start = time.perf_counter()
    step = (timm_step if args.peer == "timm" else tf_step)(args, arch)
    rss_built = status_mib("VmRSS")
    for _ in range(args.warmup):
        step()
    warmup_seconds = time.perf_counter() - build_start
    rss_before = status_mib("VmRSS")
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    seconds = time.perf_counter() - start
    result = {
        "images_per_second": args.steps * args.batch_size / seconds,
        "step_seconds": seconds / args.steps,
        "warmup_seconds": warmup_seconds,
        # The process's high-water mark: the model, its framework and the
        # steps' working memory; each peer pays its own framework.
        "peak_rss_mib": status_mib("VmHWM"),
        "rss_before_steps_mib": rss_before,
        # Peak minus the RSS with the model built: the steps' own working
        # memory (activations, gradients, optimizer slots, compiled code).
        "step_memory_mib": status_mib("VmHWM") - rss_built,
        "versions": versions(args.peer),
        "threads": os.cpu_count(),
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
