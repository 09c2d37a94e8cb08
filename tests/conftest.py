import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import pytest  # noqa: E402


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
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    import keras_vit

    digits = load_digits()
    pixels = digits.images * (255.0 / 16.0)
    pixels = np.kron(pixels, np.ones((2, 2)))[..., None].astype("float32")
    images = (pixels / 255.0 - 0.5) / 0.5
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
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
