"""How good and how well calibrated a classifier is on a labelled dataset.

`evaluate(model, data)` runs the model once over the data and reports top-1
and top-5 accuracy, the confusion matrix (rows: true class, columns:
predicted class) and the expected calibration error with 15 equal-width
confidence bins (Guo et al., "On Calibration of Modern Neural Networks",
2017). The metric functions take plain arrays, so they also work on
predictions made elsewhere (a SavedModel, a `.tflite` file).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import keras
import numpy as np

from keras_vit.files import write_atomic


@dataclasses.dataclass
class Evaluation:
    """Metrics of one evaluation run.

    Attributes:
        accuracy: float, top-1 accuracy in [0, 1].
        top5_accuracy: float, top-k accuracy with k = min(5, num_classes).
        expected_calibration_error: float in [0, 1].
        confusion_matrix: `(num_classes, num_classes)` int64 counts; row =
            true class, column = predicted class.
        num_examples: int.
        labels: class names, or None.
    """

    accuracy: float
    top5_accuracy: float
    expected_calibration_error: float
    confusion_matrix: np.ndarray
    num_examples: int
    labels: list[str] | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict (the confusion matrix as nested lists)."""
        result = dataclasses.asdict(self)
        result["confusion_matrix"] = self.confusion_matrix.tolist()
        return result

    def summary(self) -> str:
        """Three human-readable lines."""
        return (
            f"examples: {self.num_examples}\n"
            f"accuracy: {self.accuracy:.4f}  top-5: {self.top5_accuracy:.4f}\n"
            f"expected calibration error (15 bins): "
            f"{self.expected_calibration_error:.4f}"
        )


def _check_labels(probabilities: np.ndarray, y_true) -> tuple[np.ndarray, np.ndarray]:
    probabilities = np.asarray(probabilities, dtype="float64")
    y_true = np.asarray(y_true)
    if probabilities.ndim != 2:
        raise ValueError(
            "probabilities must have shape (num_examples, num_classes), got "
            f"{probabilities.shape}."
        )
    if y_true.ndim == 2 and y_true.shape == probabilities.shape:
        y_true = y_true.argmax(axis=-1)
    if y_true.shape != probabilities.shape[:1]:
        raise ValueError(
            f"Labels of shape {y_true.shape} do not match "
            f"{probabilities.shape[0]} predictions; expected integer class ids "
            f"({probabilities.shape[0]},) or one-hot {probabilities.shape}."
        )
    if not np.issubdtype(y_true.dtype, np.integer):
        if not np.all(np.mod(y_true, 1) == 0):
            raise ValueError("Labels must be integer class ids or one-hot rows.")
        y_true = y_true.astype("int64")
    num_classes = probabilities.shape[1]
    if len(y_true) and (y_true.min() < 0 or y_true.max() >= num_classes):
        bad = y_true[(y_true < 0) | (y_true >= num_classes)][0]
        raise ValueError(
            f"Label {bad} is out of range for {num_classes} classes "
            f"(valid: 0..{num_classes - 1})."
        )
    return probabilities, y_true.astype("int64")


def top_k_accuracy(probabilities, y_true, k: int = 5) -> float:
    """Fraction of examples whose true class is among the k highest scores.

    Ties are broken toward the lower class id, as `argsort` does; `k` larger
    than the number of classes is clipped to it.
    """
    probabilities, y_true = _check_labels(probabilities, y_true)
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}.")
    k = min(k, probabilities.shape[1])
    top = np.argsort(-probabilities, axis=-1, kind="stable")[:, :k]
    return float(np.mean(np.any(top == y_true[:, None], axis=-1)))


def confusion_matrix(y_true, y_pred, num_classes: int) -> np.ndarray:
    """Counts `(num_classes, num_classes)`: `[i, j]` = examples of class i
    predicted as class j."""
    y_true = np.asarray(y_true, dtype="int64").ravel()
    y_pred = np.asarray(y_pred, dtype="int64").ravel()
    if y_true.shape != y_pred.shape:
        raise ValueError(
            f"y_true has {y_true.size} entries but y_pred has {y_pred.size}."
        )
    for name, values in (("y_true", y_true), ("y_pred", y_pred)):
        if values.size and (values.min() < 0 or values.max() >= num_classes):
            raise ValueError(
                f"{name} holds class ids outside 0..{num_classes - 1}: "
                f"{sorted(set(values[(values < 0) | (values >= num_classes)]))[:5]}."
            )
    matrix = np.zeros((num_classes, num_classes), dtype="int64")
    np.add.at(matrix, (y_true, y_pred), 1)
    return matrix


def expected_calibration_error(probabilities, y_true, num_bins: int = 15) -> float:
    """Expected calibration error (Guo et al. 2017).

    Predictions are grouped by confidence (the top probability) into
    `num_bins` equal-width bins `(i / M, (i + 1) / M]`; the ECE is the
    size-weighted mean over bins of |accuracy - mean confidence|.
    """
    probabilities, y_true = _check_labels(probabilities, y_true)
    if not isinstance(num_bins, int) or num_bins < 1:
        raise ValueError(f"num_bins must be a positive int, got {num_bins!r}.")
    if not len(y_true):
        raise ValueError("Cannot compute a calibration error on zero examples.")
    confidence = probabilities.max(axis=-1)
    correct = probabilities.argmax(axis=-1) == y_true
    bins = np.clip(np.ceil(confidence * num_bins).astype("int64") - 1, 0, num_bins - 1)
    error = 0.0
    for b in range(num_bins):
        members = bins == b
        if members.any():
            gap = abs(correct[members].mean() - confidence[members].mean())
            error += members.mean() * gap
    return float(error)


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def _looks_like_probabilities(outputs: np.ndarray) -> bool:
    return bool(
        outputs.size
        and outputs.min() >= 0.0
        and outputs.max() <= 1.0
        and np.allclose(outputs.sum(axis=-1), 1.0, atol=1e-3)
    )


def _batches(data, batch_size: int, example_rank: int):
    """Yields `(images, labels)` numpy batches from `(x, y)` arrays or a
    `tf.data.Dataset` of `(images, labels)`, batched or not (an element of
    rank `example_rank` is one example)."""
    if isinstance(data, tuple | list) and len(data) == 2:
        x, y = np.asarray(data[0]), np.asarray(data[1])
        if len(x) != len(y):
            raise ValueError(
                f"data holds {len(x)} images but {len(y)} labels; pass (x, y) "
                "of the same length."
            )
        for start in range(0, len(x), batch_size):
            yield x[start : start + batch_size], y[start : start + batch_size]
        return
    import tensorflow as tf

    if not isinstance(data, tf.data.Dataset):
        raise ValueError(
            "data must be a tuple (images, labels) of arrays or a tf.data.Dataset "
            f"of (images, labels), got {type(data).__name__}."
        )
    spec = data.element_spec
    if not isinstance(spec, tuple) or len(spec) < 2:
        raise ValueError(
            f"The dataset must yield (images, labels) pairs; its elements are {spec}."
        )
    if spec[0].shape.rank == example_rank:
        data = data.batch(batch_size)
    for images, labels, *_ in data.as_numpy_iterator():
        yield images, labels


def _check_finite(values: np.ndarray, offset: int, what: str) -> None:
    """A non-finite number is never a result: a ValueError naming the first
    example (its position in the data) whose values are not finite."""
    if values.dtype.kind != "f" or np.isfinite(values).all():
        return
    rows = ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    raise ValueError(
        f"held-out example {offset + int(np.argmax(rows))} (counting from 0 in "
        f"the data's order) {what}; no metrics computed."
    )


def predict(
    model, data, *, batch_size: int = 64, from_logits: bool | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Runs `model` over `data`; returns `(probabilities, labels)`.

    Args:
        model: a Keras model (or any callable) from images to logits or
            probabilities `(batch, num_classes)`.
        data: `(images, labels)` arrays, or a `tf.data.Dataset` yielding
            `(images, labels)`, batched or not. Labels are class ids or
            one-hot rows.
        batch_size: int, for arrays and unbatched datasets.
        from_logits: whether the model returns logits; None decides from the
            outputs (probabilities are in [0, 1] with rows summing to 1).
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
    outputs, labels = [], []
    # One example is an image (height, width, channels) unless the model
    # says otherwise.
    example_rank = 3
    if isinstance(model, keras.Model):
        example_rank = len(model.inputs[0].shape) - 1
    seen = 0
    for images, y in _batches(data, batch_size, example_rank):
        _check_finite(np.asarray(images), seen, "holds NaN or Inf pixels")
        if isinstance(model, keras.Model):
            out = model(images, training=False)
        else:
            out = model(images)
        outputs.append(np.asarray(out, dtype="float64"))
        _check_finite(
            outputs[-1],
            seen,
            "gives NaN or Inf scores (the model's weights hold non-finite numbers?)",
        )
        labels.append(np.asarray(y))
        seen += len(outputs[-1])
    if not outputs:
        raise ValueError("The dataset is empty; there is nothing to evaluate.")
    outputs, labels = np.concatenate(outputs), np.concatenate(labels)
    if from_logits is None:
        from_logits = not _looks_like_probabilities(outputs)
    return (_softmax(outputs) if from_logits else outputs), labels


def evaluate(
    model,
    data,
    *,
    labels: list[str] | None = None,
    batch_size: int = 64,
    from_logits: bool | None = None,
    num_bins: int = 15,
    confusion_png: str | Path | None = None,
    report_json: str | Path | None = None,
) -> Evaluation:
    """Accuracy, top-5, confusion matrix and calibration of `model` on `data`.

    Args:
        model, data, batch_size, from_logits: as in `predict`.
        labels: class names for the report and the confusion-matrix picture.
        num_bins: confidence bins of the calibration error.
        confusion_png: path of a PNG of the confusion matrix (needs
            matplotlib).
        report_json: path of a JSON file with all the metrics.

    Returns:
        An `Evaluation`.
    """
    probabilities, y_true = predict(
        model, data, batch_size=batch_size, from_logits=from_logits
    )
    probabilities, y_true = _check_labels(probabilities, y_true)
    num_classes = probabilities.shape[1]
    if labels is not None and len(labels) != num_classes:
        raise ValueError(
            f"{len(labels)} labels given for a model with {num_classes} classes."
        )
    result = Evaluation(
        accuracy=float(np.mean(probabilities.argmax(axis=-1) == y_true)),
        top5_accuracy=top_k_accuracy(probabilities, y_true, 5),
        expected_calibration_error=expected_calibration_error(
            probabilities, y_true, num_bins
        ),
        confusion_matrix=confusion_matrix(
            y_true, probabilities.argmax(axis=-1), num_classes
        ),
        num_examples=int(len(y_true)),
        labels=None if labels is None else [str(label) for label in labels],
    )
    if confusion_png is not None:
        save_confusion_matrix(result.confusion_matrix, confusion_png, result.labels)
    if report_json is not None:
        path = Path(report_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(result.to_dict(), indent=2) + "\n"
        write_atomic(path, lambda temp: temp.write_text(text))
    return result


def save_confusion_matrix(
    matrix: np.ndarray, path: str | Path, labels: list[str] | None = None
) -> None:
    """Writes the confusion matrix as a PNG heat map (row-normalised colours,
    counts written in the cells when there are at most 20 classes)."""
    from keras_vit.analysis.visualize import _figure, _save

    matrix = np.asarray(matrix)
    num_classes = len(matrix)
    if matrix.shape != (num_classes, num_classes):
        raise ValueError(f"A confusion matrix is square; got shape {matrix.shape}.")
    names = labels if labels is not None else [str(i) for i in range(num_classes)]
    side = min(12.0, 2.0 + 0.45 * num_classes)
    figure = _figure(side, side)
    axes = figure.add_subplot(1, 1, 1)
    rates = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    axes.imshow(rates, cmap="Blues", vmin=0, vmax=1)
    if num_classes <= 20:
        ticks = np.arange(num_classes)
        axes.set_xticks(ticks, names, rotation=90, fontsize=7)
        axes.set_yticks(ticks, names, fontsize=7)
        for i in range(num_classes):
            for j in range(num_classes):
                if matrix[i, j]:
                    axes.text(
                        j,
                        i,
                        str(matrix[i, j]),
                        ha="center",
                        va="center",
                        fontsize=6,
                        color="white" if rates[i, j] > 0.5 else "black",
                    )
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    axes.set_title(f"confusion matrix ({int(matrix.sum())} examples)", fontsize=9)
    _save(figure, path)
