import keras
import numpy as np
import pytest
from helpers import (
    FLOAT32_PARITY,
    TFLITE_FLOAT32_PARITY,
    assert_close,
    check_config_round_trip,
    check_reloads_in_fresh_process,
    near_ties,
    parity_bound,
)

from keras_vit.analysis.flops import count_macs, vit_macs, vit_parameter_count
from keras_vit.deploy.export import export_model
from keras_vit.models.blocks import MultiHeadSelfAttention, TransformerBlock
from keras_vit.models.vit import ViT
from keras_vit.training import pruning

TI = dict(variant="Ti/16", image_size=32, num_classes=10)
D, HEAD_DIM, MLP_DIM, LAYERS, TOKENS = 192, 64, 768, 12, 5


def _random_model(**kwargs):
    keras.utils.set_random_seed(0)
    model = ViT(**kwargs)
    rng = np.random.default_rng(0)
    # The head starts at zero; random weights everywhere make the scores and
    # the outputs informative.
    for weight in model.weights:
        weight.assign(rng.normal(0, 0.05, weight.shape).astype("float32"))
    return model


def _block_params(heads: int, units: int) -> int:
    inner = heads * HEAD_DIM
    attention = D * 3 * inner + 3 * inner + inner * D + D
    return 2 * D + attention + 2 * D + D * units + units + units * D + D


def _block_macs(heads: int, units: int) -> int:
    inner = heads * HEAD_DIM
    return (
        TOKENS * D * 3 * inner
        + 2 * TOKENS * TOKENS * inner
        + TOKENS * inner * D
        + 2 * TOKENS * D * units
    )


@pytest.fixture(scope="module")
def halved():
    model = _random_model(**TI)
    rng = np.random.default_rng(1)
    images = rng.normal(size=(16, 32, 32, 3)).astype("float32")
    labels = rng.integers(0, 10, 16)
    pruned, removed = pruning.prune(model, images, labels, 0.5, 0.5)
    return model, pruned, removed, images


def test_half_heads_and_units_removed_from_ti_give_the_implied_counts(halved):
    model, pruned, removed, _ = halved
    blocks = pruning.transformer_blocks(pruned)
    heads = [b.num_heads for b in blocks]
    units = [b.mlp_dim for b in blocks]
    assert sum(heads) == 18 and sum(units) == 12 * MLP_DIM // 2
    assert [3 - len(v) for v in removed["heads"].values()] == heads
    assert all(b.attention.head_dim == HEAD_DIM for b in blocks)

    full_params = vit_parameter_count(**TI)
    full_macs = vit_macs(**TI)
    assert model.count_params() == full_params
    assert count_macs(model) == full_macs
    saved_params = sum(
        _block_params(3, MLP_DIM) - _block_params(h, m)
        for h, m in zip(heads, units, strict=True)
    )
    saved_macs = sum(
        _block_macs(3, MLP_DIM) - _block_macs(h, m)
        for h, m in zip(heads, units, strict=True)
    )
    assert pruned.count_params() == full_params - saved_params
    assert count_macs(pruned) == full_macs - saved_macs


def test_pruned_model_equals_the_masked_original(halved):
    model, pruned, removed, images = halved
    masked = keras.models.clone_model(model)
    masked.set_weights(model.get_weights())
    for block in pruning.transformer_blocks(masked):
        proj = block.attention.proj.kernel.numpy()
        for head in removed["heads"][block.name]:
            proj[head * HEAD_DIM : (head + 1) * HEAD_DIM] = 0
        block.attention.proj.kernel.assign(proj)
        fc2 = block.mlp.fc2.kernel.numpy()
        fc2[removed["units"][block.name]] = 0
        block.mlp.fc2.kernel.assign(fc2)
    expected = np.asarray(masked(images))
    # Same products minus exact zeros; only the summation order differs.
    assert_close(pruned(images), expected, FLOAT32_PARITY)


@pytest.mark.slow
def test_pruned_model_reloads_in_a_fresh_process_and_exports(halved, tmp_path):
    _, pruned, _, images = halved
    check_reloads_in_fresh_process(pruned, images[:4], tmp_path)
    pixels = np.random.default_rng(2).uniform(0, 255, (8, 32, 32, 3))
    metadata = export_model(
        pruned,
        "pruned",
        tmp_path / "export",
        preprocessing={"mean": 0.5, "std": 0.5, "pixel_scale": 255.0},
        tflite=("float32",),
        verify_images=pixels.astype("float32"),
    )
    logits = np.asarray(pruned((pixels / 255.0 - 0.5) / 0.5, training=False))
    tolerance = parity_bound(logits, TFLITE_FLOAT32_PARITY)
    ties = near_ties(logits, tolerance)
    for artifact in ("saved_model", "tflite_float32"):
        parity = metadata["parity"][artifact]
        assert parity["top1_agreement"] >= 1 - ties / len(pixels), (artifact, parity)
        # float32 reorderings, TFLite's fusions included (helpers).
        assert parity["max_abs_diff_logits"] <= tolerance, (artifact, parity)


def test_block_with_head_dim_round_trips_its_config():
    block = TransformerBlock(2, 48, head_dim=64)
    block.build((None, 5, 192))
    assert block.attention.qkv.kernel.shape == (192, 3 * 128)
    assert block.attention.proj.kernel.shape == (128, 192)
    assert check_config_round_trip(block)["head_dim"] == 64
    attention = MultiHeadSelfAttention(3)
    attention.build((None, 5, 192))
    assert attention.head_dim == 64
    assert check_config_round_trip(attention)["head_dim"] is None


def test_removing_every_head_of_a_block_names_the_count():
    model = ViT("Ti/4", 8, 10, num_channels=1, hidden_dim=48, num_layers=1)
    with pytest.raises(ValueError, match=r"block_0 has 3 heads; cannot remove 3 "):
        pruning.remove(model, heads={"block_0": [0, 1, 2]})
    with pytest.raises(ValueError, match=r"block_0 has 3 heads \(0\.\.2\); .*\[5\]"):
        pruning.remove(model, heads={"block_0": [5]})
    with pytest.raises(ValueError, match=r"`head_fraction` must be in \[0, 1\), got 1"):
        pruning.select({"block_0": (np.ones(3), np.ones(8))}, 1, 0.1)


@pytest.mark.slow
def test_prune_command_writes_a_smaller_model(tmp_path, capsys):
    import json

    from keras_vit import cli

    model = ViT(
        "Ti/4", 16, 10, num_channels=1, hidden_dim=32, num_layers=2, num_heads=4
    )
    model.save(tmp_path / "model.keras")
    out = tmp_path / "pruned.keras"
    status = cli.main(
        ["prune", str(tmp_path / "model.keras"), "--recipe", "prune_digits"]
        + ["--output", str(out), "--fraction", "0.25", "--finetune-steps", "2"]
        + ["--calibration-images", "16"]
    )
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    pruned = keras.saving.load_model(out)
    assert [b.num_heads for b in pruning.transformer_blocks(pruned)] == report["heads"]
    assert sum(report["heads"]) == 6 and sum(report["mlp_dims"]) == 2 * 768 * 3 // 4
    assert pruned.count_params() == report["params"] < report["source_params"]
    assert 0.0 <= report["accuracy_finetuned"] <= 1.0


def test_finetune_learns_from_the_recipe_teacher(tmp_path):
    import dataclasses

    from keras_vit.training.recipes import load_recipe

    model = ViT(
        "Ti/4", 16, 10, num_channels=1, hidden_dim=32, num_layers=1, num_heads=2
    )
    model.save(tmp_path / "teacher.keras")
    config = load_recipe("prune_digits", {"model.pretrained": ""})
    before = [w.numpy() for w in model.trainable_weights]
    # Teaching itself with the whole loss on the soft targets, the model's KL
    # to the teacher and its gradient are zero: no weight may move. Without
    # the teacher the same steps follow the labels and do move them.
    taught = dataclasses.replace(
        config,
        distill=dataclasses.replace(
            config.distill, teacher=str(tmp_path / "teacher.keras"), weight=1.0
        ),
    )
    pruning.finetune(model, taught, steps=2)
    for old, new in zip(before, model.trainable_weights, strict=True):
        np.testing.assert_array_equal(old, new.numpy())
    untaught = dataclasses.replace(
        config, distill=dataclasses.replace(config.distill, teacher="")
    )
    pruning.finetune(model, untaught, steps=2)
    moved = [
        not np.array_equal(old, new.numpy())
        for old, new in zip(before, model.trainable_weights, strict=True)
    ]
    assert any(moved)


def test_ablation_removes_the_head_whose_removal_costs_least():
    model = _random_model(**TI, num_layers=2)
    rng = np.random.default_rng(2)
    images = rng.normal(size=(8, 32, 32, 3)).astype("float32")
    labels = rng.integers(0, 10, 8)
    before = [w.numpy().copy() for w in model.weights]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    losses = {
        (name, head): float(
            loss_fn(labels, pruning.remove(model, {name: [head]})(images))
        )
        for name in ("block_0", "block_1")
        for head in range(3)
    }
    # One of six heads: the greedy search is exhaustive for a single head.
    chosen = pruning.ablated_heads(model, images, labels, 1 / 6, batch_size=4)
    cheapest = min(losses, key=losses.get)
    assert chosen == {
        name: [cheapest[1]] if name == cheapest[0] else [] for name in chosen
    }
    assert all(
        np.array_equal(a, w.numpy()) for a, w in zip(before, model.weights, strict=True)
    )
    # A fraction beyond what may go still leaves one head in every block.
    assert [
        len(v) for v in pruning.ablated_heads(model, images, labels, 0.9).values()
    ] == [2, 2]
    with pytest.raises(ValueError, match="'magnitude'"):
        pruning.prune(model, images, labels, head_criterion="magnitude")
