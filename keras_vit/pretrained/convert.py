"""Pretrained ViT checkpoints from timm, Hugging Face transformers and
AugReg / big_vision `.npz` files, converted into keras_vit models.

The architecture is read off the tensors (and the `config.json` beside them),
the matching model is built, and every tensor is checked before any is
assigned: an unknown, missing or mis-shaped tensor raises `CheckpointError`
and no model is returned. Files are read by `keras_vit.pretrained.readers`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import keras
import numpy as np

from keras_vit.errors import CheckpointError
from keras_vit.files import sha256 as file_sha256
from keras_vit.files import write_atomic, write_json_atomic
from keras_vit.models.hybrid import HybridViT
from keras_vit.models.preprocessing import normalize_preprocessing
from keras_vit.models.resolution import resample_position_embedding
from keras_vit.models.vit import image_hw
from keras_vit.pretrained.config_values import check_overrides
from keras_vit.pretrained.detect import detect_architecture
from keras_vit.pretrained.hub import download_checkpoint
from keras_vit.pretrained.json_files import MAX_LISTED, name_list
from keras_vit.pretrained.layouts import Plan
from keras_vit.pretrained.metadata import source_metadata, timm_preprocessing
from keras_vit.pretrained.names import NamedCheckpoint, alias_preprocessing, lookup
from keras_vit.pretrained.readers import (
    TORCH_SUFFIXES,
    read_checkpoint,
    refuse_torch,
)

HUB_PATTERN = re.compile(r"^(hf-hub:)?[\w.-]+/[\w.-]+$")

# --------------------------------------------------------------------------
# Where a checkpoint comes from


def resolve_source(
    src, filename: str | None = None, revision=None, sha256=None
) -> Path:
    """A local file or folder as it is; otherwise a short name of
    `names.ALIASES` or a Hub repository id (downloaded, or found in the
    Hugging Face cache)."""
    entry = lookup(src) if not Path(src).exists() else None
    if entry is not None:
        return download_checkpoint(
            entry.repo_id,
            filename or entry.filename,
            revision or entry.revision,
            sha256 or entry.sha256,
        )
    path = Path(src)
    if path.exists():
        if sha256 is not None and path.is_file() and file_sha256(path) != sha256:
            raise CheckpointError(
                f"sha256 mismatch for {path}: expected {sha256}, the file has "
                f"{file_sha256(path)}."
            )
        return path
    if path.suffix.lower() in TORCH_SUFFIXES:
        refuse_torch(path)
    file_suffixes = (".safetensors", ".npz", ".json", *TORCH_SUFFIXES)
    if (
        isinstance(src, str)
        and HUB_PATTERN.match(src)
        and path.suffix not in file_suffixes
    ):
        return download_checkpoint(
            src, filename or "model.safetensors", revision, sha256
        )
    raise FileNotFoundError(
        f"No checkpoint at {str(src)!r}: not a local file or folder, and not a "
        "Hugging Face Hub repository id such as 'timm/vit_tiny_patch16_224."
        "augreg_in21k_ft_in1k', nor a short name such as 'vit-b16' "
        "(keras_vit.pretrained.names.ALIASES)."
    )


# --------------------------------------------------------------------------
# Building and loading


ARCHITECTURE_OVERRIDES = ("num_heads", "norm_groups", "layer_norm_epsilon")


def _values_for(model: keras.Model, plan: Plan, tensors: dict, skip: set[str]) -> dict:
    """Every model variable's new value; raises before anything is assigned."""
    variables = {v.path: v for v in model.weights}
    used, values, problems = set(), {}, []
    for target, (sources, fn) in plan.assign.items():
        if any(target.startswith(s) for s in skip):
            used.update(s for s in sources if s in tensors)
            continue
        missing = [s for s in sources if s not in tensors]
        if missing:
            problems.append(f"missing tensor(s) {name_list(missing)} for {target}")
            continue
        used.update(sources)
        if target not in variables:
            problems.append(
                f"tensor(s) {list(sources)} have no model variable {target}"
            )
            continue
        try:
            value = fn(*(tensors[s] for s in sources))
        except (ValueError, IndexError) as error:
            problems.append(f"tensor(s) {list(sources)} do not fit {target}: {error}")
            continue
        encoder = model.get_layer("patch_encoder")
        if target == "patch_encoder/pos_embedding" and encoder.grid_size != plan.grid:
            try:
                value = resample_position_embedding(
                    value,
                    encoder.grid_size,
                    plan.grid,
                    encoder.num_embedded_prefix_tokens,
                    encoder.position_resample,
                )
            except ValueError as error:
                problems.append(f"{sources[0]} cannot be resampled: {error}")
                continue
        expected = tuple(variables[target].shape)
        if tuple(value.shape) != expected:
            shapes = [tuple(tensors[s].shape) for s in sources]
            problems.append(
                f"{' + '.join(sources)} has shape {' + '.join(map(str, shapes))}, "
                f"which gives {tuple(value.shape)}; {target} needs {expected}"
            )
            continue
        values[target] = value
    unknown = sorted(set(tensors) - used - set(plan.ignored))
    if unknown:
        problems.append(
            f"{len(unknown)} unknown tensor(s) not used by the model: "
            f"{name_list(unknown)}"
        )
    unset = sorted(
        set(variables)
        - set(values)
        - {t for t in variables if any(t.startswith(s) for s in skip)}
    )
    if not problems and unset:
        problems.append(f"model variables with no tensor: {name_list(unset)}")
    if problems:
        # One line (the CLI prints it as it is), the first problems in full.
        more = len(problems) - MAX_LISTED
        shown = problems[:MAX_LISTED] + ([f"... and {more} more"] if more > 0 else [])
        raise CheckpointError(
            "The checkpoint does not match the model; nothing was loaded: "
            + "; ".join(shown)
        )
    return values


def _check_finite(tensors: dict, path) -> None:
    """A weight that is NaN or Inf makes every prediction NaN: refused by
    name rather than converted."""
    for name in sorted(tensors):
        value = np.asarray(tensors[name])
        if value.dtype.kind in "iub":  # bfloat16 (ml_dtypes) has kind "V"
            continue
        finite = np.isfinite(value)
        if not finite.all():
            count = int(value.size - finite.sum())
            raise CheckpointError(
                f"tensor {name!r} of {str(path)!r} holds {count} NaN or Inf "
                f"value(s) of {value.size}; the checkpoint is damaged (or was "
                "saved from a diverged run): use another one."
            )


def convert_checkpoint(
    src: str | os.PathLike,
    out_path: str | os.PathLike | None = None,
    *,
    image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None,
    include_top: bool | None = None,
    filename: str | None = None,
    revision: str | None = None,
    sha256: str | None = None,
    dynamic_size: bool = False,
    **overrides,
) -> keras.Model:
    """Converts a timm, Hugging Face or AugReg/big_vision ViT checkpoint.

    Args:
        src: a `.safetensors` or `.npz` file, a folder holding
            `model.safetensors` (+ `config.json`), or a Hugging Face Hub id
            (`"timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"`,
            `"google/vit-base-patch16-224"`), downloaded when
            `huggingface_hub` is installed and the network allows.
        out_path: where to save the model as `.keras` (written to a
            temporary file and renamed, so never half-written). The
            checkpoint's preprocessing and class names go beside it, in
            `<out_path without .keras>/metadata.json` (the trainer's format,
            found by `predict`, `evaluate`, `visualize` and `export`).
        image_size: build at this size; the position embedding is resampled
            from the checkpoint's grid with the kernel of the library the
            checkpoint came from (timm, Hugging Face or big_vision), which
            the model records for `with_image_size` and `dynamic_size`.
        num_classes: a new head of this size (zero-initialised, for
            fine-tuning) instead of the checkpoint's.
        include_top: `False` drops the head.
        filename, revision, sha256: which Hub file / revision to fetch, and
            the sha256 it must have (checked for local files too).
        dynamic_size: a model that takes images of any size (multiples of
            the patch size), its position table resampled in the graph with
            the source's kernel, as `ViT(dynamic_size=True)`.
        **overrides: what the tensors cannot tell and the config does not
            say: `num_heads`, `norm_groups` (hybrid GroupNorm groups, default
            32), `layer_norm_epsilon`.

    Returns:
        A `keras.Model` (`ViT` or `HybridViT`) holding every tensor.
    """
    unknown = set(overrides) - set(ARCHITECTURE_OVERRIDES)
    if unknown:
        raise ValueError(
            f"Unknown options {sorted(unknown)}; valid: image_size, num_classes, "
            "include_top, filename, revision, sha256, "
            f"{', '.join(ARCHITECTURE_OVERRIDES)}."
        )
    check_overrides(overrides)
    if out_path is not None and Path(out_path).suffix != ".keras":
        raise ValueError(f"out_path must end in .keras, got {str(out_path)!r}.")
    if num_classes is not None and (
        isinstance(num_classes, bool)
        or not isinstance(num_classes, int)
        or num_classes < 1
    ):
        raise ValueError(f"`num_classes` must be a positive int, got {num_classes!r}.")
    path = resolve_source(src, filename, revision, sha256)
    tensors, config = read_checkpoint(path)
    _check_finite(tensors, path)
    hints = {
        "image_size": image_hw(image_size) if image_size else None,
        "num_heads": overrides.get("num_heads"),
    }
    plan = detect_architecture(tensors, config, hints)
    kwargs = dict(plan.kwargs)
    if "norm_groups" in overrides and plan.builder is not HybridViT:
        raise ValueError("norm_groups= applies to hybrid checkpoints only.")
    kwargs.update(overrides)
    skip = set()
    if include_top is False:
        kwargs["include_top"] = False
    if num_classes is not None and num_classes != plan.num_classes:
        kwargs["num_classes"] = num_classes
        kwargs["include_top"] = include_top is not False
        skip = {"head/", "head_dist/"}
    if not kwargs.get("include_top", True):
        skip |= {"head/", "head_dist/"}
    elif include_top and not plan.num_classes and num_classes is None:
        raise ValueError(
            "This checkpoint has no classification head; pass num_classes= for "
            "a new one, or leave include_top unset for the features."
        )
    source_size = (plan.grid[0] * plan.stride, plan.grid[1] * plan.stride)
    kwargs["image_size"] = image_hw(image_size) if image_size else source_size
    if dynamic_size:
        kwargs["dynamic_size"] = True
    model = plan.builder(**kwargs)
    values = _values_for(model, plan, tensors, skip)
    for variable in model.weights:
        if variable.path in values:
            variable.assign(values[variable.path])
    if out_path is not None:
        save_atomically(model, out_path)
        metadata = source_metadata(
            model,
            plan.layout,
            config,
            path if path.is_dir() else path.parent,
            new_head=num_classes is not None and num_classes != plan.num_classes,
            source=str(src),
        )
        entry = lookup(src) if not Path(src).exists() else None
        if entry is not None:
            _add_alias_metadata(metadata, model, entry)
        folder = Path(out_path).with_suffix("")
        folder.mkdir(exist_ok=True)
        write_json_atomic(folder / "metadata.json", metadata)
    return model


def _add_alias_metadata(metadata: dict, model: keras.Model, entry: NamedCheckpoint):
    """The alias table's preprocessing where the downloaded config states
    none, and the repository the short name stands for."""
    metadata["source"]["repo_id"] = entry.repo_id
    config = alias_preprocessing(entry)
    if "preprocessing" not in metadata and config is not None:
        preprocessing = timm_preprocessing(config)
        metadata["preprocessing"] = normalize_preprocessing(model, preprocessing)


def from_pretrained(
    name: str, out_path: str | os.PathLike | None = None, **options
) -> keras.Model:
    """A named checkpoint as a keras_vit model.

    Args:
        name: a short name of `keras_vit.pretrained.names.ALIASES`
            (`"vit-b16"`, `"deit-s16"`, ...), a Hugging Face Hub id
            (`"timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"`,
            `"facebook/dinov2-small"`), or a local checkpoint path.
            Downloads go into the Hugging Face cache and are read from there
            afterwards, also offline (`HF_HUB_OFFLINE=1`); they need the
            `hub` extra (`pip install 'keras-vit-tf[hub]'`).
        out_path: also save the model there (`.keras`, with its
            `metadata.json`: preprocessing and labels).
        **options: as for `convert_checkpoint` (`image_size`,
            `num_classes`, `include_top`, `dynamic_size`, `revision`,
            `sha256`, ...).

    Returns:
        The converted `keras.Model`.
    """
    return convert_checkpoint(name, out_path, **options)


def save_atomically(model: keras.Model, out_path: str | os.PathLike) -> Path:
    """`model.save` to a temporary file beside `out_path`, then a rename."""
    out_path = Path(out_path)
    if out_path.suffix != ".keras":
        raise ValueError(f"out_path must end in .keras, got {str(out_path)!r}.")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(out_path, lambda path: model.save(str(path)))
