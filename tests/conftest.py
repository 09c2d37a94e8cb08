import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    # The AVX2 stand-in on AVX-512 machines (keras_vit.hardware explains).
    from keras_vit.hardware import bfloat16_refused_by_onednn

    if not bfloat16_refused_by_onednn():
        return
    skip = pytest.mark.skip(
        reason="bfloat16 under a oneDNN ISA cap below bfloat16 on a bfloat16 CPU: "
        "TensorFlow sends it to oneDNN anyway, which aborts (the AVX2 stand-in "
        "cannot run bfloat16; a real AVX2 CPU can)"
    )
    for item in items:
        if "bf16" in item.nodeid or "bfloat16" in item.nodeid:
            item.add_marker(skip)
        elif item.get_closest_marker("bfloat16"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _float32_policy():
    """Each test starts and ends under the float32 policy."""
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.fixture(scope="session")
def digits_model():
    """A small ViT trained on scikit-learn's digits, shared by export and
    visualisation tests: (model, x_test, y_test, labels). Images are 16x16x1
    floats normalised as (pixels / 255 - 0.5) / 0.5."""
    import numpy as np

    import keras_vit
    from keras_vit.training.sources import digits_arrays

    def upsampled(pixels):  # 8x8 -> 16x16, each pixel repeated 2x2
        pixels = np.kron(pixels[..., 0], np.ones((2, 2)))[..., None]
        return ((pixels / 255.0 - 0.5) / 0.5).astype("float32")

    split = digits_arrays()
    x_train, x_test = upsampled(split["x_train"]), upsampled(split["x_eval"])
    y_train, y_test = split["y_train"], split["y_eval"]
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(
        "Ti/4",
        image_size=16,
        num_classes=10,
        num_channels=1,
        hidden_dim=64,
        num_layers=2,
        num_heads=4,
        mlp_dim=128,
    )
    model.compile(
        optimizer=keras.optimizers.AdamW(2e-3, weight_decay=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(x_train, y_train, batch_size=64, epochs=40, verbose=0)
    labels = [str(i) for i in range(10)]
    return model, x_test, y_test, labels
