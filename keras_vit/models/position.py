"""Position embeddings at another patch grid than the one they were made for:
one implementation shared by the offline resampling (`resolution`) and the
in-graph one of a dynamic-size model (`PatchEncoder`), so both give the same
numbers.

Grid sizes may be Python ints or, inside a TensorFlow graph whose image size
is unknown until run time, scalar tensors. Only the TensorFlow backend has
such symbolic sizes (JAX traces and PyTorch run with concrete shapes), and
`keras.ops.image.resize` validates its size with Python comparisons that a
symbolic size cannot answer; for those alone `tf.image.resize` is called,
which is what `keras.ops.image.resize` runs on TensorFlow anyway.
"""

from __future__ import annotations

from keras import ops

INTERPOLATIONS = ("bicubic", "bilinear")


def is_static(*sizes) -> bool:
    """Whether every size is a Python int (known before run time)."""
    return all(isinstance(s, int) for s in sizes)


def resize_grid(grid, size, method: str = "bicubic"):
    """Resizes `(1, rows, cols, hidden_dim)` to `(1, *size, hidden_dim)`
    without antialiasing (timm's and `with_image_size`'s choice)."""
    if method not in INTERPOLATIONS:
        raise ValueError(
            f"`method` must be one of {INTERPOLATIONS}, got {method!r}."
        )
    if is_static(*size):
        return ops.image.resize(grid, tuple(size), interpolation=method, antialias=False)
    import tensorflow as tf  # see the module docstring: symbolic sizes only

    return tf.image.resize(grid, tf.stack(size), method=method, antialias=False)


def interpolate_position_embedding(
    table, old_grid, new_grid, num_prefix_tokens: int, method: str = "bicubic"
):
    """A learned `(1, num_prefix_tokens + rows * cols, hidden_dim)` table
    resampled from `old_grid` (ints) to `new_grid` (ints or scalar tensors);
    the prefix tokens' rows are kept as they are."""
    hidden_dim = table.shape[-1]
    prefix, grid = table[:, :num_prefix_tokens], table[:, num_prefix_tokens:]
    grid = ops.reshape(grid, (1, old_grid[0], old_grid[1], hidden_dim))
    resized = resize_grid(grid, new_grid, method)
    resized = ops.reshape(resized, (1, -1, hidden_dim))
    return ops.concatenate([ops.cast(prefix, resized.dtype), resized], axis=1)


def sincos_table(grid, hidden_dim: int, temperature: float = 10000.0):
    """`layers.sincos_position_embedding` for a grid that may be known only at
    run time: `(rows * cols, hidden_dim)` float32. Computed in float64, as the
    numpy table is, so both agree to float32 rounding."""
    rows, cols = grid
    quarter = hidden_dim // 4
    omega = ops.arange(quarter, dtype="float64") / float(quarter - 1 or 1)
    omega = 1.0 / ops.power(ops.cast(temperature, "float64"), omega)
    y = ops.arange(rows, dtype="float64")[:, None] + ops.zeros((1, cols), "float64")
    x = ops.arange(cols, dtype="float64")[None, :] + ops.zeros((rows, 1), "float64")
    y = ops.reshape(y, (-1, 1)) * omega[None]
    x = ops.reshape(x, (-1, 1)) * omega[None]
    table = ops.concatenate([ops.sin(x), ops.cos(x), ops.sin(y), ops.cos(y)], axis=1)
    return ops.cast(table, "float32")
