"""The normalisations the ViT families use: LayerNorm (the paper's) and
RMSNorm (AIMv2), behind one factory, written with `keras.ops` (LayerNorm's
training calls on TensorFlow take the fused kernel of `models.fused`)."""

from __future__ import annotations

import keras
from keras import ops

from keras_vit.models import fused

register = keras.saving.register_keras_serializable(package="keras_vit")

NORM_TYPES = ("layernorm", "rmsnorm")


def check_norm_type(norm_type: str) -> str:
    if norm_type not in NORM_TYPES:
        raise ValueError(
            f"`norm_type` must be 'layernorm' or 'rmsnorm', got {norm_type!r}."
        )
    return norm_type


@register
class LayerNorm(keras.layers.LayerNormalization):
    """Keras' `LayerNormalization`, whose training calls on TensorFlow over
    the last axis run one fused kernel forward and one backward
    (`models.fused.layer_norm`); every other call is Keras' own. Same
    arguments, weights and outputs (up to float rounding).

    Call arguments:
        inputs: any shape.
        training: bool, whether this is a training call.
    """

    def call(self, inputs, training=None):
        last_axis = list(self.axis) in ([-1], [len(inputs.shape) - 1])
        plain = self.gamma is not None and self.beta is not None
        fuse = fused.active(training, inputs.shape[-1])
        if fuse and last_axis and plain and not self.rms_scaling:
            return fused.layer_norm(inputs, self.gamma, self.beta, self.epsilon)
        return super().call(inputs)


@register
class RMSNorm(keras.layers.Layer):
    """Root-mean-square normalisation with a learned per-channel scale
    (Zhang and Sennrich 2019), as AIMv2 uses in place of LayerNorm.

    The statistics are computed in float32 whatever the compute dtype, as
    Keras' LayerNormalization does, so `mixed_float16` does not overflow the
    squares.

    Args:
        epsilon: float, added to the mean square.

    Call arguments:
        x: `(..., channels)`.
    """

    def __init__(self, epsilon: float = 1e-6, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = float(epsilon)

    def build(self, input_shape):
        self.gamma = self.add_weight(
            shape=(input_shape[-1],), initializer="ones", name="gamma"
        )

    def call(self, x):
        x32 = ops.cast(x, "float32")
        scale = ops.rsqrt(
            ops.mean(ops.square(x32), axis=-1, keepdims=True) + self.epsilon
        )
        return ops.cast(
            x32 * scale * ops.cast(self.gamma, "float32"), self.compute_dtype
        )

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}


def make_norm(norm_type: str, epsilon: float, name: str, dtype=None):
    """A LayerNorm or RMSNorm named `name`; both keep their scale in `gamma`."""
    if check_norm_type(norm_type) == "rmsnorm":
        return RMSNorm(epsilon, dtype=dtype, name=name)
    return LayerNorm(epsilon=epsilon, dtype=dtype, name=name)
