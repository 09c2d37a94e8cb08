import sys

import keras
import numpy as np
import pytest
from helpers import FLOAT32_PARITY, assert_close
from PIL import Image

import keras_vit
from keras_vit.analysis import visualize
from keras_vit.models.hybrid import HybridViT


def tiny(**kwargs):
    options = dict(
        image_size=16,
        num_classes=3,
        num_channels=1,
        hidden_dim=32,
        num_layers=2,
        num_heads=4,
        mlp_dim=64,
    )
    options.update(kwargs)
    return keras_vit.ViT(options.pop("variant", "Ti/4"), **options)


def images(batch=2, size=16, channels=1, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, size, size, channels)).astype("float32")


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_attention_scores_are_the_blocks_softmax_of_q_k():
    model = tiny()
    x = images(2)
    scores = visualize.attention_scores(model, x)
    assert [s.shape for s in scores] == [(2, 4, 17, 17)] * 2
    # float32 softmax rows: sums of values of order one.
    assert_close(scores[1].sum(axis=-1), 1.0, 1e-5)

    # Block 0 by hand from the layer's weights: LN -> fused QKV -> softmax.
    tokens = np.asarray(model.get_layer("patch_encoder")(model.get_layer("patches")(x)))
    block = model.get_layer("block_0")
    normed = np.asarray(block.norm1(tokens))
    kernel, bias = (np.asarray(w) for w in block.attention.qkv.weights)
    qkv = (normed @ kernel + bias).reshape(2, 17, 3, 4, 8)
    q, k = qkv[:, :, 0], qkv[:, :, 1]
    expected = softmax(np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(8))
    # Keras' kernels against float32 numpy: reassociation of probabilities.
    assert_close(scores[0], expected, FLOAT32_PARITY, scale=1.0)


def test_attention_maps_are_the_class_token_row_of_each_head():
    model = tiny()
    x = images(1)
    scores = visualize.attention_scores(model, x)
    maps = visualize.attention_maps(model, x[0], block=0)
    assert maps.shape == (4, 4, 4)
    np.testing.assert_allclose(maps, scores[0][0, :, 0, 1:].reshape(4, 4, 4))
    last = visualize.attention_maps(model, x[0])  # block=-1: the last block
    np.testing.assert_allclose(last, scores[1][0, :, 0, 1:].reshape(4, 4, 4))
    with pytest.raises(ValueError, match=r"block 2 is out of range .* -2\.\.1"):
        visualize.attention_maps(model, x[0], block=2)


def test_rollout_of_one_block_is_its_head_mean_class_row():
    # With one block, (A + I) / 2 only adds to the class token's own entry,
    # so the patch part of row 0 is proportional to the head-mean attention.
    model = tiny(num_layers=1)
    x = images(1)
    rollout = visualize.attention_rollout(model, x[0])
    mean_row = visualize.attention_scores(model, x)[0][0].mean(axis=0)[0, 1:]
    assert rollout.shape == (4, 4)
    assert rollout.sum() == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_allclose(rollout.ravel(), mean_row / mean_row.sum(), rtol=1e-5)


def test_rollout_multiplies_the_residual_mixed_blocks_in_order():
    model = tiny(num_layers=3)
    x = images(1)
    mixed = []
    for s in visualize.attention_scores(model, x):
        a = 0.5 * s[0].astype("float64").mean(axis=0) + 0.5 * np.eye(17)
        mixed.append(a)
    joint = mixed[2] @ mixed[1] @ mixed[0]
    expected = joint[0, 1:] / joint[0, 1:].sum()
    rollout = visualize.attention_rollout(model, x[0])
    np.testing.assert_allclose(rollout.ravel(), expected, rtol=1e-5)
    assert (rollout > 0).all()


def test_gap_model_without_class_token_pools_over_patch_queries():
    model = tiny(pooling="gap", position_embedding="sincos")
    x = images(1)
    scores = visualize.attention_scores(model, x)
    assert scores[0].shape == (1, 4, 16, 16)
    maps = visualize.attention_maps(model, x[0], block=0)
    np.testing.assert_allclose(
        maps.reshape(4, 16), scores[0][0].mean(axis=1), rtol=1e-6
    )
    assert visualize.attention_rollout(model, x[0]).sum() == pytest.approx(1.0)


def test_position_embedding_similarity_grid():
    model = tiny(pooling="gap", position_embedding="sincos", image_size=32)
    similarity = visualize.position_embedding_similarity(model)
    assert similarity.shape == (8, 8, 8, 8)
    flat = similarity.reshape(64, 64)
    # Cosines in float32: a few epsilons of one.
    assert_close(np.diag(flat), 1.0, 1e-5)
    assert_close(flat, flat.T, 1e-6, scale=1.0)
    # The fixed sin-cos table is smooth: a neighbour is more alike than the
    # far corner.
    assert similarity[0, 0, 0, 1] > similarity[0, 0, 7, 7]
    # Learned tables skip the class token's entry.
    learned = visualize.position_embedding_similarity(tiny())
    table = np.asarray(tiny().get_layer("patch_encoder").pos_embedding)
    assert learned.shape == (4, 4, 4, 4) and table.shape[1] == 17


def test_mean_attention_distance_of_uniform_attention_is_the_mean_pair_distance():
    model = tiny(image_size=24, variant="Ti/8")  # 3x3 grid of 8-pixel patches
    for i in range(2):
        qkv = model.get_layer(f"block_{i}").attention.qkv
        qkv.set_weights([np.zeros_like(w) for w in qkv.get_weights()])
    distance = visualize.mean_attention_distance(model, images(3, size=24))
    centres = [(8 * r + 4, 8 * c + 4) for r in range(3) for c in range(3)]
    pairs = [np.hypot(a[0] - b[0], a[1] - b[1]) for a in centres for b in centres]
    assert distance.shape == (2, 4)
    np.testing.assert_allclose(distance, np.mean(pairs), rtol=1e-6)


def test_pngs_open_as_images_and_the_model_is_left_unchanged(tmp_path):
    model = tiny()
    x = images(4)
    before = model.predict(x, verbose=0)
    nodes = len(model.get_layer("block_0")._inbound_nodes)
    visualize.attention_maps(model, x[0], save_to=tmp_path / "maps.png")
    visualize.attention_rollout(model, x[0], save_to=tmp_path / "rollout.png")
    visualize.position_embedding_similarity(model, save_to=tmp_path / "pos.png")
    visualize.mean_attention_distance(model, x, save_to=tmp_path / "distance.png")
    for name in ("maps", "rollout", "pos", "distance"):
        with Image.open(tmp_path / f"{name}.png") as png:
            assert png.format == "PNG" and min(png.size) > 50
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "distance.png",
        "maps.png",
        "pos.png",
        "rollout.png",
    ]
    assert len(model.get_layer("block_0")._inbound_nodes) == nodes
    np.testing.assert_array_equal(model.predict(x, verbose=0), before)


def test_hybrid_model():
    model = HybridViT(
        "Ti",
        image_size=32,
        num_classes=3,
        stem=(1,),
        stem_width=8,
        norm_groups=4,
        hidden_dim=32,
        num_layers=2,
        num_heads=2,
        mlp_dim=64,
    )
    rows, cols = visualize.grid_size(model)
    assert (rows, cols) == (8, 8)
    x = np.random.default_rng(0).standard_normal((1, 32, 32, 3)).astype("float32")
    scores = visualize.attention_scores(model, x)
    assert [s.shape for s in scores] == [(1, 2, 65, 65)] * 2
    rollout = visualize.attention_rollout(model, x[0])
    assert rollout.shape == (8, 8) and rollout.sum() == pytest.approx(1.0)
    assert visualize.mean_attention_distance(model, x).shape == (2, 2)
    assert visualize.position_embedding_similarity(model).shape == (8, 8, 8, 8)


def test_bad_inputs_are_clear_errors(tmp_path):
    model = tiny()
    with pytest.raises(
        ValueError, match=r"shape \(16, 16, 3\) do not fit .* \(16, 16, 1\)"
    ):
        visualize.attention_rollout(model, np.zeros((16, 16, 3)))
    with pytest.raises(ValueError, match="takes one image, got a batch of 2"):
        visualize.attention_rollout(model, images(2))
    with pytest.raises(
        ValueError, match=r"save_to must be a \.png path, got '.*maps\.jpg'"
    ):
        visualize.attention_maps(model, images(1)[0], save_to=tmp_path / "maps.jpg")
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="no 'patch_encoder' layer"):
        visualize.attention_scores(plain, np.zeros((1, 4)))


def test_png_without_matplotlib_says_how_to_install_it(monkeypatch, tmp_path):
    model = tiny()
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install \"keras-vit-tf\[viz\]\""):
        visualize.attention_rollout(model, images(1)[0], save_to=tmp_path / "r.png")
    # The arrays need no matplotlib.
    assert visualize.attention_rollout(model, images(1)[0]).shape == (4, 4)
    assert not list(tmp_path.iterdir())
