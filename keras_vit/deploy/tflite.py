"""TFLite files from an exported SavedModel, builtin ops only, run with LiteRT.

Five kinds (`KINDS`): `float32`; `float16` (weights stored as float16,
computed in float32); `dynamic_int8` (int8 weights, activations quantized on
the fly); `int8` (full-integer: weights and activations int8, calibrated on a
representative set of raw pixel images); `int16x8` (int16 activations, int8
weights, calibrated the same way; converted from the graph
`keras_vit.deploy.int16` writes, and not exported unless asked for:
`DEFAULT_KINDS` are the other four). Every kind keeps the SavedModel's
`serving_default` interface: float32 raw pixels `(batch, H, W, C)` in, float32
`logits` / `probabilities` out, so the same client code runs all of them; the
integer kinds quantize at their input and dequantize at their outputs.

Conversion goes through `tf.lite.TFLiteConverter.from_saved_model` (the Keras 3
`from_keras_model` path is broken) with `TFLITE_BUILTINS` (or
`TFLITE_BUILTINS_INT8`) only: Flex (SELECT_TF_OPS) kernels are absent from a
stock mobile runtime, and `check_builtin_only` proves none slipped in.

The SavedModel's in-graph shape and NaN checks are `tf.debugging.Assert` ops,
which have no TFLite builtin; the converter drops them. The shape check has a
builtin twin (`signatures.Graphs.builtin_shape_guard`): every kind's file makes
LiteRT's own signature runner fail ("gather index out of bounds") on a wrong
channel count, height, width or rank instead of answering, and LiteRT refuses
another dtype than float32 when the input is set. The pixel range is not
checked in the file: `Runner` and `predict` check it in Python (and shape and
dtype, with a readable message), and on a device the app must. What a NaN
pixel does in the file itself: in `float32` and `float16`
that image's outputs are all NaN (other images in the batch are unaffected);
in `dynamic_int8` and `int8` the quantizer maps NaN to some in-range value and
the output looks like an ordinary prediction, so check before you call.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import tensorflow as tf

from keras_vit.deploy.checks import check_pixel_batch

# The names of the files: one home in deploy.names, kept here as before.
from keras_vit.deploy.names import KINDS, file_name  # noqa: F401

DEFAULT_KINDS = ("float32", "float16", "dynamic_int8", "int8")
CALIBRATED_KINDS = ("int8", "int16x8")
SIGNATURE = "serving_default"
# At most this many representative images calibrate the int8 ranges (evenly
# spaced through the set beyond it). On the digits model, 300 random images
# gave 98.9-100% top-1 agreement depending on the draw, all 1,437 gave 99.7%.
MAX_CALIBRATION_IMAGES = 2000
_NO_16X8_KERNEL = re.compile(r"16x8-bit not yet supported for op: '(\w+)'")


def check_kinds(kinds) -> tuple[str, ...]:
    if isinstance(kinds, str):
        kinds = (kinds,)
    kinds = tuple(kinds or ())
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"Unknown TFLite kinds {bad}; valid kinds are {list(KINDS)}.")
    return kinds


def convert(saved_model_dir, kind: str, representative_pixels=None) -> bytes:
    """Converts the SavedModel's `serving_default` signature to a `.tflite`
    flatbuffer of `kind`; `int8` and `int16x8` need `representative_pixels`,
    raw pixel images `(n, H, W, C)` like the ones it will see. `int16x8` needs
    a SavedModel written by `keras_vit.deploy.int16.write_source`."""
    check_kinds(kind)
    converter = tf.lite.TFLiteConverter.from_saved_model(
        str(saved_model_dir), signature_keys=[SIGNATURE]
    )
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if kind != "float32":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if kind == "float16":
        converter.target_spec.supported_types = [tf.float16]
    if kind in CALIBRATED_KINDS:
        if representative_pixels is None or len(representative_pixels) == 0:
            raise ValueError(
                f"Full-integer {kind} conversion needs representative_images: raw "
                "pixel images (n, height, width, channels) from the training data."
            )
        calibration = np.asarray(representative_pixels, dtype="float32")
        if len(calibration) > MAX_CALIBRATION_IMAGES:
            keep = np.linspace(0, len(calibration) - 1, MAX_CALIBRATION_IMAGES)
            calibration = calibration[keep.astype(int)]

        def representative_dataset():
            for image in calibration:
                yield {"pixels": image[None]}

        converter.representative_dataset = representative_dataset
        ops_set = tf.lite.OpsSet
        converter.target_spec.supported_ops = [
            ops_set.TFLITE_BUILTINS_INT8
            if kind == "int8"
            else ops_set.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
        ]
    with warnings.catch_warnings():
        # int8 calibration runs TF's own deprecated tf.lite.Interpreter inside.
        warnings.filterwarnings("ignore", message=".*tf.lite.Interpreter is deprecated")
        try:
            return converter.convert()
        except Exception as error:
            missing = sorted(set(_NO_16X8_KERNEL.findall(str(error))))
            if kind != "int16x8" or not missing:
                raise
            raise ValueError(
                f"int16x8 conversion failed: ops {missing} have no 16x8 kernel. "
                "Convert a SavedModel written by keras_vit.deploy.int16."
                "write_source (export_model does), which rewrites LayerNorm."
            ) from None


def _operator_names() -> dict[int, str]:
    from ai_edge_litert import schema_py_generated as schema

    return {
        code: name
        for name, code in vars(schema.BuiltinOperator).items()
        if not name.startswith("_")
    }


def operators(model) -> list[str]:
    """Sorted operator names in a `.tflite` flatbuffer (bytes or path): builtin
    names such as `FULLY_CONNECTED`, custom ops as `CUSTOM:<code>` (Flex ops
    are custom ops named `Flex<TfOp>`)."""
    from ai_edge_litert import schema_py_generated as schema

    content = Path(model).read_bytes() if isinstance(model, str | Path) else model
    flatbuffer = schema.Model.GetRootAsModel(bytearray(content), 0)
    names = _operator_names()
    found = set()
    for i in range(flatbuffer.OperatorCodesLength()):
        code = flatbuffer.OperatorCodes(i)
        # Builtin codes above 127 live in `builtin_code`; older ones in the
        # deprecated int8 field. The larger of the two is the real one.
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if builtin == schema.BuiltinOperator.CUSTOM:
            found.add(f"CUSTOM:{(code.CustomCode() or b'').decode()}")
        else:
            found.add(names.get(builtin, f"BUILTIN_{builtin}"))
    return sorted(found)


def check_builtin_only(model) -> list[str]:
    """Raises ValueError if the flatbuffer holds Flex or other custom ops;
    returns its operator names."""
    ops = operators(model)
    custom = [op for op in ops if op.startswith("CUSTOM:")]
    if custom:
        flex = [op for op in custom if op.startswith("CUSTOM:Flex")]
        raise ValueError(
            f"TFLite model uses non-builtin ops {custom}"
            + (" (Flex / SELECT_TF_OPS ops)" if flex else "")
            + "; it would not run on a stock LiteRT runtime."
        )
    return ops


class Runner:
    """Runs a `.tflite` file's `serving_default` with the LiteRT interpreter;
    any batch size (the input is resized per call; a batch of 0 returns empty
    outputs `(0, num_classes)` without running the model).

    The file cannot check its input, so the runner does before invoking, with
    the SavedModel's wording (`checks.check_pixel_batch`): numeric dtype,
    shape `(batch, H, W, C)`, and values in `[0, pixel_scale]` when
    `pixel_scale` is given (else finite). Errors are ValueErrors."""

    def __init__(
        self, model, num_threads: int | None = None, pixel_scale: float | None = None
    ):
        from ai_edge_litert.interpreter import Interpreter

        if isinstance(model, str | Path):
            self.interpreter = Interpreter(
                model_path=str(model), num_threads=num_threads
            )
        else:
            self.interpreter = Interpreter(model_content=model, num_threads=num_threads)
        signatures = self.interpreter.get_signature_list()
        if SIGNATURE not in signatures:
            raise ValueError(
                f"TFLite model has no {SIGNATURE!r} signature (it has "
                f"{sorted(signatures)}); export it with keras-vit export."
            )
        self.runner = self.interpreter.get_signature_runner(SIGNATURE)
        details = self.runner.get_input_details()["pixels"]
        self.input_shape = tuple(int(d) for d in details["shape_signature"][1:])
        self.outputs = sorted(signatures[SIGNATURE]["outputs"])
        self.output_widths = {
            name: int(detail["shape_signature"][-1])
            for name, detail in self.runner.get_output_details().items()
        }
        self.pixel_scale = pixel_scale

    def __call__(self, pixels) -> dict[str, np.ndarray]:
        pixels = check_pixel_batch(pixels, self.input_shape, self.pixel_scale)
        if len(pixels) == 0:
            return {
                name: np.zeros((0, width), "float32")
                for name, width in self.output_widths.items()
            }
        return {k: np.array(v) for k, v in self.runner(pixels=pixels).items()}
