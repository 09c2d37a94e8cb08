"""Full-integer `.tflite` files from quantization-aware-trained models.

The QAT model's fake-quantization ops carry its trained int8 ranges into the
SavedModel; the converter turns them into the int8 scales of those tensors
and calibrates the rest (LayerNorm internals, residual sums) on
representative images, as for post-training int8 (`tflite.convert`).
"""

from __future__ import annotations

import tempfile

import keras

from keras_vit.deploy import tflite as tflite_lib
from keras_vit.deploy.signatures import write_saved_model
from keras_vit.models.precision import computes_in_float32, low_precision_policy
from keras_vit.models.preprocessing import normalize_preprocessing
from keras_vit.models.qat import activation_quantizers, for_conversion


def int8_tflite(
    qat_model: keras.Model,
    representative_pixels,
    preprocessing: dict | None = None,
    labels: list[str] | None = None,
) -> bytes:
    """The full-int8 `.tflite` flatbuffer of a `quantize_aware` model, with
    the same `serving_default` interface as `tflite.convert`'s kinds (float32
    raw pixels in, `logits` / `probabilities` out); builtin ops only.

    Raises a ValueError naming the model if it has no QAT quantizers."""
    if not activation_quantizers(qat_model):
        raise ValueError(
            f"int8_tflite: model {qat_model.name!r} has no QAT quantizers; "
            "make it with keras_vit.models.qat.quantize_aware, or convert a "
            "float model with tflite.convert(..., 'int8', ...)."
        )
    preprocessing = normalize_preprocessing(qat_model, preprocessing)
    labels = labels or [str(i) for i in range(qat_model.output_shape[-1])]
    if not computes_in_float32(qat_model):
        # A QAT model does not rebuild from its config (its layers are
        # swapped in place), so it has no float32 twin to write.
        raise ValueError(
            f"int8_tflite: model {qat_model.name!r} computes in "
            f"{low_precision_policy(qat_model)}; quantization-aware training "
            "for an int8 .tflite runs under the float32 policy "
            "(keras.mixed_precision.set_global_policy('float32') before "
            "quantize_aware, or precision='float32' in the recipe)."
        )
    with tempfile.TemporaryDirectory() as tmp, for_conversion(qat_model):
        write_saved_model(qat_model, tmp, labels, preprocessing)
        content = tflite_lib.convert(tmp, "int8", representative_pixels)
    tflite_lib.check_builtin_only(content)
    return content


__all__ = ["int8_tflite"]
