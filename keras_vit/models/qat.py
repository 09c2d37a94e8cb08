"""Quantization-aware training (QAT): int8 fake quantization in the forward
pass, straight-through gradients in the backward pass.

`quantize_aware(model)` returns a copy of a trained model whose every `Dense`
(patch projection, QKV, attention projection, MLP, pre-logits, head) rounds
its kernel to per-channel symmetric int8 and its input and output to
per-tensor int8, and whose attention rounds the scaled queries, the logits
and the probabilities. Each activation range is tracked during training as a
moving average of the batch min / max (as TensorFlow Model Optimization's
`MovingAverageQuantizer` does) and kept as non-trainable weights.

The rounding is `keras.quantizers.fake_quant_with_min_max_vars`, which on
TensorFlow is the `FakeQuantWithMinMaxVars(PerChannel)` op: the TFLite
converter reads its ranges as the tensors' int8 scales, so a full-int8
`.tflite` of the QAT model computes what the model was trained to compute.
Tensors without a fake quantizer (LayerNorm internals, residual sums) are
calibrated by the converter from representative images as in post-training
quantization.

The copy keeps every layer name and float variable path of the original;
`copy_float_weights(qat_model, model)` writes the fine-tuned float weights
back into an ordinary model (the QAT copy itself is not meant to be saved as
`.keras`: its `Dense` layers are of a QAT class).
"""

from __future__ import annotations

import contextlib

import keras
from keras import ops

from keras_vit.models.blocks import MultiHeadSelfAttention
from keras_vit.models.sublayers import register

# Softmax outputs in TFLite int8 are fixed to scale 1/256, zero point -128;
# this range gives exactly that, so the converter adds no requantization.
PROBABILITY_RANGE = (0.0, 255.0 / 256.0)
MIN_RANGE = 1e-3


@register
class ActivationQuantizer(keras.layers.Layer):
    """Per-tensor int8 fake quantization with a tracked (or fixed) range.

    Args:
        ema_decay: float in [0, 1), weight of the old range in the moving
            average of batch min / max; the first training batch sets the
            range outright.
        fixed_range: `(min, max)` or None; a fixed range is never updated.

    Call arguments:
        x: any shape.
        training: bool, whether the range is updated from this batch.
    """

    def __init__(self, ema_decay: float = 0.99, fixed_range=None, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= float(ema_decay) < 1.0:
            raise ValueError(f"`ema_decay` must be in [0, 1), got {ema_decay!r}.")
        if fixed_range is not None:
            low, high = (float(v) for v in fixed_range)
            if not low <= 0.0 <= high or low == high:
                raise ValueError(
                    "`fixed_range` must be (min, max) with min <= 0 <= max and "
                    f"min < max, got {fixed_range!r}."
                )
            fixed_range = (low, high)
        self.ema_decay = float(ema_decay)
        self.fixed_range = fixed_range

    def build(self, input_shape):
        # TFMOT's initial range; replaced by the first training batch.
        low, high = self.fixed_range or (-6.0, 6.0)
        # float32 whatever the policy: the ranges are what the converter reads.
        self.range_min = self.add_weight(
            shape=(),
            initializer=keras.initializers.Constant(low),
            dtype="float32",
            trainable=False,
            name="range_min",
        )
        self.range_max = self.add_weight(
            shape=(),
            initializer=keras.initializers.Constant(high),
            dtype="float32",
            trainable=False,
            name="range_max",
        )
        self.observed_batches = self.add_weight(
            shape=(),
            initializer="zeros",
            dtype="float32",
            trainable=False,
            name="observed_batches",
        )

    def call(self, x, training=None):
        low, high = self.range_min, self.range_max
        if training and self.fixed_range is None:
            low, high = self._update(x)
        return keras.quantizers.fake_quant_with_min_max_vars(
            x, low, high, num_bits=8, narrow_range=False
        )

    def _update(self, x):
        values = ops.stop_gradient(ops.cast(x, "float32"))
        # The range must hold 0 so that zero padding and ReLU-like zeros stay
        # exact (the int8 zero point).
        batch_min = ops.minimum(ops.min(values), 0.0)
        # An all-zero tensor (a fresh zero-initialised head) would give an
        # empty range, which fake quantization and the converter turn into
        # NaN or a zero scale.
        batch_max = ops.maximum(ops.max(values), batch_min + MIN_RANGE)
        first = ops.equal(self.observed_batches, 0.0)
        decay = self.ema_decay
        low = ops.where(
            first, batch_min, decay * self.range_min + (1 - decay) * batch_min
        )
        high = ops.where(
            first, batch_max, decay * self.range_max + (1 - decay) * batch_max
        )
        self.range_min.assign(low)
        self.range_max.assign(high)
        self.observed_batches.assign_add(1.0)
        return low, high

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "ema_decay": self.ema_decay,
            "fixed_range": self.fixed_range,
        }


def fake_quantize_kernel(kernel):
    """`kernel` `(in, out)` rounded to symmetric int8 per output channel, in
    [-127, 127] (TFLite's weight range), with straight-through gradients."""
    bound = ops.stop_gradient(ops.max(ops.abs(ops.cast(kernel, "float32")), axis=0))
    # An all-zero channel would give an empty range; any positive bound
    # rounds it to zeros.
    bound = ops.maximum(bound, 1e-8)
    return keras.quantizers.fake_quant_with_min_max_vars(
        kernel, -bound, bound, num_bits=8, narrow_range=True, axis=-1
    )


class QATDense(keras.layers.Dense):
    """A `Dense` whose kernel, input and output are fake-quantized to int8.

    Not constructed directly: `quantize_aware` gives this class to the
    `Dense` layers of a built model, keeping their variables, and adds the
    `input_quantizer` and `output_quantizer` sub-layers.

    Inside `for_conversion` the kernel stays float in the traced graph: the
    TFLite converter refuses a per-channel fake-quantized `MatMul` kernel
    ("mismatched quantized axes" of the transpose it inserts), and quantizes
    a float kernel itself to exactly the same per-channel int8 values
    (scale `max|w| / 127` per output unit, zero point 0).
    """

    converting = False

    def call(self, inputs, training=None):
        leading = (-1, *inputs.shape[1:-1])
        if None in inputs.shape[1:-1]:
            leading = tuple(
                ops.shape(inputs)[i] if d is None else d
                for i, d in enumerate(inputs.shape[:-1])
            )
        x = self.input_quantizer(inputs, training=training)
        # A 2-D product: on 3-D inputs TF's Tensordot transposes the
        # per-channel int8 kernel, which the TFLite converter refuses
        # ("mismatched quantized axes").
        x = ops.reshape(x, (-1, inputs.shape[-1]))
        kernel = self.kernel
        if not self.converting:
            kernel = fake_quantize_kernel(kernel)
        y = ops.matmul(x, kernel)
        if self.bias is not None:
            y = ops.add(y, self.bias)
        if self.activation is not None:
            y = self.activation(y)
        y = ops.reshape(y, (*leading, self.units))
        return self.output_quantizer(y, training=training)


class QATMultiHeadSelfAttention(MultiHeadSelfAttention):
    """Self-attention whose two products see int8 operands and outputs: the
    scaled queries, the keys and values (already int8 as the QKV `Dense`'s
    output), the logits and the probabilities (fixed to TFLite's softmax
    range). The product with the values needs no output quantizer: the
    projection's input quantizer rounds the same tensor."""

    def _attention_matmul(self, a, b, product, training=None):
        if product == "logits":
            a = self.query_quantizer(a, training=training)
            return self.logits_quantizer(ops.matmul(a, b), training=training)
        return ops.matmul(self.probs_quantizer(a, training=training), b)


def _add_sublayers(layer, sublayers: dict, input_shape) -> None:
    # A built Keras layer locks its state; Keras' own `quantize` unlocks it
    # the same way to add its scale variables.
    layer._tracker.unlock()
    for name, sub in sublayers.items():
        setattr(layer, name, sub)
        # Under the parent's path, so the ranges are saved and listed as
        # e.g. `block_0/attention/qkv/input_quantizer/range_min`.
        parent = layer.path.rpartition("/")[0]
        with keras.name_scope(layer.name, override_parent=parent):
            sub.build(input_shape)
    layer._tracker.lock()


def quantize_aware(model: keras.Model, ema_decay: float = 0.99) -> keras.Model:
    """A QAT copy of the built functional `model`, with its weights.

    Every `Dense` and every `MultiHeadSelfAttention` in the copy is fake
    quantized (module docstring); `model` itself is left unchanged. Raises a
    ValueError naming the model if it has no `Dense` layer to quantize.
    """
    dense = [
        layer
        for layer in model._flatten_layers(include_self=False)
        if isinstance(layer, keras.layers.Dense)
    ]
    if not dense:
        kinds = sorted({type(layer).__name__ for layer in model.layers})
        raise ValueError(
            f"quantize_aware: model {model.name!r} has no Dense layers to "
            f"quantize (its layers are {kinds}); QAT covers Dense and "
            "attention layers only."
        )
    copy = model.__class__.from_config(model.get_config())
    copy.set_weights(model.get_weights())
    for layer in copy._flatten_layers(include_self=False):
        if isinstance(layer, QATDense | QATMultiHeadSelfAttention):
            continue
        if isinstance(layer, keras.layers.Dense):
            layer.__class__ = QATDense
            _add_sublayers(
                layer,
                {
                    "input_quantizer": ActivationQuantizer(
                        ema_decay, name="input_quantizer"
                    ),
                    "output_quantizer": ActivationQuantizer(
                        ema_decay, name="output_quantizer"
                    ),
                },
                (),
            )
        elif type(layer) is MultiHeadSelfAttention:
            layer.__class__ = QATMultiHeadSelfAttention
            _add_sublayers(
                layer,
                {
                    "query_quantizer": ActivationQuantizer(
                        ema_decay, name="query_quantizer"
                    ),
                    "logits_quantizer": ActivationQuantizer(
                        ema_decay, name="logits_quantizer"
                    ),
                    "probs_quantizer": ActivationQuantizer(
                        fixed_range=PROBABILITY_RANGE, name="probs_quantizer"
                    ),
                },
                (),
            )
    return copy


@contextlib.contextmanager
def for_conversion(model: keras.Model):
    """While active, `model`'s QAT `Dense` layers trace with float kernels
    for the TFLite converter (see `QATDense`); write the SavedModel inside."""
    layers = [
        layer
        for layer in model._flatten_layers(include_self=False)
        if isinstance(layer, QATDense)
    ]
    for layer in layers:
        layer.converting = True
    try:
        yield model
    finally:
        for layer in layers:
            layer.converting = False


def activation_quantizers(model: keras.Model) -> dict[str, ActivationQuantizer]:
    """The model's activation quantizers by path, e.g.
    `block_0/attention/qkv/input_quantizer`."""
    return {
        layer.path: layer
        for layer in model._flatten_layers(include_self=False)
        if isinstance(layer, ActivationQuantizer)
    }


def copy_float_weights(qat_model: keras.Model, model: keras.Model) -> None:
    """Writes `qat_model`'s float weights into `model` (the architecture it
    was copied from), matched by variable path; the quantizers' ranges have
    no place in `model` and are left out."""
    source = {v.path: v for v in qat_model.weights}
    missing = [v.path for v in model.weights if v.path not in source]
    if missing:
        raise ValueError(
            f"copy_float_weights: {qat_model.name!r} is not a QAT copy of "
            f"{model.name!r}; it lacks {missing[:3]}."
        )
    for variable in model.weights:
        variable.assign(source[variable.path])


__all__ = [
    "PROBABILITY_RANGE",
    "ActivationQuantizer",
    "QATDense",
    "QATMultiHeadSelfAttention",
    "activation_quantizers",
    "copy_float_weights",
    "fake_quantize_kernel",
    "for_conversion",
    "quantize_aware",
]
