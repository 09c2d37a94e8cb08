"""A mixed-precision model's float32 twin, which is what keras_vit exports.

Keras' mixed policies (`mixed_bfloat16`, `mixed_float16`) keep float32
variables and compute in bfloat16 or float16. The TFLite converter has no
builtin op for bfloat16 tensors (it refuses the graph, naming every op). So
the exporters write the same weights computing in float32, one graph for
the SavedModel and every TFLite kind (float16 and int8 are made from it as
from any float32 model), and record how far it is from the trained model.
"""

from __future__ import annotations

import keras
import numpy as np

LOW_PRECISION = ("bfloat16", "float16")


def computes_in_float32(model: keras.Model) -> bool:
    """Whether no layer of `model` computes or stores in bfloat16 or
    float16 (quantized layers count by the dtype they compute in)."""
    return not any(
        layer.compute_dtype in LOW_PRECISION or layer.variable_dtype in LOW_PRECISION
        for layer in model._flatten_layers(include_self=True)
    )


def low_precision_policy(model: keras.Model) -> str | None:
    """The dtype policy name of `model`'s first layer computing in bfloat16
    or float16 (`"mixed_bfloat16"`, ...), or None."""
    for layer in model._flatten_layers(include_self=False):
        if layer.compute_dtype in LOW_PRECISION:
            return layer.dtype_policy.name
    return None


def in_float32(model: keras.Model) -> keras.Model:
    """`model` if it computes in float32, else its `float32_copy`. Callers
    that patch a model's layers for tracing (int16's LayerNorm, QAT's
    conversion mode) take it first: the copy would not carry the patch."""
    return model if computes_in_float32(model) else float32_copy(model)


def float32_copy(model: keras.Model) -> keras.Model:
    """A copy of `model` whose every layer computes in float32, with its
    weights (float32 already under a mixed policy; bfloat16 / float16
    weights of a pure low-precision policy are widened exactly). `model`
    itself is unchanged."""
    config = _float32_config(model.get_config())
    # Sub-layers a layer creates without a dtype take the global policy: a
    # trainer exports while its mixed policy is still set.
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    try:
        copy = model.__class__.from_config(config)
    finally:
        keras.config.set_dtype_policy(previous)
    weights = [
        w.astype("float32") if np.dtype(w.dtype).name in LOW_PRECISION else w
        for w in model.get_weights()
    ]
    copy.set_weights(weights)
    if not computes_in_float32(copy):
        raise ValueError(
            f"Model {model.name!r} still computes in "
            f"{low_precision_policy(copy)} after its dtype policies were set "
            "to float32 (a layer that fixes its own dtype?); build it under "
            "the float32 policy to export it."
        )
    return copy


def _float32_config(config):
    """`config` with every Keras dtype policy in it (and a layer's `dtype`
    given by name) computing in float32."""
    if isinstance(config, list):
        return [_float32_config(item) for item in config]
    if not isinstance(config, dict):
        return config
    out = {key: _float32_config(value) for key, value in config.items()}
    if str(out.get("class_name", "")).endswith("DTypePolicy"):
        policy = dict(out.get("config") or {})
        for key in ("name", "source_name"):
            if _low(policy.get(key)):
                policy[key] = "float32"
        out["config"] = policy
    elif _low(out.get("dtype")):
        out["dtype"] = "float32"
    return out


def _low(name) -> bool:
    """Whether a policy or dtype name computes in bfloat16 or float16."""
    return isinstance(name, str) and name.removeprefix("mixed_") in LOW_PRECISION


__all__ = [
    "LOW_PRECISION",
    "computes_in_float32",
    "float32_copy",
    "in_float32",
    "low_precision_policy",
]
