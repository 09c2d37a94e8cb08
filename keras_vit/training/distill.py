"""Knowledge distillation in the trainer: a frozen teacher's predictions as a
second target (DeiT, Touvron et al. 2021; Hinton et al. 2015).

A `distilled=True` student trains its class head on the labels and its
distillation head on the teacher; any other student gets both targets on its
one head. `hard` uses the teacher's argmax (DeiT's choice, eq. 3); `soft`
the KL divergence between the temperature-softened distributions, scaled by
`T^2` so its gradients keep their size as `T` grows (Hinton et al.). The loss
is `(1 - weight) * CE(labels) + weight * distillation`.

The teacher is any Keras classifier: a keras_vit `.keras` model, a converted
timm / Hugging Face / AugReg checkpoint, or a CNN. It sees the student's
images turned back into raw pixels and normalised its own way (`teacher_mean`
/ `teacher_std`, else the `metadata.json` beside a `.keras` teacher, else the
student's), resized to its input size. It is loaded under the run's strategy
and precision, frozen, and called with `training=False`.
"""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
from keras import ops

from keras_vit.models.preprocessing import pixel_affine, resolve_preprocessing
from keras_vit.models.vit import distillation_heads
from keras_vit.training import data as data_lib
from keras_vit.training.config import TrainConfig

KINDS = ("hard", "soft")


def _as_logits(model: keras.Model, outputs):
    """Log-probabilities of a classifier that ends in softmax; else as is."""
    last = model.layers[-1]
    activation = getattr(last, "activation", None)
    if getattr(activation, "__name__", "") == "softmax":
        return ops.log(ops.clip(ops.cast(outputs, "float32"), 1e-7, 1.0))
    return ops.cast(outputs, "float32")


class Distiller(keras.Model):
    """A student trained against labels and a frozen teacher.

    Args:
        student: a keras_vit model returning logits (with `distilled=True`,
            its two heads are trained apart).
        teacher: a Keras classifier over the same classes.
        kind: `"hard"` or `"soft"`.
        temperature: float > 0, softens both distributions (`soft` only).
        weight: float in [0, 1], share of the distillation loss.
        label_smoothing: float, on the true labels.
        teacher_scale, teacher_shift: per-channel affine map from the
            student's normalised images to the teacher's.

    Call arguments:
        images: `(batch, height, width, channels)`, the student's input.
        training: bool; True returns the student's training outputs (both
            heads of a distilled student).
    """

    def __init__(
        self,
        student,
        teacher,
        kind: str = "hard",
        temperature: float = 1.0,
        weight: float = 0.5,
        label_smoothing: float = 0.0,
        teacher_scale=1.0,
        teacher_shift=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if kind not in KINDS:
            raise ValueError(
                f"distill.kind must be one of {list(KINDS)}, got {kind!r}."
            )
        if not 0.0 <= float(label_smoothing) < 1.0:
            raise ValueError(
                f"`label_smoothing` must be in [0, 1), got {label_smoothing!r}."
            )
        student_classes = int(student.outputs[0].shape[-1])
        teacher_classes = int(teacher.outputs[0].shape[-1])
        if student_classes != teacher_classes:
            raise ValueError(
                f"The teacher {teacher.name!r} predicts {teacher_classes} classes, "
                f"the student (and its data) {student_classes}; they must agree."
            )
        self.student = student
        self.teacher = teacher
        self.teacher.trainable = False
        self.kind = kind
        self.temperature = float(temperature)
        self.weight = float(weight)
        self.label_smoothing = float(label_smoothing)
        self.teacher_scale = np.asarray(teacher_scale, "float32")
        self.teacher_shift = np.asarray(teacher_shift, "float32")
        self.teacher_size = tuple(int(d) for d in teacher.inputs[0].shape[1:3])
        try:
            self.heads = distillation_heads(student)
        except ValueError:  # no distillation token: both targets on one head
            self.heads = None
        self.class_loss_tracker = keras.metrics.Mean(name="class_loss")
        self.distillation_loss_tracker = keras.metrics.Mean(name="distillation_loss")
        # Its parts are functional models, built when made, and it has no
        # weights of its own: built from the start, so that a resumed run
        # loads its checkpoint before the first call.
        self.built = True

    def call(self, images, training=False):
        if training and self.heads is not None:
            return self.heads(images, training=True)
        return self.student(images, training=training)

    def teacher_logits(self, images):
        x = ops.cast(images, "float32") * self.teacher_scale + self.teacher_shift
        if tuple(x.shape[1:3]) != self.teacher_size:
            x = ops.image.resize(x, self.teacher_size, interpolation="bilinear")
        return ops.stop_gradient(
            _as_logits(self.teacher, self.teacher(x, training=False))
        )

    def _distillation(self, teacher_logits, logits):
        logits = ops.cast(logits, "float32")
        if self.kind == "hard":
            return ops.mean(
                keras.losses.sparse_categorical_crossentropy(
                    ops.argmax(teacher_logits, axis=-1), logits, from_logits=True
                )
            )
        t = self.temperature
        target = ops.softmax(teacher_logits / t, axis=-1)
        log_student = ops.log_softmax(logits / t, axis=-1)
        log_target = ops.log(ops.clip(target, 1e-7, 1.0))
        kl = ops.sum(target * (log_target - log_student), axis=-1)
        return ops.mean(kl) * (t * t)

    def _labels_loss(self, labels, logits):
        num_classes = logits.shape[-1]
        if len(labels.shape) == 1 or labels.shape[-1] != num_classes:
            labels = ops.one_hot(
                ops.cast(ops.reshape(labels, (-1,)), "int32"), num_classes
            )
        return ops.mean(
            keras.losses.categorical_crossentropy(
                ops.cast(labels, "float32"),
                ops.cast(logits, "float32"),
                from_logits=True,
                label_smoothing=self.label_smoothing,
            )
        )

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        if not training:
            loss = self._labels_loss(y, y_pred)
        else:
            class_logits, dist_logits = (
                y_pred if isinstance(y_pred, (tuple, list)) else (y_pred, y_pred)
            )
            class_loss = self._labels_loss(y, class_logits)
            dist_loss = self._distillation(self.teacher_logits(x), dist_logits)
            self.class_loss_tracker.update_state(class_loss)
            self.distillation_loss_tracker.update_state(dist_loss)
            loss = (1.0 - self.weight) * class_loss + self.weight * dist_loss
        if self.losses:
            loss = loss + ops.sum(self.losses)
        return loss

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        if isinstance(y_pred, (tuple, list)):
            y_pred = (y_pred[0] + y_pred[1]) / 2.0
        return super().compute_metrics(x, y, y_pred, sample_weight)


class HardDistillation(Distiller):
    """DeiT hard-label distillation of a `distilled=True` student: a
    `Distiller` with `kind="hard"` and `weight=0.5`, for a teacher that takes
    the student's images as they are.

    In training the class head learns the true labels and the distillation
    head the teacher's argmax, each half of the loss (DeiT, eq. 3). In
    inference the model is the student, whose output is the mean of both
    heads. Compile with an optimizer and metrics only (the loss is this
    model's); save `distiller.student`.

    Args:
        student: a keras_vit ViT or HybridViT built with `distilled=True`.
        teacher: a model from the same images to logits over the same
            classes.
        label_smoothing: float in [0, 1), on the true labels (DeiT: 0.1).

    Call arguments:
        images: `(batch, height, width, channels)`.
        training: bool; True returns `(class_logits, distillation_logits)`.
    """

    def __init__(self, student, teacher, label_smoothing: float = 0.0, **kwargs):
        distillation_heads(student)  # a one-line error without the token
        super().__init__(
            student,
            teacher,
            kind="hard",
            weight=0.5,
            label_smoothing=label_smoothing,
            **kwargs,
        )


def _metadata_preprocessing(path: Path) -> dict:
    beside = path.parent / "metadata.json"
    if path.suffix == ".keras" and beside.is_file():
        return json.loads(beside.read_text()).get("preprocessing", {})
    return {}


def check_teacher(config: TrainConfig) -> None:
    """A one-line ValueError when `distill.teacher` is a `.keras` path that
    does not exist, naming the recipe that writes it."""
    path, recipe = config.distill.teacher, config.distill.teacher_recipe
    if Path(path).suffix != ".keras" or Path(path).is_file():
        return
    how = (
        f"train its recipe first: keras-vit train {recipe} (or add --train-teacher)"
        if recipe
        else "give a trained .keras classifier"
    )
    raise ValueError(f"distill.teacher {path!r} is not a file; {how}.")


def load_teacher(config: TrainConfig, image_size) -> keras.Model:
    """The config's `distill.teacher`: a `.keras` file or a checkpoint that
    `keras_vit.pretrained.convert_checkpoint` reads."""
    path = config.distill.teacher
    if Path(path).suffix == ".keras":
        check_teacher(config)
        return keras.saving.load_model(path, compile=False)
    from keras_vit.pretrained.convert import convert_checkpoint

    return convert_checkpoint(path, image_size=image_size)


def _teacher_affine(config: TrainConfig, teacher_path: str, channels: int):
    """`(scale, shift)` from the student's input to the teacher's: the
    student's pixels undone and renormalised as the teacher's metadata (or
    `distill.teacher_mean / teacher_std`) says."""
    data, distill = config.data, config.distill
    found = _metadata_preprocessing(Path(teacher_path))
    student = data_lib.preprocessing(data, (1, 1))
    teacher = resolve_preprocessing(
        {
            "mean": distill.teacher_mean or found.get("mean") or data.mean,
            "std": distill.teacher_std or found.get("std") or data.std,
            "pixel_scale": found.get("pixel_scale", data.pixel_scale),
        },
        (1, 1),
        channels,
    )
    # The student sees pixels * a_s + b_s, the teacher pixels * a_t + b_t (the
    # same raw pixels, each in its own pixel_scale): an affine map of x.
    a_s, b_s = pixel_affine(student)
    a_t, b_t = pixel_affine(teacher)
    ratio = a_t * (teacher["pixel_scale"] / student["pixel_scale"]) / a_s
    return ratio, b_t - b_s * ratio


def wrap(model: keras.Model, config: TrainConfig) -> keras.Model:
    """`model` itself without a teacher; else a `Distiller` around it (call
    inside the strategy's scope, under the run's precision)."""
    distill = config.distill
    if not distill.teacher:
        return model
    teacher = load_teacher(config, model.input_shape[1:3])
    channels = int(model.input_shape[-1])
    if int(teacher.input_shape[-1]) != channels:
        raise ValueError(
            f"The teacher {distill.teacher!r} takes {teacher.input_shape[-1]} "
            f"channels, the data has {channels}."
        )
    scale, shift = _teacher_affine(config, distill.teacher, channels)
    return Distiller(
        model,
        teacher,
        kind=distill.kind,
        temperature=distill.temperature,
        weight=distill.weight,
        label_smoothing=config.optim.label_smoothing,
        teacher_scale=scale,
        teacher_shift=shift,
        name="distiller",
    )
