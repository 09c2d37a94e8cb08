"""Multihead attention pooling (MAP): a learned probe attends over the tokens.

big_vision's `MAPHead` (`pool_type="map"`, SigLIP's image towers) and timm's
`AttentionPoolLatent` (`global_pool="map"`) are the same computation: one
learned query (the probe) attends over every token of the encoder output,
the attended vector goes through an output projection, then a residual MLP
behind a LayerNorm: `y = proj(attn(probe, x)); y + MLP(LN(y))`.

Which tokens the probe sees differs: big_vision's models have no prefix
tokens; timm >= 1.0.16 leaves the class and register tokens out unless
`pool_include_prefix=True` (`VisionTransformer.pool`), which is
`num_skipped_tokens` here.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_vit.models.norms import make_norm
from keras_vit.models.sublayers import MLP, MLP_ACTIVATIONS, register


@register
class MAPHead(keras.layers.Layer):
    """Pools `(batch, num_tokens, hidden_dim)` to `(batch, hidden_dim)` with
    one learned probe query.

    Args:
        num_heads: int, attention heads; must divide `hidden_dim`.
        mlp_dim: int, hidden width of the residual MLP.
        qkv_bias: bool, whether the query and key/value projections have a
            bias.
        layer_norm_epsilon: float, epsilon of the LayerNorm before the MLP.
        num_skipped_tokens: int, leading tokens (class, registers) the probe
            does not attend to; 0 pools every token.
        activation: the residual MLP's activation, one of
            `sublayers.MLP_ACTIVATIONS` (timm and transformers' SigLIP use
            the blocks' one: `"gelu_tanh"` for SigLIP).

    Call arguments:
        x: `(batch, num_tokens, hidden_dim)`, the encoder's normalised output.

    Returns:
        `(batch, hidden_dim)`.
    """

    def __init__(
        self,
        num_heads: int,
        mlp_dim: int,
        qkv_bias: bool = True,
        layer_norm_epsilon: float = 1e-6,
        num_skipped_tokens: int = 0,
        activation: str = "gelu",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if activation not in MLP_ACTIVATIONS:
            raise ValueError(
                f"`activation` must be one of {', '.join(MLP_ACTIVATIONS)}, got "
                f"{activation!r}."
            )
        self.activation = activation
        if (
            isinstance(num_skipped_tokens, bool)
            or not isinstance(num_skipped_tokens, int)
            or num_skipped_tokens < 0
        ):
            raise ValueError(
                f"`num_skipped_tokens` must be an int >= 0, got {num_skipped_tokens!r}."
            )
        self.num_skipped_tokens = num_skipped_tokens
        for key, value in (("num_heads", num_heads), ("mlp_dim", mlp_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{key}` must be a positive int, got {value!r}.")
        self.num_heads = num_heads
        self.mlp_dim = mlp_dim
        self.qkv_bias = bool(qkv_bias)
        self.layer_norm_epsilon = layer_norm_epsilon

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        if hidden_dim % self.num_heads:
            raise ValueError(
                f"hidden_dim {hidden_dim} is not divisible by num_heads "
                f"{self.num_heads}."
            )
        self.probe = self.add_weight(
            shape=(1, hidden_dim),
            # timm's AttentionPoolLatent initialisation of its latent.
            initializer=keras.initializers.TruncatedNormal(stddev=hidden_dim**-0.5),
            name="probe",
        )
        policy = self.dtype_policy
        self.query = keras.layers.Dense(
            hidden_dim, use_bias=self.qkv_bias, dtype=policy, name="query"
        )
        self.key_value = keras.layers.Dense(
            2 * hidden_dim, use_bias=self.qkv_bias, dtype=policy, name="key_value"
        )
        self.proj = keras.layers.Dense(hidden_dim, dtype=policy, name="proj")
        self.norm = make_norm("layernorm", self.layer_norm_epsilon, "norm", policy)
        self.mlp = MLP(
            self.mlp_dim, activation=self.activation, dtype=policy, name="mlp"
        )
        vector = (None, hidden_dim)
        for layer in (self.query, self.key_value, self.proj, self.norm, self.mlp):
            layer.build(vector)

    def call(self, x):
        if self.num_skipped_tokens:
            x = x[:, self.num_skipped_tokens :]
        hidden_dim = x.shape[2]
        # Known only at run time in a dynamic-size model.
        num_tokens = ops.shape(x)[1] if x.shape[1] is None else x.shape[1]
        heads = self.num_heads
        head_dim = hidden_dim // heads
        # The probe's query is the same for every image: projected once.
        q = self.query(ops.cast(self.probe, x.dtype))
        q = ops.reshape(q * ops.cast(head_dim**-0.5, q.dtype), (heads, head_dim))
        kv = self.key_value(ops.reshape(x, (-1, hidden_dim)))
        kv = ops.reshape(kv, (-1, num_tokens, 2, heads, head_dim))
        k, v = ops.unstack(kv, 2, axis=2)
        # float32 logits and softmax whatever the compute dtype (DESIGN.md).
        logits = ops.einsum(
            "hd,bnhd->bhn", ops.cast(q, "float32"), ops.cast(k, "float32")
        )
        probs = ops.softmax(logits, axis=-1)
        pooled = ops.einsum("bhn,bnhd->bhd", ops.cast(probs, v.dtype), v)
        pooled = self.proj(ops.reshape(pooled, (-1, hidden_dim)))
        return pooled + self.mlp(self.norm(pooled))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "qkv_bias": self.qkv_bias,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "num_skipped_tokens": self.num_skipped_tokens,
            "activation": self.activation,
        }
