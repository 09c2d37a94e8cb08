"""What a finished run leaves in its folder: `model.keras`, the loss and
accuracy curves, the export (int8-calibrated and parity-checked on the
data) and `metadata.json`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from keras_vit.files import check_free_space, weights_bytes, write_atomic
from keras_vit.models.preprocessing import denormalize_pixels
from keras_vit.training import data as data_lib
from keras_vit.training import qat as qat_lib
from keras_vit.training import run_folder
from keras_vit.training.config import DataConfig


def has_tensorboard() -> bool:
    # tf.summary needs the `tensorboard` package, which tensorflow-cpu does
    # not pull in; without it the run goes on with the CSV history only.
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def plot_history(history_csv: Path, png: Path, steps_per_row: int = 1) -> Path | None:
    """Loss and accuracy (train, and held-out where evaluated) against the
    step, one panel each; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = run_folder.read_history(history_csv)  # skips torn or foreign rows
    if not rows:
        return None
    steps = np.array([(int(r["epoch"]) + 1) * steps_per_row for r in rows])
    figure, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for axis, metric in zip(axes, ("loss", "accuracy"), strict=True):
        for prefix in ("", "val_"):
            column = prefix + metric
            if column in rows[0]:
                values = np.array([_number(r[column]) for r in rows])
                if np.isfinite(values).any():
                    kept = np.isfinite(values)
                    axis.plot(steps[kept], values[kept], marker=".", label=column)
        axis.set_xlabel("step")
        axis.set_title(metric)
        axis.legend()
    figure.tight_layout()
    try:
        write_atomic(png, lambda path: figure.savefig(path, dpi=100, format="png"))
    finally:
        plt.close(figure)
    return png


def _raw_pixels(data: DataConfig, dataset, limit: int) -> np.ndarray:
    """Undoes the normalisation of up to `limit` images of `dataset`: raw
    pixels in `[0, pixel_scale]`, as clients of the export send them."""
    batches, count = [], 0
    for images, _ in dataset:
        batches.append(images.numpy())
        count += len(batches[-1])
        if count >= limit:
            break
    contract = data_lib.preprocessing(data, batches[0].shape[1:3])
    return np.asarray(denormalize_pixels(np.concatenate(batches)[:limit], contract))


def run_export_settings(run_dir: Path) -> dict:
    """What `export_run` takes from the training run in `run_dir` (its
    config.json): `data` (its DataConfig), `seed` and `variant`; {} when the
    folder holds no run."""
    path = Path(run_dir) / "config.json"
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        data, model = saved["data"], saved.get("model") or {}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
        return {}
    known = {field.name for field in dataclasses.fields(DataConfig)}
    values = {
        key: tuple(value) if isinstance(value, list) else value
        for key, value in data.items()
        if key in known
    }
    return {
        "data": DataConfig(**values),
        "seed": int(saved.get("seed") or 0),
        "variant": model.get("variant") or None,
    }


def export_run(
    model,
    name: str,
    root,
    *,
    labels,
    preprocessing: dict,
    data: DataConfig | None = None,
    seed: int = 0,
    representative_images=None,
    **options,
) -> dict:
    """The one export of a trained model, for the trainer and `keras-vit
    export`: with the run's `data`, int8 is calibrated on 512 training images
    (the pipeline's own resize, normalisation and augmentation, undone back to
    raw pixels) and every parity figure is measured on the held-out split (at
    most 2,000 images); without it, on `representative_images` if given.
    `options` go to `keras_vit.deploy.export.export_model` (version, tflite,
    variant, top_k, quantize, max_pixels)."""
    from keras_vit.deploy.export import export_model

    verify = None
    if data is not None:
        size = tuple(preprocessing["image_size"])
        train = data_lib.make_train_dataset(data, size, 64, seed)
        held_out = data_lib.make_eval_dataset(data, size, 256)
        representative_images = _raw_pixels(data, train, 512)
        verify = _raw_pixels(data, held_out, 2000)
    result = export_model(
        model,
        name,
        root=root,
        labels=labels,
        preprocessing=preprocessing,
        representative_images=representative_images,
        verify_images=verify,
        **options,
    )
    return result if isinstance(result, dict) else {"path": str(result)}


def _export(model, config, labels, preprocessing) -> dict:
    return export_run(
        model,
        config.export_name,
        config.export_root,
        labels=labels,
        preprocessing=preprocessing,
        data=config.data,
        seed=config.seed,
        variant=config.model.variant,
        quantize=config.export_quantize or None,
        # A Keras-quantized SavedModel has no TFLite conversion.
        **({"tflite": ()} if config.export_quantize else {}),
    )


def write_qat(qat_model, config, metadata, run_dir, size) -> dict:
    """The QAT run's full-int8 `.tflite`, calibrated on training images and
    checked against the QAT model on the held-out split."""
    train = data_lib.make_train_dataset(config.data, size, 64, config.seed)
    held_out = data_lib.make_eval_dataset(config.data, size, 256)
    return qat_lib.write_tflite(
        qat_model,
        run_dir,
        metadata["labels"],
        metadata["preprocessing"],
        _raw_pixels(config.data, train, 512),
        _raw_pixels(config.data, held_out, 2000),
    )


def write_outputs(model, config, metadata, run_dir, size, finished=False) -> None:
    """The chief's files: model.keras, curves, the export and metadata.json.
    `finished`: the run had finished before this call trained anything, so
    the export it made then is kept rather than written again as a new
    version."""
    paths = metadata["paths"]
    paths["model"] = str(run_dir / "model.keras")
    # Every file here replaces the last run's atomically: a kill while a
    # resumed run saves leaves the old file, never a truncated one.
    # HDF5 can crash the process on a full disk: check first.
    needed = int(weights_bytes(model.weights) * 1.1) + (1 << 20)
    check_free_space(paths["model"], needed)
    write_atomic(paths["model"], lambda path: model.save(str(path)))
    history = run_dir / "history.csv"
    if history.exists():
        paths["history"] = str(history)
        curves = plot_history(history, run_dir / "curves.png", config.checkpoint_every)
        if curves:
            paths["curves"] = str(curves)
    if has_tensorboard():
        paths["tensorboard"] = str(run_dir / "tensorboard")
    previous = _previous_export(run_dir) if finished else None
    if previous is not None and previous.get("name") == config.export_name:
        metadata["export"] = previous
        print(
            f"{config.name}: kept the export it made then ({config.export_root}/"
            f"{previous['name']}, version {previous.get('version')}); no new version"
        )
    elif config.export_name:
        labels, preprocessing = metadata["labels"], metadata["preprocessing"]
        metadata["export"] = _export(model, config, labels, preprocessing)
    text = json.dumps(metadata, indent=2, default=str)
    write_atomic(run_dir / "metadata.json", lambda path: path.write_text(text))


def _previous_export(run_dir: Path) -> dict | None:
    try:
        saved = json.loads((run_dir / "metadata.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    export = saved.get("export") if isinstance(saved, dict) else None
    return export if isinstance(export, dict) and export.get("files") else None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:  # CSVLogger writes "NA" for epochs without a value
        return float("nan")
