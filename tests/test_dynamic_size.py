"""Any image size at inference: `ViT(..., dynamic_size=True)` and its
SavedModel against fixed-size models rebuilt with `with_image_size`."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import FLOAT32_PARITY, assert_close, assert_parity, fit_one_step

import keras_vit
from keras_vit.deploy.export import export_model
from keras_vit.models import position
from keras_vit.models.position import sincos_position_embedding
from keras_vit.models.resolution import nominal_image_size, with_image_size

SMALL = dict(hidden_dim=32, num_layers=1, num_heads=2, mlp_dim=64, num_classes=5)


def randomized(model: keras.Model, seed: int = 0) -> keras.Model:
    """Random weights everywhere (the head starts at zero), so that logits
    depend on every weight and on where each patch is."""
    rng = np.random.default_rng(seed)
    model.set_weights(
        [w + rng.normal(0, 0.05, w.shape).astype(w.dtype) for w in model.get_weights()]
    )
    return model


def images(size, batch=2, seed=1):
    return np.random.default_rng(seed).uniform(0, 1, (batch, *size, 3)).astype("f4")


def test_dynamic_vit_gives_the_logits_of_with_image_size_models(tmp_path):
    kwargs = dict(hidden_dim=192, num_layers=2, num_heads=3, mlp_dim=768)
    fixed = randomized(keras_vit.ViT("Ti/16", 224, num_classes=10, **kwargs))
    fixed.save_weights(tmp_path / "fixed.weights.h5")
    dynamic = keras_vit.ViT("Ti/16", 224, num_classes=10, dynamic_size=True, **kwargs)
    assert dynamic.input_shape == (None, None, None, 3)
    # Same layer names and weight shapes: the fixed model's file loads as is.
    dynamic.load_weights(tmp_path / "fixed.weights.h5")
    for size in [(224, 224), (256, 256), (320, 192)]:
        reference = fixed if size == (224, 224) else with_image_size(fixed, size)
        x = images(size)
        expected = np.asarray(reference(x))
        # Random weights: each image has its own logits.
        assert np.ptp(expected, axis=0).max() > 1e-2
        assert_parity(dynamic(x), expected, expected, FLOAT32_PARITY, f"eager {size}")
        served = dynamic.predict(x, verbose=0)
        assert_parity(served, expected, expected, FLOAT32_PARITY, f"predict {size}")


@pytest.mark.parametrize(
    "options",
    [
        dict(position_embedding="sincos", pooling="gap"),
        dict(pooling="map", num_register_tokens=2),
        dict(distilled=True, patch_norm=True),
        dict(shifted_patches=True, pooling="gap"),
    ],
)
def test_every_pooling_and_embedding_follows_the_grid(options):
    fixed = randomized(keras_vit.ViT("S/8", 32, **SMALL, **options))
    dynamic = keras_vit.ViT("S/8", 32, dynamic_size=True, **SMALL, **options)
    dynamic.set_weights(fixed.get_weights())
    for size in [(32, 32), (48, 24)]:
        reference = fixed if size == (32, 32) else with_image_size(fixed, size)
        x = images(size)
        expected = np.asarray(reference(x))
        assert_parity(dynamic(x), expected, expected, FLOAT32_PARITY, str(size))


def test_in_graph_resampling_is_tensorflows_resize():
    grid = np.random.default_rng(0).normal(0, 1, (1, 7, 5, 16)).astype("float32")
    for method in position.INTERPOLATIONS:
        for size in [(14, 14), (3, 9), (7, 5), (1, 1)]:
            expected = tf.image.resize(grid, size, method=method, antialias=False)
            # Float32 sums in another order: a few epsilons of the values.
            assert_close(position.resize_grid(grid, size, method), expected, 5e-6)


def test_sincos_table_in_the_graph_is_the_numpy_table():
    for grid in [(4, 4), (6, 3), (20, 12)]:
        # The graph's float32 sines against numpy's float64 ones, of scale 1.
        assert_close(
            position.sincos_table(grid, 32), sincos_position_embedding(grid, 32), 1e-6
        )


def test_sizes_that_are_not_patch_multiples_fail_with_the_size_and_patch():
    model = keras_vit.ViT("S/8", 32, dynamic_size=True, **SMALL)
    with pytest.raises(ValueError, match="Image size 36x32 is not divisible by patch"):
        model(np.zeros((1, 36, 32, 3), "float32"))
    graph = tf.function(
        lambda x: model(x), input_signature=[tf.TensorSpec([None, None, None, 3])]
    )
    # A graph traced for any size fails at run time (TensorFlow's reshape
    # error; keras.ops cannot word it), for every batch size: the batch is
    # never reinterpreted to absorb the extra pixels.
    for batch in (1, 8):
        with pytest.raises(tf.errors.InvalidArgumentError, match="reshape"):
            graph(tf.zeros((batch, 36, 32, 3)))


def test_keras_round_trip_fit_and_nominal_size(tmp_path):
    model = randomized(keras_vit.ViT("S/8", (32, 40), dynamic_size=True, **SMALL))
    assert nominal_image_size(model) == (32, 40)
    fit_one_step(model, images((24, 16), batch=4), np.arange(4) % 5)
    model.save(tmp_path / "dynamic.keras")
    reloaded = keras.saving.load_model(tmp_path / "dynamic.keras", safe_mode=True)
    assert nominal_image_size(reloaded) == (32, 40)
    for size in [(32, 40), (16, 64)]:
        x = images(size)
        np.testing.assert_array_equal(reloaded(x), model(x))
    # Back to a fixed size: the same numbers at that size.
    fixed = with_image_size(model, (16, 64))
    x = images((16, 64))
    assert_parity(fixed(x), model(x), model(x), FLOAT32_PARITY, "with_image_size")


def test_dynamic_hybrid_matches_with_image_size():
    options = dict(stem=(1, 1), stem_width=8, norm_groups=4, **SMALL)
    fixed = randomized(keras_vit.HybridViT("S", 32, **options))
    dynamic = keras_vit.HybridViT("S", 32, dynamic_size=True, **options)
    dynamic.set_weights(fixed.get_weights())
    assert nominal_image_size(dynamic) == (32, 32)
    for size in [(32, 32), (48, 24)]:
        reference = fixed if size == (32, 32) else with_image_size(fixed, size)
        x = images(size)
        expected = np.asarray(reference(x))
        assert_parity(dynamic(x), expected, expected, FLOAT32_PARITY, str(size))
    with pytest.raises(ValueError, match="dynamic_size=True needs a ResNet-v2 stem"):
        keras_vit.HybridViT("S", 32, stem="ResNet50", dynamic_size=True, **SMALL)


def test_feature_tokens_follow_the_size_and_grids_say_why_not():
    model = keras_vit.ViT("S/8", 32, dynamic_size=True, pooling="gap", **SMALL)
    tokens = keras_vit.feature_extractor(model, blocks=0, output="tokens")
    assert tokens(images((48, 24)))["block_0"].shape == (2, 18, 32)
    with pytest.raises(ValueError, match="dynamic-size model"):
        keras_vit.feature_extractor(model, blocks=0)


def test_xla_compiles_once_per_new_size_and_reuses_seen_ones():
    model = keras_vit.ViT("S/8", 32, dynamic_size=True, **SMALL)
    model.compile(jit_compile=True)
    seen = []
    for size in [(32, 32), (32, 32), (48, 24), (48, 24), (32, 32)]:
        model.predict(images(size), verbose=0)
        seen.append(model.predict_function.experimental_get_tracing_count())
    # TensorFlow traces a second time at the second size, with the size
    # relaxed to unknown; XLA still compiles a program per concrete shape.
    assert seen == [1, 1, 2, 2, 2]


def test_saved_model_serves_two_sizes_in_one_process(tmp_path):
    model = randomized(keras_vit.ViT("S/8", 32, dynamic_size=True, **SMALL))
    metadata = export_model(model, "dyn", tmp_path, version=1, tflite=())
    serving = metadata["signatures"]["serving_default"]
    assert serving["inputs"]["pixels"] == ["float32", [-1, -1, -1, 3]]
    assert serving["size_multiple"] == [8, 8]
    assert metadata["image_size"] == [32, 32]
    assert json.loads((tmp_path / "dyn" / "metadata.json").read_text()) == metadata
    loaded = tf.saved_model.load(str(tmp_path / "dyn" / "1"))
    signature = loaded.signatures["serving_default"]
    for size in [(32, 32), (24, 48)]:
        pixels = images(size) * 255.0
        logits = signature(pixels=tf.constant(pixels))["logits"].numpy()
        # export_model's default preprocessing: mean 0.5, std 0.5 on 0..1.
        expected = np.asarray(model((pixels / 255.0 - 0.5) / 0.5))
        assert_parity(logits, expected, expected, FLOAT32_PARITY, str(size))
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"\(batch, H, W, 3\) with H and W multiples of 8; got shape\] "
        r"\[1 32 36 3\]",
    ):
        signature(pixels=tf.zeros((1, 32, 36, 3)))
    # The bytes signature decodes and resizes to the nominal size.
    png = tf.io.encode_png(tf.cast(images((50, 70))[0] * 255, tf.uint8))
    top = loaded.signatures["classify_images"](images=tf.stack([png]))
    assert top["class_ids"].shape == (1, 5)
    with pytest.raises(ValueError, match="no .tflite"):
        export_model(model, "dyn", tmp_path, version=2, tflite=("float32",))
