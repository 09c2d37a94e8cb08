"""The int16x8 TFLite kind: int16 activations, int8 weights, LayerNorm
rewritten into ops that have 16x8 kernels; run with LiteRT."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter
from helpers import (
    DIGITS_METADATA_PREPROCESSING,
    FLOAT32_PARITY,
    assert_parity,
    near_ties,
    parity_bound,
)
from test_export import (
    DIGITS_PREPROCESSING,
    digits_train_pixels,
    keras_outputs,
    raw_pixels,
)

from keras_vit.deploy import int16, tflite
from keras_vit.deploy.export import export_model
from keras_vit.deploy.signatures import write_saved_model

LABELS = [str(i) for i in range(10)]
PREPROCESSING = DIGITS_METADATA_PREPROCESSING


@pytest.fixture(scope="module")
def int16x8_export(digits_model, tmp_path_factory):
    model, x_test, *_ = digits_model
    root = tmp_path_factory.mktemp("int16x8")
    metadata = export_model(
        model,
        "digits",
        root,
        labels=LABELS,
        preprocessing=DIGITS_PREPROCESSING,
        representative_images=digits_train_pixels(),
        verify_images=raw_pixels(x_test),
        tflite=("int16x8",),
    )
    return root / "digits_int16x8.tflite", metadata


def test_int16x8_computes_with_int16_activations(int16x8_export):
    interpreter = Interpreter(model_path=str(int16x8_export[0]))
    interpreter.allocate_tensors()
    dtypes = {d["index"]: d["dtype"] for d in interpreter.get_tensor_details()}
    # Op details have no public accessor; the private one is stable in LiteRT.
    ops = interpreter._get_ops_details()
    heavy = {"FULLY_CONNECTED", "BATCH_MATMUL", "SOFTMAX", "GELU", "MEAN", "RSQRT"}
    found = set()
    for op in ops:
        if op["op_name"] in heavy:
            found.add(op["op_name"])
            inputs = [dtypes[i] for i in op["inputs"] if i >= 0]
            # The activation (first input) is int16; a second input is int16
            # (BATCH_MATMUL, MEAN's axes as int32) or an int8 weight matrix.
            assert inputs[0] == np.int16, (op["op_name"], inputs)
            assert set(inputs) <= {np.int16, np.int8, np.int32, np.int64}
    assert found == heavy
    floats = {
        op["op_name"]
        for op in ops
        if any(dtypes[i] == np.float32 for i in op["inputs"] if i >= 0)
    }
    # Float only at the interface: no op falls back to a float kernel.
    assert floats <= {"QUANTIZE", "DELEGATE"}, floats
    assert interpreter.get_input_details()[0]["dtype"] == np.float32


def test_int16x8_top1_agrees_on_held_out_digits(int16x8_export, digits_model):
    path, metadata = int16x8_export
    model, x_test, *_ = digits_model
    got = tflite.Runner(path)(raw_pixels(x_test))
    expected = keras_outputs(model, x_test)
    agreement = np.mean(got["logits"].argmax(-1) == expected["logits"].argmax(-1))
    assert agreement >= 0.98, agreement
    # export_model's own Keras reference ran other batches: near ties aside.
    recorded = metadata["parity"]["tflite_int16x8"]["top1_agreement"]
    logits = expected["logits"]
    ties = near_ties(logits, parity_bound(logits, FLOAT32_PARITY))
    assert abs(recorded - agreement) <= ties / len(logits)


def test_rewritten_layer_norm_matches_keras_and_is_undone(digits_model, tmp_path):
    model, x_test, *_ = digits_model
    int16.write_source(model, tmp_path, LABELS, PREPROCESSING, 5, 2**24)
    served = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    got = served(pixels=tf.constant(raw_pixels(x_test[:64])))["logits"].numpy()
    expected = keras_outputs(model, x_test[:64])["logits"]
    assert_parity(got, expected, expected, FLOAT32_PARITY, "logits")
    # The rewrite lives only inside write_source: the model's own layers are
    # back on Keras' LayerNormalization.call.
    norms = [
        layer
        for layer in model._flatten_layers(include_self=False)
        if isinstance(layer, keras.layers.LayerNormalization)
    ]
    assert norms and not any("call" in vars(layer) for layer in norms)


def test_int16x8_of_a_plain_saved_model_names_the_missing_ops(digits_model, tmp_path):
    model = digits_model[0]
    write_saved_model(model, tmp_path, LABELS, PREPROCESSING)
    pixels = digits_train_pixels()[:8]
    with pytest.raises(ValueError, match=r"ops \['NEG'\] have no 16x8 kernel"):
        tflite.convert(tmp_path, "int16x8", pixels)
