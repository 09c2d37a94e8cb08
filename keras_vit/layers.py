"""The Vision Transformer's building blocks, written with `keras.ops` only.

Data path: images `(batch, height, width, channels)` -> `Patches` ->
`(batch, num_patches, patch_dim)` -> `PatchEncoder` ->
`(batch, num_tokens, hidden_dim)` -> `TransformerBlock` x N -> `TokenPooling`.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

register = keras.saving.register_keras_serializable(package="keras_vit")


def _check_rate(name: str, value: float) -> float:
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"`{name}` must be in [0, 1), got {value!r}.")
    return float(value)


@register
class Patches(keras.layers.Layer):
    """Cuts images into non-overlapping square patches and flattens each one.

    Each patch is flattened in `(row, column, channel)` order, which is the
    order of a `(patch_size, patch_size, channels, hidden_dim)` convolution
    kernel reshaped to a matrix, so a strided-conv patch embedding converts
    to `Patches` + `Dense` exactly.

    Args:
        patch_size: int, side of a square patch in pixels.

    Call arguments:
        images: `(batch, height, width, channels)`; height and width must be
            static multiples of `patch_size`.

    Returns:
        `(batch, num_patches, patch_size * patch_size * channels)`, patches in
        row-major order over the `(height // patch_size, width // patch_size)`
        grid.
    """

    def __init__(self, patch_size: int, **kwargs):
        super().__init__(**kwargs)
        if isinstance(patch_size, bool) or not isinstance(patch_size, int):
            raise ValueError(f"`patch_size` must be an int, got {patch_size!r}.")
        if patch_size < 1:
            raise ValueError(f"`patch_size` must be >= 1, got {patch_size}.")
        self.patch_size = patch_size

    def _grid(self, input_shape) -> tuple[int, int]:
        if len(input_shape) != 4:
            raise ValueError(
                "Patches expects images of shape (batch, height, width, "
                f"channels), got shape {tuple(input_shape)}."
            )
        height, width = input_shape[1], input_shape[2]
        if height is None or width is None:
            raise ValueError(
                "Patches needs a static image height and width, got shape "
                f"{tuple(input_shape)}."
            )
        p = self.patch_size
        if height % p or width % p:
            raise ValueError(
                f"Image size {height}x{width} is not divisible by patch_size {p}."
            )
        return height // p, width // p

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
        channels = images.shape[-1]
        x = ops.reshape(images, (-1, rows, p, cols, p, channels))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
        return ops.reshape(x, (-1, rows * cols, p * p * channels))

    def compute_output_shape(self, input_shape):
        rows, cols = self._grid(input_shape)
        p = self.patch_size
        return (input_shape[0], rows * cols, p * p * input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size}


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


@register
class PatchEncoder(keras.layers.Layer):
    """Projects flattened patches, adds prefix tokens and position embedding.

    Args:
        hidden_dim: int, width of the token embeddings.
        class_token: bool, prepend a learned class token.
        distillation_token: bool, prepend a learned DeiT distillation token
            (after the class token).
        position_embedding: `"learned"` (1-D, truncated normal with stddev
            0.02, covering the prefix tokens too) or `"sincos"` (fixed 2-D
            sine-cosine on the patch tokens; prefix tokens get none).
        grid_size: `(rows, cols)` of the patch grid; `None` means a square
            grid, derived from the number of patches.
        patch_norm: bool, LayerNorm before and after the projection, as in
            vit-pytorch.
        dropout_rate: float, dropout on the embedded tokens.
        layer_norm_epsilon: float, epsilon of the patch LayerNorms.

    Call arguments:
        patches: `(batch, num_patches, patch_dim)`.
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
        dropout_rate: float = 0.0,
        layer_norm_epsilon: float = 1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if position_embedding not in ("learned", "sincos"):
            raise ValueError(
                "`position_embedding` must be 'learned' or 'sincos', got "
                f"{position_embedding!r}."
            )
        if distillation_token and not class_token:
            raise ValueError("`distillation_token=True` needs `class_token=True`.")
        self.hidden_dim = int(hidden_dim)
        self.class_token = bool(class_token)
        self.distillation_token = bool(distillation_token)
        self.position_embedding = position_embedding
        self.grid_size = None if grid_size is None else tuple(int(g) for g in grid_size)
        self.patch_norm = bool(patch_norm)
        self.dropout_rate = _check_rate("dropout_rate", dropout_rate)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.projection = keras.layers.Dense(self.hidden_dim, name="projection")
        self.embedding_dropout = keras.layers.Dropout(self.dropout_rate)
        if self.patch_norm:
            self.input_norm = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, name="input_norm"
            )
            self.output_norm = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, name="output_norm"
            )

    @property
    def num_prefix_tokens(self) -> int:
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

    def build(self, input_shape):
        num_patches = input_shape[1]
        grid = self._resolve_grid(num_patches)
        if self.patch_norm:
            self.input_norm.build(input_shape)
            self.output_norm.build((None, num_patches, self.hidden_dim))
        self.projection.build(input_shape)
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
        if self.position_embedding == "learned":
            self.pos_embedding = self.add_weight(
                shape=(1, self.num_prefix_tokens + num_patches, self.hidden_dim),
                initializer=keras.initializers.TruncatedNormal(stddev=0.02),
                name="pos_embedding",
            )
        else:
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
        pos = ops.cast(self.pos_embedding, x.dtype)
        if self.position_embedding == "sincos":
            x = x + pos
        batch = ops.shape(x)[0]
        prefix = []
        if self.class_token:
            prefix.append(self.cls_token)
        if self.distillation_token:
            prefix.append(self.dist_token)
        if prefix:
            tokens = ops.cast(ops.concatenate(prefix, axis=1), x.dtype)
            tokens = ops.broadcast_to(
                tokens, (batch, self.num_prefix_tokens, self.hidden_dim)
            )
            x = ops.concatenate([tokens, x], axis=1)
        if self.position_embedding == "learned":
            x = x + pos
        return self.embedding_dropout(x, training=training)

    def compute_output_shape(self, input_shape):
        return (
            input_shape[0],
            self.num_prefix_tokens + input_shape[1],
            self.hidden_dim,
        )

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_dim": self.hidden_dim,
            "class_token": self.class_token,
            "distillation_token": self.distillation_token,
            "position_embedding": self.position_embedding,
            "grid_size": self.grid_size,
            "patch_norm": self.patch_norm,
            "dropout_rate": self.dropout_rate,
            "layer_norm_epsilon": self.layer_norm_epsilon,
        }


def _attention_output_spec(layer, x, return_attention_scores: bool):
    """Symbolic outputs of a layer that may also return attention scores."""
    out = keras.KerasTensor(x.shape, dtype=layer.compute_dtype)
    if not return_attention_scores:
        return out
    tokens = x.shape[1]
    scores_shape = (x.shape[0], layer.num_heads, tokens, tokens)
    return out, keras.KerasTensor(scores_shape, dtype="float32")


@register
class MultiHeadSelfAttention(keras.layers.Layer):
    """Self-attention with one fused QKV projection.

    Logits and softmax are computed in float32 whatever the compute dtype, so
    `mixed_float16` neither overflows the logits nor flattens the softmax.

    Args:
        num_heads: int, number of attention heads; must divide the input width.
        qkv_bias: bool, whether the QKV projection has a bias.
        attention_dropout_rate: float, dropout on the attention probabilities.
        dropout_rate: float, dropout after the output projection.

    Call arguments:
        x: `(batch, num_tokens, hidden_dim)`.
        training: bool, whether dropout is active.
        return_attention_scores: bool, also return the attention
            probabilities `(batch, num_heads, num_tokens, num_tokens)`.
    """

    def __init__(
        self,
        num_heads: int,
        qkv_bias: bool = True,
        attention_dropout_rate: float = 0.0,
        dropout_rate: float = 0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if int(num_heads) < 1:
            raise ValueError(f"`num_heads` must be >= 1, got {num_heads!r}.")
        self.num_heads = int(num_heads)
        self.qkv_bias = bool(qkv_bias)
        self.attention_dropout_rate = _check_rate(
            "attention_dropout_rate", attention_dropout_rate
        )
        self.dropout_rate = _check_rate("dropout_rate", dropout_rate)
        # float32 so the dropout layer's policy does not cast the probabilities.
        self.probs_dropout = keras.layers.Dropout(
            self.attention_dropout_rate, dtype="float32"
        )
        self.output_dropout = keras.layers.Dropout(self.dropout_rate)

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        if hidden_dim % self.num_heads:
            raise ValueError(
                f"hidden_dim {hidden_dim} is not divisible by num_heads "
                f"{self.num_heads}."
            )
        self.head_dim = hidden_dim // self.num_heads
        self.qkv = keras.layers.Dense(
            3 * hidden_dim, use_bias=self.qkv_bias, name="qkv"
        )
        self.qkv.build(input_shape)
        self.proj = keras.layers.Dense(hidden_dim, name="proj")
        self.proj.build(input_shape)

    def call(self, x, training=None, return_attention_scores=False):
        num_tokens, hidden_dim = x.shape[1], x.shape[2]
        # The projections run on (batch * num_tokens, hidden_dim): a 2-D
        # MatMul + BiasAdd is what oneDNN fuses into one kernel (bench/).
        qkv = ops.reshape(
            self.qkv(ops.reshape(x, (-1, hidden_dim))),
            (-1, num_tokens, 3, self.num_heads, self.head_dim),
        )
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        # Scaling q before the product keeps float16 logits in range.
        q = q * ops.cast(self.head_dim**-0.5, q.dtype)
        use_dropout = training and self.attention_dropout_rate > 0
        if return_attention_scores or use_dropout:
            logits = ops.einsum("bqhd,bkhd->bhqk", q, k)
            probs = ops.softmax(ops.cast(logits, "float32"), axis=-1)
            probs = self.probs_dropout(probs, training=training)
            out = ops.einsum("bhqk,bkhd->bqhd", ops.cast(probs, v.dtype), v)
        else:
            # Keras' TF kernel casts the logits to float32 before the softmax.
            out = ops.dot_product_attention(q, k, v, scale=1.0)
        out = self.proj(ops.reshape(out, (-1, hidden_dim)))
        out = ops.reshape(out, (-1, num_tokens, hidden_dim))
        out = self.output_dropout(out, training=training)
        if return_attention_scores:
            return out, probs
        return out

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, x, training=None, return_attention_scores=False):
        return _attention_output_spec(self, x, return_attention_scores)

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "qkv_bias": self.qkv_bias,
            "attention_dropout_rate": self.attention_dropout_rate,
            "dropout_rate": self.dropout_rate,
        }


@register
class MLP(keras.layers.Layer):
    """Two-layer feed-forward block: Dense(mlp_dim) + GELU + Dense(hidden_dim).

    Args:
        mlp_dim: int, width of the hidden layer.
        dropout_rate: float, dropout after each Dense.
        approximate_gelu: bool, tanh approximation of GELU (exact erf when
            False, as in the paper and timm).

    Call arguments:
        x: `(batch, num_tokens, hidden_dim)`.
        training: bool, whether dropout is active.
    """

    def __init__(
        self,
        mlp_dim: int,
        dropout_rate: float = 0.0,
        approximate_gelu: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = _check_rate("dropout_rate", dropout_rate)
        self.approximate_gelu = bool(approximate_gelu)
        self.hidden_dropout = keras.layers.Dropout(self.dropout_rate)
        self.output_dropout = keras.layers.Dropout(self.dropout_rate)

    def build(self, input_shape):
        self.fc1 = keras.layers.Dense(self.mlp_dim, name="fc1")
        self.fc1.build(input_shape)
        self.fc2 = keras.layers.Dense(input_shape[-1], name="fc2")
        self.fc2.build((*input_shape[:-1], self.mlp_dim))

    def call(self, x, training=None):
        # On 2-D (tokens, features) TensorFlow's oneDNN rewrite fuses
        # MatMul + BiasAdd + exact GELU into one kernel; on the 3-D input it
        # is a BatchMatMul and GELU's erf runs as separate passes (bench/).
        leading = tuple(
            ops.shape(x)[i] if d is None else d for i, d in enumerate(x.shape[:-1])
        )
        h = ops.reshape(x, (-1, x.shape[-1]))
        h = ops.gelu(self.fc1(h), approximate=self.approximate_gelu)
        h = self.hidden_dropout(h, training=training)
        h = self.output_dropout(self.fc2(h), training=training)
        return ops.reshape(h, (*leading, h.shape[-1]))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "mlp_dim": self.mlp_dim,
            "dropout_rate": self.dropout_rate,
            "approximate_gelu": self.approximate_gelu,
        }


@register
class DropPath(keras.layers.Layer):
    """Stochastic depth: drops the whole residual branch per sample.

    Args:
        rate: float, probability of dropping the branch in training.
        seed: int or None, seed of the drop mask.

    Call arguments:
        x: `(batch, ...)`, the residual branch.
        training: bool, whether samples are dropped.
    """

    def __init__(self, rate: float = 0.0, seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.rate = _check_rate("rate", rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, x, training=None):
        if not training or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        shape = (ops.shape(x)[0],) + (1,) * (len(x.shape) - 1)
        noise = keras.random.uniform(shape, seed=self.seed_generator, dtype=x.dtype)
        mask = ops.cast(noise < keep, x.dtype)
        return x * mask / ops.cast(keep, x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}


@register
class LayerScale(keras.layers.Layer):
    """Per-channel learned scale of a residual branch (CaiT, DeiT III).

    Args:
        init_value: float, initial value of every scale.

    Call arguments:
        x: `(..., hidden_dim)`.
    """

    def __init__(self, init_value: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        self.init_value = float(init_value)

    def build(self, input_shape):
        self.gamma = self.add_weight(
            shape=(input_shape[-1],),
            initializer=keras.initializers.Constant(self.init_value),
            name="gamma",
        )

    def call(self, x):
        return x * ops.cast(self.gamma, x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "init_value": self.init_value}


@register
class TransformerBlock(keras.layers.Layer):
    """Pre-norm encoder block: `x + MHSA(LN(x))`, then `x + MLP(LN(x))`.

    Args:
        num_heads: int, attention heads.
        mlp_dim: int, hidden width of the MLP.
        dropout_rate: float, dropout in the MLP and after the attention
            projection.
        attention_dropout_rate: float, dropout on attention probabilities.
        drop_path_rate: float, stochastic-depth rate of both branches.
        qkv_bias: bool, bias in the QKV projection.
        layer_scale_init: float or None, LayerScale initial value; None
            disables LayerScale.
        layer_norm_epsilon: float, epsilon of both LayerNorms.

    Call arguments:
        x: `(batch, num_tokens, hidden_dim)`.
        training: bool, whether dropout and stochastic depth are active.
        return_attention_scores: bool, also return the attention
            probabilities `(batch, num_heads, num_tokens, num_tokens)`.
    """

    def __init__(
        self,
        num_heads: int,
        mlp_dim: int,
        dropout_rate: float = 0.0,
        attention_dropout_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        qkv_bias: bool = True,
        layer_scale_init: float | None = None,
        layer_norm_epsilon: float = 1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = _check_rate("dropout_rate", dropout_rate)
        self.attention_dropout_rate = _check_rate(
            "attention_dropout_rate", attention_dropout_rate
        )
        self.drop_path_rate = _check_rate("drop_path_rate", drop_path_rate)
        self.qkv_bias = bool(qkv_bias)
        self.layer_scale_init = layer_scale_init
        self.layer_norm_epsilon = layer_norm_epsilon

        self.norm1 = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, name="norm1"
        )
        self.attention = MultiHeadSelfAttention(
            num_heads,
            qkv_bias=qkv_bias,
            attention_dropout_rate=attention_dropout_rate,
            dropout_rate=dropout_rate,
            name="attention",
        )
        self.norm2 = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, name="norm2"
        )
        self.mlp = MLP(mlp_dim, dropout_rate=dropout_rate, name="mlp")
        self.drop_path1 = DropPath(drop_path_rate, name="drop_path1")
        self.drop_path2 = DropPath(drop_path_rate, name="drop_path2")
        self.layer_scale1 = self.layer_scale2 = None
        if layer_scale_init is not None:
            self.layer_scale1 = LayerScale(layer_scale_init, name="layer_scale1")
            self.layer_scale2 = LayerScale(layer_scale_init, name="layer_scale2")

    def build(self, input_shape):
        for layer in (self.norm1, self.attention, self.norm2, self.mlp):
            layer.build(input_shape)
        if self.layer_scale1 is not None:
            self.layer_scale1.build(input_shape)
            self.layer_scale2.build(input_shape)

    def call(self, x, training=None, return_attention_scores=False):
        attended = self.attention(
            self.norm1(x),
            training=training,
            return_attention_scores=return_attention_scores,
        )
        if return_attention_scores:
            attended, scores = attended
        if self.layer_scale1 is not None:
            attended = self.layer_scale1(attended)
        x = x + self.drop_path1(attended, training=training)
        mlp_out = self.mlp(self.norm2(x), training=training)
        if self.layer_scale2 is not None:
            mlp_out = self.layer_scale2(mlp_out)
        x = x + self.drop_path2(mlp_out, training=training)
        if return_attention_scores:
            return x, scores
        return x

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, x, training=None, return_attention_scores=False):
        return _attention_output_spec(self, x, return_attention_scores)

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "dropout_rate": self.dropout_rate,
            "attention_dropout_rate": self.attention_dropout_rate,
            "drop_path_rate": self.drop_path_rate,
            "qkv_bias": self.qkv_bias,
            "layer_scale_init": self.layer_scale_init,
            "layer_norm_epsilon": self.layer_norm_epsilon,
        }


@register
class TokenPooling(keras.layers.Layer):
    """Reduces the token sequence to one vector per image.

    Args:
        mode: `"token"` (the class token, position 0), `"distillation"` (the
            distillation token, position 1) or `"gap"` (mean of the patch
            tokens, prefix tokens excluded).
        num_prefix_tokens: int, number of class/distillation tokens in front.

    Call arguments:
        x: `(batch, num_tokens, hidden_dim)`.

    Returns:
        `(batch, hidden_dim)`.
    """

    def __init__(self, mode: str = "token", num_prefix_tokens: int = 1, **kwargs):
        super().__init__(**kwargs)
        if mode not in ("token", "distillation", "gap"):
            raise ValueError(
                f"`mode` must be 'token', 'distillation' or 'gap', got {mode!r}."
            )
        needed = {"token": 1, "distillation": 2, "gap": 0}[mode]
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
        return ops.mean(x[:, self.num_prefix_tokens :], axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        return {
            **super().get_config(),
            "mode": self.mode,
            "num_prefix_tokens": self.num_prefix_tokens,
        }
