"""Fused element-wise kernels for training on TensorFlow: exact GELU, the
bias add after a matrix product (alone or with GELU) and LayerNorm, each one
XLA kernel forward and one backward, between oneDNN's matrix products; the
attention softmax's backward pass as one XLA kernel.

Why (docs/performance.md, "Fused kernels in the training step"): without XLA,
TensorFlow runs GELU and LayerNorm as chains of separate element-wise ops,
each a pass over memory, and in bfloat16 each op converts every element to
float32 and back on its own. In a mixed-bfloat16 training step of ViT-Ti/16
(224, batch 32) on a CPU with AMX, GELU's forward and backward took 29% of
the op time and LayerNorm's 17%, more than the matrix products. Compiling
the whole step with XLA fuses them but loses oneDNN's bfloat16 matrix
products (XLA:CPU's dots do not use AMX or AVX512_BF16). Compiling only these
small functions keeps both. Each kernel computes in float32 whatever the
input dtype and returns the input's dtype.

TensorFlow's oneDNN rewrite turns a bfloat16 MatMul + BiasAdd into an inner
product that does not use AMX (TensorFlow 2.21: twice the time of the bare
product at the MLP's shapes), and sums the bias gradient with a bfloat16
BiasAddGrad. `bias_add` and `bias_gelu` (the bias inside the GELU kernel)
leave the product a bare MatMul and sum the bias gradient in float32 in
their backward kernel.

Used in training calls on the TensorFlow backend, in models at least
`MIN_FEATURES` wide (`active`), and in their inference calls within
`inference()`: other inference calls, narrower models and other backends
keep the `keras.ops` graph, and SavedModels are always written from it
(`deploy.signatures.write_saved_model` traces under `disabled()`), so TF
Serving and the TFLite converter never meet an XLA function. XLA compiles
each kernel once per input shape in a process (about 0.1 s each on a 2-core
CPU), so a model's first training step takes a second or two longer.
"""

from __future__ import annotations

import contextlib
import functools
import math

import keras

_enabled = True
_inference = False

# Narrower models keep the plain graph: the digits and mnist5k recipes (96
# features) were measured and tuned with it. On mnist5k_deit (96 features,
# 49 tokens, batch 64, float32, seed 4, quiet) the first version of the
# kernels trained in 573 s against 510 s without; the current ones in 435 s,
# held-out 0.984 against 0.989 (one seed each; the recipe's accuracy over
# seeds with the kernels is not measured yet). ViT-Ti and wider (192+)
# gain 1.17x (float32) to 1.95x (bfloat16).
MIN_FEATURES = 128


@contextlib.contextmanager
def disabled():
    """Within the block, layers take the `keras.ops` path in training and in
    `inference()` too (comparisons, exports); models traced inside keep
    it."""
    global _enabled
    previous, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = previous


@contextlib.contextmanager
def inference():
    """Within the block, inference calls (`training` False or None) of models
    at least `MIN_FEATURES` wide use the kernels too: ViT-Ti/16 at 224,
    batch 32, mixed bfloat16, 2-core Xeon with AMX: 142 -> 202 img/s
    (docs/performance.md). Opt-in because a function traced inside holds
    XLA-compiled kernels: run it on TensorFlow in this process, do not save
    it (keras_vit's exports trace their own, plain, under `disabled()`).
    Keras keeps the predict function it traced first: call `model.predict`
    inside the block from the start, or `model.make_predict_function(
    force=True)` after entering it. Inside `disabled()` it does nothing.
    Process-wide, like `disabled()` (MirroredStrategy traces its replicas in
    threads of their own)."""
    global _inference
    previous, _inference = _inference, True
    try:
        yield
    finally:
        _inference = previous


def active(training, width) -> bool:
    """Whether a layer call with this `training`, in a model `width` features
    wide, uses the fused kernels: a Python `True` (or, within `inference()`,
    False or None) on the TensorFlow backend, at least `MIN_FEATURES` wide,
    unless `disabled()`. A symbolic `training` keeps the plain graph."""
    if training is None or isinstance(training, bool):
        mode_ok = training is True or _inference
    else:
        mode_ok = False
    return (
        _enabled
        and mode_ok
        and width is not None
        and width >= MIN_FEATURES
        and keras.backend.backend() == "tensorflow"
    )


@functools.cache
def _kernels():
    import tensorflow as tf

    # reduce_retracing: one trace per rank, not per shape; XLA still compiles
    # (and caches) one executable per concrete shape.
    compiled = functools.partial(
        tf.function, jit_compile=True, reduce_retracing=True, autograph=False
    )
    rsqrt2 = 1.0 / math.sqrt(2.0)
    rsqrt2pi = 1.0 / math.sqrt(2.0 * math.pi)

    def sum_leading(x):
        """Sum over every axis but the last (traced with any rank: retracing
        is reduced to shapes of unknown rank)."""
        return tf.reduce_sum(tf.reshape(x, [-1, tf.shape(x)[-1]]), axis=0)

    def sum_last(x):
        """Sum over the last axis, kept as an axis of 1, as a product with a
        column of ones. XLA:CPU splits a reduction along a row into a
        reduce-window over a float32 copy of its input; the product is one
        pass (LayerNorm forward 1.32 -> 0.83 ms at ViT-Ti's 6,304 x 192,
        the softmax backward 2.26 -> 1.30 ms at 96 x 197 x 197; a sum over
        the leading axes, the bias gradients, gains nothing that way)."""
        shape = tf.shape(x)
        ones = tf.ones(tf.stack([shape[-1], 1]), x.dtype)
        rows = tf.matmul(tf.reshape(x, tf.stack([-1, shape[-1]])), ones)
        return tf.reshape(rows, tf.concat([shape[:-1], [1]], 0))

    def mean_last(x):
        return sum_last(x) / tf.cast(tf.shape(x)[-1], x.dtype)

    def gelu_parts(x):
        """x in float32, the normal CDF at x, x * the normal PDF at x."""
        cdf = 0.5 * (1.0 + tf.math.erf(x * rsqrt2))
        return cdf, x * tf.exp(-0.5 * x * x) * rsqrt2pi

    @compiled
    def gelu_forward(x):
        x32 = tf.cast(x, tf.float32)
        return tf.cast(x32 * gelu_parts(x32)[0], x.dtype)

    @compiled
    def gelu_backward(x, dy):
        cdf, xpdf = gelu_parts(tf.cast(x, tf.float32))
        return tf.cast(tf.cast(dy, tf.float32) * (cdf + xpdf), x.dtype)

    @compiled
    def bias_add_forward(y, bias):
        return y + tf.cast(bias, y.dtype)

    @compiled
    def bias_sum(dy, bias):
        return tf.cast(sum_leading(tf.cast(dy, tf.float32)), bias.dtype)

    @compiled
    def bias_gelu_forward(y, bias):
        x32 = tf.cast(y, tf.float32) + tf.cast(bias, tf.float32)
        return tf.cast(x32 * gelu_parts(x32)[0], y.dtype)

    @compiled
    def bias_gelu_backward(y, bias, dh):
        cdf, xpdf = gelu_parts(tf.cast(y, tf.float32) + tf.cast(bias, tf.float32))
        dx = tf.cast(dh, tf.float32) * (cdf + xpdf)
        dbias = sum_leading(dx)
        return tf.cast(dx, y.dtype), tf.cast(dbias, bias.dtype)

    @compiled
    def norm_forward(x, gamma, beta, epsilon):
        x32 = tf.cast(x, tf.float32)
        mean = mean_last(x32)
        centred = x32 - mean
        variance = mean_last(centred * centred)
        inv = tf.math.rsqrt(variance + epsilon)
        y = centred * inv * tf.cast(gamma, tf.float32) + tf.cast(beta, tf.float32)
        return tf.cast(y, x.dtype), mean, inv

    @compiled
    def norm_backward(x, gamma, mean, inv, dy):
        dy32 = tf.cast(dy, tf.float32)
        normed = (tf.cast(x, tf.float32) - mean) * inv
        dgamma = sum_leading(dy32 * normed)
        dbeta = sum_leading(dy32)
        g = dy32 * tf.cast(gamma, tf.float32)
        dx = inv * (g - mean_last(g) - normed * mean_last(g * normed))
        return tf.cast(dx, x.dtype), dgamma, dbeta

    @compiled
    def softmax_backward(probs, dprobs):
        # From the probabilities the forward pass returned (in the compute
        # dtype; the context product keeps them anyway), not from float32
        # ones: no float32 batch x heads x tokens^2 tensor is held per block.
        p, d = tf.cast(probs, tf.float32), tf.cast(dprobs, tf.float32)
        return tf.cast(p * (d - sum_last(d * p)), probs.dtype)

    # The forward pass is TensorFlow's softmax (oneDNN's on x86): 2.55 ms
    # in float32 at 96 x 197 x 197 where an XLA kernel takes 3.63 (its two
    # row reductions, see `sum_last`). oneDNN's bfloat16 softmax computes in
    # float32 and rounds once (identical to the float32 one rounded, 2.16
    # ms and no float32 copy of the logits: a ViT-Ti step 612 -> 597 ms);
    # without oneDNN, TensorFlow's bfloat16 softmax is off by up to 30%, so
    # other dtypes and builds go through float32.
    onednn_bfloat16 = _onednn_enabled()

    @tf.custom_gradient
    def softmax(logits, like):
        if onednn_bfloat16 and logits.dtype == like.dtype == tf.bfloat16:
            probs = tf.nn.softmax(logits)
        else:
            probs = tf.nn.softmax(tf.cast(logits, tf.float32))
            probs = tf.cast(probs, like.dtype)

        def grad(dprobs):
            dlogits = tf.cast(softmax_backward(probs, dprobs), logits.dtype)
            return dlogits, tf.zeros_like(like)

        return probs, grad

    @tf.custom_gradient
    def gelu(x):
        return gelu_forward(x), lambda dy: gelu_backward(x, dy)

    @tf.custom_gradient
    def bias_add(y, bias):
        return bias_add_forward(y, bias), lambda dy: (dy, bias_sum(dy, bias))

    @tf.custom_gradient
    def bias_gelu(y, bias):
        return bias_gelu_forward(y, bias), lambda dh: bias_gelu_backward(y, bias, dh)

    def layer_norm(x, gamma, beta, epsilon):
        epsilon = tf.constant(epsilon, tf.float32)
        gamma, beta = _read(gamma), _read(beta)

        @tf.custom_gradient
        def norm(x, gamma, beta):
            y, mean, inv = norm_forward(x, gamma, beta, epsilon)

            def grad(dy):
                dx, dgamma, dbeta = norm_backward(x, gamma, mean, inv, dy)
                return dx, tf.cast(dgamma, gamma.dtype), tf.cast(dbeta, beta.dtype)

            return y, grad

        return norm(x, gamma, beta)

    return gelu, bias_gelu, layer_norm, bias_add, softmax


def _onednn_enabled() -> bool:
    """Whether TensorFlow runs its oneDNN kernels in this process (x86
    builds, unless `TF_ENABLE_ONEDNN_OPTS=0`); False when it cannot tell."""
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return False


def _read(variable):
    """A variable's value as a tensor: `tf.custom_gradient` takes tensors and
    passes their gradients on to the variables read."""
    import tensorflow as tf

    return tf.convert_to_tensor(variable)


def gelu(x):
    """Exact (erf) GELU of `x`, computed in float32, in `x`'s dtype."""
    return _kernels()[0](x)


def bias_gelu(y, bias):
    """`gelu(y + bias)`, `bias` broadcast over the last axis of `y`."""
    return _kernels()[1](y, _read(bias))


def bias_add(y, bias):
    """`y + bias`, `bias` broadcast over the last axis of `y` (its gradient
    summed in float32)."""
    return _kernels()[3](y, _read(bias))


def softmax(logits, dtype):
    """Softmax over the last axis of `logits`, computed in float32, returned
    in `dtype`."""
    import tensorflow as tf

    return _kernels()[4](logits, tf.zeros((), dtype))


def layer_norm(x, gamma, beta, epsilon: float):
    """LayerNorm over the last axis of `x` with scale `gamma` and offset
    `beta`; statistics in float32, the result in `x`'s dtype."""
    return _kernels()[2](x, gamma, beta, float(epsilon))
