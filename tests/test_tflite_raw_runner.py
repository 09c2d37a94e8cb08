"""Every `.tflite` kind keras_vit writes, for every model kind (a ViT, one
with shifted patches, a hybrid with a convolutional stem, a plain
CNN), converts to builtin ops and refuses a wrong input by itself: run
through LiteRT's own signature runner (what a phone app calls), not
keras_vit's `tflite.Runner`, a wrong channel count, height, width, rank or
dtype is an error, never an answer."""

import keras
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

from keras_vit.deploy import int16, tflite
from keras_vit.deploy.qat import int8_tflite
from keras_vit.deploy.signatures import write_saved_model
from keras_vit.models import qat
from keras_vit.models.cnn import SmallCNN
from keras_vit.models.hybrid import HybridViT
from keras_vit.models.precision import computes_in_float32, float32_copy
from keras_vit.models.preprocessing import normalize_pixels, normalize_preprocessing
from keras_vit.models.vit import ViT

SIZE, CHANNELS, CLASSES = 8, 1, 4
LABELS = [str(i) for i in range(CLASSES)]
ALL_KINDS = (*tflite.KINDS, "qat_int8")
# Shapes a careless caller passes to a (-1, 8, 8, 1) model. Each one holds a
# whole number of 8x8 patches, so the model's own reshapes would turn it into
# several images or a shuffled one without the in-graph guard.
WRONG_SHAPES = [
    (1, SIZE, SIZE, 3),
    (1, SIZE, SIZE, 2),
    (2, SIZE, SIZE, 2),
    (1, SIZE // 2, SIZE * 2, CHANNELS),
    (1, SIZE * 2, SIZE // 2, CHANNELS),
    (1, SIZE * 2, SIZE * 2, CHANNELS),
    (1, SIZE, SIZE // 2, 2),
    (1, 1, SIZE, SIZE),
    (1, SIZE, SIZE),
    (SIZE, SIZE, CHANNELS),
]


TINY_TRANSFORMER = dict(hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32)


def tiny_vit(**options):
    return ViT(
        "Ti/4",
        image_size=SIZE,
        num_classes=CLASSES,
        num_channels=CHANNELS,
        **TINY_TRANSFORMER,
        **options,
    )


# A convolution on the input needs its channel count known to the converter
# (a hybrid's and a CNN's first layer); a ViT cuts patches by reshaping.
MODEL_KINDS = {
    "vit": tiny_vit,
    # Shifted patch tokenisation: pads, slices and concatenates the image.
    "vit_spt": lambda: tiny_vit(shifted_patches=True, patch_norm=True),
    "hybrid": lambda: HybridViT(
        "Ti",
        image_size=SIZE,
        num_classes=CLASSES,
        num_channels=CHANNELS,
        stem="cnn",
        cnn_widths=(4, 8),
        **TINY_TRANSFORMER,
    ),
    "cnn": lambda: SmallCNN(
        SIZE, CLASSES, widths=(4, 8), num_channels=CHANNELS, name="tiny_cnn"
    ),
    # Trained under mixed bfloat16 (the automatic precision on CPUs with
    # AVX512_BF16 or AMX): every file is made from its float32 twin.
    "vit_bf16": lambda: under_policy("mixed_bfloat16", tiny_vit),
}


def under_policy(policy: str, build):
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        return build()
    finally:
        keras.mixed_precision.set_global_policy(previous)


def pixels(shape, dtype="float32", seed=0):
    return np.random.default_rng(seed).uniform(0, 255, shape).astype(dtype)


@pytest.fixture(scope="module", params=list(MODEL_KINDS))
def files(request, tmp_path_factory):
    """Each kind's flatbuffer, and the Keras model they came from."""
    keras.utils.set_random_seed(0)
    model = MODEL_KINDS[request.param]()
    preprocessing = normalize_preprocessing(model, None)
    root = tmp_path_factory.mktemp("raw_runner")
    write_saved_model(model, root / "saved", LABELS, preprocessing)
    int16.write_source(model, root / "int16", LABELS, preprocessing, 4, 1 << 20)
    calibration = pixels((32, SIZE, SIZE, CHANNELS), seed=1)
    found = {}
    for kind in tflite.KINDS:
        source = root / ("int16" if kind == "int16x8" else "saved")
        found[kind] = tflite.convert(source, kind, calibration)
    if not computes_in_float32(model):
        # From here the float32 twin the files were made from: the float kinds
        # are compared with it (tests/test_precision.py bounds it against the
        # model), and QAT trains in float32 (test_qat refuses a bfloat16 one).
        model = float32_copy(model)
    found["qat_int8"] = int8_tflite(qat.quantize_aware(model), calibration)
    return found, model, preprocessing


def raw_runner(content):
    return Interpreter(model_content=content).get_signature_runner("serving_default")


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_builtin_ops_only(files, kind):
    tflite.check_builtin_only(files[0][kind])


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_right_shape_answers_one_row_per_image(files, kind):
    content, model, preprocessing = files[0][kind], files[1], files[2]
    batch = pixels((3, SIZE, SIZE, CHANNELS), seed=2)
    got = raw_runner(content)(pixels=batch)
    assert got["probabilities"].shape == (3, CLASSES)
    if kind in ("float32", "float16"):
        # The guard changes no value: the float kinds still match Keras, to
        # 1e-2 of the logits' scale (float16 weights round at 1e-3).
        expected = np.asarray(model(normalize_pixels(batch, preprocessing)))
        scale = np.max(np.abs(expected))
        assert np.max(np.abs(got["logits"] - expected)) <= 1e-2 * scale


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("shape", WRONG_SHAPES, ids=str)
def test_wrong_shape_is_an_error_not_an_answer(files, kind, shape):
    runner = raw_runner(files[0][kind])
    with pytest.raises((RuntimeError, ValueError)) as raised:
        runner(pixels=pixels(shape))
    # A graph error (the guard's GATHER, or the shape SUB for another rank),
    # not some failure after the model computed an answer.
    assert "gather index out of bounds" in str(raised.value) or (
        "not broadcastable" in str(raised.value)
    )


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("dtype", ["int32", "uint8", "float64", "int8"])
def test_wrong_dtype_is_an_error(files, kind, dtype):
    runner = raw_runner(files[0][kind])
    with pytest.raises(ValueError, match="Cannot set tensor"):
        runner(pixels=pixels((1, SIZE, SIZE, CHANNELS), dtype))


@pytest.mark.parametrize("kind", ["float32", "int8"])
def test_runner_still_answers_after_a_refused_call(files, kind):
    """A refused call leaves the interpreter usable for the next right one."""
    runner = raw_runner(files[0][kind])
    with pytest.raises(RuntimeError):
        runner(pixels=pixels((1, SIZE, SIZE, 3)))
    got = runner(pixels=pixels((2, SIZE, SIZE, CHANNELS)))
    assert got["probabilities"].shape == (2, CLASSES)
