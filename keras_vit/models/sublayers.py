"""The encoder block's smaller parts: the MLP, stochastic depth
(`DropPath`), `LayerScale`, and the helpers every keras_vit layer shares
(registration, quantized sub-layer policies), written with `keras.ops` only.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_vit.models import fused
from keras_vit.models.norms import check_norm_type, make_norm

register = keras.saving.register_keras_serializable(package="keras_vit")


def with_sublayer_policies(layer: keras.layers.Layer, config: dict) -> dict:
    """`config` with the quantized sub-layers' policies in its `dtype`.

    `model.quantize` gives each quantized `Dense` its own policy; a layer that
    created that `Dense` itself must record it, or a `.keras` reload rebuilds
    the float layer and fails on the extra scale variable. The map is keyed by
    layer path, and the sub-layers receive it through `dtype=self.dtype_policy`.
    """
    quantized = {}
    for sub in layer._flatten_layers(include_self=False):
        if sub.quantization_mode is not None:
            policy = sub.dtype_policy
            if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
                policy = policy[sub.path]
            quantized[sub.path] = policy
    if not quantized:
        return config
    default = layer.dtype_policy
    if isinstance(default, keras.dtype_policies.DTypePolicyMap):
        default = default.default_policy
    policy_map = keras.dtype_policies.DTypePolicyMap(default, quantized)
    return {**config, "dtype": keras.dtype_policies.serialize(policy_map)}


def check_rate(name: str, value: float) -> float:
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"`{name}` must be in [0, 1), got {value!r}.")
    return float(value)


def plain_dense(dense) -> bool:
    """Whether `dense` is a float `Dense` with a bias and no activation,
    adapters, quantization or subclass: `x @ kernel + bias` and nothing its
    own call would add."""
    return (
        type(dense) is keras.layers.Dense
        and dense.use_bias
        and dense.activation is keras.activations.linear
        and not dense.lora_enabled
        and dense.quantization_mode is None
    )


def bare_product(dense, x, kernel=None):
    """`x @ kernel` of a `plain_dense` (or `x @` the given float32 `kernel`
    in its place), in its compute dtype."""
    dtype = dense.compute_dtype
    kernel = dense.kernel if kernel is None else kernel
    return ops.matmul(ops.cast(x, dtype), ops.cast(kernel, dtype))


def project(dense, x, training=None):
    """`dense(x)`; in a fused training call (`models.fused`) a plain `Dense`
    computing in bfloat16 or float16 runs as the bare product and
    `fused.bias_add`, which keeps the product on oneDNN's fastest kernel. In
    float32 oneDNN's MatMul + BiasAdd kernel costs what the bare product does
    (measured at the ViT's shapes), so `Dense` keeps its own call."""
    low_precision = dense.compute_dtype != "float32"
    width = min(dense.kernel.shape)  # the model's width for QKV, output, MLP
    if fused.active(training, width) and low_precision and plain_dense(dense):
        return fused.bias_add(bare_product(dense, x), dense.bias)
    return dense(x)


def project_scaled(dense, x, width: int, scale: float, training=None):
    """`(project(dense, x), folded)`. In a fused call (`fused.active`) of a
    `plain_dense` the first `width` output columns come out times `scale`,
    folded into the kernel and bias (a pass over the weights, not the
    activations: the attention's query scaling forward and backward, a
    bfloat16 ViT-Ti/16 step at batch 32 602 -> 580 ms), and `folded` is
    True; otherwise the output is `project`'s and the caller scales."""
    if not (fused.active(training, min(dense.kernel.shape)) and plain_dense(dense)):
        return project(dense, x, training), False
    rest = dense.units - width
    columns = ops.concatenate([ops.full((width,), scale), ops.ones((rest,))])
    y = bare_product(dense, x, ops.cast(dense.kernel, "float32") * columns)
    bias = ops.cast(dense.bias, "float32") * columns
    if dense.compute_dtype == "float32":
        return ops.add(y, bias), True
    return fused.bias_add(y, bias), True


MLP_ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu", "silu")


def activate(x, activation: str, approximate_gelu: bool = False, fuse=False):
    """`activation` of `x`; exact GELU as `fused.gelu` when `fuse`."""
    if activation == "gelu" and not approximate_gelu and fuse:
        return fused.gelu(x)
    if activation == "gelu":
        return ops.gelu(x, approximate=approximate_gelu)
    if activation == "gelu_tanh":
        return ops.gelu(x, approximate=True)
    if activation == "quick_gelu":
        # CLIP's sigmoid approximation of GELU.
        return x * ops.sigmoid(ops.cast(1.702, x.dtype) * x)
    return ops.silu(x)


@register
class MLP(keras.layers.Layer):
    """Two-layer feed-forward block: Dense(mlp_dim) + GELU + Dense(hidden_dim).

    With `gated=True` it is a gated linear unit (SwiGLU with `"silu"`):
    `fc1` is `2 * mlp_dim` wide and packs the gate then the value, the hidden
    layer is `act(gate) * value`. Checkpoints with two separate gate and
    value projections (timm's `SwiGLU`) load into the packed kernel.

    Args:
        mlp_dim: int, width of the hidden layer.
        dropout_rate: float, dropout after each Dense.
        approximate_gelu: bool, tanh approximation of GELU (exact erf when
            False, as in the paper and timm).
        activation: `"gelu"`, `"gelu_tanh"`, `"quick_gelu"` (CLIP's
            `x * sigmoid(1.702 x)`) or `"silu"`.
        gated: bool, gated hidden layer as above.
        use_bias: bool, biases in both Dense layers.
        norm_type: None, or `"layernorm"` / `"rmsnorm"` on the hidden layer
            before `fc2` (EVA-02's `scale_mlp`).
        norm_epsilon: float, epsilon of that norm.

    Call arguments:
        x: `(batch, num_tokens, hidden_dim)`.
        training: bool, whether dropout is active.
    """

    def __init__(
        self,
        mlp_dim: int,
        dropout_rate: float = 0.0,
        approximate_gelu: bool = False,
        activation: str = "gelu",
        gated: bool = False,
        use_bias: bool = True,
        norm_type: str | None = None,
        norm_epsilon: float = 1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if activation not in MLP_ACTIVATIONS:
            raise ValueError(
                f"`activation` must be one of {', '.join(MLP_ACTIVATIONS)}, got "
                f"{activation!r}."
            )
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = check_rate("dropout_rate", dropout_rate)
        self.approximate_gelu = bool(approximate_gelu)
        self.activation = activation
        self.gated = bool(gated)
        self.use_bias = bool(use_bias)
        self.norm_type = None if norm_type is None else check_norm_type(norm_type)
        self.norm_epsilon = float(norm_epsilon)
        self.hidden_dropout = keras.layers.Dropout(
            self.dropout_rate, dtype=self.dtype_policy, name="hidden_dropout"
        )
        self.output_dropout = keras.layers.Dropout(
            self.dropout_rate, dtype=self.dtype_policy, name="output_dropout"
        )
        self.norm = None
        if self.norm_type is not None:
            self.norm = make_norm(
                self.norm_type, self.norm_epsilon, "norm", dtype=self.dtype_policy
            )

    def build(self, input_shape):
        width = self.mlp_dim * (2 if self.gated else 1)
        self.fc1 = keras.layers.Dense(
            width, use_bias=self.use_bias, dtype=self.dtype_policy, name="fc1"
        )
        self.fc1.build((None, input_shape[-1]))
        self.fc2 = keras.layers.Dense(
            input_shape[-1], use_bias=self.use_bias, dtype=self.dtype_policy, name="fc2"
        )
        self.fc2.build((None, self.mlp_dim))
        if self.norm is not None:
            self.norm.build((None, self.mlp_dim))
        self.hidden_dropout.build((None, self.mlp_dim))
        self.output_dropout.build(input_shape)

    def call(self, x, training=None):
        # On 2-D (tokens, features) TensorFlow's oneDNN rewrite fuses
        # MatMul + BiasAdd (+ exact GELU in a float32 graph) into one kernel;
        # on the 3-D input it is a BatchMatMul and separate passes. Training
        # calls take the fused kernels instead (models.fused; docs/performance.md).
        # Only an unknown batch size is taken from the tensor: a shape op on
        # `x` beside the reshape makes the TFLite converter keep the
        # LayerNorm before it in float in a QAT model (`models.qat`).
        dynamic = [d is None for d in x.shape[1:-1]]
        leading = (-1, *x.shape[1:-1])
        if any(dynamic):
            leading = tuple(
                ops.shape(x)[i] if d is None else d for i, d in enumerate(x.shape[:-1])
            )
        h = ops.reshape(x, (-1, x.shape[-1]))
        fuse = fused.active(training, x.shape[-1])
        if fuse and self._fusable_fc1():
            # The bare product, then bias and GELU in one kernel (models.fused).
            h = fused.bias_gelu(bare_product(self.fc1, h), self.fc1.bias)
        else:
            h = self.fc1(h)
            if self.gated:
                gate, value = h[:, : self.mlp_dim], h[:, self.mlp_dim :]
                h = activate(gate, self.activation, self.approximate_gelu) * value
            else:
                h = activate(h, self.activation, self.approximate_gelu, fuse)
        h = self.hidden_dropout(h, training=training)
        if self.norm is not None:
            h = self.norm(h)
        h = self.output_dropout(project(self.fc2, h, training), training=training)
        return ops.reshape(h, (*leading, h.shape[-1]))

    def _fusable_fc1(self) -> bool:
        """Whether `fc1` is a plain `Dense` followed by exact GELU."""
        return (
            not self.gated
            and self.activation == "gelu"
            and not self.approximate_gelu
            and plain_dense(self.fc1)
        )

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = {
            **super().get_config(),
            "mlp_dim": self.mlp_dim,
            "dropout_rate": self.dropout_rate,
            "approximate_gelu": self.approximate_gelu,
            "activation": self.activation,
            "gated": self.gated,
            "use_bias": self.use_bias,
            "norm_type": self.norm_type,
            "norm_epsilon": self.norm_epsilon,
        }
        return with_sublayer_policies(self, config)


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
        self.rate = check_rate("rate", rate)
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
