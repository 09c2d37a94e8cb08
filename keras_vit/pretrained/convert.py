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
from keras_vit.models.resolution import resample_position_embedding
from keras_vit.models.vit import image_hw
from keras_vit.pretrained.detect import detect_architecture
from keras_vit.pretrained.layouts import Plan
from keras_vit.pretrained.metadata import source_metadata
from keras_vit.pretrained.readers import (
    TORCH_SUFFIXES,
    read_checkpoint,
    refuse_torch,
)

HUB_PATTERN = re.compile(r"^(hf-hub:)?[\w.-]+/[\w.-]+$")

# --------------------------------------------------------------------------
# The Hugging Face Hub


def _import_hub():
    try:
        import huggingface_hub
    except ImportError:
        raise ImportError(
            "Downloading checkpoints by name needs huggingface_hub: "
            'pip install "keras-vit-tf[hub]". Local paths work without it.'
        ) from None
    return huggingface_hub


def download_checkpoint(
    repo_id: str,
    filename: str = "model.safetensors",
    revision: str | None = None,
    sha256: str | None = None,
) -> Path:
    """Downloads `filename` (and `config.json`) of a Hub repository into the
    Hugging Face cache and checks the checkpoint's sha256.

    The expected digest is `sha256` when given, otherwise the Hub's own: the
    cache stores large (LFS) files under their sha256. Returns the local
    path of the checkpoint.
    """
    hub = _import_hub()
    repo_id = repo_id.removeprefix("hf-hub:")
    if filename.endswith(TORCH_SUFFIXES):
        refuse_torch(Path(filename))
    try:
        local = Path(hub.hf_hub_download(repo_id, filename, revision=revision))
    except Exception as error:
        # Matched by class name: huggingface_hub has renamed and re-parented
        # these across releases.
        kinds = {c.__name__ for c in type(error).__mro__}
        offline = kinds & {"LocalEntryNotFoundError", "OfflineModeIsEnabled"}
        if not offline and "EntryNotFoundError" in kinds:
            raise CheckpointError(
                f"Hub repository {repo_id!r} has no {filename!r}. keras_vit reads "
                "safetensors or .npz files only (PyTorch .bin pickles are refused)."
            ) from None
        if not offline and "RepositoryNotFoundError" in kinds:
            raise CheckpointError(
                f"No Hub repository {repo_id!r} (or it is private or gated)."
            ) from None
        raise ConnectionError(
            f"Could not download {filename!r} from the Hugging Face Hub repository "
            f"{repo_id!r} ({type(error).__name__}: {error}). This needs network "
            "access (or the file in the local Hugging Face cache); offline, pass "
            "the path of a local checkpoint instead."
        ) from None
    for extra in ("config.json", "preprocessor_config.json"):
        try:
            hub.hf_hub_download(repo_id, extra, revision=revision)
        except Exception:
            pass  # timm .npz repos and others lack them; the tensors suffice.
    blob = local.resolve().name
    expected = sha256 or (blob if re.fullmatch(r"[0-9a-f]{64}", blob) else None)
    if expected is None:
        raise CheckpointError(
            f"Cannot verify {filename!r} from {repo_id!r}: the Hub gave no sha256 "
            "for it; pass sha256= with the digest you expect."
        )
    actual = file_sha256(local)
    if actual != expected.lower():
        raise CheckpointError(
            f"sha256 mismatch for {filename!r} from {repo_id!r}: expected "
            f"{expected}, the file has {actual}. Delete it from the Hugging Face "
            "cache and download again."
        )
    return local


def resolve_source(
    src, filename: str | None = None, revision=None, sha256=None
) -> Path:
    """A local file or folder as it is; otherwise a Hub repository id."""
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
        "augreg_in21k_ft_in1k'."
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
            problems.append(f"missing tensor(s) {missing} for {target}")
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
    unknown = sorted(set(tensors) - used)
    if unknown:
        problems.append(f"unknown tensor(s) not used by the model: {unknown}")
    unset = sorted(
        set(variables)
        - set(values)
        - {t for t in variables if any(t.startswith(s) for s in skip)}
    )
    if not problems and unset:
        problems.append(f"model variables with no tensor: {unset}")
    if problems:
        raise CheckpointError(
            "The checkpoint does not match the model; nothing was loaded:\n  - "
            + "\n  - ".join(problems)
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
            (bicubic) from the checkpoint's grid.
        num_classes: a new head of this size (zero-initialised, for
            fine-tuning) instead of the checkpoint's.
        include_top: `False` drops the head.
        filename, revision, sha256: which Hub file / revision to fetch, and
            the sha256 it must have (checked for local files too).
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
        folder = Path(out_path).with_suffix("")
        folder.mkdir(exist_ok=True)
        write_json_atomic(folder / "metadata.json", metadata)
    return model


def save_atomically(model: keras.Model, out_path: str | os.PathLike) -> Path:
    """`model.save` to a temporary file beside `out_path`, then a rename."""
    out_path = Path(out_path)
    if out_path.suffix != ".keras":
        raise ValueError(f"out_path must end in .keras, got {str(out_path)!r}.")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(out_path, lambda path: model.save(str(path)))
