"""The graph the `int16x8` TFLite kind converts: LayerNorm in 16x8-ready ops.

The 16x8 quantizer (int16 activations, int8 weights) has no 16x8 kernel for
two ops of Keras' own LayerNormalization graph: `NEG` (from `-mean * inv`)
fails the conversion ("Quantization to 16x8-bit not yet supported for op:
'NEG'"), and `SQUARED_DIFFERENCE` (from `moments`) converts with a float
fallback that LiteRT then refuses in int16 at run time. The same arithmetic
written as `d = x - mean(x)`, `var = mean(d * d)`, `d * rsqrt(var + eps) *
gamma + beta` uses only MEAN, SUB, MUL, ADD and RSQRT, which all have 16x8
kernels; GELU, SOFTMAX, BATCH_MATMUL and FULLY_CONNECTED already do.

The trained model is not changed: while the int16x8 source SavedModel is
traced, each of its LayerNormalization layers computes the rewritten form
(equal to Keras' up to float rounding, checked by the parity on export).
"""

from __future__ import annotations

import contextlib
import types

import keras
from keras import ops

from keras_vit.deploy.signatures import write_saved_model
from keras_vit.models.precision import in_float32


def _plain_layer_norm(layer, inputs, training=None):
    # `training`: keras_vit's LayerNorm takes it (an export traces False).
    if list(layer.axis) not in ([-1], [len(inputs.shape) - 1]) or layer.rms_scaling:
        return keras.layers.LayerNormalization.call(layer, inputs)
    x = ops.cast(inputs, "float32")
    mean = ops.mean(x, axis=-1, keepdims=True)
    centred = x - mean
    variance = ops.mean(centred * centred, axis=-1, keepdims=True)
    y = centred * ops.rsqrt(variance + layer.epsilon)
    if layer.gamma is not None:
        y = y * ops.cast(layer.gamma, "float32")
    if layer.beta is not None:
        y = y + ops.cast(layer.beta, "float32")
    return ops.cast(y, layer.compute_dtype)


@contextlib.contextmanager
def plain_layer_norms(model: keras.Model):
    """Within the block, every LayerNormalization in `model` (nested ones
    included) that normalises the last axis computes `_plain_layer_norm`;
    others keep Keras' graph (a 16x8 conversion of them then fails with the
    converter's message)."""
    layers = [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, keras.layers.LayerNormalization)
    ]
    try:
        for layer in layers:
            # An instance attribute shadows the class's `call` for this layer
            # only; other models (and other threads' models) are untouched.
            object.__setattr__(
                layer, "call", types.MethodType(_plain_layer_norm, layer)
            )
        yield
    finally:
        for layer in layers:
            if "call" in vars(layer):
                object.__delattr__(layer, "call")


def write_source(model, path, labels, preprocessing, top_k, max_pixels) -> None:
    """Writes the SavedModel the `int16x8` kind converts: `model`'s own
    signatures, traced with `plain_layer_norms` (on its float32 twin if it
    computes in low precision: `write_saved_model` would copy it unpatched)."""
    model = in_float32(model)
    with plain_layer_norms(model):
        write_saved_model(model, path, labels, preprocessing, top_k, max_pixels)
