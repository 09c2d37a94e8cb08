"""What runs against an exported model: image loading, `predict` over a SavedModel, a
`.tflite` file or a `.keras` file, and the TF Serving request format used for
warm-up records.

Clients send raw pixels in `[0, pixel_scale]` (255 for 8-bit images); the
model sees `(pixels / pixel_scale - mean) / std` at `image_size`. Images of
another size are resized first, with `resize_method` as in training.
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from keras_vit.deploy.checks import check_pixel_batch
from keras_vit.deploy.images import image_items, load_pixels
from keras_vit.errors import CheckpointError
from keras_vit.hardware import choose_settings
from keras_vit.models.preprocessing import (
    normalize_pixels,
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


PREDICT_BATCH = 32


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
    return list(
        iter_predict(
            model_path,
            images_or_paths,
            top_k,
            metadata=metadata,
            jit_compile=jit_compile,
            verbose=verbose,
            output=output,
        )
    )


def iter_predict(
    model_path,
    images_or_paths,
    top_k: int = 5,
    *,
    metadata=None,
    jit_compile: bool | str = "auto",
    verbose: bool = False,
    output: str = "probabilities",
    batch_size: int = PREDICT_BATCH,
):
    """`predict`, one image's top-k pairs at a time, in order: the model is
    loaded once and run on `batch_size` images at a time, so memory stays
    that of one batch however many images are given, and results come as
    they are computed. An error (a damaged file, non-finite scores) stops
    the iteration at the image it concerns; earlier results were yielded."""
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
    from keras_vit.deploy.exported import read_metadata

    metadata, labels, pre = read_metadata(path, metadata, find_metadata)
    # Metadata written before a key existed reads with that key's default.
    missing = [key for key in ("image_size", "num_channels") if key not in pre]
    if missing:
        raise ValueError(
            f"the model's metadata preprocessing has no {missing[0]!r}; export the "
            "model again or pass metadata= with a complete 'preprocessing'."
        )
    pre = resolve_preprocessing(pre, pre["image_size"], pre["num_channels"])
    items = image_items(images_or_paths)
    run = _scorer(path, pre, jit_compile, verbose)
    shape = (*pre["image_size"], pre["num_channels"])
    k = min(top_k, len(labels))
    for first in range(0, len(items), batch_size):
        pixels = load_pixels(items[first : first + batch_size], pre, first)
        pixels = check_pixel_batch(pixels, shape, pre["pixel_scale"])
        outputs = run(pixels)
        if output not in outputs:
            raise ValueError(
                f"{str(model_path)!r} gives no {output} (it returns {sorted(outputs)})."
            )
        scores = np.asarray(outputs[output])
        if scores.shape[-1] != len(labels):
            raise ValueError(
                f"the metadata of {str(model_path)!r} names {len(labels)} labels but "
                f"the model scores {scores.shape[-1]} classes; export the "
                "model again with its labels."
            )
        finite = np.isfinite(scores).all(axis=-1)
        if not finite.all():
            raise ValueError(
                f"{str(model_path)!r} gives NaN or Inf {output} for image "
                f"{first + int(np.argmin(finite))} (counting from 0): its weights "
                "hold non-finite numbers; no prediction printed for it."
            )
        order = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
        for row, top in zip(scores, order, strict=True):
            yield [(labels[i], float(row[i])) for i in top]


def _scorer(path: Path, pre: dict, jit_compile, verbose: bool):
    """A function from a raw pixel batch to the model's outputs by name, the
    model loaded once."""
    if path.is_dir() or path.suffix == ".tflite":
        from keras_vit.deploy.exported import exported_runner

        return exported_runner(path, pre)
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
    softmax = ends_in_softmax(model)

    def run(pixels):
        scores = model.predict(normalize_pixels(pixels, pre), verbose=0)
        if softmax:
            return {"probabilities": scores}
        return {"logits": scores, "probabilities": tf.nn.softmax(scores)}

    return run
