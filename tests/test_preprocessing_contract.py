"""One preprocessing contract: what training-time evaluation applies is what
the model's metadata records and what `predict`, `keras-vit evaluate`, the
SavedModel and the `.tflite` file apply, the centre crop included.

The folder recipe (ImageNet-style, evaluated on 0.875 centre crops) runs in
smoke form on a small folder of real photos (crops of scikit-learn's
china.jpg and flower.jpg, none of them square), and every way of scoring its
held-out images must give the logits of the training-time evaluation."""

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    FLOAT32_PARITY,
    TFLITE_FLOAT32_PARITY,
    assert_close,
    assert_parity,
    parity_bound,
)
from PIL import Image
from sklearn.datasets import load_sample_image

from keras_vit.analysis import evaluation
from keras_vit.cli.main import main as cli_main
from keras_vit.deploy.export import export_model
from keras_vit.deploy.serving import predict
from keras_vit.models.preprocessing import (
    DEFAULT_MEAN,
    DEFAULT_STD,
    PREPROCESSING_KEYS,
    denormalize_pixels,
    normalize_pixels,
    resolve_preprocessing,
)
from keras_vit.training import data as data_lib
from keras_vit.training.config import DataConfig
from keras_vit.training.recipes import load_recipe
from keras_vit.training.trainer import train

# (top, left, height, width) crops: portrait, landscape and odd sizes, so a
# pipeline that squashed, cropped off-centre or skipped the crop would differ.
CROPS = [(10, 20, 96, 150), (120, 300, 140, 90), (200, 40, 77, 121), (30, 400, 65, 66)]


def write_folder(root: Path) -> list[Path]:
    """train/ and val/ splits of two classes; returns the val files in the
    order the folder source reads them (class, then file name)."""
    val = []
    for label in ("china", "flower"):
        photo = load_sample_image(f"{label}.jpg")
        for split, crops in (("train", CROPS[:2]), ("val", CROPS)):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i, (top, left, h, w) in enumerate(crops):
                path = folder / f"{i}.jpg"
                Image.fromarray(photo[top : top + h, left : left + w]).save(
                    path, quality=90
                )
                if split == "val":
                    val.append(path)
    return val


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract")
    val_files = write_folder(root / "photos")
    config = load_recipe(
        "vit_ti16_imagefolder",
        {
            "smoke": "true",
            "data.path": str(root / "photos"),
            "run_dir": str(root / "run"),
            # One float32 device: the parity below is about preprocessing,
            # not about bfloat16 rounding or replica splits.
            "precision": "float32",
            "jit_compile": False,
            "strategy": "default",
        },
    )
    assert config.data.eval_crop == 0.875
    metadata = train(config)
    model = metadata.pop("model")
    # Two smoke steps leave the zero-initialised head near zero (logits
    # ~1e-4), where every difference is below any bound relative to the
    # logits' scale. A seeded random head gives logits of order 1, so that a
    # difference in the features (other pixels) shows in them; the model is
    # saved again where the run put it, with the run's metadata beside it.
    head = model.get_layer("head")
    rng = np.random.default_rng(0)
    kernel, bias = head.get_weights()
    scale = 3.0 / np.sqrt(kernel.shape[0])
    head.set_weights([rng.normal(0, scale, kernel.shape).astype("float32"), bias])
    model.save(metadata["paths"]["model"])
    size = tuple(metadata["preprocessing"]["image_size"])
    # The training-time evaluation: the trainer's held-out pipeline.
    held_out = data_lib.make_eval_dataset(config.data, size, 8)
    reference = np.asarray(model.predict(held_out, verbose=0), "float64")
    exported = export_model(
        model,
        "folder_vit",
        root=root / "saved_models",
        labels=metadata["labels"],
        preprocessing=metadata["preprocessing"],
        tflite=("float32",),
    )
    return {
        "root": root,
        "config": config,
        "metadata": metadata,
        "exported": exported,
        "reference": reference,
        "val_files": val_files,
    }


def softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def logits_of(model_path, files, **kwargs) -> np.ndarray:
    """Per-file logits from `predict`, in the order of `files`."""
    results = predict(model_path, [str(f) for f in files], output="logits", **kwargs)
    labels = sorted(label for label, _ in results[0])
    return np.array([[dict(r)[label] for label in labels] for r in results])


@pytest.mark.slow
def test_metadata_records_the_whole_contract_crop_included(folder_run):
    recorded = folder_run["metadata"]["preprocessing"]
    assert list(recorded) == list(PREPROCESSING_KEYS)
    assert recorded["crop_fraction"] == 0.875
    assert recorded["image_size"] == [32, 32]  # the smoke size of 224
    on_disk = json.loads((folder_run["root"] / "run" / "metadata.json").read_text())
    assert on_disk["preprocessing"] == recorded
    assert folder_run["exported"]["preprocessing"] == recorded


@pytest.mark.slow
def test_predict_and_the_export_give_the_training_time_evaluation_logits(folder_run):
    reference = folder_run["reference"]
    files = folder_run["val_files"]
    # Real logits, one row per held-out photo: a crop mismatch shows here.
    assert reference.shape == (len(files), 2)
    root = folder_run["root"]
    saved_model = root / "saved_models" / "folder_vit"
    # Same float32 network, graph vs eager: equal up to summation order
    # (FLOAT32_PARITY, relative to the logits' scale); the TFLite converter
    # fuses more (TFLITE_FLOAT32_PARITY).
    assert np.abs(reference).max() > 0.5
    measured = {}
    for path, bound in (
        (root / "run" / "model.keras", FLOAT32_PARITY),
        (saved_model, FLOAT32_PARITY),
        (root / "saved_models" / "folder_vit.tflite", TFLITE_FLOAT32_PARITY),
    ):
        got = logits_of(path, files)
        measured[path.name] = assert_parity(
            got, reference, reference, bound, f"predict {path.name}"
        )

    # The SavedModel's own image-bytes signature decodes, resizes and crops
    # in the graph.
    version = max(p for p in saved_model.iterdir() if p.name.isdigit())
    classify = tf.saved_model.load(str(version)).signatures["classify_images"]
    out = classify(images=tf.constant([f.read_bytes() for f in files]))
    probabilities = np.sort(softmax(reference), axis=-1)
    got = np.sort(out["probabilities"].numpy(), axis=-1)
    measured["classify_images"] = assert_parity(
        got, probabilities, reference, FLOAT32_PARITY, "classify_images"
    )
    print("max |logit difference| against training-time evaluation:", measured)


@pytest.mark.slow
def test_the_crop_is_what_makes_them_agree(folder_run):
    """Scoring the whole image (the contract without its crop) moves the
    logits far beyond the parity bound: the check above can tell."""
    metadata = dict(folder_run["metadata"])
    metadata["preprocessing"] = dict(metadata["preprocessing"], crop_fraction=1.0)
    model = folder_run["root"] / "run" / "model.keras"
    whole = logits_of(model, folder_run["val_files"], metadata=metadata)
    reference = folder_run["reference"]
    diff = float(np.max(np.abs(whole - reference)))
    print("max |logit difference| without the crop:", diff)
    assert diff > 100 * parity_bound(reference, FLOAT32_PARITY), diff


@pytest.mark.slow
def test_keras_vit_evaluate_scores_the_training_time_evaluation(folder_run, capsys):
    root = folder_run["root"]
    out = root / "evaluate"
    code = cli_main(
        [
            "evaluate",
            str(root / "run" / "model.keras"),
            "--data",
            "folder",
            "--data-path",
            str(root / "photos"),
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr()
    report = json.loads((out / "evaluation.json").read_text())
    reference = folder_run["reference"]
    labels = np.repeat([0, 1], len(CROPS))
    assert report["accuracy"] == np.mean(reference.argmax(-1) == labels)
    # The calibration error moves with every probability: a pipeline that fed
    # other pixels would not match it.
    expected = evaluation.expected_calibration_error(softmax(reference), labels)
    assert report["expected_calibration_error"] == pytest.approx(
        expected, abs=parity_bound(reference, FLOAT32_PARITY)
    )


def test_one_default_and_one_formula():
    config = DataConfig()
    assert (config.mean, config.std) == (DEFAULT_MEAN, DEFAULT_STD)
    contract = resolve_preprocessing(None, (4, 6), 3)
    assert list(contract) == list(PREPROCESSING_KEYS)
    assert contract["mean"] == [0.5] * 3 and contract["std"] == [0.5] * 3
    assert contract["crop_fraction"] == 1.0
    pixels = np.array([0.0, 51.0, 255.0], "float32")
    pre = dict(contract, mean=[0.1, 0.2, 0.3], std=[0.5, 0.25, 2.0])
    # (pixels / pixel_scale - mean) / std, to float32 rounding of values of
    # order 1 (a few 1e-8; 51 / 255 - 0.2 is 0 up to that rounding).
    expected = (pixels / 255.0 - np.array([0.1, 0.2, 0.3])) / np.array([0.5, 0.25, 2])
    assert_close(normalize_pixels(pixels, pre), expected, 1e-6)
    assert_close(denormalize_pixels(normalize_pixels(pixels, pre), pre), pixels, 1e-6)
    # Metadata written before the crop was recorded reads as no crop.
    old = {k: contract[k] for k in ("image_size", "num_channels", "mean", "std")}
    assert resolve_preprocessing(old, (4, 6), 3) == contract
