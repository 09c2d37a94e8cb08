"""TFLite files of the exported digits model, run with ai_edge_litert:
parity per kind, builtin ops only, batch resize, NaN behaviour, sizes."""

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter
from helpers import (
    FLOAT32_PARITY,
    TFLITE_FLOAT32_PARITY,
    assert_close,
    assert_parity,
    near_ties,
    parity_bound,
)
from test_export import exported, keras_outputs, raw_pixels  # noqa: F401

from keras_vit.deploy import tflite
from keras_vit.deploy.tflite import (
    DEFAULT_KINDS,
    Runner,
    check_builtin_only,
    file_name,
    operators,
)


@pytest.fixture(scope="module")
def outputs(exported):  # noqa: F811
    """Every kind's outputs on the 360 held-out images, and Keras'."""
    root, _, model, x_test, _, _ = exported
    pixels = raw_pixels(x_test)
    got = {
        kind: Runner(root / file_name("digits", kind))(pixels) for kind in DEFAULT_KINDS
    }
    return got, keras_outputs(model, x_test)


def test_float32_within_1e4_of_the_logits_scale(outputs):
    got, expected = outputs
    for key in ("logits", "probabilities"):
        assert_parity(
            got["float32"][key],
            expected[key],
            expected["logits"],
            TFLITE_FLOAT32_PARITY,
            key,
        )


def test_float16_within_1e2_of_keras(outputs):
    got, expected = outputs
    # Probabilities are of order one; float16 weights move them by ~1e-3.
    assert_close(
        got["float16"]["probabilities"], expected["probabilities"], 1e-2, scale=1.0
    )
    # Logits are unbounded, so their float16-weight error is relative.
    logits = expected["logits"]
    error = np.abs(got["float16"]["logits"] - logits).max()
    assert error <= 1e-2 * np.abs(logits).max()


@pytest.mark.parametrize("kind", ["dynamic_int8", "int8"])
def test_int8_top1_agrees_on_held_out_digits(outputs, exported, kind):  # noqa: F811
    got, expected = outputs
    top1 = got[kind]["probabilities"].argmax(-1)
    agreement = np.mean(top1 == expected["probabilities"].argmax(-1))
    assert agreement >= 0.98, agreement
    # The figure export_model measured and recorded is this one, up to the
    # near ties its own Keras reference (other batches) may rank otherwise.
    recorded = exported[1]["parity"][f"tflite_{kind}"]["top1_agreement"]
    logits = expected["logits"]
    ties = near_ties(logits, parity_bound(logits, FLOAT32_PARITY))
    assert abs(recorded - agreement) <= ties / len(logits)


def test_full_integer_file_computes_in_int8(exported):  # noqa: F811
    interpreter = Interpreter(model_path=str(exported[0] / "digits_int8.tflite"))
    interpreter.allocate_tensors()
    dtypes = {d["index"]: d["dtype"] for d in interpreter.get_tensor_details()}
    # Op details have no public accessor; the private one is stable in LiteRT.
    ops = interpreter._get_ops_details()
    heavy = {"FULLY_CONNECTED", "BATCH_MATMUL", "SOFTMAX", "GELU"}
    found = set()
    for op in ops:
        if op["op_name"] in heavy:
            found.add(op["op_name"])
            inputs = {dtypes[i] for i in op["inputs"] if i >= 0}
            assert inputs <= {np.int8, np.int32}, (op["op_name"], inputs)
    assert found == heavy
    # Float only at the interface (and LayerNorm's NEG, which has no int8
    # kernel, between a DEQUANTIZE and a QUANTIZE).
    floats = {
        op["op_name"]
        for op in ops
        if any(dtypes[i] == np.float32 for i in op["inputs"] if i >= 0)
    }
    assert floats <= {"QUANTIZE", "NEG", "DELEGATE"}
    assert interpreter.get_input_details()[0]["dtype"] == np.float32


def test_no_flex_ops_in_any_file(exported):  # noqa: F811
    root, metadata = exported[:2]
    for kind in DEFAULT_KINDS:
        ops = check_builtin_only(root / file_name("digits", kind))
        assert "FULLY_CONNECTED" in ops and "SOFTMAX" in ops
        assert not [op for op in ops if op.startswith("CUSTOM")]
        assert metadata["tflite_ops"][kind] == ops
    assert "QUANTIZE" in metadata["tflite_ops"]["int8"]


def test_flex_ops_are_detected(tmp_path):
    # MatrixInverse has no TFLite builtin: allowed Flex ops bring it in as
    # FlexMatrixInverse, which the check must refuse.
    module = tf.Module()
    module.f = tf.function(
        lambda x: {"y": tf.linalg.inv(x)},
        input_signature=[tf.TensorSpec([2, 2], tf.float32)],
    )
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": module.f})
    converter = tf.lite.TFLiteConverter.from_saved_model(str(tmp_path))
    converter.target_spec.supported_ops = [
        tf.lite.OpsSet.TFLITE_BUILTINS,
        tf.lite.OpsSet.SELECT_TF_OPS,
    ]
    content = converter.convert()
    assert "CUSTOM:FlexMatrixInverse" in operators(content)
    with pytest.raises(ValueError, match="FlexMatrixInverse.*Flex / SELECT_TF_OPS"):
        check_builtin_only(content)


def test_batch_resize(exported, outputs):  # noqa: F811
    root, _, _, x_test, _, _ = exported
    pixels = raw_pixels(x_test[:7])
    full = outputs[0]["float32"]
    runner = Runner(root / "digits.tflite")
    for batch in (1, 7, 3):
        # Another batch size may take another XNNPACK kernel path.
        assert_parity(
            runner(pixels[:batch])["probabilities"],
            full["probabilities"][:batch],
            full["logits"][:batch],
            FLOAT32_PARITY,
            f"batch {batch}",
        )
    # The plain interpreter API, as an app would use it.
    interpreter = Interpreter(model_path=str(root / "digits_int8.tflite"))
    (detail,) = interpreter.get_input_details()
    assert list(detail["shape_signature"]) == [-1, 16, 16, 1]
    interpreter.resize_tensor_input(detail["index"], [7, 16, 16, 1])
    interpreter.allocate_tensors()
    interpreter.set_tensor(detail["index"], pixels)
    interpreter.invoke()
    shapes = [
        interpreter.get_tensor(d["index"]).shape
        for d in interpreter.get_output_details()
    ]
    assert shapes == [(7, 10), (7, 10)]
    with pytest.raises(
        ValueError, match=r"shape \(batch, 16, 16, 1\); got shape \(2, 8, 8, 1\)"
    ):
        runner(np.zeros((2, 8, 8, 1)))


@pytest.mark.parametrize("kind", ["float32", "float16"])
def test_nan_pixel_gives_nan_for_that_image_only(exported, kind):  # noqa: F811
    root, _, _, x_test, _, _ = exported
    pixels = raw_pixels(x_test[:2])
    # What the file itself does (an app calling LiteRT directly); Runner
    # refuses NaN before invoking (test_runner_checks_input_before_invoking).
    unchecked = Runner(root / file_name("digits", kind)).runner
    clean = unchecked(pixels=pixels)
    pixels[0, 5, 5, 0] = np.nan
    dirty = unchecked(pixels=pixels)["probabilities"]
    assert np.all(np.isnan(dirty[0]))
    assert_parity(
        dirty[1], clean["probabilities"][1], clean["logits"][1], FLOAT32_PARITY
    )


def test_file_sizes_reported(exported):  # noqa: F811
    root, metadata = exported[:2]
    sizes = {
        kind: (root / file_name("digits", kind)).stat().st_size
        for kind in DEFAULT_KINDS
    }
    for kind, size in sizes.items():
        assert metadata["files"][file_name("digits", kind)] == size
    assert sizes["float16"] < 0.7 * sizes["float32"]
    assert sizes["int8"] < 0.5 * sizes["float32"]
    assert sizes["dynamic_int8"] < 0.5 * sizes["float32"]


def test_kind_names_are_checked():
    with pytest.raises(ValueError, match=r"Unknown TFLite kinds \['fp8'\]"):
        tflite.check_kinds(("float32", "fp8"))


@pytest.mark.parametrize("kind", ["dynamic_int8", "int8"])
def test_nan_pixel_in_int8_files_is_silently_quantized(exported, kind):  # noqa: F811
    # Documented: quantized inputs cannot carry NaN, so the output looks like a
    # normal prediction; callers must check (predict does, see test_export.py).
    root, _, _, x_test, _, _ = exported
    pixels = raw_pixels(x_test[:2])
    pixels[0, 5, 5, 0] = np.nan
    unchecked = Runner(root / file_name("digits", kind)).runner  # LiteRT itself
    dirty = unchecked(pixels=pixels)["probabilities"]
    assert np.all(np.isfinite(dirty))
    assert_close(dirty.sum(-1), 1.0, 0.05)
