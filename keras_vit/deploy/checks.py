"""The input checks every runner of an export makes, in one wording: the
SavedModel's graph makes them in TF ops (`keras_vit.deploy.signatures`), the
`.tflite` runner and `predict` with these numpy twins before invoking."""

from __future__ import annotations

import numpy as np

SERVING_INPUT = "pixels"
# How far pixels may overshoot [0, pixel_scale], as a fraction of it, before
# they are refused: float rounding of normalised-and-back images and bicubic
# resizing overshoot a little; 1e30 or -500 is not that.
PIXEL_RANGE_SLACK = 0.01


def check_pixel_batch(pixels, shape, pixel_scale: float | None = None) -> np.ndarray:
    """`pixels` as a float32 `(batch, *shape)` array after the checks the
    SavedModel's `serving_default` makes in its graph, with the same wording:
    numeric dtype, rank 4, size and channels, and (with `pixel_scale`) values
    in `[0, pixel_scale]` (1% slack), else finite. ValueError otherwise."""
    expected = f"(batch, {', '.join(str(d) for d in shape)})"
    array = np.asarray(pixels)
    if array.dtype.kind not in "iuf":
        raise ValueError(
            f"`{SERVING_INPUT}` must be a numeric array of raw pixel values "
            f"{expected}; got dtype {array.dtype}."
        )
    if array.ndim != 4 or tuple(array.shape[1:]) != tuple(shape):
        raise ValueError(
            f"`{SERVING_INPUT}` must have shape {expected}; got shape "
            f"{tuple(array.shape)}."
        )
    array = np.ascontiguousarray(array, dtype="float32")
    if array.size == 0:
        return array
    low, high = float(np.min(array)), float(np.max(array))
    if pixel_scale is None:
        if not np.all(np.isfinite(array)):
            raise ValueError(f"`{SERVING_INPUT}` must be finite; got NaN or Inf.")
    else:
        slack = PIXEL_RANGE_SLACK * pixel_scale
        # NaN fails both comparisons, as in the graph's check.
        if not (np.all(array >= -slack) and np.all(array <= pixel_scale + slack)):
            raise ValueError(
                f"`{SERVING_INPUT}` must be finite raw pixel values in "
                f"[0, {pixel_scale:g}]; got values from {low:g} to {high:g}."
            )
    return array
