"""Exports a trained `.keras` model: a TF Serving SavedModel version, .tflite
files (float32, float16, dynamic-range int8, full-integer int8) and
metadata.json, each checked against the Keras model.

    python recipes/export.py runs/digits/model.keras --calibration digits \
        --name vit_digits
    python recipes/export.py --smoke   # 2-step model -> saved_models/digits_smoke

Labels and preprocessing default to the `metadata.json` the training run wrote
beside the model (runs/<name>/metadata.json); `--labels`, `--mean`, `--std`,
`--pixel-scale` and `--resize-method` override them. Full-integer int8 needs
`--calibration`: `digits` (the training split of scikit-learn's digits, for the
default recipe) or a folder of images like the training data; without it the
int8 kind is left out. Prints the parity figures, file sizes and the
commands that predict with or serve the export; on the default recipe's model
every TFLite kind agrees with Keras on >= 98% of the held-out digits (float32
within 1e-4 of the logits' scale).
"""

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# Before TensorFlow loads, as keras_vit.logs explains: errors only.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


def digits_pixels(image_size=(16, 16), split="train"):
    """Raw 0..255 pixels of scikit-learn's digits at `image_size`, 1 channel,
    from the split of the default recipe (`split`: "train" or "eval"):
    (images, labels)."""
    import tensorflow as tf

    from keras_vit.training.sources import digits_arrays

    arrays = digits_arrays()
    pixels = tf.image.resize(arrays[f"x_{split}"], image_size, method="nearest")
    return pixels.numpy(), arrays[f"y_{split}"]


def folder_pixels(folder, preprocessing, limit=2000):
    from keras_vit.deploy.serving import load_pixels

    files = sorted(
        p for p in Path(folder).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES
    )
    if not files:
        raise ValueError(f"--calibration folder {str(folder)!r} holds no images")
    step = max(1, len(files) // limit)
    return load_pixels(files[::step][:limit], preprocessing)


def smoke_model():
    """A tiny digits ViT after two training steps (the export is what is
    smoke-tested, not the accuracy)."""
    import keras

    import keras_vit

    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(
        "Ti/4",
        image_size=16,
        num_classes=10,
        num_channels=1,
        hidden_dim=32,
        num_layers=1,
        num_heads=2,
        mlp_dim=64,
    )
    pixels, labels = digits_pixels()
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit((pixels[:64] / 255.0 - 0.5) / 0.5, labels[:64], batch_size=32, verbose=0)
    return model


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help=".keras model file")
    parser.add_argument("--name", help="served model name (default: model file stem)")
    parser.add_argument("--root", default="saved_models")
    parser.add_argument("--version", type=int)
    parser.add_argument("--labels", help="file with one class name per line, or a,b,c")
    parser.add_argument("--mean", help="per-channel means, e.g. 0.485,0.456,0.406")
    parser.add_argument("--std", help="per-channel stds")
    parser.add_argument("--pixel-scale", type=float)
    parser.add_argument(
        "--max-pixels", type=int, help="classify_images size limit (4096*4096)"
    )
    parser.add_argument("--resize-method")
    parser.add_argument("--calibration", help="'digits' or an image folder (int8)")
    parser.add_argument("--tflite", help="comma list (default: all kinds possible)")
    parser.add_argument("--smoke", action="store_true", help="2-step digits model")
    parser.add_argument(
        "--quantize",
        choices=("int8", "int4", "float8"),
        help="export a copy with Dense kernels quantized by model.quantize",
    )
    args = parser.parse_args(argv)
    if not args.smoke and not args.model:
        parser.error("give a .keras model file, or --smoke")
    return args


def main(argv):
    """Exports as the module docstring says; the package's own errors (a
    model that does not load, bad values, a version taken) are one line and
    exit status 2, anything else keeps its traceback."""
    from keras_vit.cli.common import user_error_line

    try:
        return export(parse_args(argv))
    except Exception as error:
        message = user_error_line(error)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2


def export(args):

    import keras_vit  # noqa: F401  registers the layers
    from keras_vit.deploy import serving, tflite
    from keras_vit.deploy.export import export_model
    from keras_vit.models import preprocessing as preprocessing_lib
    from keras_vit.training.report import serve_command

    found = {}
    if args.smoke:
        model, name = smoke_model(), args.name or "digits_smoke"
        found = {"labels": [str(i) for i in range(10)]}
        found["preprocessing"] = {"mean": [0.5], "std": [0.5]}
        args.calibration = args.calibration or "digits"
    else:
        model = serving.load_keras_file(args.model)
        name = args.name or Path(args.model).stem
        try:
            found = json.loads(serving.find_metadata(args.model).read_text())
        except ValueError:
            found = {}
    preprocessing = dict(found.get("preprocessing") or {})
    for key, value in (
        ("mean", args.mean),
        ("std", args.std),
        ("pixel_scale", args.pixel_scale),
        ("resize_method", args.resize_method),
    ):
        if value is not None:
            preprocessing[key] = (
                [float(v) for v in value.split(",")]
                if key in ("mean", "std")
                else value
            )
    preprocessing = preprocessing_lib.normalize_preprocessing(model, preprocessing)
    labels = found.get("labels")
    if args.labels:
        path = Path(args.labels)
        labels = (
            path.read_text().split("\n") if path.is_file() else args.labels.split(",")
        )
        labels = [label.strip() for label in labels if label.strip()]

    representative = verify = None
    if args.calibration == "digits":
        representative, _ = digits_pixels(preprocessing["image_size"])
        verify, _ = digits_pixels(preprocessing["image_size"], split="eval")
    elif args.calibration:
        representative = folder_pixels(args.calibration, preprocessing)
    kinds = tflite.DEFAULT_KINDS if args.tflite is None else args.tflite.split(",")
    if representative is None and args.tflite is None:
        kinds = [k for k in kinds if k != "int8"]
        print("int8 left out: it needs --calibration (digits or an image folder)")
    metadata = export_model(
        model,
        name,
        args.root,
        version=args.version,
        labels=labels,
        preprocessing=preprocessing,
        representative_images=representative,
        tflite=kinds,
        verify_images=verify,
        quantize=args.quantize,
        **({"max_pixels": args.max_pixels} if args.max_pixels is not None else {}),
    )
    print(f"exported {name} version {metadata['version']} under {args.root}/")
    for artifact, figures in metadata["parity"].items():
        if isinstance(figures, dict):
            shown = ", ".join(f"{k}={v:.3g}" for k, v in figures.items())
            print(f"  {artifact}: {shown}")
    for file, size in metadata["files"].items():
        print(f"  {args.root}/{file}: {size / 1024:.1f} KiB")
    print(f"predict: keras-vit predict {Path(args.root) / name} IMAGE.png")
    print(f"serve:   {serve_command(args.root, name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
