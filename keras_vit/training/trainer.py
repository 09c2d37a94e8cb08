"""The trainer: `train(config)` runs one recipe from data to an exported model.

Steps are batches (`optimizer.iterations`); `model.fit` runs "epochs" of
`checkpoint_every` steps on an infinite, deterministic stream, so resuming
at step s is `make_train_dataset(..., start_step=s)` and
`initial_epoch = s // checkpoint_every`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import keras

from keras_vit.analysis.flops import count_macs, vit_macs
from keras_vit.hardware import choose_settings
from keras_vit.hardware import describe as describe_hardware
from keras_vit.models.lora import enable_lora, merge_lora, restart_lora_adapters
from keras_vit.models.resolution import with_image_size
from keras_vit.models.vit import HEAD_LAYERS, ViT
from keras_vit.training import checkpoints as checkpoint_lib
from keras_vit.training import data as data_lib
from keras_vit.training import distill as distill_lib
from keras_vit.training import distribute, run_folder
from keras_vit.training import qat as qat_lib
from keras_vit.training.config import (
    TrainConfig,
    validate,
)
from keras_vit.training.finetune import freeze_backbone
from keras_vit.training.model_kinds import build_kind
from keras_vit.training.optimizer import (
    make_optimizer,
)
from keras_vit.training.outputs import has_tensorboard, write_outputs, write_qat
from keras_vit.training.report import StepLines

__all__ = ["build_model", "train"]


def build_model(config: TrainConfig, num_classes: int, image_size: int | None = None):
    """The recipe's ViT (or `model.kind` baseline) at `image_size` (default
    `model.image_size`)."""
    m = config.model
    if m.kind != "vit":
        model = build_kind(config, num_classes, image_size or m.image_size)
        return _finish_model(model, m)
    model = ViT(
        m.variant,
        image_size=image_size or m.image_size,
        num_classes=num_classes,
        num_channels=config.data.num_channels,
        dropout_rate=m.dropout_rate,
        attention_dropout_rate=m.attention_dropout_rate,
        drop_path_rate=m.drop_path_rate,
        remat=m.remat,
        **_vit_options(m),
    )
    if m.pretrained and Path(m.pretrained).suffix != ".keras":
        from keras_vit.pretrained.convert import convert_checkpoint

        model = convert_checkpoint(
            m.pretrained, image_size=image_size or m.image_size, num_classes=num_classes
        )
        return _finish_model(model, m, loaded=True)
    return _finish_model(model, m)


def _vit_options(m) -> dict:
    """The `ViT` options of `model` that set its weights and products: what
    `build_model` builds and the automatic settings count (`vit_macs`)."""
    return {
        **m.architecture_overrides(),
        "representation_size": m.representation_size or None,
        "layer_scale_init": m.layer_scale_init or None,
        "pooling": m.pooling,
        "position_embedding": m.position_embedding,
        "shifted_patches": m.shifted_patches,
        # The SPT paper normalises the shifted patches before and after the
        # projection.
        "patch_norm": m.shifted_patches,
        "distilled": m.distilled,
    }


def _finish_model(model: keras.Model, m, loaded: bool = False) -> keras.Model:
    """`model` with the `.keras` weights of `model.pretrained` copied in (when
    not `loaded` from a checkpoint already), frozen and given LoRA adapters as
    the config asks."""
    if m.pretrained and not loaded:
        _load_pretrained(model, m.pretrained)
    if m.freeze_backbone:
        freeze_backbone(model)
    if m.lora_rank:
        enable_lora(model, m.lora_rank)
    return model


def _load_pretrained(model: keras.Model, path: str) -> None:
    """Copies weights by layer name from a `.keras` model, resized to this
    model's input; layers whose weight shapes differ (a new head) stay fresh."""
    if not Path(path).is_file():
        raise ValueError(f"model.pretrained {path!r} is not a file.")
    from keras_vit.deploy.serving import load_keras_file

    source = load_keras_file(path, compile=False)
    if tuple(source.input_shape[1:3]) != tuple(model.input_shape[1:3]):
        source = with_image_size(source, model.input_shape[1:3])
    copied = 0
    for layer in model.layers:
        try:
            weights = source.get_layer(layer.name).get_weights()
        except ValueError:
            continue
        if [w.shape for w in weights] == [tuple(w.shape) for w in layer.weights]:
            layer.set_weights(weights)
            copied += len(weights)
        elif layer.name not in HEAD_LAYERS:
            raise ValueError(
                f"model.pretrained {path!r} does not fit the recipe's model: layer "
                f"{layer.name!r} has other weight shapes; set model.variant, "
                "hidden_dim, num_layers, ... to the checkpoint's."
            )
    if not copied:
        raise ValueError(
            f"model.pretrained {path!r} shares no layer (by name and weight "
            f"shapes) with the recipe's {model.name!r} model: nothing to start from."
        )


def _compile(model, config, strategy, start_step):
    distribute.compile_model(
        model,
        strategy=strategy,
        jit_compile=config.jit_compile,
        optimizer=make_optimizer(config, model, start_step),
        loss=keras.losses.CategoricalCrossentropy(
            from_logits=True, label_smoothing=config.optim.label_smoothing
        ),
        metrics=[keras.metrics.CategoricalAccuracy(name="accuracy")],
    )


def _stages(config: TrainConfig) -> list[tuple[int, int, int]]:
    """`(first_step, end_step, image_size)` for each resolution."""
    bounds = [(0, config.model.image_size), *config.model.resize_at]
    ends = [step for step, _ in bounds[1:]] + [config.total_steps]
    return [(start, end, size) for (start, size), end in zip(bounds, ends, strict=True)]


def _stage_of_checkpoint(stages, step: int):
    """The stage that wrote the checkpoint at `step` (the end of its last
    interval), i.e. the one with `first < step <= end`."""
    for index, (first, end, _) in enumerate(stages):
        if first < step <= end:
            return index
    return 0


def _callbacks(run_dir: Path, chief: bool, config: TrainConfig, first_epoch: int):
    # The history row of an interval is written before its checkpoint (see
    # HistoryWriter). The checkpoint is saved atomically; a NaN loss raises
    # NonFiniteLossError and keeps the last good checkpoint.
    callbacks = []
    if chief:
        history = run_dir / run_folder.HISTORY_FILE
        callbacks.append(run_folder.HistoryWriter(history, first_epoch))
    callbacks.append(checkpoint_lib.CheckpointCallback(run_dir / "checkpoints"))
    if config.verbose == 2:
        # Keras' own per-epoch display takes two lines an interval.
        callbacks.append(
            StepLines(
                config.name,
                config.total_steps,
                config.checkpoint_every,
                config.eval_every,
            )
        )
    if chief:
        if has_tensorboard():
            callbacks.append(
                keras.callbacks.TensorBoard(
                    str(run_dir / "tensorboard"), write_graph=False
                )
            )
    return callbacks


def train(config: TrainConfig) -> dict:
    """Trains, evaluates on the held-out split, saves and (with
    `export_name`) exports; a rerun of the same config resumes from the last
    checkpoint in the run folder. Returns the run metadata (also written to
    `<run_dir>/metadata.json`): `accuracy`, `eval_loss`, `steps`, `run_dir`,
    `paths`, `preprocessing`, `labels`, `train_seconds`, ..."""
    config, settings = resolve_settings(validate(config))
    # Before the run folder is touched: a missing teacher names its recipe.
    distill_lib.check_teacher(config)
    print(
        f"{config.name}: precision={settings['precision']} "
        f"jit_compile={settings['jit_compile']}"
        + (f" (auto: {settings['reason']})" if settings["auto"] else "")
    )
    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(config.precision)
    try:
        return _train(config, settings)
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)


def resolve_settings(config: TrainConfig) -> tuple[TrainConfig, dict]:
    """`config` with "auto" precision / jit_compile replaced by this machine's
    choice (keras_vit.hardware.choose_settings), and the record of it."""
    macs = _macs_per_image(config)
    # A QAT run trains in float32 (validate): only XLA is chosen for it.
    precision = "float32" if config.qat else config.precision
    settings = choose_settings(macs, precision, config.jit_compile)
    settings["macs_per_image"] = int(macs)
    settings["hardware"] = describe_hardware()
    config = dataclasses.replace(
        config, precision=settings["precision"], jit_compile=settings["jit_compile"]
    )
    return config, settings


def _macs_per_image(config: TrainConfig) -> int:
    """What the automatic settings are chosen from: a ViT's by formula; a
    hybrid's or CNN's counted on a throwaway float32 build, since the ViT
    formula leaves the convolutional stem out (a mnist5k hybrid: 16.7M by
    the formula, 46.0M counted)."""
    m = config.model
    if m.kind == "vit":
        return vit_macs(
            m.variant,
            m.image_size,
            10,
            num_channels=config.data.num_channels,
            **_vit_options(m),
        )
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    try:
        return count_macs(build_kind(config, 10, m.image_size))
    finally:
        keras.config.set_dtype_policy(policy)


def _train(config: TrainConfig, settings: dict) -> dict:
    clock = (time.perf_counter(), time.process_time())
    run_dir = Path(config.run_dir or Path("runs") / config.name)
    strategy = distribute.get_strategy(config.strategy)
    distribute.per_replica_batch_size(config.batch_size, strategy)
    chief = distribute.is_chief(strategy)
    lock, config_changes = _claim_run_folder(config, run_dir, strategy, chief)
    try:
        return _run(config, settings, run_dir, strategy, chief, clock, config_changes)
    finally:
        lock.release()


def _claim_run_folder(config, run_dir, strategy, chief):
    """The chief locks the run folder and checks the config against the run it
    holds before writing anything there; returns `(lock, allowed changes)`."""
    if not chief:
        return run_folder.RunLock(run_dir), []  # never taken: release is a no-op
    run_folder.prepare_run_folder(run_dir)
    lock = run_folder.RunLock(run_dir)
    lock.acquire()
    try:
        checkpoints = run_dir / "checkpoints"
        resumes = checkpoints.is_dir() and any(checkpoints.iterdir())
        replicas = strategy.num_replicas_in_sync
        changes = run_folder.check_fingerprint(run_dir, config, replicas, resumes)
    except BaseException:
        lock.release()
        raise
    return lock, changes


def _run(config, settings, run_dir, strategy, chief, clock, config_changes) -> dict:
    """Trains, evaluates and writes the run's files; `clock` is the wall and
    CPU time at the start."""
    labels = data_lib.class_names(config.data, config.model.image_size)
    keras.utils.set_random_seed(config.seed)
    stages = _stages(config)
    model, fitted, step = _restore(config, strategy, stages, len(labels), run_dir)
    finished = step >= stages[-1][1]
    if chief and step:
        print(
            f"{config.name}: {run_dir} had finished at step {step}: nothing to "
            "train; evaluating and saving it again (a new run: --run_dir "
            "another folder)"
            if finished
            else f"{config.name}: resuming {run_dir} from step {step} of "
            f"{stages[-1][1]}"
        )
    model, fitted, step, skipped, trained = _fit_stages(
        model, fitted, config, strategy, stages, step, run_dir, chief
    )
    if config.optim.use_ema and not trained:
        # `fit` swaps the EMA weights in when it ends; checkpoints hold the
        # raw ones, so a rerun of a finished run swaps them in itself.
        fitted.optimizer.finalize_variable_values(model.trainable_variables)
    train_seconds = time.perf_counter() - clock[0]
    # CPU time of all threads: on a shared machine wall time is inflated, and
    # CPU-seconds / cores is what a quiet machine would take.
    train_cpu_seconds = time.process_time() - clock[1]
    size = stages[-1][2]
    metadata = _evaluate(fitted, config, size, step)
    metadata.update(
        train_seconds=round(train_seconds, 2),
        train_cpu_seconds=round(train_cpu_seconds, 2),
        run_dir=str(run_dir),
        precision=config.precision,
        settings=settings,
        strategy=config.strategy,
        replicas=strategy.num_replicas_in_sync,
        labels=labels,
        preprocessing=data_lib.preprocessing(config.data, size),
        skipped_images=int(sum(int(v.numpy()) for v in skipped)),
        allowed_config_changes=config_changes,
        paths={},
    )
    if config.qat:
        qat_lib.finish(model, fitted)
        if chief:
            metadata["qat"] = write_qat(fitted, config, metadata, run_dir, size)
    if config.model.lora_rank:
        # Saved, exported and returned as an ordinary model.
        model = merge_lora(model)
    if chief:
        write_outputs(model, config, metadata, run_dir, size, finished=finished)
    metadata["model"] = model
    if config.qat:
        metadata["qat_model"] = fitted
    return metadata


def _restore(config, strategy, stages, num_classes, run_dir):
    """Builds the model at the size of the latest checkpoint's stage (a
    checkpoint holds the model at the size of the stage that wrote it) and
    restores it; returns `(model, fitted, step)`: with a teacher, `fit` (and
    the checkpoints) run on a Distiller around the model (`fitted`), and
    `model` stays the student that is saved; otherwise both are the model."""
    checkpoints = run_dir / "checkpoints"
    saved = [entry["step"] for entry in checkpoint_lib.list_checkpoints(checkpoints)]
    latest = max(saved, default=0)
    with strategy.scope():
        model = build_model(
            config, num_classes, stages[_stage_of_checkpoint(stages, latest)][2]
        )
        fitted = distill_lib.wrap(qat_lib.wrap(model, config), config)
        _compile(fitted, config, strategy, 0)
    step = checkpoint_lib.restore_latest(checkpoints, fitted)
    if (
        step
        and config.model.lora_rank
        and not checkpoint_lib.holds_lora_state(checkpoints, step)
    ):
        # An older checkpoint: merged kernels and zero adapters (Keras' LoRA).
        restart_lora_adapters(model, config.seed + step)
    return model, fitted, step


def _fit_stages(model, fitted, config, strategy, stages, step, run_dir, chief):
    """Trains each resolution stage not yet done; returns `(model, fitted,
    step, skipped-image counters, whether anything trained)`."""
    ce = config.checkpoint_every
    skipped = []
    trained = False
    for _, end, size in stages:
        if end <= step:
            continue
        if tuple(model.input_shape[1:3]) != (size, size):
            with strategy.scope():
                model = with_image_size(model, size)
                fitted = distill_lib.wrap(qat_lib.wrap(model, config), config)
                _compile(fitted, config, strategy, step)
        train_ds = data_lib.make_train_dataset(
            config.data, size, config.batch_size, config.seed, start_step=step
        )
        if train_ds.skipped_images is not None:
            skipped.append(train_ds.skipped_images)
        fit_kwargs = {}
        if config.eval_every:
            fit_kwargs = dict(
                validation_data=data_lib.make_eval_dataset(
                    config.data, size, config.eval_batch_size
                ),
                validation_freq=config.eval_every,
            )
        fitted.fit(
            train_ds,
            steps_per_epoch=ce,
            epochs=end // ce,
            initial_epoch=step // ce,
            callbacks=_callbacks(run_dir, chief, config, step // ce),
            verbose=0 if config.verbose == 2 else config.verbose,
            shuffle=False,  # the stream is shuffled, deterministically
            **fit_kwargs,
        )
        step = end
        trained = True
    return model, fitted, step, skipped, trained


def _evaluate(fitted, config, size, step) -> dict:
    """Held-out accuracy and loss, as the first keys of the run metadata."""
    eval_ds = data_lib.make_eval_dataset(
        config.data,
        size,
        config.eval_batch_size,
        max_batches=2 if config.smoke else None,
    )
    results = fitted.evaluate(eval_ds, verbose=0, return_dict=True)
    if not all(math.isfinite(float(v)) for v in results.values()):
        # The held-out images were checked as they were read: NaN here is the
        # model's own (non-finite weights), and an accuracy then means nothing.
        raise checkpoint_lib.NonFiniteLossError(
            f"{config.name}: the held-out evaluation gave {results} after {step} "
            "steps: the trained weights hold NaN or Inf; lower the learning rate "
            "or resume from an earlier checkpoint."
        )
    accuracy = float(results["accuracy"])
    print(f"{config.name}: held-out accuracy {accuracy:.4f} after {step} steps")
    return {
        "name": config.name,
        "accuracy": accuracy,
        "eval_loss": float(results["loss"]),
        "steps": int(step),
        "optimizer_iterations": int(fitted.optimizer.iterations.numpy()),
    }
