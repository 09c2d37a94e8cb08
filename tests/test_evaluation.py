import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import FLOAT32_PARITY, near_ties, parity_bound
from PIL import Image
from sklearn.metrics import confusion_matrix as sklearn_confusion_matrix

from keras_vit.analysis import evaluation


def test_expected_calibration_error_by_hand():
    probabilities = np.array(
        [
            [0.9, 0.05, 0.05],  # right, confidence 0.9: bin (13/15, 14/15]
            [0.05, 0.9, 0.05],  # wrong, 0.9: same bin
            [0.5, 0.25, 0.25],  # right, 0.5: bin (7/15, 8/15]
            [0.2, 0.15, 0.65],  # wrong, 0.65: bin (9/15, 10/15]
        ]
    )
    labels = np.array([0, 0, 0, 1])
    expected = 2 / 4 * abs(0.5 - 0.9) + 1 / 4 * abs(1 - 0.5) + 1 / 4 * abs(0 - 0.65)
    assert expected == pytest.approx(0.4875)
    error = evaluation.expected_calibration_error(probabilities, labels)
    assert error == pytest.approx(expected)
    # With one bin it is |mean accuracy - mean confidence|.
    one_bin = evaluation.expected_calibration_error(probabilities, labels, num_bins=1)
    assert one_bin == pytest.approx(abs(0.5 - (0.9 + 0.9 + 0.5 + 0.65) / 4))


def test_perfectly_calibrated_bins_have_zero_error():
    # 10 predictions at confidence 0.8, 8 of them right.
    probabilities = np.tile([0.8, 0.2], (10, 1))
    labels = np.array([0] * 8 + [1] * 2)
    assert evaluation.expected_calibration_error(
        probabilities, labels
    ) == pytest.approx(0.0, abs=1e-12)
    # One-hot labels are accepted too.
    assert evaluation.expected_calibration_error(
        probabilities, np.eye(2)[labels]
    ) == pytest.approx(0.0, abs=1e-12)


def test_top_k_and_confusion_matrix():
    rng = np.random.default_rng(0)
    probabilities = rng.dirichlet(np.ones(7), size=200)
    labels = rng.integers(0, 7, size=200)
    ranks = (probabilities > probabilities[np.arange(200), labels][:, None]).sum(1)
    assert evaluation.top_k_accuracy(probabilities, labels, 5) == pytest.approx(
        np.mean(ranks < 5)
    )
    assert evaluation.top_k_accuracy(probabilities, labels, 1) == pytest.approx(
        np.mean(probabilities.argmax(1) == labels)
    )
    assert evaluation.top_k_accuracy(probabilities, labels, 99) == 1.0
    predicted = probabilities.argmax(1)
    np.testing.assert_array_equal(
        evaluation.confusion_matrix(labels, predicted, 7),
        sklearn_confusion_matrix(labels, predicted, labels=range(7)),
    )


def test_bad_labels_are_clear_errors():
    probabilities = np.full((3, 4), 0.25)
    with pytest.raises(ValueError, match=r"Label 4 is out of range for 4 classes"):
        evaluation.top_k_accuracy(probabilities, [0, 1, 4])
    with pytest.raises(ValueError, match=r"Labels of shape \(2,\) do not match 3"):
        evaluation.expected_calibration_error(probabilities, [0, 1])
    with pytest.raises(ValueError, match="num_bins must be a positive int, got 0"):
        evaluation.expected_calibration_error(probabilities, [0, 1, 2], num_bins=0)


def linear_model():
    """A fixed 3-class linear classifier on 2-D points (logits out)."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    model.set_weights(
        [np.array([[2.0, -1.0, 0.0], [0.0, 1.0, -2.0]]), np.zeros(3, "float32")]
    )
    return model


def test_evaluate_arrays_and_datasets_agree(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((50, 2)).astype("float32")
    model = linear_model()
    logits = x @ model.get_weights()[0]
    y = logits.argmax(1)
    y[:5] = (y[:5] + 1) % 3  # five mistakes
    result = evaluation.evaluate(
        model,
        (x, y),
        labels=["a", "b", "c"],
        batch_size=16,
        confusion_png=tmp_path / "confusion.png",
        report_json=tmp_path / "report.json",
    )
    assert result.num_examples == 50
    assert result.accuracy == pytest.approx(45 / 50)
    assert result.top5_accuracy == 1.0  # k is clipped to the 3 classes
    probabilities = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    assert result.expected_calibration_error == pytest.approx(
        evaluation.expected_calibration_error(probabilities, y), rel=1e-5
    )
    assert result.confusion_matrix.sum() == 50
    assert np.trace(result.confusion_matrix) == 45
    with Image.open(tmp_path / "confusion.png") as png:
        assert png.format == "PNG"
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["accuracy"] == result.accuracy
    assert report["labels"] == ["a", "b", "c"]

    # The same through an unbatched and a batched tf.data pipeline with
    # one-hot labels.
    unbatched = tf.data.Dataset.from_tensor_slices((x, np.eye(3)[y]))
    for data in (unbatched, unbatched.batch(7)):
        again = evaluation.evaluate(model, data)
        assert again.accuracy == result.accuracy
        np.testing.assert_array_equal(again.confusion_matrix, result.confusion_matrix)
        assert again.expected_calibration_error == pytest.approx(
            result.expected_calibration_error
        )


def test_probability_outputs_are_not_softmaxed_twice():
    x = np.random.default_rng(2).standard_normal((20, 2)).astype("float32")
    logits_model = linear_model()
    probs_model = keras.Sequential([logits_model, keras.layers.Softmax()])
    y = np.zeros(20, "int64")
    a = evaluation.evaluate(logits_model, (x, y))
    b = evaluation.evaluate(probs_model, (x, y))
    assert a.expected_calibration_error == pytest.approx(
        b.expected_calibration_error, abs=1e-6
    )
    c = evaluation.evaluate(probs_model, (x, y), from_logits=False)
    assert c.expected_calibration_error == pytest.approx(b.expected_calibration_error)


def test_digits_model_metrics(digits_model, tmp_path):
    model, x_test, y_test, labels = digits_model
    result = evaluation.evaluate(
        model, (x_test, y_test), labels=labels, confusion_png=tmp_path / "cm.png"
    )
    logits = model.predict(x_test, verbose=0)
    keras_accuracy = np.mean(logits.argmax(1) == y_test)
    # Other batches than predict's: a near tie may rank either way.
    ties = near_ties(logits, parity_bound(logits, FLOAT32_PARITY))
    assert abs(result.accuracy - keras_accuracy) <= ties / len(y_test)
    assert result.accuracy > 0.9
    assert result.top5_accuracy >= result.accuracy
    assert 0.0 <= result.expected_calibration_error < 0.1
    assert result.confusion_matrix.shape == (10, 10)
    np.testing.assert_array_equal(result.confusion_matrix.sum(1), np.bincount(y_test))
    with Image.open(tmp_path / "cm.png") as png:
        assert png.format == "PNG"
