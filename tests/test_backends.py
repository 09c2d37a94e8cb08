"""The layers are written with keras.ops only, so they run on any backend."""

import importlib.util
import re

import numpy as np
import pytest
from helpers import REPO, run_python

import keras_vit

OTHER_BACKENDS = [name for name in ("jax", "torch") if importlib.util.find_spec(name)]


def test_layers_and_vit_builder_use_no_tensorflow():
    for module in (
        "layers.py",
        "blocks.py",
        "sublayers.py",
        "vit.py",
        "hybrid.py",
        "resolution.py",
        "position.py",
    ):
        source = (REPO / "keras_vit" / "models" / module).read_text()
        assert not re.search(r"\btf\.|import tensorflow", source), module


@pytest.mark.slow
@pytest.mark.skipif(not OTHER_BACKENDS, reason="neither jax nor torch is installed")
@pytest.mark.parametrize("backend", OTHER_BACKENDS or ["none"])
def test_a_tensorflow_trained_model_runs_the_same_on_another_backend(backend, tmp_path):
    model = keras_vit.ViT(
        "Ti/4",
        image_size=(8, 12),
        num_classes=3,
        hidden_dim=16,
        num_layers=2,
        num_heads=2,
        mlp_dim=32,
        distilled=True,
        layer_scale_init=0.1,
        patch_norm=True,
    )
    x = np.random.default_rng(0).normal(size=(2, 8, 12, 3)).astype("float32")
    model.save(tmp_path / "m.keras")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "expected.npy", np.asarray(model(x)))
    run_python(
        """
        import sys
        from pathlib import Path
        import keras
        import numpy as np
        assert keras.backend.backend() == sys.argv[2], keras.backend.backend()
        import keras_vit
        sys.path.insert(0, "tests")
        from helpers import FLOAT32_PARITY, assert_close, check_config_round_trip
        d = Path(sys.argv[1])
        model = keras.saving.load_model(d / "m.keras", safe_mode=True)
        x = np.load(d / "x.npy")
        out = keras.ops.convert_to_numpy(model(x))
        # Another backend's kernels: float32 reassociation (helpers).
        assert_close(out, np.load(d / "expected.npy"), FLOAT32_PARITY)
        for layer in model.layers:
            if type(layer).__module__ == "keras_vit.models.layers":
                check_config_round_trip(layer)
        # Training-mode paths: dropout, stochastic depth, attention scores.
        block = keras_vit.TransformerBlock(2, 16, drop_path_rate=0.5,
                                           attention_dropout_rate=0.1)
        y, scores = block(np.ones((4, 5, 8), "float32"), training=True,
                          return_attention_scores=True)
        assert tuple(scores.shape) == (4, 2, 5, 5)
        print("ok", keras.backend.backend())
        """,
        str(tmp_path),
        backend,
        env={"KERAS_BACKEND": backend},
    )
