"""The GPU check, for the day a GPU machine is lent: under 10 minutes.

    python bench/gpu_check.py --json bench/results/gpu_check.json

MirroredStrategy over every visible GPU (`compile_model`: per-replica XLA),
B/16 at 224 by default, for mixed bfloat16 and mixed float16 (with dynamic
loss scaling), each with and without gradient checkpointing (`remat`):
training images/s, model FLOP utilisation (3 x forward FLOPs per image
against the GPU's dense bf16/fp16 peak from the table below, or a measured
matmul peak for a GPU not in it), peak device memory per replica; and the
float32 loss of the same steps on one replica against all of them (parity).
Prints one table and writes a JSON.

Without a GPU it runs on CPUs: `--cpu-devices 2` splits the CPU into two
logical devices (the tests run it so, on a tiny model); memory is then the
process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Dense (no sparsity) bf16 / fp16 tensor-core peaks, TFLOP/s, from the
# vendors' data sheets; matched by substring of the device name.
PEAK_TFLOPS = {
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10G": 70.0,
    "A10": 125.0,
    "RTX 4090": 165.0,
    "V100": 125.0,  # fp16 only; no bf16 tensor cores
    "T4": 65.0,  # fp16 only
}
PRECISIONS = ("mixed_bfloat16", "mixed_float16")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--num-layers", type=int, default=0, help="0: the variant's")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--per-replica-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--cpu-devices", type=int, default=0, help="no GPU: split CPU")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    args.precisions = [p for p in args.precisions.split(",") if p]
    bad = [p for p in args.precisions if p not in PRECISIONS]
    if bad or not args.precisions:
        parser.error(f"--precisions {bad}: valid values are {list(PRECISIONS)}")
    for name in ("per_replica_batch", "steps", "warmup"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def devices(args):
    import tensorflow as tf

    if args.cpu_devices:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.cpu_devices
        )
        return [d.name for d in tf.config.list_logical_devices("CPU")], "CPU"
    gpus = tf.config.list_logical_devices("GPU")
    if not gpus:
        raise SystemExit("no GPU visible; use --cpu-devices N to run on the CPU")
    return [d.name for d in gpus], "GPU"


def device_name(kind: str) -> str:
    import tensorflow as tf

    if kind == "GPU":
        details = tf.config.experimental.get_device_details(
            tf.config.list_physical_devices("GPU")[0]
        )
        return details.get("device_name", "GPU")
    from keras_vit.hardware import cpu_name

    return cpu_name()


def matmul_tflops(device: str, dtype: str, n: int) -> float:
    """Measured dense matmul rate on `device`, TFLOP/s."""
    import tensorflow as tf

    with tf.device(device):
        a = tf.random.uniform((n, n), dtype=tf.float32)
        a = tf.cast(a, dtype)
        matmul = tf.function(lambda x: tf.reduce_sum(tf.matmul(x, x)))
        matmul(a).numpy()
        start, repeats = time.perf_counter(), 10
        for _ in range(repeats):
            matmul(a).numpy()
        seconds = time.perf_counter() - start
    return 2 * n**3 * repeats / seconds / 1e12


def peak_tflops(name: str, kind: str, device: str, args) -> tuple[float, str]:
    for key, value in PEAK_TFLOPS.items():
        if kind == "GPU" and key in name:
            return value, f"data sheet ({key})"
    n = 8192 if kind == "GPU" else 512
    return matmul_tflops(device, "bfloat16", n), f"measured bf16 matmul {n}^2"


def memory_probe(kind: str, device_list):
    """`(reset, peak MiB)` for the first device, or the process's peak RSS."""
    import tensorflow as tf

    if kind == "GPU":
        first = device_list[0].replace("/device:", "")

        def peak():
            return tf.config.experimental.get_memory_info(first)["peak"] / 2**20

        return lambda: tf.config.experimental.reset_memory_stats(first), peak
    from throughput import peak_rss_mib, reset_peak_rss

    return reset_peak_rss, peak_rss_mib


def train_run(args, strategy, precision, remat, steps, batches):
    """Trains `steps` steps; returns `(images/s, losses)`."""
    import keras

    import keras_vit
    from keras_vit.training.distribute import compile_model

    keras.mixed_precision.set_global_policy(precision)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras_vit.ViT(
            args.variant,
            image_size=args.image_size,
            num_classes=1000,
            num_layers=args.num_layers or None,
            remat=remat,
        )
        optimizer = keras.optimizers.AdamW(1e-4)
        if precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        compile_model(
            model,
            strategy=strategy,
            jit_compile=True,
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    losses = []
    callback = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda b, logs: losses.append(float(logs["loss"]))
    )
    model.fit(batches, steps_per_epoch=args.warmup, epochs=1, verbose=0)
    start = time.perf_counter()
    model.fit(batches, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[callback])
    seconds = time.perf_counter() - start
    keras.mixed_precision.set_global_policy("float32")
    # Free this model before the next one is built and measured.
    del model, optimizer
    keras.backend.clear_session()
    return steps * global_batch(args, strategy) / seconds, losses


def global_batch(args, strategy) -> int:
    return args.per_replica_batch * strategy.num_replicas_in_sync


def dataset(args, batch: int):
    import tensorflow as tf

    shape = (batch, args.image_size, args.image_size, 3)

    def make(step):
        seed = tf.stack([tf.cast(step, tf.int32), 0])
        images = tf.random.stateless_uniform(shape, seed=seed)
        labels = tf.random.stateless_uniform(
            (batch,), seed=seed + 1, maxval=1000, dtype=tf.int32
        )
        return images, labels

    return tf.data.Dataset.range(2**62).map(make).prefetch(2)


def run(args) -> dict:
    import tensorflow as tf

    from keras_vit.analysis.flops import vit_macs
    from keras_vit.training.distribute import get_strategy

    device_list, kind = devices(args)
    name = device_name(kind)
    strategy = get_strategy("mirrored", devices=device_list)
    peak, peak_source = peak_tflops(name, kind, device_list[0], args)
    reset, peak_mib = memory_probe(kind, device_list)
    batch = global_batch(args, strategy)
    options = {"num_layers": args.num_layers} if args.num_layers else {}
    flops_per_image = 3 * 2 * vit_macs(args.variant, args.image_size, **options)
    rows = []
    for precision in args.precisions:
        for remat in (False, True):
            reset()
            rate, _ = train_run(
                args, strategy, precision, remat, args.steps, dataset(args, batch)
            )
            rows.append(
                {
                    "precision": precision,
                    "remat": remat,
                    "images_per_second": rate,
                    "mfu": rate * flops_per_image / (peak * 1e12 * len(device_list)),
                    "peak_memory_mib": peak_mib(),
                }
            )
    # float32 parity: the same global batches on one replica and on all.
    one = (
        get_strategy("default")
        if kind == "GPU"
        else get_strategy("mirrored", devices=device_list[:1])
    )
    parity_steps = 3
    one_args = argparse.Namespace(**{**vars(args), "per_replica_batch": batch})
    _, single = train_run(
        one_args, one, "float32", False, parity_steps, dataset(args, batch)
    )
    _, many = train_run(
        args, strategy, "float32", False, parity_steps, dataset(args, batch)
    )
    return {
        "device": name,
        "replicas": len(device_list),
        "variant": args.variant,
        "num_layers": args.num_layers or None,
        "image_size": args.image_size,
        "global_batch": batch,
        "peak_tflops_per_device": peak,
        "peak_source": peak_source,
        "model_flops_per_image_train": flops_per_image,
        "rows": rows,
        "parity": {
            "single_replica_losses": single,
            "all_replica_losses": many,
            "max_relative_diff": max(
                abs(a - b) / max(abs(a), 1e-12)
                for a, b in zip(single, many, strict=True)
            ),
        },
        "tensorflow": tf.__version__,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def format_table(report: dict) -> str:
    lines = [
        f"{report['device']} x {report['replicas']}, {report['variant']} at "
        f"{report['image_size']}, global batch {report['global_batch']}, XLA; "
        f"peak {report['peak_tflops_per_device']:.1f} TFLOP/s per device "
        f"({report['peak_source']})",
        "| precision | remat | img/s | MFU | peak memory MiB |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['precision']} | {'yes' if row['remat'] else 'no'} | "
            f"{row['images_per_second']:.1f} | {row['mfu']:.1%} | "
            f"{row['peak_memory_mib']:.0f} |"
        )
    parity = report["parity"]["max_relative_diff"]
    lines.append(f"float32 loss, 1 vs {report['replicas']} replicas: {parity:.2e} rel")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    report = run(args)
    print(format_table(report))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
