import csv

import keras
import numpy as np
import pytest

from keras_vit.training import trainer
from keras_vit.training.recipes import load_recipe


def _cnn_teacher(path, num_classes=10, image_size=8):
    """A small CNN over raw 0..1 pixels ending in softmax, as a user's own
    classifier would be."""
    keras.utils.set_random_seed(3)
    inputs = keras.Input((image_size, image_size, 1))
    x = keras.layers.Conv2D(8, 3, activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax")(x)
    model = keras.Model(inputs, outputs, name="cnn_teacher")
    model.save(path)
    return model


def _config(tmp_path, teacher, **extra):
    overrides = {
        "smoke": "true",
        "run_dir": str(tmp_path / "run"),
        "verbose": "0",
        "distill.teacher": str(teacher),
        "distill.teacher_mean": "(0.0,)",
        "distill.teacher_std": "(1.0,)",
        **extra,
    }
    return load_recipe("distill_digits", overrides)


def test_two_steps_with_a_teacher_use_both_heads_and_keep_the_teacher(tmp_path):
    teacher = _cnn_teacher(tmp_path / "teacher.keras")
    config = _config(tmp_path, tmp_path / "teacher.keras")
    keras.utils.set_random_seed(config.seed)
    student = trainer.build_model(config, 10)
    distiller = trainer.distill_lib.wrap(student, config)
    teacher = distiller.teacher
    before = [w.copy() for w in teacher.get_weights()]
    heads = {
        n: student.get_layer(n).get_weights()[0].copy() for n in ("head", "head_dist")
    }
    trainer._compile(distiller, config, distiller.distribute_strategy, 0)
    x, y = next(iter(trainer.data_lib.make_train_dataset(config.data, 16, 8, 0)))
    history = distiller.fit(x, y, batch_size=8, epochs=2, verbose=0).history

    for name, start in heads.items():
        # Both heads start at zero; the class head gets gradients only from
        # the label loss, the distillation head only from the teacher's.
        moved = np.abs(student.get_layer(name).get_weights()[0] - start).max()
        assert moved > 0, name
    class_loss, dist_loss = history["class_loss"][-1], history["distillation_loss"][-1]
    assert class_loss > 0 and dist_loss > 0
    # weight 0.5: the reported loss is the mean of both (last step's values).
    np.testing.assert_allclose(
        history["loss"][-1], 0.5 * class_loss + 0.5 * dist_loss, rtol=1e-5
    )
    for old, new in zip(before, teacher.get_weights(), strict=True):
        np.testing.assert_array_equal(old, new)


@pytest.mark.slow
def test_trainer_runs_a_recipe_with_a_teacher(tmp_path):
    _cnn_teacher(tmp_path / "teacher.keras")
    metadata = trainer.train(_config(tmp_path, tmp_path / "teacher.keras"))
    assert metadata["steps"] == 2
    assert metadata["model"].get_layer("head_dist") is not None
    with open(tmp_path / "run" / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[-1]["distillation_loss"]) > 0, rows[-1]


def test_teacher_of_other_classes_is_refused_naming_the_count(tmp_path):
    _cnn_teacher(tmp_path / "teacher.keras", num_classes=7)
    config = _config(tmp_path, tmp_path / "teacher.keras")
    student = trainer.build_model(config, 10)
    with pytest.raises(
        ValueError, match=r"predicts 7 classes, the student \(and its data\) 10"
    ):
        trainer.distill_lib.wrap(student, config)


def test_distill_keys_are_validated():
    with pytest.raises(ValueError, match=r"distill.kind must be one of .* 'medium'"):
        load_recipe("distill_digits", {"distill.kind": "medium"})
    with pytest.raises(ValueError, match=r"distill.temperature must be > 0, got 0.0"):
        load_recipe("distill_digits", {"distill.temperature": "0"})
