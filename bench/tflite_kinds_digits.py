"""Held-out accuracy, logit error, size and batch-1 latency of the TFLite
kinds of a trained digits ViT (the int8 and int16x8 kinds side by side).

    keras-vit train digits
    python bench/tflite_kinds_digits.py --json bench/results/tflite_kinds_digits.json

Calibration: all 1,437 training images (no augmentation); parity and
accuracy: the 360 held-out images. Latency: LiteRT, 1 thread, alternating
rounds, medians (the machine was shared; compare the ratios).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import recorded  # noqa: E402  paths as committed results hold them

KINDS = ("float32", "dynamic_int8", "int8", "int16x8")


def _raw_pixels(dataset):
    import numpy as np

    images, labels = [], []
    for x, y in dataset:
        # The digits recipe normalises as (pixels / 255 - 0.5) / 0.5.
        images.append((x.numpy() * 0.5 + 0.5) * 255.0)
        labels.append(y.numpy().argmax(-1))
    return np.concatenate(images), np.concatenate(labels)


def run(args, root: Path) -> dict:
    import keras

    from keras_vit.deploy import tflite
    from keras_vit.deploy.export import export_model
    from keras_vit.training import data as data_lib
    from keras_vit.training.recipes import load_recipe

    data = load_recipe("digits").data
    model = keras.saving.load_model(args.model, compile=False)
    size = model.input_shape[1:3]
    held_out, labels = _raw_pixels(data_lib.make_eval_dataset(data, size, 256))
    train_split = dataclasses.replace(data, eval_split=data.train_split)
    calibration, _ = _raw_pixels(data_lib.make_eval_dataset(train_split, size, 256))
    metadata = export_model(
        model,
        "digits",
        root,
        preprocessing=data_lib.preprocessing(data, size),
        representative_images=calibration,
        verify_images=held_out,
        tflite=KINDS,
    )
    runners = {
        kind: tflite.Runner(root / tflite.file_name("digits", kind), num_threads=1)
        for kind in KINDS
    }
    rows = {}
    for kind, runner in runners.items():
        predicted = runner(held_out)["logits"].argmax(-1)
        rows[kind] = {
            "accuracy": float((predicted == labels).mean()),
            "file_bytes": metadata["files"][tflite.file_name("digits", kind)],
            "parity": metadata["parity"][f"tflite_{kind}"],
            "ops": metadata["tflite_ops"][kind],
        }
    times = {kind: [] for kind in KINDS}
    for _ in range(args.rounds):
        for kind, runner in runners.items():
            for _ in range(args.iterations):
                start = time.perf_counter()
                runner(held_out[:1])
                times[kind].append(1000 * (time.perf_counter() - start))
    for kind in KINDS:
        rows[kind]["median_ms"] = round(statistics.median(times[kind]), 4)
    return {
        "model": recorded(args.model),
        "calibration_images": len(calibration),
        "held_out_images": len(held_out),
        "rows": rows,
        "note": "shared 2-core machine; LiteRT 1 thread, batch 1, medians",
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/digits/model.keras")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        report = run(args, Path(tmp))
    print("| kind | accuracy | max logit error | top-1 agreement | KB | ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for kind, row in report["rows"].items():
        parity = row["parity"]
        print(
            f"| {kind} | {row['accuracy']:.4f} | "
            f"{parity['max_abs_diff_logits']:.3f} | {parity['top1_agreement']:.4f} "
            f"| {row['file_bytes'] / 1024:.0f} | {row['median_ms']:.3f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
