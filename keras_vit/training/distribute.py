"""Distribution strategies, and XLA that works under them.

The trainer's calls, in this order:

    strategy = get_strategy("mirrored")            # or default/multiworker/tpu
    per_replica = per_replica_batch_size(global_batch_size, strategy)
    with strategy.scope():
        model = keras_vit.ViT(...)
        compile_model(
            model, strategy=strategy, jit_compile=True,
            optimizer=keras.optimizers.AdamW(...), loss=..., metrics=[...],
        )
    model.fit(dataset_of_global_batches, ...)

`fit` splits each global batch evenly across the replicas; every loss is
divided by the number of replicas and the gradients are summed, so a step is
the same step a single device takes on the whole global batch.

Why `compile_model` instead of `model.compile(jit_compile=True)`: Keras 3.15
wraps `strategy.run` itself in one XLA function, which fails with two or more
replicas ("Trying to access resource ... located in device CPU:1 from device
CPU:0"), and `jit_compile="auto"` turns XLA off under any strategy. With two
or more replicas `compile_model` compiles the per-replica forward and backward
pass with XLA instead; the gradient all-reduce and the optimizer update run
outside XLA, because `MirroredStrategy` steps out of the replica (`merge_call`)
to update variables, which an XLA cluster cannot do. With one replica Keras'
own whole-step XLA is used. `evaluate` and `predict` run without XLA.

Use `compile_model` under MultiWorkerMirroredStrategy even without XLA: Keras
3.15's `fit` fails there before the first step (see `_build_from_local_batch`
and `_with_replica_axis`, which work around both failures). Keras 3.15's
gradient accumulation fails with two or more replicas; `compile_model` takes
`gradient_accumulation_steps` from the optimizer there and accumulates in
`keras_vit.training.accumulate` instead.
"""

from __future__ import annotations

import json
import os
import warnings

import keras
import tensorflow as tf

from keras_vit.training import accumulate
from keras_vit.training.config import STRATEGY_NAMES

STRATEGIES = STRATEGY_NAMES


def get_strategy(
    name: str = "default",
    *,
    devices: list[str] | None = None,
    collective_timeout_seconds: float | None = None,
    heartbeat_timeout_seconds: float | None = None,
    tpu: str | None = None,
) -> tf.distribute.Strategy:
    """Returns the `tf.distribute.Strategy` called `name`.

    Args:
        name: `"default"` (one device), `"mirrored"` (all local GPUs, or all
            logical CPUs when there is no GPU), `"multiworker"` (cluster from
            the `TF_CONFIG` environment variable) or `"tpu"`.
        devices: devices for `"mirrored"`, e.g. `["/cpu:0", "/cpu:1"]`.
        collective_timeout_seconds: `"multiworker"` only: a collective that
            waits longer fails with `DeadlineExceededError` instead of hanging.
        heartbeat_timeout_seconds: `"multiworker"` only: a worker whose
            heartbeats stop for this long is declared dead and every other
            worker's pending ops fail. Must be set before TensorFlow starts
            its runtime (before any op runs in this process).
        tpu: TPU name or address for `"tpu"`; defaults to `$TPU_NAME`, else
            `"local"` (a TPU VM).
    """
    if name not in STRATEGIES:
        raise ValueError(
            f"Unknown strategy {name!r}; valid strategies are {list(STRATEGIES)}."
        )
    if name != "mirrored" and devices is not None:
        raise ValueError(f"`devices` is only used by 'mirrored', not {name!r}.")
    if name != "multiworker" and (
        collective_timeout_seconds is not None or heartbeat_timeout_seconds is not None
    ):
        raise ValueError(f"Timeouts are only used by 'multiworker', not {name!r}.")
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        if devices is None:
            gpus = tf.config.list_logical_devices("GPU")
            devices = [d.name for d in gpus or tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices=devices)
    if name == "multiworker":
        return _multi_worker_strategy(
            collective_timeout_seconds, heartbeat_timeout_seconds
        )
    return _tpu_strategy(tpu)


def _multi_worker_strategy(collective_timeout, heartbeat_timeout):
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise ValueError(
            "Strategy 'multiworker' needs the TF_CONFIG environment variable, "
            'e.g. {"cluster": {"worker": ["host1:port", "host2:port"]}, '
            '"task": {"type": "worker", "index": 0}}.'
        )
    try:
        config = json.loads(raw)
        workers = config["cluster"]["worker"]
        config["task"]["type"], int(config["task"]["index"])
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"TF_CONFIG is not valid ({error!r}): {raw!r}; it needs "
            "cluster.worker (a list of host:port) and task.type / task.index."
        ) from None
    if not isinstance(workers, list) or not workers:
        raise ValueError(f"TF_CONFIG cluster.worker must be a non-empty list: {raw}")
    for label, value in (
        ("collective_timeout_seconds", collective_timeout),
        ("heartbeat_timeout_seconds", heartbeat_timeout),
    ):
        if value is not None and not value > 0:
            raise ValueError(f"{label} must be > 0 seconds, got {value!r}.")
    if heartbeat_timeout is not None:
        _configure_coordination_service(config, heartbeat_timeout)
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=collective_timeout
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def _configure_coordination_service(config, heartbeat_timeout):
    # MultiWorkerMirroredStrategy configures the coordination service with the
    # defaults unless one is configured already; the heartbeat timeout has no
    # public knob, so set the same service up first with our timeout.
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.eager import context

    jobs = [
        coordination_config_pb2.CoordinatedJob(name=job, num_tasks=len(tasks))
        for job, tasks in config["cluster"].items()
        if job in ("chief", "worker")
    ]
    leader = "chief" if "chief" in config["cluster"] else "worker"
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=f"/job:{leader}/replica:0/task:0",
        heartbeat_timeout_in_ms=int(heartbeat_timeout * 1000),
        shutdown_barrier_timeout_in_ms=int(heartbeat_timeout * 1000),
        coordinated_jobs=jobs,
    )


def _tpu_strategy(tpu):
    tpu = tpu if tpu is not None else os.environ.get("TPU_NAME", "local")
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as error:
        raise ValueError(
            f"Strategy 'tpu' found no TPU at {tpu!r} ({error}); run on a TPU VM "
            "or set TPU_NAME, or use 'default' / 'mirrored'."
        ) from error
    return tf.distribute.TPUStrategy(resolver)


def is_chief(strategy: tf.distribute.Strategy | None = None) -> bool:
    """True where this process writes the run's real artifacts."""
    strategy = strategy or tf.distribute.get_strategy()
    return bool(strategy.extended.should_checkpoint)


def per_replica_batch_size(global_batch_size: int, strategy=None) -> int:
    """The batch each replica sees; the global batch must split evenly,
    because Keras averages the loss per replica and then over replicas."""
    strategy = strategy or tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    valid = isinstance(global_batch_size, int) and not isinstance(
        global_batch_size, bool
    )
    if not valid or global_batch_size < 1 or global_batch_size % replicas:
        nearest = replicas
        if valid:
            nearest *= max(1, round(global_batch_size / replicas))
        raise ValueError(
            f"Global batch size {global_batch_size!r} must be a positive "
            f"multiple of the number of replicas ({replicas}), e.g. {nearest}."
        )
    return global_batch_size // replicas


def compile_model(
    model: keras.Model,
    *,
    strategy: tf.distribute.Strategy | None = None,
    jit_compile: bool | str = False,
    **compile_kwargs,
) -> keras.Model:
    """`model.compile(**compile_kwargs)` in `strategy`'s scope, with XLA that
    works for any number of replicas.

    Args:
        model: built in `strategy.scope()`.
        strategy: defaults to the strategy the model was built under.
        jit_compile: `True`, `False` or `"auto"` (XLA when a GPU or TPU is
            present and every layer supports it).
        **compile_kwargs: `optimizer`, `loss`, `metrics`, ... for
            `keras.Model.compile`; `jit_compile` and `run_eagerly=True`
            together are refused.

    Returns:
        `model`, compiled. `model.xla_mode` says how XLA runs: `None`,
        `"whole_step"` (Keras' own) or `"per_replica"`.
    """
    strategy = strategy or model.distribute_strategy
    if model.distribute_strategy is not strategy:
        raise ValueError(
            f"The model was built under {type(model.distribute_strategy).__name__}"
            f" but compile_model got {type(strategy).__name__}; build the model "
            "inside `strategy.scope()`."
        )
    if jit_compile not in (True, False, "auto"):
        raise ValueError(
            f"jit_compile must be True, False or 'auto', got {jit_compile!r}."
        )
    if jit_compile and compile_kwargs.get("run_eagerly"):
        raise ValueError("jit_compile and run_eagerly=True exclude each other.")
    optimizer = compile_kwargs.get("optimizer")
    for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        owner = getattr(opt, "_distribution_strategy", strategy)
        if owner is not strategy:
            raise ValueError(
                "The optimizer was created outside `strategy.scope()`; create it "
                "inside the scope (or pass its name) so its slots are mirrored."
            )
    replicas = strategy.num_replicas_in_sync
    accumulation = _take_accumulation(optimizer) if replicas > 1 else None
    if jit_compile == "auto":
        accelerators = tf.config.list_logical_devices("GPU")
        accelerators += tf.config.list_logical_devices("TPU")
        jit_compile = bool(accelerators) and all(
            layer.supports_jit for layer in model._flatten_layers()
        )
    if isinstance(strategy, tf.distribute.TPUStrategy):
        jit_compile = False  # the TPU compiles every step with XLA anyway
    whole_step = bool(jit_compile) and replicas == 1
    with strategy.scope():
        model.compile(jit_compile=whole_step, **compile_kwargs)
    for name in (
        "train_step",
        "test_step",
        "_maybe_symbolic_build",
        "make_train_function",
    ):
        if name in vars(model):
            delattr(model, name)  # undo an earlier compile_model
    model.xla_mode = "whole_step" if whole_step else None
    if jit_compile and replicas > 1:
        model.xla_mode = "per_replica"
        model.train_step = _per_replica_xla_train_step(model)
    if accumulation:
        accumulate.install(model, strategy, accumulation, bool(jit_compile))
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        model.train_step = _with_replica_axis(model.train_step)
        model.test_step = _with_replica_axis(model.test_step)
        model._maybe_symbolic_build = _build_from_local_batch(model, strategy)
    return model


def _take_accumulation(optimizer) -> int | None:
    """The optimizer's `gradient_accumulation_steps`, taken from it: Keras
    3.15 applies accumulated gradients inside a `cond` whose branches call
    `merge_call`, which tf.distribute cannot do with two or more replicas;
    `accumulate.install` accumulates outside the optimizer instead."""
    for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        steps = getattr(opt, "gradient_accumulation_steps", None)
        if not steps:
            continue
        if opt.built:
            raise ValueError(
                f"gradient_accumulation_steps={steps} with two or more replicas "
                "needs an optimizer not yet used; pass a fresh one."
            )
        opt.gradient_accumulation_steps = None
        return steps
    return None


def _with_replica_axis(step):
    """Keras 3.15 averages a step's logs over workers with
    `strategy.reduce("MEAN", value, axis=0)`, which fails on scalar logs
    ("Invalid reduction dimension 0 for input with 0 dimensions"); give every
    log a leading replica axis of 1, which that mean then removes."""

    def step_with_replica_axis(data):
        return tf.nest.map_structure(lambda t: tf.expand_dims(t, 0), step(data))

    step_with_replica_axis.wrapped = step
    return step_with_replica_axis


def _build_from_local_batch(model, strategy):
    """Keras 3.15's `fit` builds metrics from a first batch that it averages
    over replicas with `strategy.reduce`, which fails under
    MultiWorkerMirroredStrategy ("Attempt to convert a value (PerReplica...");
    only the shapes matter, so take this worker's first replica instead."""

    def maybe_symbolic_build(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = tf.nest.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0], next(batches)
                )
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    return maybe_symbolic_build


def _per_replica_xla_train_step(model):
    """Keras 3.15's `TensorFlowTrainer.train_step`, with the forward and
    backward pass in an XLA function that each replica calls for itself."""
    forward_backward = accumulate.forward_backward_function(model, jit_compile=True)

    def train_step(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        loss, y_pred, gradients = forward_backward(x, y, sample_weight)
        accumulate.track_replica_loss(model, loss, x)
        if model.trainable_weights:
            pairs = zip(gradients, model.trainable_weights, strict=True)
            model.optimizer.apply_gradients(pairs)
        else:
            warnings.warn(
                "The model does not have any trainable weights.", stacklevel=2
            )
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    train_step.forward_backward = forward_backward
    return train_step
