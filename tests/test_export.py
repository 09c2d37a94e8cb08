"""SavedModel export: parity in a fresh process, signatures (golden
saved_model_cli output), bytes and pixel inputs, in-graph checks, warm-up
records, metadata, atomic versions, TF Serving over REST."""

import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    DIGITS_METADATA_PREPROCESSING,
    FLOAT32_PARITY,
    REPO,
    TFLITE_FLOAT32_PARITY,
    assert_parity,
    assert_same_top1,
    near_ties,
    parity_bound,
    read_json,
    run_python,
)
from PIL import Image
from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

from keras_vit.deploy.export import export_model
from keras_vit.deploy.serving import predict

GOLDEN = Path(__file__).parent / "golden" / "saved_model_cli_show.txt"
DIGITS_PREPROCESSING = {
    "image_size": (16, 16),
    "channels": 1,
    "mean": [0.5],
    "std": [0.5],
    "pixel_scale": 255.0,
}


def raw_pixels(images: np.ndarray) -> np.ndarray:
    """The fixture's normalised images back to the raw 0..255 pixels a client
    sends."""
    return ((images * 0.5 + 0.5) * 255.0).astype("float32")


def digits_train_pixels() -> np.ndarray:
    """Raw pixels of the training split the `digits_model` fixture trained on
    (same split), to calibrate int8: the held-out images stay held out."""
    from keras_vit.training.sources import digits_arrays

    pixels = digits_arrays()["x_train"][..., 0]
    return np.kron(pixels, np.ones((2, 2)))[..., None].astype("float32")


# One export per trained model and process, shared with test_tflite.py
# (conversion is the slow part).
_EXPORTS = {}


@pytest.fixture(scope="session")
def exported(tmp_path_factory, digits_model):
    """The digits model exported once with all four TFLite kinds:
    (root, metadata, model, x_test, y_test, labels)."""
    model, x_test, y_test, labels = digits_model
    if id(model) not in _EXPORTS:
        root = tmp_path_factory.mktemp("saved_models")
        metadata = export_model(
            model,
            "digits",
            root,
            labels=labels,
            preprocessing=DIGITS_PREPROCESSING,
            representative_images=digits_train_pixels(),
            verify_images=raw_pixels(x_test),
            variant="Ti/4",
        )
        _EXPORTS[id(model)] = root, metadata
    root, metadata = _EXPORTS[id(model)]
    return root, metadata, model, x_test, y_test, labels


def keras_outputs(model, images) -> dict:
    logits = np.asarray(model(images, training=False))
    return {"logits": logits, "probabilities": np.asarray(tf.nn.softmax(logits))}


def encode(pixels: np.ndarray, fmt: str, scale: int = 1) -> list[bytes]:
    """Each raw pixel image as PNG / JPEG file bytes written by PIL."""
    files = []
    for image in pixels:
        picture = Image.fromarray(np.round(image[..., 0]).astype("uint8"), "L")
        if scale > 1:
            picture = picture.resize((16 * scale, 16 * scale), Image.NEAREST)
        buffer = io.BytesIO()
        picture.save(buffer, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
        files.append(buffer.getvalue())
    return files


@pytest.fixture(scope="module")
def signatures(exported):
    root = exported[0]
    loaded = tf.saved_model.load(str(root / "digits" / "1"))
    return loaded.signatures["serving_default"], loaded.signatures["classify_images"]


@pytest.mark.slow
def test_saved_model_matches_keras_in_fresh_process(exported, tmp_path):
    root, _, model, x_test, _, _ = exported
    np.save(tmp_path / "pixels.npy", raw_pixels(x_test[:7]))
    run_python(
        """
        import sys
        import numpy as np
        import tensorflow as tf
        loaded = tf.saved_model.load(sys.argv[1])
        serve = loaded.signatures["serving_default"]
        pixels = np.load(sys.argv[2])
        outputs = {}
        for batch in (1, 7):
            result = serve(pixels=tf.constant(pixels[:batch]))
            for key, value in result.items():
                outputs[f"{key}_{batch}"] = value.numpy()
        assert not any(m.startswith("keras_vit") for m in sys.modules), "imported"
        np.savez(sys.argv[3], **outputs)
        """,
        str(root / "digits" / "1"),
        str(tmp_path / "pixels.npy"),
        str(tmp_path / "outputs.npz"),
    )
    outputs = np.load(tmp_path / "outputs.npz")
    for batch in (1, 7):
        expected = keras_outputs(model, x_test[:batch])
        for key in ("logits", "probabilities"):
            got = outputs[f"{key}_{batch}"]
            assert got.shape == (batch, 10)
            assert_parity(got, expected[key], expected["logits"], FLOAT32_PARITY, key)


def normalised_cli_output(text: str) -> str:
    """saved_model_cli output without what changes between runs and TF
    builds: the graph's op set (internals, not the interface) and the numbered
    suffix of call-op tensor names."""
    text = re.sub(r"contains the following ops: \{.*\}", "contains ops: <ops>", text)
    text = re.sub(r"StatefulPartitionedCall(_\d+)?:", "StatefulPartitionedCall:", text)
    return "\n".join(line.rstrip() for line in text.strip().splitlines()) + "\n"


@pytest.mark.slow
def test_saved_model_cli_show_matches_golden(exported):
    cli = shutil.which("saved_model_cli")
    if cli is None:
        pytest.skip("saved_model_cli (from the tensorflow wheel) is not on PATH")
    proc = subprocess.run(
        [cli, "show", "--dir", str(exported[0] / "digits" / "1"), "--all"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        check=True,
    )
    text = normalised_cli_output(proc.stdout)
    if os.environ.get("KERAS_VIT_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_bytes_signature_matches_tensor_path(exported, signatures):
    serve, classify = signatures
    pixels = raw_pixels(exported[3])
    tensor_top1 = serve(pixels=pixels)["probabilities"].numpy().argmax(-1)

    # PNG is lossless: decoding + the tensor path on the same 8-bit pixels.
    served = serve(pixels=np.round(pixels))
    rounded = served["probabilities"].numpy()
    png = classify(images=tf.constant(encode(pixels, "PNG")))
    assert png["class_ids"].shape == (len(pixels), 5)
    tolerance = parity_bound(served["logits"], FLOAT32_PARITY)
    assert_same_top1(png["class_ids"][:, 0], rounded, tolerance, "PNG bytes")
    assert_parity(
        png["probabilities"][:, 0],
        rounded.max(-1),
        served["logits"],
        FLOAT32_PARITY,
        "PNG bytes vs pixels",
    )
    labels = png["labels"].numpy().astype(str)
    np.testing.assert_array_equal(labels, png["class_ids"].numpy().astype(str))
    assert np.mean(png["class_ids"][:, 0] == tensor_top1) >= 0.99

    # JPEG is lossy: top-1 equals the tensor path on the pixels PIL decodes.
    jpeg_files = encode(pixels, "JPEG")
    jpeg = classify(images=tf.constant(jpeg_files))
    decoded = np.stack(
        [
            np.asarray(Image.open(io.BytesIO(f)), "float32")[..., None]
            for f in jpeg_files
        ]
    )
    decoded = serve(pixels=decoded)["probabilities"].numpy()
    assert_same_top1(jpeg["class_ids"][:, 0], decoded, tolerance, "JPEG bytes")
    assert np.mean(jpeg["class_ids"][:, 0] == tensor_top1) >= 0.98


def test_bytes_signature_resizes_any_size(signatures, exported):
    serve, classify = signatures
    pixels = raw_pixels(exported[3][:20])
    big = classify(images=tf.constant(encode(pixels, "PNG", scale=3)))
    upscaled = np.repeat(np.repeat(np.round(pixels), 3, axis=1), 3, axis=2)
    resized = tf.image.resize(upscaled, (16, 16))  # bilinear, as exported
    served = serve(pixels=resized)
    expected = served["probabilities"].numpy()
    tolerance = parity_bound(served["logits"], FLOAT32_PARITY)
    assert_same_top1(big["class_ids"][:, 0], expected, tolerance, "resized PNG")
    assert_parity(
        big["probabilities"][:, 0],
        expected.max(-1),
        served["logits"],
        FLOAT32_PARITY,
        "resized PNG bytes vs pixels",
    )


def test_bytes_signature_rejects_non_image_bytes(signatures):
    _, classify = signatures
    png = encode(np.zeros((1, 16, 16, 1), "float32"), "PNG")[0]
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="23 bytes that are not a JPEG or PNG"
    ) as error:
        classify(images=tf.constant([png, b"GIF89a not what we take"]))
    assert "GIF89a" not in str(error.value)  # request bytes are never echoed
    with pytest.raises(tf.errors.InvalidArgumentError, match="Invalid PNG"):
        classify(images=tf.constant([png[:30]]))


@pytest.mark.parametrize("shape", [(1, 8, 8, 1), (2, 16, 16, 3), (16, 16, 1)])
def test_wrong_shape_is_invalid_argument_naming_expected_shape(signatures, shape):
    serve, _ = signatures
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        serve(pixels=tf.zeros(shape))
    message = str(error.value)
    assert "must have shape (batch, 16, 16, 1)" in message
    assert "got shape] [" + " ".join(map(str, shape)) + "]" in message


def test_wrong_dtype_is_invalid_argument(signatures):
    # Checked by the runtime before the graph runs (TF Serving does the same).
    serve, classify = signatures
    with pytest.raises(tf.errors.InvalidArgumentError, match="expected to be a float"):
        serve(pixels=tf.zeros((1, 16, 16, 1), tf.uint8))
    with pytest.raises(tf.errors.InvalidArgumentError, match="expected to be a string"):
        classify(images=tf.zeros((1,), tf.float32))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_pixels_are_invalid_argument(signatures, bad):
    serve, _ = signatures
    pixels = np.full((2, 16, 16, 1), 128.0, "float32")
    pixels[1, 3, 4, 0] = bad
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"finite raw pixel values in \[0, 255\]"
    ):
        serve(pixels=pixels)
    assert serve(pixels=pixels[:1])["probabilities"].shape == (1, 10)


def test_metadata_and_assets(exported):
    root, metadata, model, x_test, *_ = exported
    on_disk = read_json(root / "digits" / "metadata.json")
    assert on_disk == read_json(root / "digits" / "1" / "assets" / "metadata.json")
    assert on_disk == json.loads(json.dumps(metadata))
    labels = (root / "digits" / "1" / "assets" / "labels.txt").read_text().split()
    assert labels == on_disk["labels"] == [str(i) for i in range(10)]
    assert on_disk["preprocessing"] == DIGITS_METADATA_PREPROCESSING
    arch = on_disk["architecture"]
    assert (arch["variant"], arch["patch_size"], arch["hidden_dim"]) == ("Ti/4", 4, 64)
    assert (arch["num_layers"], arch["num_heads"], arch["mlp_dim"]) == (2, 4, 128)
    assert arch["parameters"] == model.count_params()
    assert on_disk["versions"]["tensorflow"] == tf.__version__
    assert set(on_disk["versions"]) == {
        "tensorflow",
        "keras",
        "keras_vit",
        "ai_edge_litert",
    }
    parity = on_disk["parity"]
    assert parity["num_images"] == 360
    logits = keras_outputs(model, x_test)["logits"]
    saved_model_diff = parity["saved_model"]["max_abs_diff_logits"]
    assert saved_model_diff <= parity_bound(logits, FLOAT32_PARITY)
    # Every top-1 agrees but on a near tie (helpers.assert_same_top1).
    ties = near_ties(logits, parity_bound(logits, FLOAT32_PARITY))
    assert parity["saved_model"]["top1_agreement"] >= 1 - ties / 360
    # The SavedModel's size is everything but the metadata file itself.
    version = root / "digits" / "1"
    size = sum(p.stat().st_size for p in version.rglob("*") if p.is_file())
    size -= (version / "assets" / "metadata.json").stat().st_size
    assert on_disk["files"]["digits/1"] == size
    for name in ("digits.tflite", "digits_int8.tflite"):
        assert on_disk["files"][name] == (root / name).stat().st_size


def test_warmup_requests_are_prediction_logs_that_run(exported, signatures):
    """Read with TF Serving's own protos (tensorflow-serving-api), as the
    model server reads the file at load time."""
    path = exported[0] / "digits" / "1" / "assets.extra" / "tf_serving_warmup_requests"
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(path))]
    assert len(records) == 2
    by_name = dict(zip(("serving_default", "classify_images"), signatures, strict=True))
    seen = set()
    for record in records:
        log = prediction_log_pb2.PredictionLog.FromString(record)
        assert log.WhichOneof("log_type") == "predict_log"
        request = log.predict_log.request
        assert request.model_spec.name == "digits"
        signature = request.model_spec.signature_name
        seen.add(signature)
        (key,) = request.inputs
        # Nothing the official messages do not know: rebuilt from the parsed
        # fields, they serialise to the very same bytes.
        rebuilt = prediction_log_pb2.PredictionLog(
            predict_log=prediction_log_pb2.PredictLog(
                request=predict_pb2.PredictRequest(
                    model_spec=model_pb2.ModelSpec(
                        name="digits", signature_name=signature
                    ),
                    inputs={key: request.inputs[key]},
                )
            )
        )
        assert rebuilt.SerializeToString(deterministic=True) == record
        tensor = tf.make_ndarray(request.inputs[key])
        outputs = by_name[signature](**{key: tf.constant(tensor)})
        assert outputs["probabilities"].shape[0] == 1
    assert seen == {"serving_default", "classify_images"}


def test_predict_reads_every_format(exported, tmp_path):
    root, _, model, x_test, _, _ = exported
    pixels = raw_pixels(x_test[:6])
    files = []
    for i, data in enumerate(encode(pixels, "PNG")):
        files.append(tmp_path / f"digit{i}.png")
        files[-1].write_bytes(data)
    expected = keras_outputs(model, (np.round(pixels) / 255.0 - 0.5) / 0.5)
    expected_top = [str(i) for i in expected["probabilities"].argmax(-1)]
    for model_path in (
        root / "digits",
        root / "digits" / "1",
        root / "digits.tflite",
        root / "digits.keras",
    ):
        results = predict(model_path, files, top_k=3)
        assert [len(r) for r in results] == [3] * 6
        assert [r[0][0] for r in results] == expected_top, model_path
        best = [r[0][1] for r in results]
        # The .tflite file is one of the formats: its bound holds for all.
        assert_parity(
            best,
            expected["probabilities"].max(-1),
            expected["logits"],
            TFLITE_FLOAT32_PARITY,
            str(model_path),
        )
    one = predict(root / "digits.keras", np.round(pixels[0]), top_k=20)
    assert len(one) == 1 and len(one[0]) == 10
    assert one[0][0][0] == expected_top[0]


def test_predict_rejects_bad_input(exported, tmp_path):
    root = exported[0]
    with pytest.raises(FileNotFoundError, match="nope.tflite"):
        predict(root / "nope.tflite", np.zeros((16, 16, 1)))
    with pytest.raises(FileNotFoundError, match="missing.png"):
        predict(root / "digits.tflite", [tmp_path / "missing.png"])
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    with pytest.raises(ValueError, match="cannot decode image .*notes.png"):
        predict(root / "digits.tflite", [text])
    with pytest.raises(ValueError, match=r"\(height, width, 1\).*\(16, 16, 3\)"):
        predict(root / "digits.tflite", np.zeros((16, 16, 3)))
    nan = np.zeros((16, 16, 1))
    nan[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="image 0 holds NaN"):
        predict(root / "digits.tflite", nan)
    other = tmp_path / "model.onnx"
    other.write_text("")
    with pytest.raises(ValueError, match="expected a SavedModel folder"):
        predict(other, nan)


def test_export_rejects_bad_arguments_before_writing(exported, tmp_path):
    root, _, model, *_ = exported
    before = sorted(p.name for p in (root / "digits").iterdir())
    with pytest.raises(ValueError, match="Version 1 of 'digits' already exists"):
        export_model(model, "digits", root, version=1, tflite=())
    with pytest.raises(ValueError, match="needs representative_images"):
        export_model(model, "other", tmp_path, tflite=("int8",))
    with pytest.raises(ValueError, match="3 labels given for a model with 10"):
        export_model(model, "other", tmp_path, labels=["a", "b", "c"])
    with pytest.raises(ValueError, match=r"image_size \[32, 32\] does not match"):
        export_model(model, "other", tmp_path, preprocessing={"image_size": 32})
    with pytest.raises(ValueError, match="Unknown TFLite kinds \\['int4'\\]"):
        export_model(model, "other", tmp_path, tflite=("int4",))
    with pytest.raises(ValueError, match="Unknown preprocessing keys \\['scale'\\]"):
        export_model(model, "other", tmp_path, preprocessing={"scale": 255})
    assert sorted(p.name for p in (root / "digits").iterdir()) == before
    assert not (tmp_path / "other").exists() or not any((tmp_path / "other").iterdir())


KILLED_EXPORT = """
import sys, time
import keras
import keras_vit
from keras_vit.deploy import export

def stall(path, *args, **kwargs):
    print("PARTIAL", path, flush=True)
    time.sleep(600)

export.write_warmup_requests = stall
model = keras.saving.load_model(sys.argv[1])
export.export_model(model, "digits", sys.argv[2], tflite=())
"""


@pytest.mark.slow
def test_killed_export_leaves_previous_version_intact(exported, tmp_path):
    shared, _, model, *_ = exported
    root = tmp_path / "models"
    shutil.copytree(shared / "digits", root / "digits")
    shutil.copy(shared / "digits.keras", root / "digits.keras")
    version_1 = root / "digits" / "1"
    snapshot = {p: p.read_bytes() for p in version_1.rglob("*") if p.is_file()}

    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(KILLED_EXPORT)]
        + [str(root / "digits.keras"), str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("PARTIAL "), line
        partial = Path(line.split(maxsplit=1)[1].strip())
        assert (partial / "saved_model.pb").is_file()  # the SavedModel is written
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    # TF Serving loads only folders named by an integer: the partial one is
    # hidden and version 1 is byte for byte what it was.
    numbered = sorted(p.name for p in (root / "digits").iterdir() if p.name.isdigit())
    assert numbered == ["1"]
    assert partial.exists() and partial.name.startswith(".2.partial-")
    assert {p: p.read_bytes() for p in version_1.rglob("*") if p.is_file()} == snapshot
    assert predict(root / "digits", np.zeros((16, 16, 1)))[0][0][0] in set("0123456789")

    # The next export cleans up the dead one's leftovers and takes version 2.
    metadata = export_model(
        model, "digits", root, preprocessing=DIGITS_PREPROCESSING, tflite=()
    )
    assert metadata["version"] == 2 and not partial.exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_tf_serving_rest_prediction(exported, tmp_path):
    server = shutil.which("tensorflow_model_server")
    if server is None:
        pytest.skip("tensorflow_model_server is not on PATH")
    root, _, model, x_test, _, _ = exported
    port = _free_port()
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            server,
            f"--rest_api_port={port}",
            "--port=0",
            "--model_name=digits",
            f"--model_base_path={root / 'digits'}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}/v1/models/digits"
        for _ in range(120):
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if b'"AVAILABLE"' in response.read():
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise AssertionError((tmp_path / "server.log").read_text())
        body = json.dumps({"instances": raw_pixels(x_test[:3]).tolist()}).encode()
        request = urllib.request.Request(f"{url}:predict", data=body)
        with urllib.request.urlopen(request, timeout=30) as response:
            predictions = json.loads(response.read())["predictions"]
        got = np.array([p["probabilities"] for p in predictions])
        expected = keras_outputs(model, x_test[:3])
        assert_parity(
            got, expected["probabilities"], expected["logits"], FLOAT32_PARITY
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_keras_vit_export_in_a_run_folder_calibrates_on_the_runs_data(
    exported, tmp_path, capsys
):
    """`keras-vit export` is the trainer's export: in a run folder (its
    config.json, metadata.json) int8 is calibrated on the run's training
    images and every kind checked on its held-out split."""
    import dataclasses

    from keras_vit.cli import main
    from keras_vit.training import data as data_lib
    from keras_vit.training.recipes import load_recipe

    model = exported[2]
    run_dir = tmp_path / "runs" / "digits"
    run_dir.mkdir(parents=True)
    model.save(run_dir / "model.keras")
    config = load_recipe("digits")
    labels = [f"digit {i}" for i in range(10)]
    (run_dir / "metadata.json").write_text(
        json.dumps(
            {"labels": labels, "preprocessing": data_lib.preprocessing(config.data, 16)}
        )
    )
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(config)))
    root = tmp_path / "saved_models"
    argv = ["export", str(run_dir / "model.keras"), "--root", str(root)]
    assert main([*argv, "--name", "vit_digits", "--tflite", "float32,int8"]) == 0
    out = capsys.readouterr().out
    assert f"exported vit_digits version 1 under {root}" in out
    assert "parity tflite_int8: max_abs_diff_logits " in out
    metadata = read_json(root / "vit_digits" / "metadata.json")
    assert metadata["labels"] == labels
    assert metadata["preprocessing"]["resize_method"] == "bilinear"
    assert metadata["architecture"]["variant"] == "Ti/4"  # from config.json
    # Checked on the run's held-out split: the 360 held-out digits.
    assert metadata["parity"]["num_images"] == 360
    logits = keras_outputs(model, exported[3])["logits"]
    ties = near_ties(logits, parity_bound(logits, TFLITE_FLOAT32_PARITY))
    assert metadata["parity"]["tflite_float32"]["top1_agreement"] >= 1 - ties / 360
    assert predict(root / "vit_digits.tflite", np.zeros((16, 16, 1)))[0][0][0] in labels


def test_softmax_model_serves_its_probabilities_and_sigmoid_is_refused(tmp_path):
    import keras_vit

    tiny = dict(num_channels=3, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32)
    model = keras_vit.ViT("Ti/4", 8, 3, classifier_activation="softmax", **tiny)
    metadata = export_model(model, "soft", tmp_path, tflite=())
    assert metadata["signatures"]["serving_default"]["outputs"] == ["probabilities"]
    pixels = np.random.default_rng(1).uniform(0, 255, (2, 8, 8, 3)).astype("float32")
    served = tf.saved_model.load(str(tmp_path / "soft" / "1"))
    got = served.signatures["serving_default"](pixels=pixels)
    assert set(got) == {"probabilities"}
    expected = np.asarray(model(pixels / 255.0))  # default preprocessing: p / 255
    # No logits here: probabilities are at most 1, a bound of 1e-5 absolute.
    assert_parity(got["probabilities"], expected, expected, FLOAT32_PARITY)
    sigmoid = keras_vit.ViT("Ti/4", 8, 3, classifier_activation="sigmoid", **tiny)
    with pytest.raises(ValueError, match="ends in activation 'sigmoid'"):
        export_model(sigmoid, "sig", tmp_path, tflite=())
    assert not (tmp_path / "sig").exists()
