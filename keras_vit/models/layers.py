"""The Vision Transformer's building blocks, written with `keras.ops` only.

Data path: images `(batch, height, width, channels)` -> `Patches` ->
`(batch, num_patches, patch_dim)` -> `PatchEncoder` ->
`(batch, num_tokens, hidden_dim)` -> `TransformerBlock` x N -> `TokenPooling`.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_vit.models import position
from keras_vit.models.norms import make_norm
from keras_vit.models.position import sincos_position_embedding
from keras_vit.models.sublayers import check_rate, register, with_sublayer_policies

# PatchEncoder's absolute position tables.
POSITION_EMBEDDINGS = ("learned", "sincos", "none")


@register
class Patches(keras.layers.Layer):
    """Cuts images into non-overlapping square patches and flattens each one.

    Each patch is flattened in `(row, column, channel)` order, which is the
    order of a `(patch_size, patch_size, channels, hidden_dim)` convolution
    kernel reshaped to a matrix, so a strided-conv patch embedding converts
    to `Patches` + `Dense` exactly.

    Args:
        patch_size: int, side of a square patch in pixels.
        flatten: bool, return the patches as one sequence (the default) or
            on their grid, `(batch, rows, cols, patch_dim)`, which is what a
            dynamic-size model feeds `PatchEncoder` so that it knows the grid
            of every image size.
        shifted: bool, shifted patch tokenisation (SPT, Lee et al. 2021,
            "Vision Transformer for Small-Size Datasets"): each patch also
            holds the pixels of the image moved by half a patch in the four
            diagonal directions (zero-filled at the border), so a token sees
            its neighbours' edges: `5 * patch_size**2 * channels` values.

    Call arguments:
        images: `(batch, height, width, channels)`; height and width must be
            multiples of `patch_size`, and may be unknown until run time.

    Returns:
        `(batch, num_patches, patch_size * patch_size * channels)` (five times
        that with `shifted`), patches in row-major order over the
        `(height // patch_size, width // patch_size)` grid; with
        `flatten=False`, `(batch, rows, cols, patch_dim)`.
    """

    # SPT's four diagonal moves, as multiples of half a patch (rows, columns).
    SHIFTS = ((-1, -1), (-1, 1), (1, -1), (1, 1))

    def __init__(
        self, patch_size: int, flatten: bool = True, shifted: bool = False, **kwargs
    ):
        super().__init__(**kwargs)
        if isinstance(patch_size, bool) or not isinstance(patch_size, int):
            raise ValueError(f"`patch_size` must be an int, got {patch_size!r}.")
        if patch_size < 1:
            raise ValueError(f"`patch_size` must be >= 1, got {patch_size}.")
        if not isinstance(flatten, bool):
            raise ValueError(f"`flatten` must be True or False, got {flatten!r}.")
        if not isinstance(shifted, bool):
            raise ValueError(f"`shifted` must be True or False, got {shifted!r}.")
        if shifted and patch_size < 2:
            raise ValueError("`shifted=True` needs patch_size >= 2 (half a patch).")
        self.patch_size = patch_size
        self.flatten = flatten
        self.shifted = shifted
        self.copies = 1 + len(self.SHIFTS) if shifted else 1

    def _grid(self, input_shape) -> tuple[int, int]:
        if len(input_shape) != 4:
            raise ValueError(
                "Patches expects images of shape (batch, height, width, "
                f"channels), got shape {tuple(input_shape)}."
            )
        height, width = input_shape[1], input_shape[2]
        p = self.patch_size
        if (height is not None and height % p) or (width is not None and width % p):
            raise ValueError(
                f"Image size {height}x{width} is not divisible by patch_size {p}."
            )
        return (
            None if height is None else height // p,
            None if width is None else width // p,
        )

    def build(self, input_shape):
        self._grid(input_shape)
        self._channels = input_shape[-1]

    def call(self, images):
        rows, cols = self._grid(images.shape)
        if images.shape[-1] != self._channels:
            # Without this the mismatch surfaces later as a Dense shape error.
            raise ValueError(
                f"Expected images with {self._channels} channels, got shape "
                f"{tuple(images.shape)}."
            )
        p = self.patch_size
        if self.shifted:
            images = self._with_shifted_copies(images)
        channels = images.shape[-1]
        if rows is None or cols is None:
            # Known only at run time, where keras.ops cannot raise a message
            # naming a size that is not a multiple (eager calls and traces at
            # one size raise above; the serving graph checks it). With the
            # batch spelled out, such a size fails this reshape instead of
            # passing as another batch size.
            batch, height, width = ops.shape(images)[:3]
            rows, cols = height // p, width // p
            x = ops.reshape(images, (batch, rows, p, cols, p, channels))
        else:
            x = ops.reshape(images, (-1, rows, p, cols, p, channels))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
        if not self.flatten:
            return ops.reshape(x, (-1, rows, cols, p * p * channels))
        return ops.reshape(x, (-1, rows * cols, p * p * channels))

    def _with_shifted_copies(self, images):
        """`images` and its four half-patch diagonal moves on the channels:
        with `s = patch_size // 2`, the copy moved by `(dy, dx)` holds pixel
        `(i - dy * s, j - dx * s)` at `(i, j)`, zero where that falls
        outside."""
        s = self.patch_size // 2
        height, width = ops.shape(images)[1], ops.shape(images)[2]
        padded = ops.pad(images, ((0, 0), (s, s), (s, s), (0, 0)))
        copies = [images]
        for dy, dx in self.SHIFTS:
            top, left = s - dy * s, s - dx * s
            copies.append(padded[:, top : top + height, left : left + width, :])
        return ops.concatenate(copies, axis=-1)

    def compute_output_shape(self, input_shape):
        rows, cols = self._grid(input_shape)
        p = self.patch_size
        patch_dim = p * p * input_shape[-1] * self.copies
        if not self.flatten:
            return (input_shape[0], rows, cols, patch_dim)
        tokens = None if rows is None or cols is None else rows * cols
        return (input_shape[0], tokens, patch_dim)

    def get_config(self):
        return {
            **super().get_config(),
            "patch_size": self.patch_size,
            "flatten": self.flatten,
            "shifted": self.shifted,
        }


@register
class PatchEncoder(keras.layers.Layer):
    """Projects flattened patches, adds prefix tokens and position embedding.

    Args:
        hidden_dim: int, width of the token embeddings.
        class_token: bool, prepend a learned class token.
        distillation_token: bool, prepend a learned DeiT distillation token
            (after the class token).
        num_register_tokens: int, learned register tokens after the class
            and distillation tokens ("Vision Transformers Need Registers",
            Darcet et al. 2024). As in that paper and DINOv2 they get no
            position embedding; they are prefix tokens, so pooling skips
            them and nothing reads them out.
        position_embedding: `"learned"` (1-D, truncated normal with stddev
            0.02, covering the prefix tokens too) or `"sincos"` (fixed 2-D
            sine-cosine on the patch tokens; prefix tokens get none).
        grid_size: `(rows, cols)` of the patch grid the position embedding
            is made for; `None` means a square grid, derived from the number
            of patches. Needed for grid-shaped input of unknown size.
        patch_norm: bool, LayerNorm before and after the projection, as in
            vit-pytorch.
        position_resample: str, the kernel that resamples the learned table
            at another grid: `"bicubic"` or `"bilinear"` (TensorFlow's
            resize), or the one of the library a converted checkpoint came
            from, `"timm"`, `"hf"` or `"big_vision"` (see `position`).
        dropout_rate: float, dropout on the embedded tokens.
        layer_norm_epsilon: float, epsilon of the patch LayerNorms.
        projection_norm: None, or `"layernorm"` / `"rmsnorm"` on the
            projected patches, before the position embedding (AIMv2).

    Call arguments:
        patches: `(batch, num_patches, patch_dim)`, or on their grid
            `(batch, rows, cols, patch_dim)` (`Patches(flatten=False)`), where
            rows and cols may differ from `grid_size` and be unknown until
            run time: the position embedding then follows the actual grid,
            the learned one resampled as `with_image_size` does
            (the same function), the sin-cos one computed for that grid.
            At `grid_size` the stored table is used as it is.
        training: bool, whether dropout is active.

    Returns:
        `(batch, num_prefix_tokens + num_patches, hidden_dim)`.
    """

    def __init__(
        self,
        hidden_dim: int,
        class_token: bool = True,
        distillation_token: bool = False,
        position_embedding: str = "learned",
        grid_size: tuple[int, int] | None = None,
        patch_norm: bool = False,
        position_resample: str = "bicubic",
        dropout_rate: float = 0.0,
        layer_norm_epsilon: float = 1e-6,
        num_register_tokens: int = 0,
        projection_norm: str | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if (
            isinstance(num_register_tokens, bool)
            or not isinstance(num_register_tokens, int)
            or num_register_tokens < 0
        ):
            raise ValueError(
                "`num_register_tokens` must be an int >= 0, got "
                f"{num_register_tokens!r}."
            )
        self.num_register_tokens = num_register_tokens
        if position_embedding not in POSITION_EMBEDDINGS:
            raise ValueError(
                "`position_embedding` must be 'learned', 'sincos' or 'none', got "
                f"{position_embedding!r}."
            )
        if distillation_token and not class_token:
            raise ValueError("`distillation_token=True` needs `class_token=True`.")
        self.hidden_dim = int(hidden_dim)
        self.class_token = bool(class_token)
        self.distillation_token = bool(distillation_token)
        self.position_embedding = position_embedding
        self.position_resample = position.check_kernel(position_resample)
        self.grid_size = None if grid_size is None else tuple(int(g) for g in grid_size)
        self.patch_norm = bool(patch_norm)
        self.dropout_rate = check_rate("dropout_rate", dropout_rate)
        self.layer_norm_epsilon = layer_norm_epsilon
        policy = self.dtype_policy
        self.projection = keras.layers.Dense(
            self.hidden_dim, dtype=policy, name="projection"
        )
        self.projection_norm = projection_norm
        self.embed_norm = None
        if projection_norm is not None:
            self.embed_norm = make_norm(
                projection_norm, layer_norm_epsilon, "embed_norm", dtype=policy
            )
        self.embedding_dropout = keras.layers.Dropout(
            self.dropout_rate, dtype=policy, name="embedding_dropout"
        )
        if self.patch_norm:
            self.input_norm = make_norm(
                "layernorm", layer_norm_epsilon, "input_norm", policy
            )
            self.output_norm = make_norm(
                "layernorm", layer_norm_epsilon, "output_norm", policy
            )

    @property
    def num_prefix_tokens(self) -> int:
        """Every token in front of the patches, registers included."""
        return self.num_embedded_prefix_tokens + self.num_register_tokens

    @property
    def num_embedded_prefix_tokens(self) -> int:
        """Class and distillation tokens: the prefix rows of a learned
        position table."""
        return int(self.class_token) + int(self.distillation_token)

    def _resolve_grid(self, num_patches: int) -> tuple[int, int]:
        if self.grid_size is not None:
            rows, cols = self.grid_size
            if rows * cols != num_patches:
                raise ValueError(
                    f"grid_size {self.grid_size} holds {rows * cols} patches, "
                    f"but the input has {num_patches}."
                )
            return self.grid_size
        side = math.isqrt(num_patches)
        if side * side != num_patches:
            raise ValueError(
                f"{num_patches} patches do not form a square grid; pass "
                "`grid_size=(rows, cols)`."
            )
        return side, side

    def _input_grid(self, input_shape) -> tuple[int, int]:
        """The grid the position table is built for."""
        if len(input_shape) == 3:
            return self._resolve_grid(input_shape[1])
        if self.grid_size is not None:
            return self.grid_size
        rows, cols = input_shape[1], input_shape[2]
        if rows is None or cols is None:
            raise ValueError(
                f"Patches on a grid of unknown size {tuple(input_shape)} need "
                "`grid_size=(rows, cols)`: the grid the position embedding is "
                "made for."
            )
        return rows, cols

    def build(self, input_shape):
        if len(input_shape) not in (3, 4):
            raise ValueError(
                "PatchEncoder expects patches (batch, num_patches, patch_dim) or "
                f"(batch, rows, cols, patch_dim), got shape {tuple(input_shape)}."
            )
        grid = self._input_grid(input_shape)
        self._built_grid = grid
        num_patches = grid[0] * grid[1]
        if self.patch_norm:
            self.input_norm.build(input_shape)
            self.output_norm.build((None, num_patches, self.hidden_dim))
        self.projection.build(input_shape)
        if self.embed_norm is not None:
            self.embed_norm.build((None, None, self.hidden_dim))
        self.embedding_dropout.build((None, None, self.hidden_dim))
        if self.class_token:
            self.cls_token = self.add_weight(
                shape=(1, 1, self.hidden_dim), initializer="zeros", name="cls_token"
            )
        if self.distillation_token:
            self.dist_token = self.add_weight(
                shape=(1, 1, self.hidden_dim),
                initializer=keras.initializers.TruncatedNormal(stddev=0.02),
                name="dist_token",
            )
        if self.num_register_tokens:
            self.register_tokens = self.add_weight(
                shape=(1, self.num_register_tokens, self.hidden_dim),
                initializer=keras.initializers.TruncatedNormal(stddev=0.02),
                name="register_tokens",
            )
        if self.position_embedding == "learned":
            self.pos_embedding = self.add_weight(
                shape=(
                    1,
                    self.num_embedded_prefix_tokens + num_patches,
                    self.hidden_dim,
                ),
                initializer=keras.initializers.TruncatedNormal(stddev=0.02),
                name="pos_embedding",
            )
        elif self.position_embedding == "sincos":
            table = sincos_position_embedding(grid, self.hidden_dim)
            self.pos_embedding = self.add_weight(
                shape=(1, num_patches, self.hidden_dim),
                initializer=keras.initializers.Constant(table[None]),
                trainable=False,
                name="pos_embedding",
            )

    def call(self, patches, training=None):
        x = patches
        if self.patch_norm:
            x = self.input_norm(x)
        x = self.projection(x)
        if self.patch_norm:
            x = self.output_norm(x)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        if len(x.shape) == 4:
            rows, cols = (
                ops.shape(x)[i] if x.shape[i] is None else x.shape[i] for i in (1, 2)
            )
            x = ops.reshape(x, (-1, rows * cols, self.hidden_dim))
        else:
            rows, cols = self._built_grid
        pos = None
        if self.position_embedding != "none":
            pos = self._position_table(x, rows, cols)
        if self.position_embedding == "sincos":
            x = x + pos
        return self._add_prefix(x, pos, training)

    def _position_table(self, x, rows, cols):
        pos = position.table_for_grid(
            self.pos_embedding,
            self._built_grid,
            (rows, cols),
            sincos=self.position_embedding == "sincos",
            num_prefix_tokens=self.num_embedded_prefix_tokens,
            method=self.position_resample,
        )
        return ops.cast(pos, x.dtype)

    def _add_prefix(self, x, pos, training):
        batch = ops.shape(x)[0]
        prefix = []
        if self.class_token:
            prefix.append(self.cls_token)
        if self.distillation_token:
            prefix.append(self.dist_token)
        if prefix:
            tokens = ops.cast(ops.concatenate(prefix, axis=1), x.dtype)
            tokens = ops.broadcast_to(
                tokens, (batch, self.num_embedded_prefix_tokens, self.hidden_dim)
            )
            x = ops.concatenate([tokens, x], axis=1)
        if self.position_embedding == "learned":
            x = x + pos
        if self.num_register_tokens:
            # After the position embedding: registers carry none.
            registers = ops.broadcast_to(
                ops.cast(self.register_tokens, x.dtype),
                (batch, self.num_register_tokens, self.hidden_dim),
            )
            embedded = self.num_embedded_prefix_tokens
            x = ops.concatenate([x[:, :embedded], registers, x[:, embedded:]], axis=1)
        return self.embedding_dropout(x, training=training)

    def compute_output_shape(self, input_shape):
        if len(input_shape) == 4:
            rows, cols = input_shape[1], input_shape[2]
            num_patches = None if rows is None or cols is None else rows * cols
        else:
            num_patches = input_shape[1]
        tokens = None if num_patches is None else self.num_prefix_tokens + num_patches
        return (input_shape[0], tokens, self.hidden_dim)

    def get_config(self):
        config = {
            **super().get_config(),
            "hidden_dim": self.hidden_dim,
            "class_token": self.class_token,
            "distillation_token": self.distillation_token,
            "position_embedding": self.position_embedding,
            "grid_size": self.grid_size,
            "patch_norm": self.patch_norm,
            "position_resample": self.position_resample,
            "dropout_rate": self.dropout_rate,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "num_register_tokens": self.num_register_tokens,
            "projection_norm": self.projection_norm,
        }
        return with_sublayer_policies(self, config)


@register
class TokenPooling(keras.layers.Layer):
    """Reduces the token sequence to one vector per image.

    Args:
        mode: `"token"` (the class token, position 0), `"distillation"` (the
            distillation token, position 1), `"gap"` (mean of the patch
            tokens, prefix tokens excluded) or `"token_gap"` (the class token
            and the mean of the patch tokens side by side, twice as wide:
            transformers' DINOv2 classifier input).
        num_prefix_tokens: int, number of class/distillation tokens in front.

    Call arguments:
        x: `(batch, num_tokens, hidden_dim)`.

    Returns:
        `(batch, hidden_dim)`, `(batch, 2 * hidden_dim)` for `"token_gap"`.
    """

    def __init__(self, mode: str = "token", num_prefix_tokens: int = 1, **kwargs):
        super().__init__(**kwargs)
        if mode not in ("token", "distillation", "gap", "token_gap"):
            raise ValueError(
                "`mode` must be 'token', 'distillation', 'gap' or 'token_gap', "
                f"got {mode!r}."
            )
        needed = {"token": 1, "distillation": 2, "gap": 0, "token_gap": 1}[mode]
        if num_prefix_tokens < needed:
            raise ValueError(
                f"mode={mode!r} needs at least {needed} prefix tokens, got "
                f"num_prefix_tokens={num_prefix_tokens}."
            )
        self.mode = mode
        self.num_prefix_tokens = int(num_prefix_tokens)

    def call(self, x):
        if self.mode == "token":
            return x[:, 0]
        if self.mode == "distillation":
            return x[:, 1]
        mean = ops.mean(x[:, self.num_prefix_tokens :], axis=1)
        if self.mode == "token_gap":
            return ops.concatenate([x[:, 0], mean], axis=-1)
        return mean

    def compute_output_shape(self, input_shape):
        width = input_shape[-1]
        if self.mode == "token_gap" and width is not None:
            width = 2 * width
        return (input_shape[0], width)

    def get_config(self):
        return {
            **super().get_config(),
            "mode": self.mode,
            "num_prefix_tokens": self.num_prefix_tokens,
        }
