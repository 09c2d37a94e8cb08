"""Weights across resolutions: position-embedding resampling and rebuilding a
trained model at a new image size."""

from __future__ import annotations

import math

import keras
import numpy as np

from keras_vit.models import position
from keras_vit.models.layers import PatchEncoder
from keras_vit.models.vit import image_hw


def resample_position_embedding(
    pos_embedding: np.ndarray,
    new_grid: tuple[int, int],
    old_grid: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    method: str = "bicubic",
) -> np.ndarray:
    """Resamples a learned position embedding to a new patch grid.

    Args:
        pos_embedding: `(1, num_prefix_tokens + rows * cols, hidden_dim)` or
            without the leading 1.
        new_grid: `(rows, cols)` of the target grid.
        old_grid: `(rows, cols)` of the source grid; None means square.
        num_prefix_tokens: class/distillation tokens at the front; their
            embeddings are kept as they are.
        method: the kernel, one of `position.RESAMPLE_KERNELS`:
            `"bicubic"` / `"bilinear"` (TensorFlow's resize), or the
            source library's `"timm"`, `"hf"`, `"big_vision"`.

    Returns:
        `(1, num_prefix_tokens + new_rows * new_cols, hidden_dim)`, float32.
        With an unchanged grid the input comes back unchanged.
    """
    position.check_kernel(method)
    table = np.asarray(pos_embedding, dtype="float32")
    if table.ndim == 2:
        table = table[None]
    if table.ndim != 3 or table.shape[0] != 1:
        raise ValueError(
            "pos_embedding must have shape (1, tokens, hidden_dim), got "
            f"{np.shape(pos_embedding)}."
        )
    num_patches = table.shape[1] - num_prefix_tokens
    if old_grid is None:
        side = math.isqrt(num_patches)
        if side * side != num_patches:
            raise ValueError(
                f"{num_patches} position embeddings after {num_prefix_tokens} "
                "prefix tokens do not form a square grid; pass old_grid."
            )
        old_grid = (side, side)
    old_grid = tuple(int(g) for g in old_grid)
    new_grid = tuple(int(g) for g in new_grid)
    if old_grid[0] * old_grid[1] != num_patches:
        raise ValueError(
            f"old_grid {old_grid} holds {old_grid[0] * old_grid[1]} positions, "
            f"the embedding has {num_patches}."
        )
    if new_grid == old_grid:
        return table
    # The function a dynamic-size model runs in its graph.
    resized = position.interpolate_position_embedding(
        table, old_grid, new_grid, num_prefix_tokens, method
    )
    return np.asarray(resized, dtype="float32")


def _patch_encoder(model: keras.Model) -> PatchEncoder:
    try:
        layer = model.get_layer("patch_encoder")
    except ValueError:
        raise ValueError(
            f"Model {model.name!r} has no 'patch_encoder' layer; it was not "
            "built by keras_vit."
        ) from None
    return layer


def is_dynamic_size(model: keras.Model) -> bool:
    """Whether `model` takes images of any size (`ViT(dynamic_size=True)`)."""
    return None in tuple(model.inputs[0].shape[1:3])


def input_stride(model: keras.Model) -> tuple[int, int]:
    """Pixels per patch-grid cell, `(rows, cols)`: the patch size of a ViT,
    the stem's output stride of a hybrid. Image sizes must be multiples."""
    encoder = _patch_encoder(model)
    if encoder.grid_size is None:
        raise ValueError("The model's patch_encoder has no grid_size.")
    height, width = nominal_image_size(model)
    return height // encoder.grid_size[0], width // encoder.grid_size[1]


def nominal_image_size(model: keras.Model) -> tuple[int, int]:
    """The input size of a fixed-size model; for a dynamic-size one, the size
    its position embedding is made for (`image_size` when it was built),
    which its preprocessing and bytes signature use."""
    shapes = [tuple(i.shape) for i in model.inputs]
    if len(shapes) != 1 or len(shapes[0]) != 4:
        raise ValueError(
            f"model {model.name!r} takes inputs of shape {', '.join(map(str, shapes))}"
            ", not one batch of images (batch, height, width, channels); this needs "
            "an image classifier."
        )
    height, width = model.inputs[0].shape[1:3]
    if height is not None and width is not None:
        return int(height), int(width)
    grid = _patch_encoder(model).grid_size
    patches = model.get_layer("patches")
    if patches.input is model.inputs[0]:
        stride = (patches.patch_size, patches.patch_size)
    else:
        # A hybrid's stem: its output size for a probe input gives the stride.
        stem = keras.Model(model.inputs[0], patches.input)
        probe = 64 * grid[0], 64 * grid[1]
        out = stem.compute_output_shape((1, *probe, model.inputs[0].shape[-1]))
        stride = (probe[0] // out[1], probe[1] // out[2])
    return grid[0] * stride[0], grid[1] * stride[1]


def with_image_size(
    model: keras.Model,
    image_size: int | tuple[int, int],
    method: str | None = None,
) -> keras.Model:
    """Rebuilds a ViT or HybridViT at a new input size with its weights.

    Every weight is copied; the learned position embedding is resampled to
    the new patch grid (prefix tokens kept) with `method`, by default the
    kernel the model records (`PatchEncoder.position_resample`: the source
    library's for a converted checkpoint, else bicubic). The new size must give a whole
    number of patches at the model's stride (patch size, or CNN stride times
    1 for a hybrid). A dynamic-size model comes back as a fixed-size one.
    """
    height, width = image_hw(image_size)
    encoder = _patch_encoder(model)
    method = position.check_kernel(method or encoder.position_resample)
    old_h, old_w = nominal_image_size(model)
    old_grid = encoder.grid_size
    if old_grid is None:
        raise ValueError("The model's patch_encoder has no grid_size to resample from.")
    stride_h, stride_w = old_h // old_grid[0], old_w // old_grid[1]
    if height % stride_h or width % stride_w:
        raise ValueError(
            f"image_size {height}x{width} is not divisible by the model's "
            f"stride {stride_h}x{stride_w} (patch size)."
        )
    new_grid = (height // stride_h, width // stride_w)

    config = model.get_config()
    for layer_config in config["layers"]:
        # Shapes recorded at the old size would rebuild the old grid.
        layer_config.pop("build_config", None)
        if layer_config["class_name"] == "InputLayer":
            shape = list(layer_config["config"]["batch_shape"])
            shape[1:3] = [height, width]
            layer_config["config"]["batch_shape"] = shape
        if layer_config["config"].get("name") == "patch_encoder":
            layer_config["config"]["grid_size"] = list(new_grid)
    resized = model.__class__.from_config(config)

    for old_layer, new_layer in zip(model.layers, resized.layers, strict=True):
        weights = old_layer.get_weights()
        if (
            old_layer.name == "patch_encoder"
            and encoder.position_embedding == "learned"
        ):
            # Weights come in creation order; the position embedding is the
            # one with a token axis.
            for i, variable in enumerate(old_layer.weights):
                if variable.path.endswith("pos_embedding"):
                    weights[i] = resample_position_embedding(
                        weights[i],
                        new_grid,
                        old_grid,
                        encoder.num_embedded_prefix_tokens,
                        method,
                    )
        elif old_layer.name == "patch_encoder":
            # Fixed sin-cos tables are recomputed for the new grid by build.
            weights = [
                w if not v.path.endswith("pos_embedding") else n
                for w, v, n in zip(
                    weights, old_layer.weights, new_layer.get_weights(), strict=True
                )
            ]
        new_layer.set_weights(weights)
    return resized


__all__ = [
    "input_stride",
    "is_dynamic_size",
    "nominal_image_size",
    "resample_position_embedding",
    "with_image_size",
]
