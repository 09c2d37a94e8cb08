"""Ship a trained model: a SavedModel for TF Serving, `.tflite` files for
phones, `metadata.json`, and `predict` over any of them.

Layout written by `export_model(model, "digits")` under `root`:

    <root>/digits/<version>/       SavedModel (TF Serving layout)
        assets/labels.txt          one class name per line
        assets/metadata.json       this version's metadata
        assets.extra/tf_serving_warmup_requests
    <root>/digits/metadata.json    metadata of the latest export
    <root>/digits.keras            the Keras model
    <root>/digits.tflite           float32; also digits_float16.tflite,
                                   digits_dynamic_int8.tflite, digits_int8.tflite
                                   (and digits_int16x8.tflite when asked for)

The signatures are built in `keras_vit.deploy.signatures`.

A version is written to a hidden temporary folder beside its final name and
renamed into place, so TF Serving (which only loads folders named by an
integer) never sees a half-written version.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import uuid
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from keras_vit.deploy import int16, names
from keras_vit.deploy import tflite as tflite_lib
from keras_vit.deploy.checks import PIXEL_RANGE_SLACK, SERVING_INPUT
from keras_vit.deploy.names import check_export_target
from keras_vit.deploy.serving import BYTES_INPUT, BYTES_SIGNATURE
from keras_vit.deploy.signatures import Graphs, write_saved_model, write_warmup_requests
from keras_vit.deploy.versions import claim_version, is_latest, remove_stale_partials
from keras_vit.files import discard, signals_held, stage
from keras_vit.files import publish as publish_staged
from keras_vit.models import quantization
from keras_vit.models.image_bytes import DEFAULT_MAX_PIXELS
from keras_vit.models.lora import has_lora, merge_lora
from keras_vit.models.precision import (
    computes_in_float32,
    float32_copy,
    low_precision_policy,
)
from keras_vit.models.preprocessing import (
    normalize_pixels,
    normalize_preprocessing,
    resize_pixels,
)
from keras_vit.models.resolution import is_dynamic_size
from keras_vit.models.vit import model_architecture
from keras_vit.version import __version__

__all__ = ["check_export_target", "export_model"]

VERIFY_BATCH = 64


def _architecture(model: keras.Model, variant: str | None) -> dict:
    """What the metadata says about the model: its name, the variant string if
    given, and the architecture numbers read off the stable layer names."""
    return {
        "model_name": model.name,
        "variant": variant,
        **model_architecture(model),
        "parameters": int(model.count_params()),
    }


def _versions() -> dict:
    found = {"tensorflow": tf.__version__, "keras": keras.__version__}
    found["keras_vit"] = __version__
    try:
        found["ai_edge_litert"] = importlib.metadata.version("ai-edge-litert")
    except importlib.metadata.PackageNotFoundError:
        found["ai_edge_litert"] = None
    return found


def _pixel_batch(images, preprocessing: dict, what: str) -> np.ndarray:
    """Raw pixel images `(n, h, w, c)` as float32 at the model size."""
    array = np.asarray(images, dtype="float32")
    channels = preprocessing["num_channels"]
    if array.ndim != 4 or array.shape[-1] != channels or len(array) == 0:
        raise ValueError(
            f"{what} must be a non-empty batch of raw pixel images "
            f"(n, height, width, {channels}), got shape {array.shape}."
        )
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{what} holds NaN or Inf pixels.")
    scale = preprocessing["pixel_scale"]
    low, high = float(array.min()), float(array.max())
    if low < -PIXEL_RANGE_SLACK * scale or high > (1 + PIXEL_RANGE_SLACK) * scale:
        raise ValueError(
            f"{what} must be raw pixel values in [0, {scale:g}] (the exported "
            f"graph refuses others), got values from {low:g} to {high:g}."
        )
    if list(array.shape[1:3]) != preprocessing["image_size"]:
        # Bicubic / Lanczos kernels overshoot the range a little.
        array = np.clip(resize_pixels(array, preprocessing).numpy(), 0.0, scale)
    return array


def _parity(reference: dict, outputs: dict) -> dict:
    result = {}
    for key in ("logits", "probabilities"):
        if key in reference and key in outputs:
            diff = np.abs(np.asarray(outputs[key]) - reference[key])
            result[f"max_abs_diff_{key}"] = float(np.max(diff))
    top1 = np.argmax(outputs["probabilities"], -1)
    result["top1_agreement"] = float(
        np.mean(top1 == np.argmax(reference["probabilities"], -1))
    )
    return result


def _in_batches(fn, pixels: np.ndarray) -> dict[str, np.ndarray]:
    """`fn` (pixel batch -> dict of outputs) over `pixels` in slices."""
    parts = [
        fn(pixels[i : i + VERIFY_BATCH]) for i in range(0, len(pixels), VERIFY_BATCH)
    ]
    return {
        key: np.concatenate([np.asarray(p[key]) for p in parts]) for key in parts[0]
    }


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def export_model(
    model: keras.Model,
    name: str,
    root: str | os.PathLike = "saved_models",
    *,
    version: int | None = None,
    labels: list[str] | None = None,
    preprocessing: dict | None = None,
    representative_images=None,
    tflite=tflite_lib.DEFAULT_KINDS,
    verify_images=None,
    variant: str | None = None,
    top_k: int = 5,
    quantize: str | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> dict:
    """Exports `model` as a TF Serving SavedModel version, `.tflite` files and
    `metadata.json` under `root` (layout in the module docstring); returns the
    metadata.

    Args:
        model: a classifier returning logits (or softmax probabilities) for
            model-ready images `(batch, H, W, C)`.
        name: the served model's name; files are `<root>/<name>...`.
        root: folder holding the exported models.
        version: integer version; default: one more than the highest there.
        labels: class names, one per output; default `"0"`, `"1"`, ...
        preprocessing: see `normalize_preprocessing`; what turns raw pixels
            into the model's input.
        representative_images: raw pixel images `(n, h, w, C)` from the
            training data; required for the `"int8"` and `"int16x8"` kinds.
        tflite: TFLite kinds to write, a subset of `tflite.KINDS` (default
            `tflite.DEFAULT_KINDS`; `"int16x8"` only when named).
        verify_images: raw pixel images on which every artifact is compared
            with the Keras model; default: `representative_images`, else 16
            seeded random images. The figures go into the metadata.
        variant: variant string for the metadata, e.g. `"Ti/16"`.
        top_k: how many classes the bytes signature returns.
        quantize: None, or a `keras_vit.models.quantization` mode (`"int8"`,
            `"int4"`, `"float8"`): a quantized copy of `model` is exported,
            and its agreement with the float model goes into the metadata
            (`parity.quantized_vs_float`); SavedModel only (`tflite=()`).
        max_pixels: the bytes signature refuses images whose header declares
            more pixels (before decoding them); recorded in the metadata.
    """
    check_export_target(name, root)
    kinds = tflite_lib.check_kinds(tflite)
    if quantize is not None and kinds:
        raise ValueError(
            f"quantize={quantize!r} exports a Keras-quantized SavedModel, which "
            f"the TFLite converter cannot read (tflite={list(kinds)}): pass "
            "tflite=() with it. TFLite quantizes by itself: export without "
            "quantize for the 'dynamic_int8' and 'int8' kinds."
        )
    if kinds and is_dynamic_size(model):
        raise ValueError(
            f"A dynamic-size model exports no .tflite file (tflite={list(kinds)}): "
            "its in-graph bicubic resampling is no TFLite builtin op. Pass "
            "tflite=() for the SavedModel, and export with_image_size(model, "
            "size) for a .tflite at one size."
        )
    preprocessing = normalize_preprocessing(model, preprocessing)
    labels = _check_arguments(model, name, labels, top_k, version, quantize)
    representative, verify = _images(
        representative_images, verify_images, preprocessing, kinds
    )
    if has_lora(model):
        # The adapters folded into the kernels: an ordinary graph to export.
        model = merge_lora(model)
    trained = None
    if not computes_in_float32(model):
        # The same weights computing in float32 (models.precision): TFLite
        # converts no bfloat16 graph; the metadata says how far it is.
        trained, model = model, float32_copy(model)
    float_model = model
    if quantize is not None:
        model = quantization.quantized_copy(model, quantize)
    graphs = Graphs(model, labels, preprocessing, top_k, max_pixels)  # checks the head

    root = Path(root)
    model_dir = root / name
    created = not model_dir.exists()
    model_dir.mkdir(parents=True, exist_ok=True)
    try:
        remove_stale_partials(model_dir)
        reference = _reference(model, graphs, verify, preprocessing)
        version, reservation = claim_version(model_dir, name, version)
        partial = None
        staged = []
        try:
            final = model_dir / str(version)
            metadata = _metadata(
                name, version, model, variant, labels, preprocessing, graphs, reference
            )
            floats = reference
            if quantize is not None:
                floats = _reference(float_model, graphs, verify, preprocessing)
                metadata["quantization"] = quantize
                metadata["parity"]["quantized_vs_float"] = _parity(floats, reference)
            if trained is not None:
                metadata["trained_precision"] = low_precision_policy(trained)
                lows = _reference(trained, graphs, verify, preprocessing)
                metadata["parity"]["float32_vs_trained"] = _parity(lows, floats)
            partial, tflite_files = _write_version(
                model_dir,
                final,
                metadata,
                model,
                kinds,
                representative,
                verify,
                reference,
            )
            if is_latest(model_dir, version):  # else a later one finished first
                _stage_latest(staged, root, name, model, metadata, tflite_files)
            # Every file is written; what is left is renames, which Ctrl-C and
            # SIGTERM wait for: the version folder and the latest version's
            # files appear together or not at all (a full disk fails above).
            with signals_held():
                os.rename(partial, final)
                partial = None
                publish_staged(staged)
                staged.clear()
        finally:
            shutil.rmtree(reservation, ignore_errors=True)
            if partial is not None:
                shutil.rmtree(partial, ignore_errors=True)
            for temp, _ in staged:
                discard(temp)
    except BaseException:
        if created:
            # The folder this call made, if still empty (a concurrent
            # export's files keep it): a failed first export leaves nothing.
            with contextlib.suppress(OSError):
                model_dir.rmdir()
        raise
    return metadata


def _stage_latest(staged, root, name, model, metadata, tflite_files) -> None:
    """Stages the files beside the versions (the `.tflite` files, the
    `.keras` model, `metadata.json`) into `staged`, as `(temp, target)`."""
    for file, content in tflite_files.items():
        target = root / file
        staged.append((stage(target, lambda p, c=content: p.write_bytes(c)), target))
    target = root / f"{name}.keras"
    staged.append((stage(target, lambda p: model.save(str(p))), target))
    text = json.dumps(metadata, indent=2) + "\n"
    target = root / name / "metadata.json"
    staged.append((stage(target, lambda p: p.write_text(text)), target))


def _check_arguments(model, name, labels, top_k, version, quantize) -> list[str]:
    """Validates what `export_model` was given; returns the labels as strings."""
    num_classes = int(model.outputs[0].shape[-1])
    labels = [str(i) for i in range(num_classes)] if labels is None else labels
    labels = [str(label) for label in labels]
    if len(labels) != num_classes:
        raise ValueError(
            f"{len(labels)} labels given for a model with {num_classes} classes."
        )
    if any(not label or "\n" in label for label in labels):
        raise ValueError(f"labels must be non-empty single-line strings: {labels!r}")
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}.")
    if quantize is not None:
        quantization.check_quantization_mode(quantize)
    if version is not None and (not isinstance(version, int) or version < 1):
        raise ValueError(f"version must be a positive int, got {version!r}.")
    return labels


def _images(representative_images, verify_images, preprocessing, kinds):
    """The calibration batch (or None) and the parity batch, as raw pixels at
    the model size."""
    representative = None
    if representative_images is not None:
        representative = _pixel_batch(
            representative_images, preprocessing, "representative_images"
        )
    calibrated = [k for k in kinds if k in tflite_lib.CALIBRATED_KINDS]
    if calibrated and representative is None:
        raise ValueError(
            f"The {calibrated[0]!r} TFLite kind needs representative_images (raw "
            "pixel images from the training data) to calibrate; pass them or "
            f"leave {calibrated[0]!r} out of tflite={list(kinds)}."
        )
    if verify_images is not None:
        return representative, _pixel_batch(
            verify_images, preprocessing, "verify_images"
        )
    if representative is not None:
        return representative, representative[:256]
    h, w = preprocessing["image_size"]
    shape = (16, h, w, preprocessing["num_channels"])
    verify = (
        np.random.default_rng(0)
        .uniform(0, preprocessing["pixel_scale"], shape)
        .astype("float32")
    )
    return representative, verify


def _reference(model, graphs, verify, preprocessing) -> dict:
    """The Keras model's outputs on the parity batch."""
    keras_out = model.predict(
        normalize_pixels(verify, preprocessing), batch_size=VERIFY_BATCH, verbose=0
    )
    if graphs.softmax_inside:
        return {"probabilities": keras_out}
    probabilities = np.asarray(tf.nn.softmax(keras_out))
    return {"logits": keras_out, "probabilities": probabilities}


def _metadata(name, version, model, variant, labels, preprocessing, graphs, reference):
    pixels_shape = [-1, *(-1 if d is None else d for d in graphs.input_shape)]
    serving = {"inputs": {SERVING_INPUT: ["float32", pixels_shape]}}
    if graphs.multiple is not None:
        # Any size that is a multiple; parity below is at `image_size`.
        serving["size_multiple"] = list(graphs.multiple)
    return {
        "name": name,
        "version": version,
        "architecture": _architecture(model, variant),
        "image_size": preprocessing["image_size"],
        "num_channels": preprocessing["num_channels"],
        "labels": labels,
        "preprocessing": preprocessing,
        "signatures": {
            "serving_default": {**serving, "outputs": sorted(reference)},
            BYTES_SIGNATURE: {
                "inputs": {BYTES_INPUT: ["string", [-1]]},
                "outputs": ["class_ids", "labels", "probabilities"],
                "top_k": graphs.top_k,
                "max_pixels": graphs.max_pixels,
                "formats": ["JPEG", "PNG"],
            },
        },
        "out_of_range_pixels": (
            "serving_default refuses pixels outside [0, pixel_scale] (1% slack "
            "for rounding) with InvalidArgumentError, never clips; tflite.Runner "
            "and predict() raise ValueError."
        ),
        "nan_pixels": (
            "SavedModel signatures: InvalidArgumentError. TFLite files do not "
            "check: float32/float16 give NaN outputs for that image, the int8 "
            "kinds an ordinary-looking prediction; predict() raises ValueError."
        ),
        "versions": _versions(),
        "parity": {"num_images": int(len(next(iter(reference.values()))))},
        "files": {},
    }


def _write_version(
    model_dir, final, metadata, model, kinds, representative, verify, reference
) -> tuple[Path, dict[str, bytes]]:
    """Writes the SavedModel version into a hidden partial folder and checks it
    and each TFLite conversion against `reference`. Returns the partial
    folder (for the caller to rename to `final`) and the TFLite files'
    contents; the folder is removed if anything fails."""
    name, labels = metadata["name"], metadata["labels"]
    preprocessing = metadata["preprocessing"]
    partial = model_dir / f".{final.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tflite_files = {}
    try:
        signature_spec = metadata["signatures"][BYTES_SIGNATURE]
        limits = {k: signature_spec[k] for k in ("top_k", "max_pixels")}
        write_saved_model(model, partial, labels, preprocessing, **limits)
        write_warmup_requests(partial, name, verify[0], preprocessing)
        loaded = tf.saved_model.load(str(partial))
        signature = loaded.signatures["serving_default"]
        served = _in_batches(lambda x: signature(**{SERVING_INPUT: x}), verify)
        metadata["parity"]["saved_model"] = _parity(reference, served)
        del loaded
        for kind in kinds:
            source = partial
            if kind == "int16x8":
                source = partial / "int16x8_source"
                int16.write_source(model, source, labels, preprocessing, **limits)
            content = tflite_lib.convert(source, kind, representative)
            if source != partial:
                shutil.rmtree(source)
            ops = tflite_lib.check_builtin_only(content)
            outputs = _in_batches(tflite_lib.Runner(content), verify)
            metadata["parity"][f"tflite_{kind}"] = _parity(reference, outputs)
            metadata.setdefault("tflite_ops", {})[kind] = ops
            tflite_files[names.file_name(name, kind)] = content
        (partial / "assets").mkdir(exist_ok=True)
        (partial / "assets" / "labels.txt").write_text("\n".join(labels) + "\n")
        # Sizes in bytes; the SavedModel's counts all but its metadata.json.
        metadata["files"][f"{name}/{final.name}"] = _dir_size(partial)
        for file, content in tflite_files.items():
            metadata["files"][file] = len(content)
        (partial / "assets" / "metadata.json").write_text(
            json.dumps(metadata, indent=2) + "\n"
        )
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return partial, tflite_files
