"""What runs against an exported model: image loading, `predict` over a SavedModel, a
`.tflite` file or a `.keras` file, and the TF Serving request format used for
warm-up records.

Clients send raw pixels in `[0, pixel_scale]` (255 for 8-bit images); the
model sees `(pixels / pixel_scale - mean) / std` at `image_size`. Images of
another size are resized first, with `resize_method` as in training.
"""

from __future__ import annotations

import codecs
import os
import re
import sys
import zipfile
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from keras_vit.deploy.checks import check_pixel_batch
from keras_vit.errors import CheckpointError
from keras_vit.hardware import choose_settings
from keras_vit.models import image_bytes
from keras_vit.models.preprocessing import (
    normalize_pixels,
    resize_pixels,
    resizes_every_image,
    resolve_preprocessing,
)

BYTES_SIGNATURE = "classify_images"
BYTES_INPUT = "images"


def ends_in_softmax(model: keras.Model) -> bool:
    last = model.layers[-1]
    if not isinstance(last, keras.layers.Activation):
        return False
    activation = keras.activations.serialize(last.activation)
    name = activation if isinstance(activation, str) else activation.get("config")
    if name not in ("softmax", "linear"):
        raise ValueError(
            f"export_model needs a model that returns logits or softmax "
            f"probabilities; {model.name!r} ends in activation {name!r}."
        )
    return name == "softmax"


# TF Serving's protos (tensorflow_serving/apis/{model,predict,prediction_log}
# .proto) are not in the tensorflow wheel and tensorflow-serving-api pins the
# full tensorflow package, so the few messages a warm-up file needs are declared
# here with the upstream field numbers, in a private descriptor pool (no clash
# if tensorflow_serving is imported too). Fields not written are left out;
# tests/test_export.py reads the file back with the official protos.
_SERVING_MESSAGES = {
    "ModelSpec": [("name", 1, "string"), ("signature_name", 3, "string")],
    "PredictRequest": [
        ("model_spec", 1, ".tensorflow.serving.ModelSpec"),
        ("inputs", 2, "map"),
    ],
    "PredictLog": [("request", 1, ".tensorflow.serving.PredictRequest")],
    "PredictionLog": [("predict_log", 6, ".tensorflow.serving.PredictLog")],
}


def _serving_message_classes() -> dict:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from tensorflow.core.framework import tensor_pb2

    pool = descriptor_pool.DescriptorPool()

    def add(file_descriptor):
        for dependency in file_descriptor.dependencies:
            add(dependency)
        try:
            pool.FindFileByName(file_descriptor.name)
        except KeyError:
            pool.Add(
                descriptor_pb2.FileDescriptorProto.FromString(
                    file_descriptor.serialized_pb
                )
            )

    add(tensor_pb2.DESCRIPTOR)
    fields = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="keras_vit/tf_serving_prediction_log.proto",
        package="tensorflow.serving",
        syntax="proto3",
        dependency=[tensor_pb2.DESCRIPTOR.name],
    )
    for message_name, message_fields in _SERVING_MESSAGES.items():
        message = proto.message_type.add(name=message_name)
        for field_name, number, kind in message_fields:
            field = message.field.add(
                name=field_name, number=number, label=fields.LABEL_OPTIONAL
            )
            if kind == "string":
                field.type = fields.TYPE_STRING
            elif kind == "map":
                entry = message.nested_type.add(name="InputsEntry")
                entry.options.map_entry = True
                entry.field.add(
                    name="key",
                    number=1,
                    type=fields.TYPE_STRING,
                    label=fields.LABEL_OPTIONAL,
                )
                entry.field.add(
                    name="value",
                    number=2,
                    type=fields.TYPE_MESSAGE,
                    type_name=".tensorflow.TensorProto",
                    label=fields.LABEL_OPTIONAL,
                )
                field.label = fields.LABEL_REPEATED
                field.type = fields.TYPE_MESSAGE
                field.type_name = f".tensorflow.serving.{message_name}.InputsEntry"
            else:
                field.type = fields.TYPE_MESSAGE
                field.type_name = kind
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"tensorflow.serving.{name}")
        )
        for name in _SERVING_MESSAGES
    }


def prediction_log_bytes(model_name: str, signature: str, inputs: dict) -> bytes:
    """A serialized `tensorflow.serving.PredictionLog` holding one PredictRequest
    for `signature` with `inputs` (name -> `tf.make_tensor_proto(...)`)."""
    log = _serving_message_classes()["PredictionLog"]()
    request = log.predict_log.request
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature
    for key, tensor in inputs.items():
        request.inputs[key].ParseFromString(tensor.SerializeToString())
    return log.SerializeToString()


def _to_pixels(item, preprocessing: dict) -> np.ndarray:
    """One image (a file path or an `(h, w)` / `(h, w, c)` array of raw pixels)
    as float32 `(h, w, c)`."""
    channels = preprocessing["num_channels"]
    if isinstance(item, str | os.PathLike):
        path = Path(item)
        if path.is_dir():
            raise IsADirectoryError(
                f"image {str(item)!r} is a folder; pass image files (e.g. "
                f"{str(path / '*.jpg')!r} expanded by the shell)"
            )
        if not path.is_file():
            raise FileNotFoundError(f"image {str(item)!r} does not exist")
        decoded = _decode_file(path, channels)
        return decoded.numpy().astype("float32") * (
            preprocessing["pixel_scale"] / 255.0
        )
    array = np.asarray(item, dtype="float32")
    if array.ndim == 2:
        array = array[..., None]
    if array.ndim != 3 or array.shape[-1] != channels:
        raise ValueError(
            f"an image array must be (height, width, {channels}) raw pixels, got "
            f"shape {array.shape}."
        )
    return array


@tf.function(reduce_retracing=True)
def _checked_bytes(contents, what):
    return image_bytes.check_declared_size(contents, what, image_bytes.FILE_MAX_PIXELS)


def _decode_file(path: Path, channels: int) -> tf.Tensor:
    """A JPEG / PNG / GIF / BMP file as uint8 `(h, w, channels)`; a file that
    is none of these, declares more than `FILE_MAX_PIXELS`, whose header lies
    (a GIF frame outside its screen) or that cannot be decoded is a
    ValueError naming it and why. Only a GIF's first frame is decoded."""
    contents = tf.constant(path.read_bytes())
    fmt = int(image_bytes.image_format(contents))
    if not fmt:
        raise ValueError(
            f"cannot decode image {str(path)!r}: its {int(tf.strings.length(contents))}"
            " bytes are not a JPEG, PNG, GIF or BMP file"
        )
    kind = image_bytes.FORMAT_NAMES[fmt]
    what = f"image {str(path)!r} ({kind})"
    try:
        contents, _ = _checked_bytes(contents, what)
        if fmt == image_bytes.JPEG and channels in (1, 3):
            # As the bytes signature decodes JPEGs (accurate IDCT).
            return image_bytes.decode_jpeg(
                contents, channels, dct_method="INTEGER_ACCURATE"
            )
        return image_bytes.decode_to_channels(contents, channels, fmt)
    except tf.errors.InvalidArgumentError as error:
        if "assertion failed:" in error.message:  # the checks name the file
            raise ValueError(_assertion_text(error)) from None
        raise ValueError(
            f"cannot decode {what} file (damaged?): {_assertion_text(error)}"
        ) from None


def _assertion_text(error) -> str:
    """The message of a graph `Assert` or op error without TF's node names
    (an `Assert` prints strings C-escaped: unescaped here)."""
    text = error.message
    if "assertion failed:" not in text:
        return text.split(" [Op:")[0].split("}} ")[-1].strip()
    text = text.split("assertion failed:", 1)[1].split("\n")[0]
    text = text.replace("] [", " ").strip(" []")
    return codecs.escape_decode(text.encode())[0].decode("utf-8", "replace")


def load_pixels(images_or_paths, preprocessing: dict) -> np.ndarray:
    """Files or arrays -> a float32 raw pixel batch `(n, H, W, C)` at the model
    size, resized as the bytes signature does (a resized image is clipped to
    `[0, pixel_scale]`, which bicubic kernels overshoot). Raises ValueError on
    NaN / Inf (a `.tflite` file would not catch them)."""
    if isinstance(images_or_paths, str | os.PathLike):
        items = [images_or_paths]
    elif isinstance(images_or_paths, np.ndarray) and images_or_paths.ndim == 4:
        items = list(images_or_paths)
    elif isinstance(images_or_paths, np.ndarray):
        items = [images_or_paths]
    else:
        items = list(images_or_paths)
    if not items:
        raise ValueError("no images given")
    batch = []
    for index, item in enumerate(items):
        pixels = _to_pixels(item, preprocessing)
        if not np.all(np.isfinite(pixels)):
            raise ValueError(f"image {index} holds NaN or Inf pixels.")
        # An image at the model size passes through untouched unless the
        # preprocessing resizes it anyway (a centre crop, as in training-time
        # evaluation or the model's source library).
        if (
            resizes_every_image(preprocessing)
            or list(pixels.shape[:2]) != preprocessing["image_size"]
        ):
            pixels = resize_pixels(pixels[None], preprocessing).numpy()[0]
            # Bicubic / Lanczos resizing overshoots the range a little.
            pixels = np.clip(pixels, 0.0, preprocessing["pixel_scale"])
        batch.append(pixels)
    return np.stack(batch).astype("float32")


def load_keras_file(path, compile: bool = True) -> keras.Model:
    """`keras.saving.load_model` (safe mode) with keras_vit's layers
    registered; a file that is not a Keras archive or holds a class nobody
    registered is a one-line `CheckpointError` naming the file and the class,
    not the whole model config Keras puts in its message."""
    import keras_vit.models  # noqa: F401  registers the layers for loading

    if Path(path).is_dir():
        raise CheckpointError(
            f"cannot load Keras model {str(path)!r}: it is a folder, not a .keras "
            "file (a SavedModel folder is what predict and TF Serving take)"
        )
    if Path(path).is_file() and not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"cannot load Keras model {str(path)!r}: the file is damaged, its "
            f"{Path(path).stat().st_size} bytes are not a whole .keras (zip) archive "
            "(a truncated copy or an interrupted save?); copy or save it again"
        )
    try:
        return keras.saving.load_model(str(path), compile=compile)
    except (TypeError, ValueError, KeyError, OSError, zipfile.BadZipFile) as error:
        text = str(error)
        unknown = re.search(r"(?:locate|find) (?:class|function) '([^']+)'", text)
        if unknown:
            reason = (
                f"it holds class {unknown[1]!r}, which is neither a Keras nor a "
                "keras_vit layer (import the module that registers it first)"
            )
        else:
            first = text.strip().splitlines()[0] if text.strip() else ""
            reason = f"{type(error).__name__}: {first[:300]}"
        raise CheckpointError(
            f"cannot load Keras model {str(path)!r}: {reason}"
        ) from None


def _saved_model_dir(path: Path) -> Path | None:
    """`path` itself, or the highest version under a TF Serving model folder."""
    if (path / "saved_model.pb").is_file():
        return path
    versions = sorted(
        (
            p
            for p in path.iterdir()
            if p.name.isdigit() and (p / "saved_model.pb").is_file()
        ),
        key=lambda p: int(p.name),
    )
    return versions[-1] if versions else None


def find_metadata(model_path) -> Path:
    """The `metadata.json` that describes an exported model file or folder."""
    path = Path(model_path)
    candidates = []
    if path.is_dir():
        candidates += [path / "assets" / "metadata.json", path / "metadata.json"]
    else:
        stem = path.stem
        for kind in ("float16", "dynamic_int8", "int8", "int16x8"):
            if path.suffix == ".tflite" and stem.endswith(f"_{kind}"):
                stem = stem[: -len(kind) - 1]
        candidates += [path.parent / stem / "metadata.json"]
        candidates += [path.parent / "metadata.json"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ValueError(
        f"no metadata.json found for {str(model_path)!r} (looked at "
        f"{[str(c) for c in candidates]}); export the model with "
        "keras-vit export (keras_vit.deploy.export.export_model), or pass "
        "metadata="
    )


def approximate_macs(model: keras.Model) -> float:
    """Multiply-adds per image, estimated as one per weight per token (what
    the Dense layers of a transformer do; within ~2x of the exact count of
    keras_vit.analysis.flops, enough to tell a digits-sized model from Ti/16,
    ~200x apart). Models without a `patch_encoder` count one token."""
    tokens = 1
    try:
        tokens = int(model.get_layer("patch_encoder").output.shape[1])
    except (ValueError, AttributeError, TypeError):
        pass
    return float(model.count_params()) * tokens


def predict(
    model_path,
    images_or_paths,
    top_k: int = 5,
    *,
    metadata=None,
    jit_compile: bool | str = "auto",
    verbose: bool = False,
    output: str = "probabilities",
) -> list[list[tuple[str, float]]]:
    """Top-k `(label, probability)` pairs per image, best first.

    Args:
        model_path: a SavedModel folder (or a TF Serving model folder holding
            numbered versions: the highest is used), a `.tflite` file or a
            `.keras` file, as written by `export_model`.
        images_or_paths: an image file path, raw pixel array `(h, w[, c])` or
            batch `(n, h, w, c)`, or a list of paths / arrays; any size.
        top_k: how many classes per image.
        metadata: the export's metadata dict or `metadata.json` path; default:
            found beside the model (see `find_metadata`).
        jit_compile: XLA for a `.keras` model: `True`, `False` or `"auto"`
            (keras_vit.hardware's choice for the model's size and this
            machine). SavedModel and TFLite graphs run as exported.
        verbose: print the `"auto"` choice to stderr.
        output: `"probabilities"` or `"logits"` (the model's own scores, for
            a model that does not end in softmax): what the pairs hold.
    """
    if output not in ("probabilities", "logits"):
        raise ValueError(f"output must be 'probabilities' or 'logits', got {output!r}.")
    path = Path(model_path)
    if not path.exists():
        raise FileNotFoundError(f"model {str(model_path)!r} does not exist")
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}.")
    if path.is_dir():
        saved_model = _saved_model_dir(path)
        if saved_model is None:
            raise ValueError(
                f"{str(model_path)!r} is a folder without saved_model.pb or "
                "numbered versions holding one."
            )
        path = saved_model
    elif path.suffix not in (".tflite", ".keras"):
        raise ValueError(
            f"model {str(model_path)!r}: expected a SavedModel folder, a .tflite "
            "file or a .keras file."
        )
    from keras_vit.deploy.exported import read_metadata, run_exported

    metadata, labels, pre = read_metadata(path, metadata, find_metadata)
    # Metadata written before a key existed reads with that key's default.
    missing = [key for key in ("image_size", "num_channels") if key not in pre]
    if missing:
        raise ValueError(
            f"the model's metadata preprocessing has no {missing[0]!r}; export the "
            "model again or pass metadata= with a complete 'preprocessing'."
        )
    pre = resolve_preprocessing(pre, pre["image_size"], pre["num_channels"])
    pixels = load_pixels(images_or_paths, pre)
    shape = (*pre["image_size"], pre["num_channels"])
    pixels = check_pixel_batch(pixels, shape, pre["pixel_scale"])
    if path.is_dir() or path.suffix == ".tflite":
        outputs = run_exported(path, pixels, pre)
    else:
        model = load_keras_file(path)
        settings = choose_settings(
            approximate_macs(model), model.dtype_policy.name, jit_compile
        )
        if verbose and settings["auto"]:
            print(
                f"predict: jit_compile={settings['jit_compile']} "
                f"(auto: {settings['reason']})",
                file=sys.stderr,
            )
        model.compile(jit_compile=settings["jit_compile"])
        scores = model.predict(normalize_pixels(pixels, pre), verbose=0)
        outputs = {"probabilities": scores}
        if not ends_in_softmax(model):
            outputs = {"logits": scores, "probabilities": tf.nn.softmax(scores)}
    if output not in outputs:
        raise ValueError(
            f"{str(model_path)!r} gives no {output} (it returns {sorted(outputs)})."
        )
    probabilities = np.asarray(outputs[output])
    if probabilities.shape[-1] != len(labels):
        raise ValueError(
            f"the metadata of {str(model_path)!r} names {len(labels)} labels but "
            f"the model scores {probabilities.shape[-1]} classes; export the "
            "model again with its labels."
        )
    finite = np.isfinite(probabilities).all(axis=-1)
    if not finite.all():
        raise ValueError(
            f"{str(model_path)!r} gives NaN or Inf {output} for image "
            f"{int(np.argmin(finite))} (counting from 0): its weights hold "
            "non-finite numbers; no prediction printed."
        )
    k = min(top_k, len(labels))
    order = np.argsort(-probabilities, axis=-1, kind="stable")[:, :k]
    return [
        [(labels[i], float(row[i])) for i in top]
        for row, top in zip(probabilities, order, strict=True)
    ]
