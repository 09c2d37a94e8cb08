"""The fine-tuning recipes (recipes/finetune_*.py) through the one
trainer: a converted checkpoint fine-tuned on the digits (linear probe and
full), and a resolution change that keeps the held-out accuracy."""

from pathlib import Path

import keras
import numpy as np
import pytest

from keras_vit.training import trainer as training
from keras_vit.training.finetune import LayerDecayAdamW
from keras_vit.training.optimizer import make_optimizer
from keras_vit.training.recipes import load_recipe
from keras_vit.training.sources import digits_arrays

FIXTURES = Path(__file__).parent / "fixtures"
CHANCE_LOSS = float(np.log(10.0))  # a zero head on 10 classes


def digits_rgb_arrays():
    """The digits split of the trainer, as three-channel 0..255 pixels."""
    split = digits_arrays()
    for key in ("x_train", "x_eval"):
        split[key] = np.repeat(split[key], 3, axis=-1)
    return split


def finetune_converted(recipe, tmp_path, **overrides):
    """The recipe started from the timm fixture (a ViT with patch 8, 64 wide,
    2 blocks, 7 classes, global average pooling) at 32x32, for 60 steps."""
    config = load_recipe(
        recipe,
        {
            "model.pretrained": str(FIXTURES / "timm_vit_avg"),
            "model.image_size": "32",
            "data.source": "arrays",
            "data.num_channels": "3",
            "total_steps": "60",
            "checkpoint_every": "20",
            "optim.warmup_steps": "5",
            "run_dir": str(tmp_path / recipe),
            "verbose": "0",
            **overrides,
        },
    )
    config.data.arrays = digits_rgb_arrays()
    start = training.build_model(config, num_classes=10)
    metadata = training.train(config)
    return start, metadata


def train_losses(metadata):
    rows = (Path(metadata["run_dir"]) / "history.csv").read_text().splitlines()
    column = rows[0].split(",").index("loss")
    return [float(row.split(",")[column]) for row in rows[1:]]


@pytest.mark.slow
def test_converted_checkpoint_linear_probe_trains_only_the_head(tmp_path):
    start, metadata = finetune_converted("finetune_digits_probe", tmp_path)
    model = metadata["model"]
    assert model.input_shape == (None, 32, 32, 3) and model.output_shape == (None, 10)
    assert [v.path for v in model.trainable_variables] == ["head/kernel", "head/bias"]
    for name in ("patch_encoder", "block_1", "encoder_norm"):
        for before, after in zip(
            start.get_layer(name).get_weights(),
            model.get_layer(name).get_weights(),
            strict=True,
        ):
            np.testing.assert_array_equal(before, after)
    losses = train_losses(metadata)
    print(f"probe: train loss {losses}, eval loss {metadata['eval_loss']:.3f}")
    # The fixture's weights are random, so its features are weak: the head
    # learns slowly (measured: 2.31 -> 2.20 train, 2.19 held out).
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0]
    assert metadata["eval_loss"] < CHANCE_LOSS - 0.08


@pytest.mark.slow
def test_converted_checkpoint_full_fine_tune_with_layer_decay(tmp_path):
    start, metadata = finetune_converted(
        "finetune_digits", tmp_path, **{"optim.layer_decay": "0.75"}
    )
    model = metadata["model"]
    assert isinstance(model.optimizer, LayerDecayAdamW)
    scales = model.optimizer.lr_multipliers
    assert scales["head/kernel"] == 1.0
    assert scales["block_1/attention/qkv/kernel"] == pytest.approx(0.75)
    assert scales["patch_encoder/pos_embedding"] == pytest.approx(0.75**3)
    moved = model.get_layer("block_0").get_weights()[0]
    assert not np.array_equal(moved, start.get_layer("block_0").get_weights()[0])
    losses = train_losses(metadata)
    print(f"full: train loss {losses}, eval loss {metadata['eval_loss']:.3f}")
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0]
    assert metadata["eval_loss"] < CHANCE_LOSS - 0.15  # measured: 2.07


def accuracy(model, images, labels):
    logits = model.predict(images, batch_size=256, verbose=0)
    return float(np.mean(np.argmax(logits, axis=-1) == labels))


@pytest.mark.slow
def test_resolution_change_keeps_accuracy_within_one_point(digits_model, tmp_path):
    """The 16x16 digits model, moved to 24x24 (3x3 -> 6x6 patches of 4,
    position embedding resampled) and fine-tuned by the recipe for 200 steps,
    loses at most one point of held-out accuracy."""
    model, x_test, y_test, _ = digits_model
    before = accuracy(model, x_test, y_test)
    model.save(tmp_path / "pretrained.keras")
    config = load_recipe(
        "finetune_digits",
        {
            "model.pretrained": str(tmp_path / "pretrained.keras"),
            # The fixture's architecture (the recipe's is the digits recipe's).
            "model.hidden_dim": "64",
            "model.num_layers": "2",
            "model.mlp_dim": "128",
            "model.image_size": "24",
            "total_steps": "200",
            "run_dir": str(tmp_path / "run"),
            "verbose": "0",
        },
    )
    metadata = training.train(config)
    after = metadata["accuracy"]
    print(f"resolution change 16 -> 24: accuracy {before:.4f} -> {after:.4f}")
    assert metadata["model"].input_shape == (None, 24, 24, 1)
    assert after >= before - 0.01


def test_fine_tuning_keys_are_validated_and_reach_the_optimizer(tmp_path):
    with pytest.raises(ValueError, match=r"optim.layer_decay must be in \(0, 1\]"):
        load_recipe("finetune_digits", {"optim.layer_decay": "0"})
    with pytest.raises(ValueError, match=r"optim.layer_decay must be in \[0.0, 1.0\]"):
        load_recipe("finetune_digits", {"optim.layer_decay": "1.5"})
    config = load_recipe(
        "finetune_digits",
        {"model.pretrained": "", "smoke": "true", "optim.layer_decay": "0.5"},
    )
    model = training.build_model(config, num_classes=10)
    optimizer = make_optimizer(config, model)
    assert isinstance(optimizer, LayerDecayAdamW)
    assert optimizer.lr_multipliers["block_0/mlp/fc1/kernel"] == 0.25
    plain = load_recipe("digits", {"smoke": "true"})
    assert type(make_optimizer(plain, model)) is keras.optimizers.AdamW


def test_pretrained_keras_file_of_another_architecture_is_refused(tmp_path):
    other = load_recipe(
        "finetune_digits",
        {"model.pretrained": "", "smoke": "true", "model.hidden_dim": "32"},
    )
    training.build_model(other, num_classes=10).save(tmp_path / "other.keras")
    mismatched = load_recipe(
        "finetune_digits",
        {"model.pretrained": str(tmp_path / "other.keras"), "smoke": "true"},
    )
    with pytest.raises(ValueError, match="does not fit the recipe's model: layer 'pa"):
        training.build_model(mismatched, num_classes=10)


def test_hybrid_stem_starts_from_the_cnn_of_the_same_widths(tmp_path):
    """A hybrid's 'cnn' stem names its layers as SmallCNN does, so a trained
    CNN's stages initialise it; its head (another width) stays fresh."""
    cnn = load_recipe("mnist5k_cnn", {"smoke": "true"})
    source = training.build_model(cnn, num_classes=10)
    for layer in source.layers:  # distinct from a fresh model's initial values
        layer.set_weights([w + 0.25 for w in layer.get_weights()])
    source.save(tmp_path / "cnn.keras")
    hybrid = load_recipe(
        "mnist5k_hybrid",
        {"smoke": "true", "model.pretrained": str(tmp_path / "cnn.keras")},
    )
    model = training.build_model(hybrid, num_classes=10)
    for name in ("stage0_conv0", "stage1_norm1", "stage2_conv1"):
        got_want = model.get_layer(name).weights, source.get_layer(name).weights
        pairs = zip(*got_want, strict=True)
        for got, want in pairs:
            np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert model.get_layer("head").kernel.shape != source.get_layer("head").kernel.shape
    # The same file under a plain ViT shares nothing: refused, not ignored.
    plain = load_recipe(
        "mnist5k", {"smoke": "true", "model.pretrained": str(tmp_path / "cnn.keras")}
    )
    with pytest.raises(ValueError, match="shares no layer .* nothing to start from"):
        training.build_model(plain, num_classes=10)
    with pytest.raises(ValueError, match="converts to a plain ViT"):
        training.build_model(
            load_recipe(
                "mnist5k_hybrid", {"smoke": "true", "model.pretrained": "x.safetensors"}
            ),
            num_classes=10,
        )


def test_layer_decay_applies_to_a_distilled_student(tmp_path):
    """Under distillation the optimizer sees the Distiller: the decay follows
    its student's blocks (the frozen teacher is not among the variables the
    optimizer updates)."""
    teacher_config = load_recipe("mnist5k_cnn", {"smoke": "true"})
    teacher = training.build_model(teacher_config, num_classes=10)
    teacher.save(tmp_path / "teacher.keras")
    config = load_recipe(
        "mnist5k_hybrid_deit",
        {
            "smoke": "true",
            "distill.teacher": str(tmp_path / "teacher.keras"),
            "model.pretrained": str(tmp_path / "teacher.keras"),
            "optim.layer_decay": "0.5",
        },
    )
    from keras_vit.training.distill import Distiller

    student = training.build_model(config, num_classes=10)
    distiller = Distiller(student, keras.models.load_model(tmp_path / "teacher.keras"))
    optimizer = make_optimizer(config, distiller)
    scales = optimizer.lr_multipliers
    depth = config.model.num_layers
    assert scales["head/kernel"] == 1.0
    assert scales["block_0/attention/qkv/kernel"] == pytest.approx(0.5**depth)
    assert scales["stage0_conv0/kernel"] == pytest.approx(0.5 ** (depth + 1))
    optimizer.build(distiller.trainable_variables)
    assert len(optimizer._scales) == len(student.trainable_variables)
    assert min(optimizer._scales) == pytest.approx(0.5 ** (depth + 1))
