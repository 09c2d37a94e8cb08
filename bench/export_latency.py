"""Batch-1 latency of one ViT as Keras, SavedModel and each TFLite kind.

Builds a randomly initialised ViT, exports it with `keras_vit.export_model`
(SavedModel + every TFLite kind, checked for parity on export), then times a
single-image request against each form in alternating rounds:

    python bench/export_latency.py --variant Ti/16 --image-size 224 \
        --json bench/export_latency.json

Keras is timed as a `tf.function` with and without XLA on model-ready input;
the SavedModel and the `.tflite` files take raw pixels and normalise inside.
TFLite runs in LiteRT (`ai_edge_litert`), whose default op resolver hands the
float graphs to XNNPACK.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# Measure this checkout's keras_vit, whichever is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from keras_vit.deploy.tflite import KINDS

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--variant", default="Ti/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument(
        "--tflite", default=",".join(KINDS), help=f"comma list from {KINDS}"
    )
    parser.add_argument("--iterations", type=int, default=20, help="calls per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count(),
        help="LiteRT interpreter threads",
    )
    parser.add_argument(
        "--root", type=Path, help="export folder (default: a temporary one)"
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    args.tflite = [k.strip() for k in args.tflite.split(",") if k.strip()]
    bad = [k for k in args.tflite if k not in KINDS]
    if bad:
        parser.error(f"--tflite got {bad}; valid kinds are {', '.join(KINDS)}")
    for name in ("image_size", "num_classes", "iterations", "rounds", "warmup"):
        if getattr(args, name) < 1:
            parser.error(
                f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}"
            )
    return args


def _latencies(call: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def run(args: argparse.Namespace, root: Path) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

    import keras
    import numpy as np
    import tensorflow as tf
    from throughput import recorded_command

    import keras_vit
    from keras_vit.deploy import tflite as tflite_lib
    from keras_vit.deploy.export import export_model
    from keras_vit.models.preprocessing import (
        normalize_pixels,
        normalize_preprocessing,
    )

    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(
        args.variant, image_size=args.image_size, num_classes=args.num_classes
    )
    # The head starts at zero; random values make the int8 calibration and the
    # parity figures meaningful.
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(0).normal(0, 0.02, head.kernel.shape))
    preprocessing = normalize_preprocessing(
        model, {"mean": 0.5, "std": 0.5, "pixel_scale": 255.0}
    )
    rng = np.random.default_rng(1)
    shape = (args.image_size, args.image_size, 3)
    calibration = rng.uniform(0, 255, (16, *shape)).astype("float32")

    name = "latency"
    start = time.perf_counter()
    metadata = export_model(
        model,
        name,
        root=root,
        preprocessing=preprocessing,
        representative_images=calibration,
        tflite=args.tflite,
        variant=args.variant,
    )
    export_seconds = time.perf_counter() - start
    version_dir = root / name / str(metadata["version"])

    pixels = calibration[:1]
    inputs = tf.constant(normalize_pixels(pixels, preprocessing))
    contestants: dict[str, Callable[[], object]] = {}
    for jit in (False, True):
        fn = tf.function(lambda x: model(x, training=False), jit_compile=jit)
        label = "keras (tf.function, XLA)" if jit else "keras (tf.function)"
        contestants[label] = lambda fn=fn: fn(inputs).numpy()
    loaded = tf.saved_model.load(str(version_dir))
    signature = loaded.signatures["serving_default"]
    raw = tf.constant(pixels)
    contestants["SavedModel serving_default"] = lambda: {
        k: v.numpy() for k, v in signature(pixels=raw).items()
    }
    saved_model_bytes = metadata["files"][f"{name}/{metadata['version']}"]
    sizes = {"SavedModel serving_default": saved_model_bytes}
    for kind in args.tflite:
        path = root / tflite_lib.file_name(name, kind)
        runner = tflite_lib.Runner(path, num_threads=args.threads)
        label = f"tflite {kind}"
        contestants[label] = lambda runner=runner: runner(pixels)
        sizes[label] = path.stat().st_size

    for call in contestants.values():
        _latencies(call, args.warmup)
    samples: dict[str, list[float]] = {label: [] for label in contestants}
    medians: dict[str, list[float]] = {label: [] for label in contestants}
    for _ in range(args.rounds):
        for label, call in contestants.items():
            times = _latencies(call, args.iterations)
            samples[label] += times
            medians[label].append(statistics.median(times))

    parity = metadata.get("parity", {})
    results = []
    for label in contestants:
        times = sorted(samples[label])
        kind = label.removeprefix("tflite ")
        check = parity.get(f"tflite_{kind}") if label.startswith("tflite") else None
        if label.startswith("SavedModel"):
            check = parity.get("saved_model")
        results.append(
            {
                "form": label,
                "median_ms": 1e3 * statistics.median(times),
                "p90_ms": 1e3 * times[int(0.9 * (len(times) - 1))],
                "round_medians_ms": [1e3 * m for m in medians[label]],
                "file_bytes": sizes.get(label),
                "parity": check,
            }
        )
    return {
        "config": {
            "variant": args.variant,
            "image_size": args.image_size,
            "num_classes": args.num_classes,
            "tflite": args.tflite,
            "iterations": args.iterations,
            "rounds": args.rounds,
            "litert_threads": args.threads,
            "command": recorded_command(),
        },
        "environment": {
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "cpu_count": os.cpu_count(),
            "load_average": os.getloadavg(),
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "export_seconds": export_seconds,
        "results": results,
    }


def format_table(report: dict) -> str:
    cfg = report["config"]
    lines = [
        f"ViT {cfg['variant']} at {cfg['image_size']}, batch 1, "
        f"{cfg['rounds']} rounds x {cfg['iterations']} calls; LiteRT threads "
        f"{cfg['litert_threads']}; export took {report['export_seconds']:.0f} s",
        "",
        "| form | median ms | p90 ms | round medians ms | file MiB |",
        "| --- | ---: | ---: | --- | ---: |",
    ]
    for r in report["results"]:
        size = "" if r["file_bytes"] is None else f"{r['file_bytes'] / 2**20:.1f}"
        rounds = " ".join(f"{m:.1f}" for m in r["round_medians_ms"])
        lines.append(
            f"| {r['form']} | {r['median_ms']:.1f} | {r['p90_ms']:.1f} | "
            f"{rounds} | {size} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.root is None:
        with tempfile.TemporaryDirectory(prefix="keras_vit_latency_") as tmp:
            report = run(args, Path(tmp))
    else:
        report = run(args, args.root)
    print(format_table(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
