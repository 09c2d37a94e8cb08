"""Checks shared by the tests: each test should read as one call to these."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np

REPO = Path(__file__).resolve().parents[1]

# The digits recipe's preprocessing as exports and metadata record it: 8x8
# digits resized to 16x16, pixels / 255 then normalised to [-1, 1].
DIGITS_METADATA_PREPROCESSING = {
    "image_size": [16, 16],
    "num_channels": 1,
    "mean": [0.5],
    "std": [0.5],
    "pixel_scale": 255.0,
    "resize_method": "bilinear",
    "crop_fraction": 1.0,
    "keep_aspect_ratio": False,
    "antialias": False,
}

# Parity bounds between two float32 computations of the same network (Keras vs
# its SavedModel, a TFLite file, the previous release, another batch size).
# They differ only in how sums are ordered and fused (graph vs eager, oneDNN vs
# Eigen, AVX2 vs AVX-512, XNNPACK), i.e. by a few float32 epsilons (1.2e-7) per
# operation relative to the magnitudes involved: the error scales with the
# logits, so a fixed bound does not hold on every CPU (1e-5 on logits of size
# ~10 is ~8 eps and one CPU measured 1.03e-5). 1e-5 of the logits' scale is ~84
# eps, enough for these shallow models and still orders of magnitude below
# what a wrong weight, layer or preprocessing step does.
FLOAT32_PARITY = 1e-5
# The TFLite converter fuses and reorders more (folded constants, fused
# activations, its own GELU and softmax kernels): ten times more room.
TFLITE_FLOAT32_PARITY = 1e-4


def check_config_round_trip(layer: keras.layers.Layer) -> dict:
    """get_config -> from_config -> get_config is the identity, also through
    `serialize_keras_object`, and the config holds exactly `__init__`'s
    arguments (plus the base Layer's)."""
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    serialized = keras.saving.serialize_keras_object(layer)
    assert serialized["registered_name"].startswith("keras_vit>")
    revived = keras.saving.deserialize_keras_object(serialized)
    assert type(revived) is type(layer)
    assert revived.get_config() == config
    base = set(keras.layers.Layer(name="x").get_config())
    params = inspect.signature(type(layer).__init__).parameters
    own = {n for n, p in params.items() if n != "self" and p.kind != p.VAR_KEYWORD}
    assert set(config) - base == own, (set(config) - base) ^ own
    return config


def run_python(code: str, *args: str, timeout: float = 300, env=None, check=True):
    """Runs `code` in a fresh Python process; returns the CompletedProcess."""
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=REPO,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def check_reloads_in_fresh_process(
    model: keras.Model,
    inputs: np.ndarray,
    tmp_path: Path,
    relative: float = FLOAT32_PARITY,
) -> None:
    """Saves `model` as .keras and loads it in a new process that imports only
    keras_vit (no custom_objects, safe_mode=True); outputs must match within
    `relative` of their scale. The same kernels on the same CPU, but another
    process may lay out its thread pools and graph otherwise, so the default
    allows float32 reassociation; 0 asks for identical outputs."""
    path = tmp_path / "model.keras"
    model.save(path)
    np.save(tmp_path / "inputs.npy", inputs)
    expected = np.asarray(model(inputs, training=False))
    run_python(
        """
        import sys
        import numpy as np
        import keras
        import keras_vit  # noqa: F401  registers the layers
        model = keras.saving.load_model(sys.argv[1], safe_mode=True)
        out = model(np.load(sys.argv[2]), training=False)
        np.save(sys.argv[3], np.asarray(out))
        """,
        str(path),
        str(tmp_path / "inputs.npy"),
        str(tmp_path / "outputs.npy"),
    )
    assert_close(np.load(tmp_path / "outputs.npy"), expected, relative, what="reload")


def assert_close(actual, expected, relative: float, scale=None, what: str = ""):
    """max |actual - expected| <= relative * scale; returns the difference
    over the scale.

    The one float comparison of the suite. Two computations of the same
    values differ by their rounding, which grows with the magnitudes summed
    (a few float32 epsilons, 1.2e-7, of the largest of them per operation)
    and with the CPU's instruction set (AVX2, AVX-512, AMX pick different
    kernels and summation orders), so every bound is a fraction of a scale,
    never an absolute number. `scale` defaults to max |expected|; pass the
    inputs' magnitude where the result cancels them (a residual, a
    difference), or 1 for values known to be of order one (probabilities).
    Exact equality (`np.testing.assert_array_equal`) is kept for what is
    guaranteed: copies, reloads, integer data, or the same function on the
    same inputs in the same process.

    With KERAS_VIT_TEST_MARGINS set to a file, each call appends a JSON line
    with the measured difference and its bound, to audit the margins on a
    new CPU kind."""
    actual = np.asarray(keras.ops.convert_to_numpy(actual), "float64")
    expected = np.asarray(keras.ops.convert_to_numpy(expected), "float64")
    actual, expected = np.broadcast_arrays(actual, expected)
    if scale is None:
        scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    diff = float(np.max(np.abs(actual - expected))) if actual.size else 0.0
    bound = relative * float(scale)
    log = os.environ.get("KERAS_VIT_TEST_MARGINS")
    if log:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
        record = {"test": test, "what": what, "diff": diff, "bound": bound}
        with open(log, "a") as f:
            f.write(json.dumps(record) + "\n")
    assert np.all(np.isfinite(actual)), f"{what}: non-finite values"
    assert diff <= bound, (
        f"{what}: max |diff| {diff:.3g} > {bound:.3g} = {relative:g} x scale "
        f"{float(scale):.3g}"
    )
    return diff / scale if scale else diff


def assert_same_top1(got, scores, tolerance: float, what: str = "") -> int:
    """`got` (class ids) is argmax(scores) on every row whose two highest
    scores are more than 2 x `tolerance` apart; returns how many rows were
    within that (near ties, which two computations of the same values may
    rank either way). `tolerance` is the parity bound of the scores."""
    got, scores = np.asarray(got), np.asarray(scores, "float64")
    ties = _tie_rows(scores, tolerance)
    wrong = (got != scores.argmax(-1)) & ~ties
    assert not wrong.any(), f"{what}: top-1 differs on rows {np.flatnonzero(wrong)}"
    return int(ties.sum())


def near_ties(scores, tolerance: float) -> int:
    """How many rows of `scores` have their two highest within 2 x
    `tolerance`: the most an accuracy computed another way may differ by."""
    return int(_tie_rows(np.asarray(scores, "float64"), tolerance).sum())


def _tie_rows(scores: np.ndarray, tolerance: float) -> np.ndarray:
    top2 = np.sort(scores, axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0] <= 2 * tolerance


def parity_bound(logits, relative: float) -> float:
    """`relative * max(1, max |logits|)`: a parity bound on logits, and on the
    probabilities computed from them (softmax moves no probability by more
    than the largest change of a logit)."""
    return relative * max(1.0, float(np.max(np.abs(np.asarray(logits)))))


def assert_parity(actual, expected, logits, relative: float, what: str = "") -> float:
    """max |actual - expected| <= parity_bound(logits, relative); returns it."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    scale = parity_bound(logits, 1.0)
    return assert_close(actual, expected, relative, scale, what) * scale


def fit_one_step(model: keras.Model, inputs: np.ndarray, labels: np.ndarray) -> float:
    """Compiles with AdamW and sparse cross-entropy, runs one epoch of one
    batch, returns the loss (which must be finite)."""
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = model.fit(inputs, labels, batch_size=len(inputs), epochs=1, verbose=0)
    loss = history.history["loss"][-1]
    assert np.isfinite(loss)
    return loss


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def check_dtype_policy_contract(
    make_layer, input_shape: tuple[int, ...], policy: str, tmp_path: Path
) -> keras.layers.Layer:
    """One layer built alone under `policy` on input of its compute dtype:
    output in the compute dtype, float32 variables, one `fit` step inside a
    small model, and a `.keras` round trip with identical outputs.

    `make_layer(dtype)` returns a fresh layer; the layer is wrapped as
    Input -> layer -> Flatten -> float32 Dense so that `fit` has logits."""
    layer = make_layer(dtype=policy)
    compute = keras.dtype_policies.get(policy).compute_dtype
    inputs = keras.Input(input_shape[1:], batch_size=input_shape[0], dtype=compute)
    features = layer(inputs)
    assert features.dtype == compute, (type(layer).__name__, features.dtype)
    logits = keras.layers.Dense(3, dtype="float32")(keras.layers.Flatten()(features))
    model = keras.Model(inputs, [logits, features])

    rng = np.random.default_rng(0)
    x = rng.standard_normal(input_shape).astype(compute)
    eager = layer(keras.ops.convert_to_tensor(x))
    assert keras.backend.standardize_dtype(eager.dtype) == compute
    assert all(v.dtype == "float32" for v in layer.trainable_weights)

    labels = rng.integers(0, 3, input_shape[0])
    trainer = keras.Model(inputs, logits)
    fit_one_step(trainer, x, labels)

    path = tmp_path / f"{type(layer).__name__}.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    for got, want in zip(reloaded(x), model(x), strict=True):
        assert keras.backend.standardize_dtype(
            got.dtype
        ) == keras.backend.standardize_dtype(want.dtype)
        np.testing.assert_array_equal(
            np.asarray(keras.ops.cast(got, "float32")),
            np.asarray(keras.ops.cast(want, "float32")),
        )
    return layer


def edited_checkpoint(source: Path, tmp_path: Path, **changes) -> Path:
    """A copy of the checkpoint folder `source` in `tmp_path`, its
    `config.json` updated with `changes`."""
    target = Path(tmp_path) / Path(source).name
    shutil.copytree(source, target)
    config = read_json(target / "config.json")
    config.update(changes)
    (target / "config.json").write_text(json.dumps(config))
    return target
