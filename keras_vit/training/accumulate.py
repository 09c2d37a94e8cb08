"""Gradient accumulation that works with any number of replicas.

Keras 3.15 accumulates inside the optimizer: every step it decides in a
`cond` whether to apply, and under `MirroredStrategy` with two or more
replicas the apply branch calls `merge_call`, which tf.distribute refuses
inside a `cond` ("`merge_call` called while defining a new graph"). Here
the decision moves out of the graph:

- each step (`train_step`, one per dataset batch) adds every replica's
  gradients to replica-local accumulators (`ON_READ` variables: no
  cross-replica traffic) and updates the loss and metrics as usual;
- every `steps`-th step, a separate function applies the accumulated
  gradients divided by `steps` on every replica (the optimizer's own
  all-reduce sums the replicas' shares) and zeroes the accumulators.

Each replica's loss is already divided by the number of replicas, so the
applied gradient is the mean over the `steps * global_batch` examples: the
gradient of one step on the full batch. `optimizer.iterations` counts
applied updates, as Keras' own accumulation reports it.
"""

from __future__ import annotations

import warnings

import keras
import tensorflow as tf


def forward_backward_function(model: keras.Model, jit_compile: bool):
    """`(x, y, sample_weight) -> (loss, y_pred, gradients)` for one replica,
    as Keras 3.15's `TensorFlowTrainer.train_step` computes them, compiled
    with XLA when `jit_compile`."""

    def forward_backward(x, y, sample_weight):
        with tf.GradientTape() as tape:
            if model._call_has_training_arg:
                y_pred = model(x, training=True)
            else:
                y_pred = model(x)
            loss = model._compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
            scaled = model.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, model.trainable_weights)
        return loss, y_pred, gradients

    return (
        tf.function(forward_backward, jit_compile=True)
        if jit_compile
        else (forward_backward)
    )


def track_replica_loss(model: keras.Model, loss, x) -> None:
    """Keras divides each replica's loss by the replica count; the loss
    tracker wants the replica's own mean back."""
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    first_input = next(t for t in tf.nest.flatten(x) if t is not None)
    model._loss_tracker.update_state(
        loss * tf.cast(replicas, loss.dtype), sample_weight=tf.shape(first_input)[0]
    )


def install(
    model: keras.Model,
    strategy: tf.distribute.Strategy,
    steps: int,
    jit_compile: bool,
) -> None:
    """Makes the compiled `model` accumulate gradients over `steps` dataset
    batches before each optimizer update (see the module docstring)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(
            f"gradient_accumulation_steps must be an int >= 2, got {steps!r}."
        )
    if model.steps_per_execution != 1:
        raise ValueError(
            f"steps_per_execution={model.steps_per_execution} with gradient "
            f"accumulation over {steps} replicas' steps is not supported; "
            "use steps_per_execution=1."
        )
    with strategy.scope():
        accumulators = [
            tf.Variable(
                tf.zeros(w.shape, w.dtype),
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
                name="accumulated_gradient",
            )
            for w in model.trainable_weights
        ]
    forward_backward = forward_backward_function(model, jit_compile)

    def train_step(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        loss, y_pred, gradients = forward_backward(x, y, sample_weight)
        track_replica_loss(model, loss, x)
        for accumulator, gradient in zip(accumulators, gradients, strict=True):
            if gradient is not None:
                accumulator.assign_add(tf.cast(gradient, accumulator.dtype))
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def apply_on_replica():
        weights = model.trainable_weights
        if not weights:
            warnings.warn(
                "The model does not have any trainable weights.", stacklevel=2
            )
            return
        scale = 1.0 / steps
        gradients = [a.read_value() * tf.cast(scale, a.dtype) for a in accumulators]
        model.optimizer.apply_gradients(zip(gradients, weights, strict=True))
        for accumulator in accumulators:
            accumulator.assign(tf.zeros_like(accumulator))

    @tf.function
    def apply_accumulated():
        strategy.run(apply_on_replica)

    counter = {"steps": 0}
    keras_make_train_function = model.make_train_function

    def make_train_function(force=False):
        if model.train_function is not None and not force:
            return model.train_function
        keras_make_train_function(force=True)
        one_step = model.train_function

        def train_function(iterator):
            logs = one_step(iterator)
            counter["steps"] += 1
            if counter["steps"] % steps == 0:
                apply_accumulated()
            return logs

        model.train_function = train_function
        return train_function

    # On the functions, not the model: variables in a model attribute would
    # be tracked into its checkpoints.
    train_step.accumulators = accumulators
    train_step.apply_accumulated = apply_accumulated
    train_step.counter = counter
    model.train_step = train_step
    model.make_train_function = make_train_function
