"""LoRA against the linear probe on the digits, from a model that has not
seen half of the classes: same base, steps and seeds.

    python bench/lora_digits.py --json bench/results/lora_digits.json

The default recipe's model has learned the digits (0.997 held out), so
probing it on the same labels says nothing. Here it is pretrained (the
digits recipe, `--pretrain-steps`, seed 0) on the training digits of classes
0-4 only, into `runs/lora_digits_pretrain/model.keras` unless that exists;
then the finetune_digits_probe and finetune_digits_lora recipes start from it
with a new 10-class head, per seed, and the held-out accuracy is measured on
all 360 held-out digits and on those of the unseen classes 5-9.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SEEN = 5  # classes 0..SEEN-1 are pretrained on


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--pretrain-steps", type=int, default=600)
    parser.add_argument(
        "--recipes", default="finetune_digits_probe,finetune_digits_lora"
    )
    parser.add_argument("--set", nargs="*", default=[], help="key=value overrides")
    parser.add_argument(
        "--probe-learning-rates",
        default="3e-3,3e-2,1e-1,3e-1",
        help="the probe also at these rates (first seed): is 1e-2 its best?",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.recipes = args.recipes.split(",")
    rates = args.probe_learning_rates
    args.probe_learning_rates = [r for r in rates.split(",") if r]
    return args


def pretrain(path: Path, steps: int) -> float:
    """The digits recipe on classes 0-4; returns its held-out accuracy."""
    from keras_vit.training.recipes import load_recipe
    from keras_vit.training.sources import digits_arrays
    from keras_vit.training.trainer import train

    split = digits_arrays()
    for part in ("train", "eval"):
        keep = split[f"y_{part}"] < SEEN
        split[f"x_{part}"] = split[f"x_{part}"][keep]
        split[f"y_{part}"] = split[f"y_{part}"][keep]
    config = load_recipe(
        "digits",
        {
            "total_steps": str(steps),
            "eval_every": "0",
            "export_name": "",
            "data.source": "arrays",
            "run_dir": str(path.parent),
            "verbose": "0",
        },
    )
    config.data.arrays = split
    return train(config)["accuracy"]


def held_out_accuracy(model) -> dict:
    from keras_vit.training.data import make_eval_dataset
    from keras_vit.training.recipes import load_recipe
    from keras_vit.training.sources import digits_arrays

    data = load_recipe("finetune_digits_probe").data
    logits = model.predict(make_eval_dataset(data, 16, 360), verbose=0)
    labels = digits_arrays()["y_eval"]
    right = np.argmax(logits, axis=-1) == labels
    return {
        "accuracy": float(right.mean()),
        "accuracy_seen": float(right[labels < SEEN].mean()),
        "accuracy_unseen": float(right[labels >= SEEN].mean()),
    }


def trainable_params(config) -> int:
    from keras_vit.training.trainer import build_model

    model = build_model(config, num_classes=10)
    return int(sum(np.prod(v.shape) for v in model.trainable_weights))


def fine_tune(recipe: str, seed: int, start: Path, overrides: dict) -> dict:
    from keras_vit.training.recipes import load_recipe
    from keras_vit.training.trainer import train

    # One run folder per setting: a folder resumes only the run it holds.
    tag = "".join(f"_{key}={value}" for key, value in overrides.items())
    config = load_recipe(
        recipe,
        {
            "model.pretrained": str(start),
            "seed": str(seed),
            "verbose": "0",
            "run_dir": f"runs/lora_digits/{recipe}_s{seed}{tag}",
            **overrides,
        },
    )
    metadata = train(config)
    row = {
        "recipe": recipe,
        "seed": seed,
        "learning_rate": config.optim.learning_rate,
        **held_out_accuracy(metadata["model"]),
        "trainer_accuracy": metadata["accuracy"],
        "trainable_params": trainable_params(config),
        "steps": metadata["steps"],
    }
    print(json.dumps(row), flush=True)
    return row


def run(args) -> dict:
    start = Path("runs/lora_digits_pretrain/model.keras")
    if not start.is_file():
        pretrain(start, args.pretrain_steps)
    pretrained = json.loads((start.parent / "metadata.json").read_text())
    report = {
        "pretrained": str(start),
        "seen_classes": list(range(SEEN)),
        "pretrain_steps": pretrained["steps"],
        "pretrain_accuracy_seen": pretrained["accuracy"],
        "overrides": args.set,
        "runs": [],
        "probe_learning_rates": [],
    }
    overrides = dict(item.split("=", 1) for item in args.set)
    for seed in args.seeds:
        for recipe in args.recipes:
            report["runs"].append(fine_tune(recipe, seed, start, overrides))
    for recipe in args.recipes:
        values = [r["accuracy"] for r in report["runs"] if r["recipe"] == recipe]
        report[f"mean_{recipe}"] = statistics.mean(values)
    for rate in args.probe_learning_rates:
        report["probe_learning_rates"].append(
            fine_tune(
                "finetune_digits_probe",
                args.seeds[0],
                start,
                {**overrides, "optim.learning_rate": rate},
            )
        )
    return report


def main(argv=None) -> int:
    args = parse_args(argv)
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
