"""Rotary position embedding (RoPE) on the patch tokens' queries and keys,
written with `keras.ops` only.

keras_vit rotates in the "half" layout: channel `i` of a head pairs with
channel `i + head_dim / 2`. A checkpoint made with the interleaved layout
(pairs `2i, 2i + 1`, timm's default) is the same model once the query and
key channels of each head are permuted alike, which the converters do:
attention only reads `q . k`, which a common permutation leaves unchanged.
"""

from __future__ import annotations

import keras
from keras import ops


def rotate_half(x):
    half = x.shape[-1] // 2
    return ops.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x, rope):
    """Rotates the last `num_patches` tokens of `x`.

    Args:
        x: `(batch_heads, num_tokens, head_dim)` queries or keys.
        rope: `(2, num_patches, head_dim)`: the cosines then the sines, in the
            half layout, float32.

    Returns:
        `x` with its prefix tokens unchanged and its patch tokens rotated, in
        `x`'s dtype (the rotation itself runs in float32).
    """
    # A mixed-precision block receives the tables cast to its compute dtype
    # (Keras casts float call arguments); the rotation runs in float32.
    cos, sin = ops.cast(rope[0], "float32"), ops.cast(rope[1], "float32")
    patches = ops.shape(cos)[0] if cos.shape[0] is None else cos.shape[0]
    tokens = ops.shape(x)[1] if x.shape[1] is None else x.shape[1]
    prefix, rotated = x[:, : tokens - patches], x[:, tokens - patches :]
    r32 = ops.cast(rotated, "float32")
    r32 = r32 * cos[None] + rotate_half(r32) * sin[None]
    return ops.concatenate([prefix, ops.cast(r32, x.dtype)], axis=1)


ROPE_COORDINATES = ("index", "centered")
AXIS_ORDERS = ("ij", "xy")


def rope_angles(rows, cols, num_bands: int, options: dict):
    """`(rows * cols, 2 * num_bands)` rotation angles, row-major tokens; the
    first `num_bands` columns follow the first coordinate of `axis_order`.

    Each axis turns at `frequency_scale * temperature ** (-k / num_bands)`
    radians per unit of its coordinate: the index (`"index"`, plus
    `grid_offset`, rescaled to `reference_grid` when given: EVA-02) or the
    cell centre mapped to [-1, 1] (`"centered"`, DINOv3).
    """
    k = ops.arange(num_bands, dtype="float32") / float(num_bands)
    bands = float(options["frequency_scale"]) * ops.power(
        float(options["temperature"]), -k
    )
    sizes = (rows, cols) if options["axis_order"] == "ij" else (cols, rows)
    reference = options.get("reference_grid")
    if reference is not None and options["axis_order"] == "xy":
        reference = (reference[1], reference[0])
    axes = []
    for i, size in enumerate(sizes):
        t = ops.arange(size, dtype="float32") + float(options["grid_offset"])
        size_f = ops.cast(size, "float32")
        if options["coordinates"] == "centered":
            t = 2.0 * ((t + 0.5) / size_f) - 1.0
        elif reference is not None:
            t = t / size_f * float(reference[i])
        axes.append(t)
    # Row-major tokens whatever the axis order.
    row_t, col_t = (
        (axes[0], axes[1]) if options["axis_order"] == "ij" else (axes[1], axes[0])
    )
    row_angles = ops.repeat(row_t[:, None] * bands[None], cols, axis=0)
    col_angles = ops.tile(col_t[:, None] * bands[None], (rows, 1))
    if options["axis_order"] == "ij":
        return ops.concatenate([row_angles, col_angles], axis=-1)
    return ops.concatenate([col_angles, row_angles], axis=-1)


@keras.saving.register_keras_serializable(package="keras_vit")
class RotaryEmbedding(keras.layers.Layer):
    """The `(cos, sin)` tables of 2-D axial RoPE for the patch grid.

    Args:
        head_dim: int, the attention heads' width (a multiple of 4).
        stride: None, or the `(rows, cols)` pixels per patch: the input is
            then the images and the grid is their size over the stride (a
            fixed-size model, also after `with_image_size`); None: the input
            is the patches on their grid (a dynamic-size model).
        coordinates: `"index"` (EVA-02, ROPE-ViT) or `"centered"` (DINOv3).
        temperature: float, the frequency base.
        frequency_scale: float, radians per unit at the lowest band (1 for
            the index coordinates, 2 pi for DINOv3's).
        grid_offset: float, added to each index.
        axis_order: `"ij"` (rows' bands first) or `"xy"` (columns' first).
        reference_grid: None or `(rows, cols)`: index coordinates are
            rescaled as if the grid had this size (EVA-02's `ref_feat_shape`).

    Call arguments:
        x: images `(batch, height, width, channels)` with `stride`, else
            patches on their grid `(batch, rows, cols, patch_dim)`.

    Returns:
        float32 `(2, num_patches, head_dim)`: cosines then sines in the half
        layout (`apply_rope`).
    """

    def __init__(
        self,
        head_dim: int,
        stride=None,
        coordinates: str = "index",
        temperature: float = 10000.0,
        frequency_scale: float = 1.0,
        grid_offset: float = 0.0,
        axis_order: str = "ij",
        reference_grid=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if int(head_dim) % 4:
            raise ValueError(f"RoPE needs head_dim divisible by 4, got {head_dim!r}.")
        if coordinates not in ROPE_COORDINATES:
            raise ValueError(
                f"`coordinates` must be 'index' or 'centered', got {coordinates!r}."
            )
        if axis_order not in AXIS_ORDERS:
            raise ValueError(f"`axis_order` must be 'ij' or 'xy', got {axis_order!r}.")
        self.head_dim = int(head_dim)
        self.stride = None if stride is None else tuple(int(s) for s in stride)
        self.coordinates = coordinates
        self.temperature = float(temperature)
        self.frequency_scale = float(frequency_scale)
        self.grid_offset = float(grid_offset)
        self.axis_order = axis_order
        self.reference_grid = (
            None if reference_grid is None else tuple(int(g) for g in reference_grid)
        )

    def _grid(self, x):
        if len(x.shape) != 4:
            raise ValueError(
                "RotaryEmbedding expects images or patches on their grid, 4-D, got "
                f"shape {tuple(x.shape)}."
            )
        rows, cols = (
            ops.shape(x)[i] if x.shape[i] is None else x.shape[i] for i in (1, 2)
        )
        if self.stride is not None:
            rows, cols = rows // self.stride[0], cols // self.stride[1]
        return rows, cols

    def call(self, x):
        rows, cols = self._grid(x)
        angles = rope_angles(rows, cols, self.head_dim // 4, self._options())
        angles = ops.concatenate([angles, angles], axis=-1)
        return ops.stack([ops.cos(angles), ops.sin(angles)])

    def _options(self) -> dict:
        return dict(
            coordinates=self.coordinates,
            temperature=self.temperature,
            frequency_scale=self.frequency_scale,
            grid_offset=self.grid_offset,
            axis_order=self.axis_order,
            reference_grid=self.reference_grid,
        )

    def compute_output_spec(self, x):
        rows, cols = self._grid(x)
        static = isinstance(rows, int) and isinstance(cols, int)
        tokens = rows * cols if static else None
        return keras.KerasTensor((2, tokens, self.head_dim), dtype="float32")

    def get_config(self):
        return {
            **super().get_config(),
            "head_dim": self.head_dim,
            "stride": self.stride,
            **self._options(),
        }
