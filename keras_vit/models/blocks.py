"""The encoder block: self-attention and the block around it (its MLP,
stochastic depth and LayerScale live in `sublayers`), written with
`keras.ops` only.

`TransformerBlock` maps `(batch, num_tokens, hidden_dim)` to the same shape:
`x + DropPath(MHSA(LN(x)))`, then `x + DropPath(MLP(LN(x)))`.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_vit.models import fused
from keras_vit.models.norms import check_norm_type, make_norm
from keras_vit.models.rope import apply_rope
from keras_vit.models.sublayers import (
    MLP,
    DropPath,
    LayerScale,
    check_rate,
    project,
    project_scaled,
    register,
    with_sublayer_policies,
)


def _check_query_tokens(num_query_tokens, num_tokens):
    if num_query_tokens is None:
        return num_tokens
    # A dynamic-size model knows its token count only at run time.
    limit = int(num_query_tokens) if num_tokens is None else num_tokens
    if not 1 <= int(num_query_tokens) <= limit:
        raise ValueError(
            f"`num_query_tokens` must be in [1, {num_tokens}] for {num_tokens} "
            f"tokens, got {num_query_tokens!r}."
        )
    return int(num_query_tokens)


class _TokenAttentionLayer(keras.layers.Layer):
    """Output shapes of a layer on `(batch, num_tokens, hidden_dim)` that may
    keep only the first `num_query_tokens` tokens and may also return its
    attention scores `(batch, num_heads, queries, num_tokens)`."""

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(
        self,
        x,
        training=None,
        return_attention_scores=False,
        num_query_tokens=None,
        rope=None,
    ):
        tokens = x.shape[1]
        queries = _check_query_tokens(num_query_tokens, tokens)
        out = keras.KerasTensor(
            (x.shape[0], queries, x.shape[2]), dtype=self.compute_dtype
        )
        if not return_attention_scores:
            return out
        scores_shape = (x.shape[0], self.num_heads, queries, tokens)
        return out, keras.KerasTensor(scores_shape, dtype="float32")


@register
class MultiHeadSelfAttention(_TokenAttentionLayer):
    """Self-attention with one fused QKV projection.

    Logits and softmax are computed in float32 whatever the compute dtype, so
    `mixed_float16` neither overflows the logits nor flattens the softmax.

    Args:
        num_heads: int, number of attention heads; must divide the input width
            unless `head_dim` is given.
        qkv_bias: bool, whether the QKV projection has a bias.
        attention_dropout_rate: float, dropout on the attention probabilities.
        dropout_rate: float, dropout after the output projection.
        head_dim: int or None, width of each head; None means
            `hidden_dim // num_heads`. A head-pruned block keeps its heads'
            width with fewer heads, so QKV is `num_heads * head_dim` wide.
        qk_norm: None, or `"layernorm"` / `"rmsnorm"` over each head's
            queries and keys before the product (QK-norm).
        norm_epsilon: float, epsilon of the QK-norm.
        proj_bias: bool, bias in the output projection.

    Call arguments:
        x: `(batch, num_tokens, hidden_dim)`.
        training: bool, whether dropout is active.
        rope: None, or the `(cos, sin)` rotary tables `(num_patches, head_dim)`
            stacked on a leading axis of 2 (`keras_vit.models.rope`), applied
            to the queries and keys of the last `num_patches` tokens; prefix
            tokens are not rotated.
        return_attention_scores: bool, also return the attention
            probabilities `(batch, num_heads, num_queries, num_tokens)`.
        num_query_tokens: int or None, only the first `num_query_tokens`
            tokens attend (all tokens are still keys and values) and only
            they are returned, `(batch, num_query_tokens, hidden_dim)`. A
            class-token model needs nothing else of its last block.
    """

    def __init__(
        self,
        num_heads: int,
        qkv_bias: bool = True,
        attention_dropout_rate: float = 0.0,
        dropout_rate: float = 0.0,
        head_dim: int | None = None,
        qk_norm: str | None = None,
        norm_epsilon: float = 1e-6,
        proj_bias: bool = True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if int(num_heads) < 1:
            raise ValueError(f"`num_heads` must be >= 1, got {num_heads!r}.")
        if head_dim is not None and int(head_dim) < 1:
            raise ValueError(f"`head_dim` must be >= 1 or None, got {head_dim!r}.")
        self.num_heads = int(num_heads)
        # The argument as given (None: derived in `build`), kept apart from
        # the derived `head_dim` so `get_config` returns exactly the input.
        self.head_dim_arg = None if head_dim is None else int(head_dim)
        self.qkv_bias = bool(qkv_bias)
        self.attention_dropout_rate = check_rate(
            "attention_dropout_rate", attention_dropout_rate
        )
        self.dropout_rate = check_rate("dropout_rate", dropout_rate)
        self.qk_norm = None if qk_norm is None else check_norm_type(qk_norm)
        self.norm_epsilon = float(norm_epsilon)
        self.proj_bias = bool(proj_bias)
        if self.qk_norm is not None:
            policy = self.dtype_policy
            self.q_norm = make_norm(self.qk_norm, norm_epsilon, "q_norm", policy)
            self.k_norm = make_norm(self.qk_norm, norm_epsilon, "k_norm", policy)
        # float32 so the dropout layer's policy does not cast the probabilities.
        self.probs_dropout = keras.layers.Dropout(
            self.attention_dropout_rate, dtype="float32", name="probs_dropout"
        )
        self.output_dropout = keras.layers.Dropout(
            self.dropout_rate, dtype=self.dtype_policy, name="output_dropout"
        )

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        if self.head_dim_arg is None and hidden_dim % self.num_heads:
            raise ValueError(
                f"hidden_dim {hidden_dim} is not divisible by num_heads "
                f"{self.num_heads}."
            )
        self.head_dim = self.head_dim_arg or hidden_dim // self.num_heads
        inner = self.num_heads * self.head_dim
        # Created here because their width is the input's; the parent's
        # policy (a DTypePolicyMap after a quantized reload) reaches them.
        self.qkv = keras.layers.Dense(
            3 * inner,
            use_bias=self.qkv_bias,
            dtype=self.dtype_policy,
            name="qkv",
        )
        self.qkv.build((None, hidden_dim))
        self.proj = keras.layers.Dense(
            hidden_dim, use_bias=self.proj_bias, dtype=self.dtype_policy, name="proj"
        )
        self.proj.build((None, inner))
        if self.qk_norm is not None:
            self.q_norm.build((None, None, self.head_dim))
            self.k_norm.build((None, None, self.head_dim))
        self.probs_dropout.build(input_shape)
        self.output_dropout.build(input_shape)

    def call(
        self,
        x,
        training=None,
        return_attention_scores=False,
        num_query_tokens=None,
        rope=None,
    ):
        hidden_dim = x.shape[2]
        queries = _check_query_tokens(num_query_tokens, x.shape[1])
        # Known only at run time in a dynamic-size model.
        num_tokens = ops.shape(x)[1] if x.shape[1] is None else x.shape[1]
        queries = num_tokens if queries is None else queries
        heads, head_dim = self.num_heads, self.head_dim
        # The projections run on (batch * num_tokens, hidden_dim): a 2-D
        # MatMul + BiasAdd is what oneDNN fuses into one kernel (README, Performance).
        x2d = ops.reshape(x, (-1, hidden_dim))
        # Scaling q before the product keeps float16 logits in range; in a
        # fused training call the scale goes into the QKV weights instead
        # (not with QK-norm, which would undo it).
        scale = head_dim**-0.5
        if self.qk_norm is None:
            qkv, scaled = project_scaled(
                self.qkv, x2d, heads * head_dim, scale, training
            )
        else:
            qkv, scaled = project(self.qkv, x2d, training), False
        # One transpose to (3, batch * heads, num_tokens, head_dim) makes both
        # attention products plain 3-D batched matmuls with contiguous
        # operands: 15% (XLA) to 30% (no XLA) less time than einsums over
        # (batch, num_tokens, heads, head_dim), forward + backward (README,
        # Performance).
        qkv = ops.reshape(qkv, (-1, num_tokens, 3, heads, head_dim))
        qkv = ops.reshape(
            ops.transpose(qkv, (2, 0, 3, 1, 4)), (3, -1, num_tokens, head_dim)
        )
        # unstack, not indexing: without XLA the gradient of each index is a
        # StridedSliceGrad that writes a zero tensor of the full QKV size (a
        # fifth of a bfloat16 training step); unstack's gradient is one stack.
        q, k, v = ops.unstack(qkv, 3, axis=0)
        if self.qk_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        if num_query_tokens is not None and queries != x.shape[1]:
            q = q[:, :queries]
        if not scaled:
            q = q * ops.cast(scale, q.dtype)
        logits = self._attention_matmul(
            q, ops.transpose(k, (0, 2, 1)), "logits", training=training
        )
        if fused.active(training, hidden_dim) and not return_attention_scores:
            probs = fused.softmax(logits, v.dtype)
        else:
            probs = ops.softmax(ops.cast(logits, "float32"), axis=-1)
        if self.attention_dropout_rate:
            # A float32 layer: called at rate 0 it would still cast the
            # probabilities to float32 and back.
            probs = self.probs_dropout(probs, training=training)
        out = self._attention_matmul(
            ops.cast(probs, v.dtype), v, "context", training=training
        )
        out = ops.transpose(
            ops.reshape(out, (-1, heads, queries, head_dim)), (0, 2, 1, 3)
        )
        out = project(self.proj, ops.reshape(out, (-1, heads * head_dim)), training)
        out = ops.reshape(out, (-1, queries, hidden_dim))
        out = self.output_dropout(out, training=training)
        if return_attention_scores:
            return out, ops.reshape(probs, (-1, heads, queries, num_tokens))
        return out

    def _attention_matmul(self, a, b, product: str, training=None):
        """`a @ b` for the `"logits"` and `"context"` products; the hook where
        `keras_vit.models.qat` rounds their operands to int8."""
        return ops.matmul(a, b)

    def get_config(self):
        config = {
            **super().get_config(),
            "num_heads": self.num_heads,
            "qkv_bias": self.qkv_bias,
            "attention_dropout_rate": self.attention_dropout_rate,
            "dropout_rate": self.dropout_rate,
            "head_dim": self.head_dim_arg,
            "qk_norm": self.qk_norm,
            "norm_epsilon": self.norm_epsilon,
            "proj_bias": self.proj_bias,
        }
        return with_sublayer_policies(self, config)


def check_remat(remat, dropout_rate, attention_dropout_rate) -> None:
    """Refuses a `remat` that is not a bool, or True with dropout."""
    if not isinstance(remat, bool):
        raise ValueError(f"`remat` must be True or False, got {remat!r}.")
    if remat and (dropout_rate or attention_dropout_rate):
        raise ValueError(
            "`remat=True` needs dropout_rate=0 and attention_dropout_rate=0 "
            "(a recomputed dropout would draw another mask), got "
            f"dropout_rate={dropout_rate!r}, "
            f"attention_dropout_rate={attention_dropout_rate!r}; "
            "drop_path_rate works with remat."
        )


@register
class TransformerBlock(_TokenAttentionLayer):
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
        head_dim: int or None, width of each attention head; None means
            `hidden_dim // num_heads` (see `MultiHeadSelfAttention`).
        remat: bool, gradient checkpointing: in training, keep only the
            inputs of the attention and MLP branches for the backward pass
            and recompute the rest (`keras.remat`, TensorFlow's gradient
            recompute underneath). Same outputs and gradients, less memory, one more
            forward pass of the block. Needs `dropout_rate` and
            `attention_dropout_rate` of 0: a recomputed dropout draws a new
            mask. Stochastic depth stays outside the recomputed part.
        norm_type: `"layernorm"` or `"rmsnorm"` (AIMv2), for both block
            norms and the QK-norm.
        qk_norm: bool, normalise each head's queries and keys.
        proj_bias: bool, biases in the attention output projection and the
            MLP (timm's `proj_bias`).
        mlp_activation: `"gelu"`, `"gelu_tanh"`, `"quick_gelu"` or `"silu"`.
        gated_mlp: bool, a gated MLP (SwiGLU with `"silu"`, see `MLP`).
        mlp_norm: bool, a norm on the MLP's hidden layer (EVA-02).

    Call arguments:
        x: `(batch, num_tokens, hidden_dim)`.
        training: bool, whether dropout and stochastic depth are active.
        rope: None or the rotary tables (see `MultiHeadSelfAttention`).
        return_attention_scores: bool, also return the attention
            probabilities `(batch, num_heads, num_queries, num_tokens)`.
        num_query_tokens: int or None, only the first `num_query_tokens`
            tokens attend (all tokens are still keys and values) and only
            they are returned, `(batch, num_query_tokens, hidden_dim)`. A
            class-token model needs nothing else of its last block.
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
        head_dim: int | None = None,
        remat: bool = False,
        norm_type: str = "layernorm",
        qk_norm: bool = False,
        proj_bias: bool = True,
        mlp_activation: str = "gelu",
        gated_mlp: bool = False,
        mlp_norm: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_remat(remat, dropout_rate, attention_dropout_rate)
        self.remat = remat
        self.num_heads = int(num_heads)
        self.norm_type = check_norm_type(norm_type)
        self.qk_norm = bool(qk_norm)
        self.proj_bias = bool(proj_bias)
        self.mlp_activation = mlp_activation
        self.gated_mlp = bool(gated_mlp)
        self.mlp_norm = bool(mlp_norm)
        self.head_dim = None if head_dim is None else int(head_dim)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = check_rate("dropout_rate", dropout_rate)
        self.attention_dropout_rate = check_rate(
            "attention_dropout_rate", attention_dropout_rate
        )
        self.drop_path_rate = check_rate("drop_path_rate", drop_path_rate)
        self.qkv_bias = bool(qkv_bias)
        self.layer_scale_init = layer_scale_init
        self.layer_norm_epsilon = layer_norm_epsilon

        policy = self.dtype_policy
        # LayerNormalization computes its statistics in float32 itself.
        self.norm1 = make_norm(norm_type, layer_norm_epsilon, "norm1", policy)
        self.attention = MultiHeadSelfAttention(
            num_heads,
            qkv_bias=qkv_bias,
            attention_dropout_rate=attention_dropout_rate,
            dropout_rate=dropout_rate,
            dtype=policy,
            head_dim=head_dim,
            qk_norm=norm_type if qk_norm else None,
            norm_epsilon=layer_norm_epsilon,
            proj_bias=proj_bias,
            name="attention",
        )
        self.norm2 = make_norm(norm_type, layer_norm_epsilon, "norm2", policy)
        self.mlp = MLP(
            mlp_dim,
            dropout_rate=dropout_rate,
            activation=mlp_activation,
            gated=gated_mlp,
            use_bias=proj_bias,
            norm_type=norm_type if mlp_norm else None,
            norm_epsilon=layer_norm_epsilon,
            dtype=policy,
            name="mlp",
        )
        self.drop_path1 = DropPath(drop_path_rate, dtype=policy, name="drop_path1")
        self.drop_path2 = DropPath(drop_path_rate, dtype=policy, name="drop_path2")
        self.layer_scale1 = self.layer_scale2 = None
        if layer_scale_init is not None:
            self.layer_scale1 = LayerScale(
                layer_scale_init, dtype=policy, name="layer_scale1"
            )
            self.layer_scale2 = LayerScale(
                layer_scale_init, dtype=policy, name="layer_scale2"
            )

    def build(self, input_shape):
        layers = [self.norm1, self.attention, self.norm2, self.mlp]
        layers += [self.drop_path1, self.drop_path2]
        if self.layer_scale1 is not None:
            layers += [self.layer_scale1, self.layer_scale2]
        for layer in layers:
            layer.build(input_shape)

    def call(
        self,
        x,
        training=None,
        return_attention_scores=False,
        num_query_tokens=None,
        rope=None,
    ):
        def attention_branch(tokens):
            return self.attention(
                self.norm1(tokens),
                training=training,
                return_attention_scores=return_attention_scores,
                num_query_tokens=num_query_tokens,
                rope=rope,
            )

        def mlp_branch(tokens):
            return self.mlp(self.norm2(tokens), training=training)

        # Only a training step keeps activations for a backward pass.
        if self.remat and training and not return_attention_scores:
            attention_branch = keras.remat(attention_branch)
            mlp_branch = keras.remat(mlp_branch)
        attended = attention_branch(x)
        if return_attention_scores:
            attended, scores = attended
        if self.layer_scale1 is not None:
            attended = self.layer_scale1(attended)
        if num_query_tokens is not None:
            x = x[:, : attended.shape[1]]
        x = x + self.drop_path1(attended, training=training)
        mlp_out = mlp_branch(x)
        if self.layer_scale2 is not None:
            mlp_out = self.layer_scale2(mlp_out)
        x = x + self.drop_path2(mlp_out, training=training)
        if return_attention_scores:
            return x, scores
        return x

    def get_config(self):
        config = {
            **super().get_config(),
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "dropout_rate": self.dropout_rate,
            "attention_dropout_rate": self.attention_dropout_rate,
            "drop_path_rate": self.drop_path_rate,
            "qkv_bias": self.qkv_bias,
            "layer_scale_init": self.layer_scale_init,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "head_dim": self.head_dim,
            "remat": self.remat,
            "norm_type": self.norm_type,
            "qk_norm": self.qk_norm,
            "proj_bias": self.proj_bias,
            "mlp_activation": self.mlp_activation,
            "gated_mlp": self.gated_mlp,
            "mlp_norm": self.mlp_norm,
        }
        return with_sublayer_policies(self, config)
