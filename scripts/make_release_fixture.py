"""Writes tests/fixtures/release_<version>/: `.keras` files saved by a
released keras_vit and the outputs that release computed, so that
tests/test_release_compat.py can check that the current package still loads
them and computes the same logits.

It must run against the released code, not this checkout:

    git worktree add ../keras_vit_release <commit>
    PYTHONPATH=../keras_vit_release KERAS_BACKEND=tensorflow \
        python scripts/make_release_fixture.py tests/fixtures/release_<version> \
        <commit>
    git worktree remove ../keras_vit_release

Releases so far: 0.1.0 (commit 0c448ed, the flat layout before the
subpackages) and 0.2.0 (commit 5abf189, the last one whose old module paths
such as `keras_vit.models.layers.TransformerBlock` re-exported their layers).

Every weight is overwritten with seeded random values (the head starts at
zero, and a zero head would hide any difference in the layers below it).
The models are tiny (a few thousand parameters) and use the options whose
layers carry state of their own: learned position embedding and class token,
LayerScale, DropPath, a pre-logits layer, and the ResNet-v2 stem's StdConv2D
and GroupNorm; from 0.2.0 on also a MAP head and register tokens.
"""

import json
import sys
from pathlib import Path

import keras
import numpy as np

import keras_vit

SEED = 0


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


def build_models(release: str) -> dict[str, keras.Model]:
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
    models = {"vit": vit, "hybrid": hybrid}
    if release != "0.1.0":
        # Layers 0.1.0 did not have: the MAP pooling head, register tokens.
        models["vit_map"] = keras_vit.ViT(
            "Ti/4",
            image_size=(16, 8),
            num_classes=3,
            hidden_dim=32,
            num_layers=1,
            num_heads=2,
            mlp_dim=64,
            pooling="map",
            num_register_tokens=2,
            name="release_vit_map",
        )
    return models


def main(out: str, commit: str) -> int:
    release = keras_vit.__version__
    out_dir = Path(out)
    if out_dir.name != f"release_{release}":
        print(
            f"keras_vit {release} from {keras_vit.__file__} writes "
            f"release_{release}, not {out_dir.name}: put a checkout of that "
            "release first on PYTHONPATH (see this script's docstring)",
            file=sys.stderr,
        )
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(SEED)
    rng = np.random.default_rng(SEED)
    expected = {}
    for key, model in build_models(release).items():
        randomize(model, rng)
        images = rng.uniform(-1.0, 1.0, (3, *model.input_shape[1:])).astype("float32")
        expected[f"{key}_images"] = images
        expected[f"{key}_logits"] = np.asarray(model(images, training=False))
        model.save(out_dir / f"{key}.keras")
    np.savez(out_dir / "expected.npz", **expected)
    (out_dir / "source.json").write_text(
        json.dumps(
            {
                "keras_vit": release,
                "commit": commit,
                "keras": keras.__version__,
                "seed": SEED,
                "models": sorted(
                    k.removesuffix("_logits") for k in expected if k.endswith("_logits")
                ),
            },
            indent=2,
        )
        + "\n"
    )
    for name in sorted(p.name for p in out_dir.iterdir()):
        print(f"wrote {out_dir / name}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(
            "usage: make_release_fixture.py tests/fixtures/release_<version> <commit>",
            file=sys.stderr,
        )
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
