"""The distill_digits table: the same student with and without a CNN teacher,
same steps, several seeds.

    python bench/distill_digits.py --json bench/results/distill_digits.json

Trains the teacher (the `digits_cnn` recipe) into `runs/digits_cnn/` unless
its model.keras exists, then runs the distill_digits
recipe per seed twice: with the teacher and with `distill.teacher=""` (the
same distilled=True student, its two heads both on the labels).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, help="default: the recipe's")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    return args


def run(args) -> dict:
    from keras_vit.training.recipes import load_recipe
    from keras_vit.training.teachers import prepare_teacher
    from keras_vit.training.trainer import train

    base = prepare_teacher(load_recipe("distill_digits"), train_missing=True)
    teacher = Path(base.distill.teacher)
    report = {"teacher": str(teacher), "runs": []}
    teacher_metadata = json.loads((teacher.parent / "metadata.json").read_text())
    report["teacher_accuracy"] = teacher_metadata["accuracy"]
    for seed in args.seeds:
        for with_teacher in (True, False):
            overrides = {
                "seed": str(seed),
                "verbose": "0",
                "run_dir": f"runs/distill_digits_s{seed}_{int(with_teacher)}",
            }
            if args.steps:
                overrides["total_steps"] = str(args.steps)
            if not with_teacher:
                overrides["distill.teacher"] = ""
            metadata = train(load_recipe("distill_digits", overrides))
            row = {
                "seed": seed,
                "teacher": with_teacher,
                "accuracy": metadata["accuracy"],
                "steps": metadata["steps"],
            }
            report["runs"].append(row)
            print(json.dumps(row), flush=True)
    for with_teacher in (True, False):
        values = [r["accuracy"] for r in report["runs"] if r["teacher"] == with_teacher]
        key = "with_teacher" if with_teacher else "without_teacher"
        report[f"mean_{key}"] = statistics.mean(values)
    report["gain_points"] = 100 * (
        report["mean_with_teacher"] - report["mean_without_teacher"]
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
