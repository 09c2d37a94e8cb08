"""The prune_digits table: fraction pruned vs held-out accuracy (before and
after fine-tuning), parameters, MACs and float32 TFLite batch-1 latency.

    keras-vit train digits        # runs/digits/model.keras, the model pruned
    python bench/prune_digits.py --seeds 0,1,2 --json bench/results/prune_digits.json

Fraction 0 is the unpruned model fine-tuned with the same steps (and the
same teacher), so every row has had the same training. Each fine-tuning seed
draws its own calibration images and training stream; accuracies are listed
per seed with their mean. The recipe's teacher is the unpruned model: with
`--model`, that file is the teacher too. Latency (seed 0's files):
alternating rounds over all rows, medians (the machine was shared; compare
the ratios).
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import recorded  # noqa: E402  paths as committed results hold them


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/digits/model.keras")
    parser.add_argument("--fractions", default="0,0.25,0.5")
    parser.add_argument("--finetune-steps", type=int, help="default: the recipe's")
    parser.add_argument("--seeds", default="0", help="fine-tuning seeds, comma list")
    parser.add_argument("--head-criterion", default="ablation")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.fractions = [float(f) for f in args.fractions.split(",")]
    args.seeds = [int(s) for s in args.seeds.split(",")]
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


def _config(model_path: str, seed: int):
    import dataclasses

    from keras_vit.training.recipes import load_recipe

    config = load_recipe("prune_digits")
    distill = config.distill
    if distill.teacher == config.model.pretrained:
        distill = dataclasses.replace(distill, teacher=model_path)
    return dataclasses.replace(config, seed=seed, distill=distill)


def _pruned_row(args, fraction: float, steps: int, root: Path, runners: dict):
    """Prunes and fine-tunes once per seed; exports seed 0's model."""
    import keras

    from keras_vit.deploy import tflite as tflite_lib
    from keras_vit.deploy.export import export_model
    from keras_vit.training import data as data_lib
    from keras_vit.training import pruning

    row, before, after = {}, [], []
    for seed in args.seeds:
        config = _config(args.model, seed)
        model = keras.saving.load_model(args.model, compile=False)
        pruned, report = pruning.prune_and_finetune(
            model, config, fraction, fraction, steps, head_criterion=args.head_criterion
        )
        print(json.dumps({"seed": seed, **report}), flush=True)
        before.append(report["accuracy_pruned"])
        after.append(report["accuracy_finetuned"])
        if row:
            continue
        row = {k: v for k, v in report.items() if not k.startswith("accuracy")}
        row.pop("removed")
        name = f"pruned_{int(fraction * 100)}"
        size = pruned.input_shape[1:3]
        metadata = export_model(
            pruned,
            name,
            root,
            preprocessing=data_lib.preprocessing(config.data, size),
            tflite=("float32",),
        )
        row["tflite_bytes"] = metadata["files"][f"{name}.tflite"]
        row["tflite_top1_agreement"] = metadata["parity"]["tflite_float32"][
            "top1_agreement"
        ]
        runners[name] = tflite_lib.Runner(root / f"{name}.tflite", num_threads=1)
    row["seeds"] = args.seeds
    row["accuracy_pruned"] = before
    row["accuracy_finetuned"] = after
    row["accuracy_pruned_mean"] = statistics.mean(before)
    row["accuracy_finetuned_mean"] = statistics.mean(after)
    return row


def run(args, root: Path) -> dict:
    import keras

    from keras_vit.training import data as data_lib
    from keras_vit.training import pruning

    config = _config(args.model, args.seeds[0])
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
    pixels = data_lib.make_eval_dataset(config.data, base.input_shape[1:3], 1)
    one = None
    for x, _ in pixels.take(1):
        one = (x.numpy() * 0.5 + 0.5) * 255.0
    for fraction in args.fractions:
        rows.append(_pruned_row(args, fraction, steps, root, runners))
    latency = _latencies(runners, one, args.rounds, args.iterations)
    for row, name in zip(rows[1:], runners, strict=True):
        row["tflite_ms"] = latency[name]
    distill = config.distill
    return {
        "model": recorded(args.model),
        "finetune_steps": steps,
        "head_criterion": args.head_criterion,
        "learning_rate": config.optim.learning_rate,
        "teacher": distill.teacher
        and {
            "kind": distill.kind,
            "temperature": distill.temperature,
            "weight": distill.weight,
            "path": recorded(distill.teacher),
        },
        "rows": rows,
        "note": "shared 2-core machine; TFLite 1 thread, batch 1, medians",
    }


def _accuracies(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    each = " / ".join(f"{v:.4f}" for v in values)
    return f"{each} (mean {statistics.mean(values):.4f})"


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
            f"{_accuracies(row['accuracy_pruned'])} | "
            f"{_accuracies(row['accuracy_finetuned'])} | "
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
