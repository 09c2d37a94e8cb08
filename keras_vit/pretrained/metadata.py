"""What a checkpoint says about its inputs and outputs: the preprocessing
(mean, std, resize, crop) and the class names, as the `metadata.json` the
trainer writes, so a converted model predicts, evaluates and exports like a
model trained here.

Sources, by layout:

- timm: `config.json`'s `pretrained_cfg` (`mean`, `std`, `interpolation`,
  `crop_pct`, `crop_mode`) and `label_names`. timm resizes with PIL, the
  shorter side to `size / crop_pct`, then takes the centre crop.
- Hugging Face: `preprocessor_config.json` (`size`, `crop_size`, `resample`,
  `rescale_factor`, `image_mean`, `image_std`) and `config.json`'s
  `id2label`. The image processors resize with PIL too.
- AugReg / big_vision `.npz`: no file says it; their input pipelines scale
  pixels to [-1, 1] (mean 0.5, std 0.5) and resize with `tf.image.resize`
  (bilinear, no crop), which is keras_vit's own resize.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import keras

from keras_vit.errors import CheckpointError
from keras_vit.models.preprocessing import normalize_preprocessing
from keras_vit.pretrained.json_files import file_kind, read_json_file

# timm's interpolation names and PIL's resample codes -> tf.image.resize.
TIMM_INTERPOLATION = {
    "bicubic": "bicubic",
    "bilinear": "bilinear",
    "nearest": "nearest",
    "lanczos": "lanczos3",
    "box": "area",
}
PIL_RESAMPLE = {0: "nearest", 1: "lanczos3", 2: "bilinear", 3: "bicubic", 4: "area"}
JAX_PREPROCESSING = {"mean": 0.5, "std": 0.5, "resize_method": "bilinear"}


def _resize_method(value, table: dict, what: str) -> str:
    if value in table:
        return table[value]
    warnings.warn(
        f"{what} {value!r} has no tf.image.resize equivalent; using bicubic.",
        stacklevel=4,
    )
    return "bicubic"


def timm_preprocessing(config: dict) -> dict | None:
    cfg = config.get("pretrained_cfg") or {}
    if "mean" not in cfg or "std" not in cfg:
        return None
    mode = cfg.get("crop_mode", "center")
    if mode not in ("center", "squash"):
        warnings.warn(
            f"timm crop_mode {mode!r} is not reproduced; using 'center'.",
            stacklevel=3,
        )
    return {
        "mean": list(cfg["mean"]),
        "std": list(cfg["std"]),
        "resize_method": _resize_method(
            cfg.get("interpolation", "bicubic"), TIMM_INTERPOLATION, "interpolation"
        ),
        # timm's DEFAULT_CROP_PCT when the config has none.
        "crop_fraction": float(cfg.get("crop_pct") or 0.875),
        "keep_aspect_ratio": mode != "squash",
        "antialias": True,
    }


def _hw(value, what: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, int):
        return value, value
    if "height" in value and "width" in value:
        return int(value["height"]), int(value["width"])
    if "shortest_edge" in value:
        return int(value["shortest_edge"]), int(value["shortest_edge"])
    raise CheckpointError(f"preprocessor_config.json {what} {value!r} is not read.")


def huggingface_preprocessing(processor: dict) -> dict | None:
    if not processor:
        return None
    scale = float(processor.get("rescale_factor", 1 / 255))
    if not processor.get("do_rescale", True):
        scale = 1.0
    if processor.get("do_normalize", True):
        mean = processor.get("image_mean", [0.5, 0.5, 0.5])
        std = processor.get("image_std", [0.5, 0.5, 0.5])
    else:
        mean, std = [0.0], [1.0]
    # The model sees (x * scale - mean) / std of 0..255 pixels; keras_vit's
    # contract is (x / 255 - mean') / std'.
    factor = 255.0 * scale
    result = {
        "mean": [float(m) / factor for m in mean],
        "std": [float(s) / factor for s in std],
        "resize_method": _resize_method(
            processor.get("resample", 2), PIL_RESAMPLE, "PIL resample"
        ),
        "keep_aspect_ratio": "shortest_edge" in (processor.get("size") or {}),
        "antialias": True,
    }
    size = _hw(processor.get("size"), "size")
    crop = _hw(processor.get("crop_size"), "crop_size")
    if processor.get("do_center_crop") and size and crop:
        result["crop_fraction"] = crop[0] / size[0]
    return result


def labels_from(config: dict, layout: str, num_classes: int) -> list[str]:
    """Class names by index; the indices themselves when the source has none
    (or a different number)."""
    names = None
    if layout == "huggingface" and config.get("id2label"):
        id2label = config["id2label"]
        names = [str(id2label[k]) for k in sorted(id2label, key=int)]
    elif layout == "timm" and config.get("label_names"):
        given = config["label_names"]
        if isinstance(given, dict):
            given = [given[k] for k in sorted(given, key=int)]
        names = [str(n) for n in given]
    if names is not None and len(names) != num_classes:
        warnings.warn(
            f"The checkpoint names {len(names)} classes and its head has "
            f"{num_classes}; labels are the class indices.",
            stacklevel=3,
        )
        names = None
    return names or [str(i) for i in range(num_classes)]


def source_metadata(
    model: keras.Model,
    layout: str,
    config: dict,
    folder: Path,
    new_head: bool,
    source: str,
) -> dict:
    """The metadata of a converted model: `preprocessing` (the contract's
    dict, checked against the model; left out when the source does not say),
    `labels` (models with a head) and `source`."""
    if layout == "timm":
        preprocessing = timm_preprocessing(config)
    elif layout == "huggingface":
        path = folder / "preprocessor_config.json"
        processor = {}
        if file_kind(path) != "missing":
            processor = read_json_file(path, "it holds the checkpoint's preprocessing")
        preprocessing = huggingface_preprocessing(processor)
    else:
        preprocessing = dict(JAX_PREPROCESSING)
    metadata = {"source": {"checkpoint": source, "layout": layout}}
    if preprocessing is not None:
        metadata["preprocessing"] = normalize_preprocessing(model, preprocessing)
    if any(layer.name == "head" for layer in model.layers):
        num_classes = int(model.output_shape[-1])
        metadata["labels"] = (
            [str(i) for i in range(num_classes)]
            if new_head
            else labels_from(config, layout, num_classes)
        )
    return metadata
