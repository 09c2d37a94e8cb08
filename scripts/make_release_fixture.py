"""Writes tests/fixtures/release_0.1.0/: `.keras` files saved by the previous
release of keras_vit (0.1.0, commit 0c448ed, the flat layout before the
subpackages) and the outputs that release computed, so that
tests/test_release_compat.py can check that the current package still loads
them and computes the same logits.

It must run against the old code, not this checkout:

    git worktree add /tmp/keras_vit_0.1.0 0c448ed
    PYTHONPATH=/tmp/keras_vit_0.1.0 KERAS_BACKEND=tensorflow \
        python scripts/make_release_fixture.py tests/fixtures/release_0.1.0
    git worktree remove /tmp/keras_vit_0.1.0

Every weight is overwritten with seeded random values (the head starts at
zero, and a zero head would hide any difference in the layers below it).
The models are tiny (a few thousand parameters) and use the options whose
layers carry state of their own: learned position embedding and class token,
LayerScale, DropPath, a pre-logits layer, and the ResNet-v2 stem's StdConv2D
and GroupNorm.
"""

import json
import sys
from pathlib import Path

import keras
import numpy as np

import keras_vit

SEED = 0
RELEASE = "0.1.0"


def randomize(model: keras.Model, rng: np.random.Generator) -> None:
    """Seeded random weights of a size that keeps every activation O(1)."""
    for variable in model.weights:
        shape = tuple(variable.shape)
        if len(shape) >= 2:
            scale = 1.0 / np.sqrt(np.prod(shape[:-1]))
            values = rng.standard_normal(shape) * scale
        else:
            values = rng.standard_normal(shape) * 0.2
            if variable.name in ("gamma", "scale"):
                values += 1.0
        variable.assign(values.astype(variable.dtype))


def build_models() -> dict[str, keras.Model]:
    vit = keras_vit.ViT(
        "Ti/4",
        image_size=16,
        num_classes=5,
        num_channels=3,
        hidden_dim=32,
        num_layers=2,
        num_heads=2,
        mlp_dim=64,
        representation_size=16,
        layer_scale_init=0.1,
        drop_path_rate=0.1,
        name="release_vit",
    )
    hybrid = keras_vit.HybridViT(
        "Ti",
        image_size=32,
        num_classes=4,
        stem=(1, 1),
        stem_width=8,
        norm_groups=4,
        hidden_dim=32,
        num_layers=1,
        num_heads=2,
        mlp_dim=64,
        name="release_hybrid_vit",
    )
    return {"vit": vit, "hybrid": hybrid}


def main(out: str) -> int:
    if keras_vit.__version__ != RELEASE:
        print(
            f"keras_vit {keras_vit.__version__} from {keras_vit.__file__} is not "
            f"release {RELEASE}: put a checkout of commit 0c448ed first on "
            "PYTHONPATH (see this script's docstring)",
            file=sys.stderr,
        )
        return 2
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(SEED)
    rng = np.random.default_rng(SEED)
    expected = {}
    for key, model in build_models().items():
        randomize(model, rng)
        images = rng.uniform(-1.0, 1.0, (3, *model.input_shape[1:])).astype("float32")
        expected[f"{key}_images"] = images
        expected[f"{key}_logits"] = np.asarray(model(images, training=False))
        model.save(out_dir / f"{key}.keras")
    np.savez(out_dir / "expected.npz", **expected)
    (out_dir / "source.json").write_text(
        json.dumps(
            {
                "keras_vit": RELEASE,
                "commit": "0c448ed",
                "keras": keras.__version__,
                "seed": SEED,
            },
            indent=2,
        )
        + "\n"
    )
    for name in sorted(p.name for p in out_dir.iterdir()):
        print(f"wrote {out_dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "release_fixture"))
