"""The fused kernels (`keras_vit.models.fused`): the values and gradients of
the `keras.ops` graph they replace, in training calls, and in inference calls
within `fused.inference()` (never in a SavedModel)."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import FLOAT32_PARITY, assert_close, run_python
from keras import ops
from test_remat import gradients, relative_difference, small_vit

import keras_vit
from keras_vit.models import fused
from keras_vit.models.norms import LayerNorm
from keras_vit.models.sublayers import plain_dense, project_scaled


def reference_gelu(x):
    return ops.gelu(x, approximate=False)


def reference_layer_norm(x, gamma, beta, epsilon):
    """Keras' LayerNormalization arithmetic: float32 statistics, the result
    in the input's dtype."""
    x32 = tf.cast(x, tf.float32)
    mean = tf.reduce_mean(x32, -1, keepdims=True)
    variance = tf.reduce_mean(tf.square(x32 - mean), -1, keepdims=True)
    y = (x32 - mean) * tf.math.rsqrt(variance + epsilon) * gamma + beta
    return tf.cast(y, x.dtype)


# name: (fused function, float32 reference, input shapes); the last axis of
# the first input is the one a bias, norm or softmax runs along.
KERNELS = {
    "gelu": (fused.gelu, reference_gelu, [(3, 5, 8)]),
    "bias_gelu": (
        fused.bias_gelu,
        lambda y, b: reference_gelu(y + tf.cast(b, y.dtype)),
        [(15, 8), (8,)],
    ),
    "bias_add": (
        fused.bias_add,
        lambda y, b: y + tf.cast(b, y.dtype),
        [(3, 5, 8), (8,)],
    ),
    "layer_norm": (
        lambda x, g, b: fused.layer_norm(x, g, b, 1e-6),
        lambda x, g, b: reference_layer_norm(x, g, b, 1e-6),
        [(3, 5, 8), (8,), (8,)],
    ),
    "softmax": (
        lambda x: fused.softmax(x, x.dtype),
        lambda x: tf.cast(tf.nn.softmax(tf.cast(x, tf.float32)), x.dtype),
        [(2, 3, 5, 7)],
    ),
}


def values_and_gradients(fn, inputs, upstream):
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        out = fn(*inputs)
    grads = tape.gradient(out, inputs, output_gradients=tf.cast(upstream, out.dtype))
    return [tf.cast(t, tf.float64) for t in [out, *grads]]


def random_inputs(shapes, dtype, seed=0):
    """The activation in `dtype`; biases, scales and offsets in float32, as a
    mixed-precision layer keeps its variables."""
    rng = np.random.default_rng(seed)
    # Scale 2 and an offset: GELU's both tails, a norm of non-centred rows,
    # softmax logits several units apart.
    arrays = [rng.normal(0.5, 2.0, shape).astype("float32") for shape in shapes]
    return [tf.cast(arrays[0], dtype), *map(tf.constant, arrays[1:])]


def scale_errors(actual, expected):
    """Largest error of each tensor over its largest entry."""
    actual, expected = [[np.asarray(t) for t in ts] for ts in (actual, expected)]
    return [
        float(np.abs(a - e).max() / max(np.abs(e).max(), 1e-12))
        for a, e in zip(actual, expected, strict=True)
    ]


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_fused_kernels_give_the_float32_values_and_gradients(name, mode):
    kernel, reference, shapes = KERNELS[name]
    inputs = random_inputs(shapes, tf.float32)
    upstream = random_inputs([shapes[0]], tf.float32, seed=1)[0]

    def run(fn):
        step = lambda *args: values_and_gradients(fn, list(args), upstream)  # noqa: E731
        if mode != "eager":
            step = tf.function(step, jit_compile=mode == "xla")
        return [np.asarray(t) for t in step(*inputs)]

    # Same float32 arithmetic, reordered (fused reductions, erf in place of
    # erfc): within 1e-5 of each tensor's largest entry (measured <= 2e-7).
    errors = scale_errors(run(kernel), run(reference))
    assert max(errors) <= 1e-5, errors


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_fused_kernels_in_half_precision_are_as_close_as_the_graph_they_replace(
    name, dtype
):
    kernel, reference, shapes = KERNELS[name]
    inputs = random_inputs(shapes, dtype)
    upstream = random_inputs([shapes[0]], tf.float32, seed=1)[0]
    # The float32 reference on the same (rounded) inputs.
    widened = [tf.cast(inputs[0], tf.float32), *inputs[1:]]
    exact = values_and_gradients(reference, widened, upstream)
    fused_out = values_and_gradients(kernel, inputs, upstream)
    assert kernel(*inputs).dtype == dtype
    # The fused kernels compute in float32 and round once: each tensor within
    # a few units of the half-precision rounding step (2^-8 bfloat16, 2^-11
    # float16) of its largest entry (measured <= 4.7e-3 and 6.2e-4, the
    # keras.ops graph's own errors or below; printed on failure).
    step = 2.0**-8 if dtype == "bfloat16" else 2.0**-11
    errors = scale_errors(fused_out, exact)
    replaced = scale_errors(values_and_gradients(reference, inputs, upstream), exact)
    assert max(errors) <= 4 * step, (errors, replaced)


@pytest.mark.slow
def test_without_onednn_the_bfloat16_softmax_widens_to_float32():
    # TensorFlow's own bfloat16 softmax (no oneDNN) is off by several
    # rounding steps; the fused softmax then computes in float32 and rounds
    # once: within half a bfloat16 step (2^-9) of the largest probability,
    # bounded here by one step (the unguarded kernel measured 7.0e-3).
    proc = run_python(
        """
        import numpy as np, tensorflow as tf
        from keras_vit.models import fused
        assert not fused._onednn_enabled()
        rng = np.random.default_rng(0)
        logits = rng.normal(0.5, 4.0, (2, 3, 40, 197)).astype("float32")
        logits = tf.cast(logits, tf.bfloat16)
        exact = tf.nn.softmax(tf.cast(logits, tf.float32))
        probs = tf.cast(fused.softmax(logits, tf.bfloat16), tf.float32)
        print(float(tf.reduce_max(tf.abs(probs - exact)) / tf.reduce_max(exact)))
        """,
        env={"TF_ENABLE_ONEDNN_OPTS": "0"},
    )
    error = float(proc.stdout.split()[-1])
    assert error <= 2.0**-8, error


@pytest.fixture(autouse=True)
def _narrow_models_fused_too(monkeypatch):
    """The models here are 32 features wide, under `fused.MIN_FEATURES`."""
    monkeypatch.setattr(fused, "MIN_FEATURES", 1)


def test_only_a_python_true_on_tensorflow_activates_them():
    assert fused.active(True, 192)
    assert not fused.active(False, 192) and not fused.active(None, 192)
    assert not fused.active(tf.constant(True), 192)
    assert not fused.active(True, None)
    with fused.disabled():
        assert not fused.active(True, 192)
    assert fused.active(True, 192)
    with fused.inference():
        assert fused.active(False, 192) and fused.active(None, 192)
        assert fused.active(True, 192)
        assert not fused.active(tf.constant(False), 192)
        with fused.disabled():
            assert not fused.active(None, 192)
    assert not fused.active(None, 192)


def test_models_narrower_than_the_threshold_keep_the_plain_graph(monkeypatch):
    monkeypatch.setattr(fused, "MIN_FEATURES", 128)
    spec = tf.TensorSpec((None, 32, 32, 3), tf.float32)
    for width, expected in ((96, False), (128, True)):
        keras.utils.set_random_seed(0)
        model = keras_vit.ViT(
            "Ti/16", image_size=32, num_classes=3, hidden_dim=width, num_layers=1,
            num_heads=4, mlp_dim=2 * width,
        )  # fmt: skip
        train = tf.function(lambda x, m=model: m(x, training=True))
        assert (xla_kernels(train.get_concrete_function(spec)) > 0) is expected


def vit(**options) -> keras.Model:
    """test_remat's small ViT (random head: every weight gets a gradient)."""
    return small_vit(options.pop("remat", False), **options)


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"pooling": "gap", "remat": True},
        {"layer_scale_init": 0.1, "pooling": "map"},
    ],
    ids=["token", "gap-remat", "layerscale-map"],
)
def test_a_fused_training_step_gives_the_plain_float32_gradients(options, mode):
    model = vit(**options)
    with fused.disabled():
        expected = gradients(model, mode)
    actual = gradients(model, mode)
    assert all(np.abs(g).max() > 0 for g in expected)  # every weight is tested
    # Float32 either way, reordered: within 1e-5 of the largest gradient entry
    # (measured 2.5e-7 to 1.3e-6).
    assert relative_difference(actual, expected) <= 1e-5


def test_a_bfloat16_fused_step_is_as_close_to_float32_as_the_plain_bfloat16_step():
    exact = gradients(vit(), "graph")
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = vit()
    with fused.disabled():
        plain = gradients(model, "graph")
    fused_grads = gradients(model, "graph")
    plain_error = relative_difference(plain, exact)
    fused_error = relative_difference(fused_grads, exact)
    # Both round the matrix products to bfloat16 alike, which dominates
    # (measured 4.8% of the largest entry fused, 4.7% plain); the fused
    # kernels round their element-wise chains once instead of after every op.
    # Bound: a quarter more than the plain step's error plus one bfloat16
    # step, so another CPU's rounding of the products cannot fail it.
    assert fused_error <= 1.25 * plain_error + 2.0**-8, (fused_error, plain_error)


def xla_kernels(concrete) -> int:
    """How many functions of a traced graph XLA must compile."""
    library = concrete.graph.as_graph_def().library.function
    return sum(f.attr["_XlaMustCompile"].b for f in library)


def test_inference_and_exports_keep_the_plain_graph():
    model = vit()
    spec = tf.TensorSpec((None, 16, 16, 3), tf.float32)
    train = tf.function(lambda x: model(x, training=True)).get_concrete_function(spec)
    infer = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec)
    default = tf.function(lambda x: model(x)).get_concrete_function(spec)
    assert xla_kernels(train) > 0
    assert xla_kernels(infer) == 0 and xla_kernels(default) == 0


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_inference_within_the_block_uses_the_kernels_with_the_plain_values(dtype):
    keras.mixed_precision.set_global_policy(dtype)
    model = vit()
    images = tf.random.stateless_normal((3, 16, 16, 3), seed=(2, 3))
    spec = tf.TensorSpec((None, 16, 16, 3), tf.float32)
    plain = np.asarray(tf.cast(model(images, training=False), tf.float32))
    with fused.inference():
        infer = tf.function(lambda x: model(x, training=False))
        default = tf.function(lambda x: model(x))
        assert xla_kernels(infer.get_concrete_function(spec)) > 0
        assert xla_kernels(default.get_concrete_function(spec)) > 0
        eager = np.asarray(tf.cast(model(images), tf.float32))
        predicted = model.predict(images, verbose=0)
    # float32: the same arithmetic reordered (1e-5 of the largest logit, as
    # the gradients above). bfloat16: the plain graph rounds every op of
    # GELU and LayerNorm to bfloat16, the kernels once: two bfloat16 steps
    # (2^-7) of the largest logit per rounding that differs, over 2 blocks.
    bound = FLOAT32_PARITY if dtype == "float32" else 4 * 2.0**-7
    assert_close(eager, plain, bound, what="kernels vs plain")
    # The traced function keeps its kernels outside the block. A traced
    # graph is not the eager one (grappler fuses a product with its bias and
    # activation on oneDNN, by CPU kind): the same kernels, reassociated;
    # in bfloat16 that can flip a rounding, one bfloat16 step of the logits.
    traced = FLOAT32_PARITY if dtype == "float32" else 2.0**-7
    kernels = np.asarray(tf.cast(infer(images), tf.float32))
    assert_close(kernels, eager, traced, what="traced vs eager")
    assert_close(predicted.astype("float32"), eager, traced, what="predict vs eager")


def test_a_saved_model_written_within_inference_holds_no_xla_function(tmp_path):
    from tensorflow.core.protobuf import saved_model_pb2

    from keras_vit.deploy.export import export_model

    model = vit()
    with fused.inference():
        export_model(model, "m", tmp_path, tflite=())
    (path,) = tmp_path.glob("m/*/saved_model.pb")
    saved = saved_model_pb2.SavedModel.FromString(path.read_bytes())
    functions = [f for g in saved.meta_graphs for f in g.graph_def.library.function]
    assert functions
    assert not any(f.attr["_XlaMustCompile"].b for f in functions)


def test_a_dynamic_size_model_trains_fused_at_two_sizes():
    model = vit(dynamic_size=True)
    for size in (16, 24):
        images = tf.random.stateless_normal((4, size, size, 3), seed=(1, size))
        with fused.disabled():
            expected = gradients(model, "graph", images)
        actual = gradients(model, "graph", images)
        assert relative_difference(actual, expected) <= 1e-5


def test_dense_layers_with_their_own_call_keep_it():
    dense = keras.layers.Dense(4)
    dense.build((None, 3))
    assert plain_dense(dense)
    dense.enable_lora(2)
    assert not plain_dense(dense)
    quantized = keras.layers.Dense(4)
    quantized.build((None, 3))
    quantized.quantize("int8")
    assert not plain_dense(quantized)
    no_bias = keras.layers.Dense(4, use_bias=False)
    no_bias.build((None, 3))
    assert not plain_dense(no_bias)


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_the_query_scale_is_folded_into_the_qkv_weights_in_a_fused_call(dtype):
    keras.utils.set_random_seed(0)
    dense = keras.layers.Dense(12, bias_initializer="normal", dtype=dtype)
    dense.build((None, 4))
    x = tf.constant(np.random.default_rng(0).normal(size=(5, 4)), tf.float32)
    columns = np.array([0.125] * 4 + [1.0] * 8, "float32")
    folded, was_folded = project_scaled(dense, x, 4, 0.125, training=True)
    assert was_folded
    expected = np.asarray(tf.cast(dense(x), tf.float32)) * columns
    # float32: the same products reordered (1e-6 of the largest entry);
    # bfloat16: one rounding of each (2^-8), the fold rounding once less.
    bound = 1e-6 if dtype == "float32" else 2.0**-8
    assert scale_errors([tf.cast(folded, tf.float32)], [expected])[0] <= bound
    # Nothing folded outside a fused call or into a Dense with its own call:
    # the Dense's output as it is, and the caller scales.
    out, was_folded = project_scaled(dense, x, 4, 0.125, training=False)
    assert not was_folded
    # Exact: the Dense's own call on the same inputs in the same process.
    np.testing.assert_array_equal(np.asarray(out), np.asarray(dense(x)))
    with fused.inference():
        assert project_scaled(dense, x, 4, 0.125, training=False)[1]
    dense.enable_lora(2)
    out, was_folded = project_scaled(dense, x, 4, 0.125, training=True)
    assert not was_folded
    np.testing.assert_array_equal(np.asarray(out), np.asarray(dense(x)))


def test_layer_norm_is_a_keras_layer_normalization_with_its_config():
    norm = LayerNorm(epsilon=1e-5, name="norm")
    assert isinstance(norm, keras.layers.LayerNormalization)
    clone = keras.layers.deserialize(keras.layers.serialize(norm))
    assert type(clone) is LayerNorm and clone.epsilon == 1e-5
    norm.build((None, 8))
    x = tf.random.stateless_normal((2, 8), seed=(0, 1)) * 3 + 1
    keras_norm = keras.layers.LayerNormalization(epsilon=1e-5)
    keras_norm.build((None, 8))
    expected = keras_norm(x)
    for training in (True, False):
        got = norm(x, training=training)
        # Normalised values of order one; statistics over 8 features.
        assert_close(got, expected, 1e-5 * math.sqrt(8), scale=1.0)
