"""The training config: dataclasses (model, data, optimizer, run),
validation, and the command-line overrides (parsed by `overrides`).

Keys are dotted (`optim.learning_rate`, `data.source`, `model.variant`) and
every one can be overridden from the command line. Recipes, the named
configs, live in `keras_vit.training.recipes`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from keras_vit.deploy import names
from keras_vit.hardware import PRECISIONS
from keras_vit.models.layers import POSITION_EMBEDDINGS
from keras_vit.models.preprocessing import DEFAULT_MEAN, DEFAULT_STD, RESIZE_METHODS
from keras_vit.models.vit import (
    ARCHITECTURE_KEYS,
    MAX_IMAGE_SIZE,
    parse_variant,
    split_variant,
)
from keras_vit.training.overrides import dotted_keys, replace_dotted

MODEL_KINDS = ("vit", "hybrid", "cnn")
STEM_KINDS = ("resnet", "cnn")
STRATEGY_NAMES = ("default", "mirrored", "multiworker", "tpu")


SOURCES = ("digits", "synthetic", "folder", "tfrecord", "tfds", "arrays", "mnist5k")


@dataclass
class DataConfig:
    """Where the images come from, how they are normalised and augmented.

    `source`: one of `SOURCES`. `path`: image-folder root (holding one folder
    per split, each holding one folder per class), TFRecord folder, TFDS
    dataset name, or `.npz` with `x_train, y_train, x_eval, y_eval` for
    `"arrays"`. Splits are sub-folders / file prefixes / TFDS split names.
    """

    source: str = "digits"
    path: str = ""
    train_split: str = "train"
    eval_split: str = "val"
    tfds_data_dir: str = ""
    num_classes: int = 0  # 0: from the source
    num_channels: int = 3
    mean: tuple[float, ...] = DEFAULT_MEAN
    std: tuple[float, ...] = DEFAULT_STD
    pixel_scale: float = 255.0
    resize_method: str = "bilinear"
    # Centre crop at evaluation (0.875: 256 -> 224), recorded as the
    # preprocessing's crop_fraction so that predict and the export apply it.
    eval_crop: float = 1.0
    shuffle_buffer: int = 10_000  # record streams only
    on_error: str = "raise"  # or "skip": drop undecodable images and count them
    synthetic_size: int = 512
    crop_scale_min: float = 1.0  # < 1: random resized crop with this min area
    flip: bool = False
    randaugment_ops: int = 0
    randaugment_magnitude: float = 0.5
    # A random affine warp after the resize (see `augment.Augmenter`): shift
    # as a fraction of the side, rotation in degrees, relative zoom.
    translate: float = 0.0
    rotate: float = 0.0
    zoom: float = 0.0
    # Elastic distortion after the warp (Simard et al. 2003), in pixels at
    # the model's resolution: field scale (0 = off) and smoothing.
    elastic_alpha: float = 0.0
    elastic_sigma: float = 4.0
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    arrays: dict | None = field(default=None, repr=False)  # in-process only


@dataclass
class ModelConfig:
    """`ViT(variant, image_size, ...)`; 0 / "" / None keeps the variant's value.

    `resize_at`: progressive resizing, `((step, image_size), ...)`: from that
    optimizer step on the model is rebuilt at the new size with
    `keras_vit.models.resolution.with_image_size` (position embedding resampled).
    `pretrained`: a `.keras` file whose weights initialise the model by layer
    name (resized to `image_size`; a head of another shape is left fresh), or
    a timm / Hugging Face / AugReg checkpoint (`keras_vit.pretrained`),
    whose own architecture is then used with a new zero head. `freeze_backbone`: a
    linear probe, only the head trains. `lora_rank` > 0: LoRA fine-tuning
    (`keras_vit.enable_lora`, QKV and projection), saved and exported merged.
    """

    kind: str = "vit"
    variant: str = "Ti/16"
    image_size: int = 224
    patch_size: int = 0
    hidden_dim: int = 0
    num_layers: int = 0
    num_heads: int = 0
    mlp_dim: int = 0
    pooling: str = "token"
    # "learned" (ViT) or "sincos" (fixed 2-D sine-cosine, Beyer et al. 2022).
    position_embedding: str = "learned"
    # Shifted patch tokenisation (`Patches(shifted=True)`, with the patch
    # LayerNorms of `patch_norm` as in the SPT paper), kind "vit" only.
    shifted_patches: bool = False
    representation_size: int = 0
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    drop_path_rate: float = 0.0
    layer_scale_init: float = 0.0
    resize_at: tuple = ()
    pretrained: str = ""
    freeze_backbone: bool = False
    lora_rank: int = 0
    # Gradient checkpointing of every encoder block but the last
    # (`ViT(remat=True)`): less activation memory for one more forward pass
    # of each of those blocks.
    remat: bool = False
    distilled: bool = False  # DeiT class + distillation tokens and heads
    # kind="hybrid": stem_kind "resnet" is the paper's ResNet-v2, `stem`
    # blocks per stage (() = R50), `stem_width` wide (0 = 64); "cnn" is
    # SmallCNN's stages (`cnn_widths`), sized for small images.
    # kind="cnn": SmallCNN's filters per stage.
    stem_kind: str = "resnet"
    stem: tuple = ()
    stem_width: int = 0
    cnn_widths: tuple = (32, 64, 128)

    def architecture_overrides(self) -> dict:
        """The `ARCHITECTURE_KEYS` this config sets (0 keeps the variant's
        value): what `ViT`, `HybridViT` and the FLOP counter take."""
        return {key: getattr(self, key) or None for key in ARCHITECTURE_KEYS}

    def architecture(self) -> dict:
        """The whole architecture, `ARCHITECTURE_KEYS` -> int: the variant's
        table entry (`keras_vit.models.vit.parse_variant`) with this config's
        overrides. A variant without a patch size (a hybrid's `"Ti"`) reads
        as patch 16, the stride of the default stem."""
        overrides = self.architecture_overrides()
        if overrides["patch_size"] is None and split_variant(self.variant)[1] is None:
            overrides["patch_size"] = 16
        return parse_variant(self.variant, **overrides)


@dataclass
class OptimConfig:
    """AdamW with linear warmup and cosine decay.

    `lr_base_batch_size > 0` scales the learning rate linearly with the
    effective global batch (`batch_size * gradient_accumulation_steps`), as
    DeiT does: `lr = learning_rate * batch / lr_base_batch_size`. Biases,
    norms, layer scales, position embedding and tokens get no weight decay.
    """

    learning_rate: float = 1e-3
    lr_base_batch_size: int = 0
    warmup_steps: int = 0
    end_lr_fraction: float = 0.0
    weight_decay: float = 0.05
    beta_1: float = 0.9
    beta_2: float = 0.999
    clipnorm: float = 1.0
    gradient_accumulation_steps: int = 1
    use_ema: bool = False
    ema_momentum: float = 0.9999
    label_smoothing: float = 0.0
    layer_decay: float = 1.0  # < 1: block i of L learns at lr * decay ** (L - i)


@dataclass
class DistillConfig:
    """Distillation from a frozen teacher (`keras_vit.training.distill`).

    `teacher`: "" (none), a `.keras` classifier (keras_vit or any Keras
    model, e.g. a CNN) or a checkpoint `convert_checkpoint` reads. `kind`:
    `hard` (the teacher's argmax, DeiT) or `soft` (KL at `temperature`).
    `weight`: the distillation loss's share, `(1 - weight) * CE + weight *
    distillation`. `teacher_mean` / `teacher_std`: the teacher's input
    normalisation of `pixels / pixel_scale`; () takes the `metadata.json`
    beside a `.keras` teacher, else the data's. `teacher_recipe`: the recipe
    whose run writes `teacher` (named when the file is missing; trained first
    with `keras-vit train --train-teacher`).
    """

    teacher: str = ""
    teacher_recipe: str = ""
    kind: str = "hard"
    temperature: float = 1.0
    weight: float = 0.5
    teacher_mean: tuple = ()
    teacher_std: tuple = ()


@dataclass
class TrainConfig:
    """One training run. Steps count batches (`optimizer.iterations`); a
    Keras "epoch" is one checkpoint interval of `checkpoint_every` steps."""

    name: str = "run"
    run_dir: str = ""  # "": runs/<name>
    seed: int = 0
    smoke: bool = False
    strategy: str = "default"
    # "auto": chosen for this machine and model by keras_vit.hardware (the
    # choice is printed and recorded in metadata.json under "settings").
    precision: str = "float32"
    jit_compile: bool | str = False
    batch_size: int = 64  # global, split over replicas
    eval_batch_size: int = 256
    total_steps: int = 1000
    checkpoint_every: int = 100
    eval_every: int = 0  # in checkpoint intervals; 0: only at the end
    verbose: int = 1  # Keras progress bar: 0 silent, 1 bar, 2 one line per epoch
    export_name: str = ""  # "": no export into export_root
    export_root: str = "saved_models"
    export_quantize: str = ""  # "", "int8", "int4" or "float8" (model.quantize)
    # Resume a run folder although trajectory settings changed (recorded in
    # fingerprint.json and the run metadata); see training.run_folder.
    allow_config_change: bool = False
    # Quantization-aware fine-tuning (keras_vit.training.qat).
    qat: bool = False
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)


def config_keys() -> list[str]:
    """Every key `override` accepts, dotted."""
    return dotted_keys(TrainConfig)


def override(config: TrainConfig, **values) -> TrainConfig:
    """A copy of `config` with dotted keys replaced (`{"optim.learning_rate":
    "3e-4"}`); strings are parsed to the key's type. Unknown keys raise a
    ValueError listing the valid ones."""
    return replace_dotted(config, values)


def _check(key, value, low, high=None, kind=(int, float)):
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"{key} must be a number, got {value!r}.")
    if not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number, got {value!r}.")
    if value < low or (high is not None and value > high):
        valid = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{key} must be in {valid}, got {value!r}.")


def validate(config: TrainConfig) -> TrainConfig:
    """ValueErrors naming the key, the bad value and the valid range."""
    _validate_run(config)
    _validate_model(config.model)
    _validate_optim(config.optim)
    _validate_schedule(config)
    validate_data_config(config.data)
    _validate_distill(config.distill)
    if config.qat not in (True, False):
        raise ValueError(f"qat must be true or false, got {config.qat!r}.")
    if config.export_name:
        # Checked before training, so a name the export cannot write is not
        # found out after the whole run.
        _validate_export_target(config.export_name, config.export_root)
    if config.qat and config.precision not in ("auto", "float32"):
        # Its int8 .tflite is converted from the float32 QAT model.
        raise ValueError(
            f"qat trains under float32 (precision 'auto' or 'float32'); got "
            f"precision={config.precision!r}."
        )
    if config.qat and config.distill.teacher:
        raise ValueError(
            "qat does not combine with a teacher; got distill.teacher "
            f"{config.distill.teacher!r} with qat=true."
        )
    return config


def _validate_run(config: TrainConfig) -> None:
    for key, value, choices in (
        ("precision", config.precision, (*PRECISIONS, "auto")),
        ("jit_compile", config.jit_compile, (True, False, "auto")),
        ("strategy", config.strategy, STRATEGY_NAMES),
        ("model.pooling", config.model.pooling, ("token", "gap")),
        ("export_quantize", config.export_quantize, ("", "int8", "int4", "float8")),
        ("model.kind", config.model.kind, MODEL_KINDS),
        ("model.stem_kind", config.model.stem_kind, STEM_KINDS),
    ):
        if value not in choices:
            raise ValueError(f"{key} must be one of {list(choices)}, got {value!r}.")
    for key, low, high in (
        ("seed", 0, 2**31 - 1),
        ("batch_size", 1, None),
        ("eval_batch_size", 1, None),
        ("total_steps", 1, None),
        ("checkpoint_every", 1, None),
        ("eval_every", 0, None),
        ("verbose", 0, 2),
    ):
        _check(key, getattr(config, key), low, high, int)


def _validate_model(model: ModelConfig) -> None:
    _check("model.image_size", model.image_size, 1, MAX_IMAGE_SIZE, int)
    for key in (*ARCHITECTURE_KEYS, "representation_size", "lora_rank"):
        _check(f"model.{key}", getattr(model, key), 0, None, int)
    for key in ("dropout_rate", "attention_dropout_rate", "drop_path_rate"):
        _check(f"model.{key}", getattr(model, key), 0.0, 0.99)
    _check("model.layer_scale_init", model.layer_scale_init, 0.0)
    if model.shifted_patches and model.kind != "vit":
        raise ValueError(
            "model.shifted_patches cuts the image itself into patches: "
            f'kind "vit" only, got kind {model.kind!r}.'
        )
    if model.position_embedding not in POSITION_EMBEDDINGS:
        raise ValueError(
            f"model.position_embedding must be one of {list(POSITION_EMBEDDINGS)}, "
            f"got {model.position_embedding!r}."
        )
    if model.remat and (
        model.kind == "cnn" or model.dropout_rate or model.attention_dropout_rate
    ):
        raise ValueError(
            "model.remat=True applies to a transformer (kind 'vit' or 'hybrid') "
            "with dropout_rate=0 and attention_dropout_rate=0, got "
            f"kind={model.kind!r}, dropout_rate={model.dropout_rate!r}, "
            f"attention_dropout_rate={model.attention_dropout_rate!r}."
        )
    if model.lora_rank and (
        model.kind != "vit" or model.freeze_backbone or model.resize_at
    ):
        raise ValueError(
            f"model.lora_rank={model.lora_rank} applies to model.kind='vit' without "
            f"freeze_backbone or resize_at, got kind={model.kind!r}, "
            f"freeze_backbone={model.freeze_backbone!r}, "
            f"resize_at={model.resize_at!r}."
        )


def _validate_optim(optim: OptimConfig) -> None:
    for key, low, high in (
        ("learning_rate", 1e-12, 10.0),
        ("weight_decay", 0.0, 10.0),
        ("beta_1", 0.0, 1.0),
        ("beta_2", 0.0, 1.0),
        ("clipnorm", 0.0, None),
        ("end_lr_fraction", 0.0, 1.0),
        ("ema_momentum", 0.0, 1.0),
        ("label_smoothing", 0.0, 0.99),
        ("layer_decay", 0.0, 1.0),
    ):
        _check(f"optim.{key}", getattr(optim, key), low, high)
    if optim.layer_decay == 0.0:
        raise ValueError("optim.layer_decay must be in (0, 1], got 0.0.")
    for key, low in (
        ("lr_base_batch_size", 0),
        ("warmup_steps", 0),
        ("gradient_accumulation_steps", 1),
    ):
        _check(f"optim.{key}", getattr(optim, key), low, None, int)


def _validate_schedule(config: TrainConfig) -> None:
    """Steps: checkpoints divide the run, warm-up ends before it, resolution
    stages increase and fall on checkpoints."""
    ce = config.checkpoint_every
    if config.total_steps % ce:
        raise ValueError(
            f"total_steps ({config.total_steps}) must be a multiple of "
            f"checkpoint_every ({config.checkpoint_every}), e.g. "
            f"{config.checkpoint_every * max(1, config.total_steps // ce)}."
        )
    accumulate = config.optim.gradient_accumulation_steps
    if config.total_steps % accumulate:
        # Keras applies the summed gradients every `accumulate` steps: the
        # steps after the last full group would never reach the optimizer
        # (with more micro-steps than steps, none would: no training at all).
        updates = config.total_steps // accumulate
        raise ValueError(
            f"total_steps ({config.total_steps}) must be a multiple of "
            f"optim.gradient_accumulation_steps ({accumulate}): "
            f"{config.total_steps % accumulate} step(s) would never reach the "
            f"optimizer ({updates} update(s)); e.g. total_steps="
            f"{accumulate * max(1, updates)}."
        )
    if config.optim.warmup_steps >= config.total_steps:
        raise ValueError(
            f"optim.warmup_steps must be < total_steps={config.total_steps}, "
            f"got {config.optim.warmup_steps}."
        )
    previous = 0
    resize_at = config.model.resize_at
    for stage in resize_at:
        if not (
            isinstance(stage, tuple | list)
            and len(stage) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in stage)
        ):
            raise ValueError(
                "model.resize_at must be ((step, image_size), ...) of ints, "
                f"got {resize_at!r}."
            )
        step, size = stage
        _check("model.resize_at image_size", size, 1, MAX_IMAGE_SIZE, int)
        if not previous < step < config.total_steps or step % config.checkpoint_every:
            raise ValueError(
                f"model.resize_at steps must increase, lie in (0, total_steps="
                f"{config.total_steps}) and be multiples of checkpoint_every="
                f"{config.checkpoint_every}; got {step!r} in {resize_at!r}."
            )
        previous = step


def _validate_export_target(name, root) -> None:
    names.check_export_target(name, root, "export_name", "export_root")


def _validate_distill(distill: DistillConfig) -> None:
    if distill.kind not in ("hard", "soft"):
        raise ValueError(
            f"distill.kind must be one of ['hard', 'soft'], got {distill.kind!r}."
        )
    _check("distill.temperature", distill.temperature, 0.0)
    if distill.temperature == 0:
        raise ValueError("distill.temperature must be > 0, got 0.0.")
    _check("distill.weight", distill.weight, 0.0, 1.0)


_CHOICES = {
    "source": SOURCES,
    "on_error": ("raise", "skip"),
    "resize_method": RESIZE_METHODS,
}


def validate_data_config(config: DataConfig) -> None:
    """ValueErrors that name the key, the bad value and what is valid."""
    for key, choices in _CHOICES.items():
        if getattr(config, key) not in choices:
            raise ValueError(
                f"data.{key} must be one of {list(choices)}, "
                f"got {getattr(config, key)!r}."
            )
    for key, low, high in (
        ("num_classes", 0, None),
        ("num_channels", 1, 4),
        ("shuffle_buffer", 1, None),
        ("synthetic_size", 1, None),
        ("randaugment_ops", 0, 11),
    ):
        _check(f"data.{key}", getattr(config, key), low, high, int)
    for key, low, high in (
        ("pixel_scale", 1e-6, None),
        ("eval_crop", 1e-6, 1.0),
        ("crop_scale_min", 1e-6, 1.0),
        ("randaugment_magnitude", 0.0, 1.0),
        ("mixup_alpha", 0.0, None),
        ("cutmix_alpha", 0.0, None),
        ("translate", 0.0, 0.5),
        ("rotate", 0.0, 180.0),
        ("zoom", 0.0, 0.9),
        ("elastic_alpha", 0.0, 1000.0),
        ("elastic_sigma", 0.1, 100.0),
    ):
        _check(f"data.{key}", getattr(config, key), low, high)
    for key in ("mean", "std"):
        values = getattr(config, key)
        if not isinstance(values, tuple | list) or not values:
            raise ValueError(
                f"data.{key} must be a tuple of numbers, one per channel or one "
                f"for all, e.g. (0.5,), got {values!r}."
            )
        for value in values:
            _check(f"data.{key}", value, -1e6 if key == "mean" else 0.0)
    if len(config.mean) not in (1, config.num_channels) or len(config.std) != len(
        config.mean
    ):
        raise ValueError(
            f"data.mean and data.std need 1 or num_channels={config.num_channels} "
            f"values each, got {config.mean!r} and {config.std!r}."
        )
    if any(s <= 0 for s in config.std):
        raise ValueError(f"data.std must be positive, got {config.std!r}.")
    if config.source in ("folder", "tfrecord", "tfds") and not config.path:
        raise ValueError(f"source={config.source!r} needs data.path.")


def data_keys() -> list[str]:
    return [f.name for f in dataclasses.fields(DataConfig) if f.name != "arrays"]
