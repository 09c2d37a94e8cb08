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

Signatures of the SavedModel:

- `serving_default`: `pixels` float32 `(batch, H, W, C)` raw pixel values in
  `[0, pixel_scale]` at exactly the exported size -> `logits` and
  `probabilities` float32 `(batch, num_classes)`. The graph normalises
  (`(pixels / pixel_scale - mean) / std`) and checks the shape and that every
  pixel is finite; a wrong size or channel count, or a NaN / Inf pixel, is an
  `InvalidArgumentError` that names the expected shape. TF Serving only checks
  dtypes, so these checks live in the graph.
- `classify_images`: `images` string `(batch,)` of encoded JPEG or PNG files of
  any size -> top-k `class_ids` int32, `labels` string and `probabilities`
  float32, each `(batch, k)`. Images are decoded to C channels and resized to
  H x W inside the graph (`resize_method`, as in training). Bytes that are not
  a JPEG or PNG are an `InvalidArgumentError` saying so.

A version is written to a hidden temporary folder beside its final name and
renamed into place, so TF Serving (which only loads folders named by an
integer) never sees a half-written version.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import uuid
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from keras_vit.deploy import tflite as tflite_lib
from keras_vit.deploy.serving import (
    BYTES_INPUT,
    BYTES_SIGNATURE,
    SERVING_INPUT,
    ends_in_softmax,
    predict,
    prediction_log_bytes,
)
from keras_vit.files import write_atomic
from keras_vit.models.preprocessing import (
    normalize_pixels,
    normalize_preprocessing,
    resize_pixels,
)
from keras_vit.version import __version__

__all__ = ["export_model", "predict", "write_saved_model", "write_warmup_requests"]

WARMUP_FILE = "tf_serving_warmup_requests"
VERIFY_BATCH = 64
JPEG_MAGIC = b"\xff\xd8\xff"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class _Graphs:
    """The serving functions, built around one model and its constants."""

    def __init__(self, model, labels, preprocessing, top_k):
        self.model = model
        self.labels = labels
        self.pre = preprocessing
        self.top_k = min(int(top_k), len(labels))
        self.softmax_inside = ends_in_softmax(model)
        h, w = preprocessing["image_size"]
        self.shape = [h, w, preprocessing["num_channels"]]
        self.shape_text = f"(batch, {h}, {w}, {preprocessing['num_channels']})"

    def scores(self, pixels):
        x = normalize_pixels(pixels, self.pre)
        out = tf.cast(self.model(x, training=False), tf.float32)
        if self.softmax_inside:
            return {"probabilities": out}
        return {"logits": out, "probabilities": tf.nn.softmax(out, axis=-1)}

    def checked(self, pixels):
        """`pixels` after in-graph checks of shape and finiteness."""
        shape = tf.shape(pixels)
        # Padding keeps the comparison valid for any rank; rank is checked too.
        padded = tf.concat([shape, [-1, -1, -1, -1]], axis=0)[1:4]
        good_shape = tf.logical_and(
            tf.equal(tf.size(shape), 4), tf.reduce_all(tf.equal(padded, self.shape))
        )
        shape_check = tf.debugging.Assert(
            good_shape,
            [f"`{SERVING_INPUT}` must have shape {self.shape_text}; got shape", shape],
            summarize=8,
        )
        with tf.control_dependencies([shape_check]):
            finite_check = tf.debugging.Assert(
                tf.reduce_all(tf.math.is_finite(pixels)),
                [
                    f"`{SERVING_INPUT}` must be finite pixel values in "
                    f"[0, {self.pre['pixel_scale']:g}]; got NaN or Inf"
                ],
            )
        with tf.control_dependencies([shape_check, finite_check]):
            return tf.identity(pixels)

    def serving_default(self, pixels):
        return self.scores(self.checked(pixels))

    def decode(self, encoded):
        head = tf.strings.substr(encoded, 0, 8)
        is_jpeg = tf.equal(tf.strings.substr(head, 0, 3), JPEG_MAGIC)
        format_check = tf.debugging.Assert(
            tf.logical_or(is_jpeg, tf.equal(head, PNG_MAGIC)),
            [
                f"`{BYTES_INPUT}` must be JPEG or PNG file bytes; got bytes starting",
                head,
            ],
        )
        channels = self.shape[2]
        with tf.control_dependencies([format_check]):
            # The accurate integer IDCT (libjpeg's ISLOW, PIL's default) rather
            # than TF's fast one, so the graph sees the pixels a client sees
            # when it opens the file (the fast one flipped ~1% of top-1s here).
            image = tf.cond(
                is_jpeg,
                lambda: tf.io.decode_jpeg(
                    encoded, channels=channels, dct_method="INTEGER_ACCURATE"
                ),
                lambda: tf.io.decode_png(encoded, channels=channels),
            )
        image = tf.cast(image, tf.float32) * (self.pre["pixel_scale"] / 255.0)
        return tf.ensure_shape(resize_pixels(image[None], self.pre)[0], self.shape)

    def classify_images(self, images):
        pixels = tf.map_fn(
            self.decode,
            images,
            fn_output_signature=tf.TensorSpec(self.shape, tf.float32),
        )
        probabilities = self.scores(pixels)["probabilities"]
        top = tf.math.top_k(probabilities, k=self.top_k)
        return {
            "class_ids": top.indices,
            "labels": tf.gather(tf.constant(self.labels), top.indices),
            "probabilities": top.values,
        }


def write_saved_model(model, path, labels, preprocessing, top_k=5) -> None:
    """Writes the SavedModel with both signatures to `path` (not atomic; see
    `export_model`)."""
    graphs = _Graphs(model, labels, preprocessing, top_k)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "serving_default",
        graphs.serving_default,
        input_signature=[
            tf.TensorSpec([None, *graphs.shape], tf.float32, name=SERVING_INPUT)
        ],
    )
    archive.add_endpoint(
        BYTES_SIGNATURE,
        graphs.classify_images,
        input_signature=[tf.TensorSpec([None], tf.string, name=BYTES_INPUT)],
    )
    archive.write_out(str(path), verbose=False)


def write_warmup_requests(path, name: str, pixels, preprocessing: dict) -> Path:
    """Writes `assets.extra/tf_serving_warmup_requests` (a TFRecord file of
    PredictionLogs) under the SavedModel at `path`: one request per signature,
    one image each (`pixels`, raw, at the model size), which TF Serving runs
    before it serves (`--enable_model_warmup`, on by default)."""
    pixels = np.asarray(pixels, dtype="float32")[None]
    as_uint8 = np.clip(
        np.round(pixels[0] * (255.0 / preprocessing["pixel_scale"])), 0, 255
    ).astype("uint8")
    png = tf.io.encode_png(as_uint8).numpy()
    records = [
        prediction_log_bytes(
            name, "serving_default", {SERVING_INPUT: tf.make_tensor_proto(pixels)}
        ),
        prediction_log_bytes(
            name,
            BYTES_SIGNATURE,
            {BYTES_INPUT: tf.make_tensor_proto([png], dtype=tf.string)},
        ),
    ]
    target = Path(path) / "assets.extra" / WARMUP_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(target)) as writer:
        for record in records:
            writer.write(record)
    return target


def _architecture(model: keras.Model, variant: str | None) -> dict:
    """What the metadata says about the model: its name, the variant string if
    given, and the architecture numbers read off the stable layer names."""
    found = {"model_name": model.name, "variant": variant}
    layers = {layer.name: layer for layer in model.layers}
    if "patches" in layers:
        found["patch_size"] = layers["patches"].get_config().get("patch_size")
    if "patch_encoder" in layers:
        found["hidden_dim"] = layers["patch_encoder"].get_config().get("hidden_dim")
    blocks = [n for n in layers if n.startswith("block_")]
    found["num_layers"] = len(blocks)
    if blocks:
        config = layers["block_0"].get_config()
        found["num_heads"] = config.get("num_heads")
        found["mlp_dim"] = config.get("mlp_dim")
    found["parameters"] = int(model.count_params())
    return found


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
    if list(array.shape[1:3]) != preprocessing["image_size"]:
        array = resize_pixels(array, preprocessing).numpy()
    return array


def _remove_stale_partials(model_dir: Path) -> None:
    """Deletes half-written versions left by an export that died (its process
    is gone); a live export's folder is left alone."""
    for partial in model_dir.glob(".*.partial-*"):
        try:
            pid = int(partial.name.rsplit("-", 2)[-2])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(partial, ignore_errors=True)
        except (ValueError, PermissionError):
            continue


def _next_version(model_dir: Path) -> int:
    versions = [int(p.name) for p in model_dir.iterdir() if p.name.isdigit()]
    return max(versions, default=0) + 1


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
    tflite=tflite_lib.KINDS,
    verify_images=None,
    variant: str | None = None,
    top_k: int = 5,
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
            training data; required for the `"int8"` TFLite kind.
        tflite: TFLite kinds to write, a subset of `tflite.KINDS`.
        verify_images: raw pixel images on which every artifact is compared
            with the Keras model; default: `representative_images`, else 16
            seeded random images. The figures go into the metadata.
        variant: variant string for the metadata, e.g. `"Ti/16"`.
        top_k: how many classes the bytes signature returns.
    """
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise ValueError(
            f"name must be a non-empty file name without '/' that does not start "
            f"with '.', got {name!r}."
        )
    kinds = tflite_lib.check_kinds(tflite)
    preprocessing = normalize_preprocessing(model, preprocessing)
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
    if version is not None and (not isinstance(version, int) or version < 1):
        raise ValueError(f"version must be a positive int, got {version!r}.")
    representative = None
    if representative_images is not None:
        representative = _pixel_batch(
            representative_images, preprocessing, "representative_images"
        )
    if "int8" in kinds and representative is None:
        raise ValueError(
            "The 'int8' TFLite kind needs representative_images (raw pixel images "
            "from the training data) to calibrate; pass them or leave 'int8' out "
            f"of tflite={list(kinds)}."
        )
    if verify_images is not None:
        verify = _pixel_batch(verify_images, preprocessing, "verify_images")
    elif representative is not None:
        verify = representative[:256]
    else:
        h, w = preprocessing["image_size"]
        shape = (16, h, w, preprocessing["num_channels"])
        verify = (
            np.random.default_rng(0)
            .uniform(0, preprocessing["pixel_scale"], shape)
            .astype("float32")
        )

    graphs = _Graphs(model, labels, preprocessing, top_k)  # checks the head too

    root = Path(root)
    model_dir = root / name
    model_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(model_dir)
    version = _next_version(model_dir) if version is None else version
    final = model_dir / str(version)
    if final.exists():
        raise ValueError(
            f"Version {version} of {name!r} already exists at {final}; versions "
            "are never overwritten, pass a new version (or none for the next)."
        )
    partial = model_dir / f".{version}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    keras_out = model.predict(
        normalize_pixels(verify, preprocessing), batch_size=VERIFY_BATCH, verbose=0
    )
    reference = {"probabilities": keras_out}
    if not graphs.softmax_inside:
        probabilities = np.asarray(tf.nn.softmax(keras_out))
        reference = {"logits": keras_out, "probabilities": probabilities}
    metadata = {
        "name": name,
        "version": version,
        "architecture": _architecture(model, variant),
        "image_size": preprocessing["image_size"],
        "num_channels": preprocessing["num_channels"],
        "labels": labels,
        "preprocessing": preprocessing,
        "signatures": {
            "serving_default": {
                "inputs": {SERVING_INPUT: ["float32", [-1, *graphs.shape]]},
                "outputs": sorted(reference),
            },
            BYTES_SIGNATURE: {
                "inputs": {BYTES_INPUT: ["string", [-1]]},
                "outputs": ["class_ids", "labels", "probabilities"],
                "top_k": graphs.top_k,
            },
        },
        "nan_pixels": (
            "SavedModel signatures: InvalidArgumentError. TFLite files do not "
            "check: float32/float16 give NaN outputs for that image, the int8 "
            "kinds an ordinary-looking prediction; predict() raises ValueError."
        ),
        "versions": _versions(),
        "parity": {"num_images": int(len(verify))},
        "files": {},
    }
    tflite_files = {}
    try:
        write_saved_model(model, partial, labels, preprocessing, top_k)
        write_warmup_requests(partial, name, verify[0], preprocessing)
        loaded = tf.saved_model.load(str(partial))
        signature = loaded.signatures["serving_default"]
        served = _in_batches(lambda x: signature(**{SERVING_INPUT: x}), verify)
        metadata["parity"]["saved_model"] = _parity(reference, served)
        del loaded
        for kind in kinds:
            content = tflite_lib.convert(partial, kind, representative)
            ops = tflite_lib.check_builtin_only(content)
            outputs = _in_batches(tflite_lib.Runner(content), verify)
            metadata["parity"][f"tflite_{kind}"] = _parity(reference, outputs)
            metadata.setdefault("tflite_ops", {})[kind] = ops
            tflite_files[tflite_lib.file_name(name, kind)] = content
        (partial / "assets").mkdir(exist_ok=True)
        (partial / "assets" / "labels.txt").write_text("\n".join(labels) + "\n")
        # Sizes in bytes; the SavedModel's counts all but its metadata.json.
        metadata["files"][f"{name}/{version}"] = _dir_size(partial)
        for file, content in tflite_files.items():
            metadata["files"][file] = len(content)
        (partial / "assets" / "metadata.json").write_text(
            json.dumps(metadata, indent=2) + "\n"
        )
        os.rename(partial, final)
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)

    for file, content in tflite_files.items():
        write_atomic(root / file, lambda p, c=content: p.write_bytes(c))
    write_atomic(root / f"{name}.keras", lambda p: model.save(str(p)))
    text = json.dumps(metadata, indent=2) + "\n"
    write_atomic(model_dir / "metadata.json", lambda p: p.write_text(text))
    return metadata
