"""Position embeddings at another patch grid than the one they were made for:
one implementation shared by the offline resampling (`resolution`) and the
in-graph one of a dynamic-size model (`PatchEncoder`), so both give the same
numbers.

Grid sizes may be Python ints or, inside a TensorFlow graph whose image size
is unknown until run time, scalar tensors. Resizing is written as two small
matrix products whose weights are those of TensorFlow's resize kernels
(half-pixel centres, no antialiasing) or of the library a checkpoint came
from (`SOURCE_KERNELS`), so a converted model at another size computes what
its source computes there: `keras.ops.image.resize` checks its
size with Python comparisons a symbolic size cannot answer, and XLA has no
kernel for `ResizeBicubic`, so a dynamic-size model under `jit_compile=True`
could not use it.
"""

from __future__ import annotations

import numpy as np
from keras import ops

INTERPOLATIONS = ("bicubic", "bilinear")
# The kernels of the libraries checkpoints come from, by the name a model
# records (`PatchEncoder(position_resample=...)`):
# - "timm": `resample_abs_pos_embed`, torch's bicubic with antialias=True
#   (Keys' cubic, a = -0.5, stretched by the factor when the grid shrinks,
#   weights renormalised at the edges); also transformers'
#   `Dinov2WithRegisters`, which asks torch for the same;
# - "hf": transformers' `interpolate_pos_encoding` (ViT, DeiT, Dinov2,
#   SigLIP, CLIP), torch's bicubic without antialias (a = -0.75, taps past
#   the edge repeat the edge);
# - "big_vision": `resample_posemb`, `scipy.ndimage.zoom(order=1)`: linear,
#   the corner samples mapped onto each other.
SOURCE_KERNELS = ("timm", "hf", "big_vision")
RESAMPLE_KERNELS = INTERPOLATIONS + SOURCE_KERNELS
# TensorFlow's bicubic kernel: Keys' cubic with a = -0.5, its weights looked
# up in a table of 1024 steps per pixel (resize_bicubic_op.cc).
_KEYS_A = -0.5
_TORCH_A = -0.75
_TABLE_STEPS = 1024.0


def check_kernel(method: str) -> str:
    if method not in RESAMPLE_KERNELS:
        raise ValueError(
            "The position resampling kernel must be 'bicubic' or 'bilinear' "
            "(TensorFlow's resize) or a source library's: 'timm', 'hf', "
            f"'big_vision'; got {method!r}."
        )
    return method


def is_static(*sizes) -> bool:
    """Whether every size is a Python int (known before run time)."""
    return all(isinstance(s, int) for s in sizes)


def _keys_near(x, a=_KEYS_A):
    return ((a + 2) * x - (a + 3)) * x * x + 1


def _keys_far(x, a=_KEYS_A):
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a


def _keys(x):
    """Keys' cubic (a = -0.5) at any offset; 0 from |x| = 2 on."""
    x = ops.abs(x)
    return ops.where(x < 1, _keys_near(x), ops.where(x < 2, _keys_far(x), 0.0))


def _taps_matrix(in_size: int, taps, weights):
    matrix = 0.0
    for tap, weight in zip(taps, weights, strict=True):
        tap = ops.clip(tap, 0, in_size - 1)
        matrix = matrix + ops.one_hot(tap, in_size, dtype="float32") * weight[:, None]
    return matrix


def _antialiased_weights(in_size: int, out_size):
    """torch's `interpolate(mode="bicubic", antialias=True)` (PIL's kernel):
    every input sample within two (stretched) pixels of an output centre,
    weighted by Keys' cubic, the weights summing to one."""
    scale = ops.cast(in_size, "float32") / ops.cast(out_size, "float32")
    stretch = ops.maximum(scale, 1.0)
    centre = (ops.arange(out_size, dtype="float32") + 0.5) * scale
    offsets = ops.arange(in_size, dtype="float32")[None, :] + 0.5 - centre[:, None]
    weights = _keys(offsets / stretch)
    return weights / ops.sum(weights, axis=1, keepdims=True)


def _zoom_weights(in_size: int, out_size):
    """`scipy.ndimage.zoom(order=1)`: output sample i reads input position
    i * (in - 1) / (out - 1), linearly interpolated."""
    steps = ops.maximum(ops.cast(out_size, "float32") - 1.0, 1.0)
    source = ops.arange(out_size, dtype="float32") * ((in_size - 1) / steps)
    floor = ops.floor(source)
    delta = source - floor
    floor = ops.cast(floor, "int32")
    return _taps_matrix(in_size, [floor, floor + 1], [1.0 - delta, delta])


def resize_weights(in_size: int, out_size, method: str = "bicubic"):
    """`(out_size, in_size)` matrix `W`: resizing an axis is `W @ x`.

    `"bicubic"` and `"bilinear"` are TensorFlow's `image.resize(...,
    antialias=False)`; the others are the kernels of `SOURCE_KERNELS`.
    """
    if method == "timm":
        return _antialiased_weights(in_size, out_size)
    if method == "big_vision":
        return _zoom_weights(in_size, out_size)
    scale = ops.cast(in_size, "float32") / ops.cast(out_size, "float32")
    source = (ops.arange(out_size, dtype="float32") + 0.5) * scale - 0.5
    floor = ops.floor(source)
    delta = source - floor
    floor = ops.cast(floor, "int32")
    if method == "bilinear":
        # Taps past the edge repeat the edge pixel.
        return _taps_matrix(in_size, [floor, floor + 1], [1.0 - delta, delta])
    taps = [floor - 1, floor, floor + 1, floor + 2]
    if method == "hf":
        # torch's exact weights; taps past the edge repeat the edge.
        a = _TORCH_A
        weights = [
            _keys_far(delta + 1, a),
            _keys_near(delta, a),
            _keys_near(1 - delta, a),
            _keys_far(2 - delta, a),
        ]
        return _taps_matrix(in_size, taps, weights)
    step = ops.round(delta * _TABLE_STEPS) / _TABLE_STEPS
    weights = [
        _keys_far(step + 1),
        _keys_near(step),
        _keys_near(1 - step),
        _keys_far(2 - step),
    ]
    # Taps past the edge get no weight; the rest are renormalised.
    weights = [
        ops.where(ops.logical_and(t >= 0, t < in_size), w, 0.0)
        for t, w in zip(taps, weights, strict=True)
    ]
    total = sum(weights)
    return _taps_matrix(in_size, taps, [w / total for w in weights])


def resize_grid(grid, size, method: str = "bicubic"):
    """Resizes `(1, rows, cols, hidden_dim)` to `(1, *size, hidden_dim)` with
    the kernel `method` (one of `RESAMPLE_KERNELS`; `"bicubic"` is
    TensorFlow's `image.resize(grid, size, "bicubic", antialias=False)`),
    for sizes known or not before run time."""
    check_kernel(method)
    rows, cols = grid.shape[1], grid.shape[2]
    grid = ops.cast(grid[0], "float32")
    grid = ops.einsum("ia,abd->ibd", resize_weights(rows, size[0], method), grid)
    grid = ops.einsum("jb,ibd->ijd", resize_weights(cols, size[1], method), grid)
    return grid[None]


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


def sincos_position_embedding(
    grid_size: tuple[int, int], hidden_dim: int, temperature: float = 10000.0
) -> np.ndarray:
    """Fixed 2-D sine-cosine position embedding, `(rows * cols, hidden_dim)`.

    A quarter of the channels each hold sin(y), cos(y), sin(x), cos(x) at
    geometrically spaced frequencies, as in MoCo v3 and big_vision.
    """
    if hidden_dim % 4:
        raise ValueError(
            "The sin-cos position embedding needs `hidden_dim` divisible by 4, "
            f"got {hidden_dim}."
        )
    rows, cols = grid_size
    y, x = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    omega = np.arange(hidden_dim // 4) / (hidden_dim // 4 - 1 or 1)
    omega = 1.0 / temperature**omega
    y = y.reshape(-1, 1) * omega[None]
    x = x.reshape(-1, 1) * omega[None]
    table = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
    return table.astype("float32")


def table_for_grid(
    table,
    built_grid,
    grid,
    *,
    sincos: bool,
    num_prefix_tokens: int,
    method: str = "bicubic",
):
    """A `PatchEncoder`'s position `table`, made for `built_grid`, at `grid`
    (ints, or scalar tensors when the size is known only at run time): the
    stored table at its own grid, else resampled with the kernel `method`
    (learned) or recomputed (sin-cos)."""
    rows, cols = grid
    if is_static(rows, cols) and (rows, cols) == tuple(built_grid):
        return table

    def for_grid():
        if sincos:
            return sincos_table((rows, cols), table.shape[-1])[None]
        return interpolate_position_embedding(
            table, built_grid, (rows, cols), num_prefix_tokens, method
        )

    if is_static(rows, cols):
        return for_grid()
    same = ops.logical_and(
        ops.equal(rows, built_grid[0]), ops.equal(cols, built_grid[1])
    )
    return ops.cond(same, lambda: ops.convert_to_tensor(table), for_grid)
