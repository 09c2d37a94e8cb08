"""Weight quantization through Keras' own `model.quantize`.

Keras quantizes every `Dense` (the QKV, attention projection, MLP, patch
projection and head; convolutions and norms stay float). Modes that need no
calibration data: `"int8"` (per-channel int8 kernels, inputs quantized on
the fly), `"int4"` (packed int4 kernels) and `"float8"` (e4m3 kernels and
inputs with delayed scaling).
"""

from __future__ import annotations

import warnings

import keras

QUANTIZATION_MODES = ("int8", "int4", "float8")


def check_quantization_mode(mode: str) -> str:
    if mode not in QUANTIZATION_MODES:
        raise ValueError(
            f"Unknown quantization mode {mode!r}; valid modes are "
            f"{', '.join(QUANTIZATION_MODES)}."
        )
    return mode


def quantized_copy(model: keras.Model, mode: str) -> keras.Model:
    """A copy of the functional `model` with its `Dense` kernels quantized to
    `mode`; `model` itself stays float (the reference for parity figures).

    The copy saves as `.keras` and reloads with the same outputs (each
    keras_vit layer records its quantized sub-layers' policies).
    """
    check_quantization_mode(mode)
    copy = model.__class__.from_config(model.get_config())
    copy.set_weights(model.get_weights())
    with warnings.catch_warnings():
        # Keras warns once per layer kind it cannot quantize (norms, patches).
        warnings.filterwarnings("ignore", "Layer .* does not have a `quantize`")
        copy.quantize(mode)
    return copy


__all__ = ["QUANTIZATION_MODES", "check_quantization_mode", "quantized_copy"]
