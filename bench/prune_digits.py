"""The prune_digits table: fraction pruned vs held-out accuracy (before and
after fine-tuning), parameters, MACs and float32 TFLite batch-1 latency.

    keras-vit train digits        # runs/digits/model.keras, the model pruned
    python bench/prune_digits.py --json bench/results/prune_digits.json

Fraction 0 is the unpruned model fine-tuned with the same steps, so every row
has had the same training. Latency: alternating rounds over all rows' files,
medians (the machine was shared; compare the ratios).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/digits/model.keras")
    parser.add_argument("--fractions", default="0,0.25,0.5")
    parser.add_argument("--finetune-steps", type=int, help="default: the recipe's")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.fractions = [float(f) for f in args.fractions.split(",")]
    return args


def _latencies(runners: dict, pixels, rounds: int, iterations: int) -> dict:
    times = {name: [] for name in runners}
    for _ in range(rounds):
        for name, runner in runners.items():
            for _ in range(iterations):
                start = time.perf_counter()
                runner(pixels)
                times[name].append(1000 * (time.perf_counter() - start))
    return {name: round(statistics.median(t), 4) for name, t in times.items()}


def run(args, root: Path) -> dict:
    import keras

    from keras_vit.deploy import tflite as tflite_lib
    from keras_vit.deploy.export import export_model
    from keras_vit.training import data as data_lib
    from keras_vit.training import pruning
    from keras_vit.training.recipes import load_recipe

    config = load_recipe("prune_digits")
    steps = args.finetune_steps or config.total_steps
    base = keras.saving.load_model(args.model, compile=False)
    rows = [
        {
            "fraction": "unpruned, not fine-tuned",
            "accuracy": pruning.held_out_accuracy(base, config),
            "params": int(base.count_params()),
        }
    ]
    runners = {}
    size = base.input_shape[1:3]
    pixels = data_lib.make_eval_dataset(config.data, size, 1).take(1)
    one = None
    for x, _ in pixels:
        one = (x.numpy() * 0.5 + 0.5) * 255.0
    for fraction in args.fractions:
        model = keras.saving.load_model(args.model, compile=False)
        pruned, report = pruning.prune_and_finetune(
            model, config, fraction, fraction, steps
        )
        report.pop("removed")
        name = f"pruned_{int(fraction * 100)}"
        metadata = export_model(
            pruned,
            name,
            root,
            preprocessing=data_lib.preprocessing(config.data, size),
            tflite=("float32",),
        )
        report["tflite_bytes"] = metadata["files"][f"{name}.tflite"]
        report["tflite_top1_agreement"] = metadata["parity"]["tflite_float32"][
            "top1_agreement"
        ]
        runners[name] = tflite_lib.Runner(root / f"{name}.tflite", num_threads=1)
        rows.append(report)
        print(json.dumps(report), flush=True)
    latency = _latencies(runners, one, args.rounds, args.iterations)
    for row, name in zip(rows[1:], runners, strict=True):
        row["tflite_ms"] = latency[name]
    return {
        "model": args.model,
        "finetune_steps": steps,
        "rows": rows,
        "note": "shared 2-core machine; TFLite 1 thread, batch 1, medians",
    }


def format_table(report: dict) -> str:
    lines = [
        "| heads and MLP units removed | params | MACs | accuracy pruned | "
        "after fine-tune | TFLite ms (batch 1) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    base = report["rows"][0]
    lines.append(
        f"| none (trained model) | {base['params']:,} | | {base['accuracy']:.4f} | | |"
    )
    for row in report["rows"][1:]:
        lines.append(
            f"| {row['head_fraction']:.0%} | {row['params']:,} | {row['macs']:,} | "
            f"{row['accuracy_pruned']:.4f} | {row['accuracy_finetuned']:.4f} | "
            f"{row['tflite_ms']:.3f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        report = run(args, Path(tmp))
    print(format_table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
