"""The qat_digits table: held-out accuracy and `.tflite` size of the digits
ViT as float, post-training int8 (PTQ) and quantization-aware int8 (QAT).

    keras-vit train digits        # runs/digits/model.keras, the float model
    python bench/qat_digits.py --json bench/results/qat_digits.json

QAT fine-tunes the float model with the `qat_digits` recipe (in
`runs/qat_digits`; a finished run there is reused). Both int8 files are
full-integer and calibrated on the same images (the 1,437 training images);
accuracy is on the 360 held-out images of `sources.digits_arrays`. The
`.tflite` of the QAT model is checked to carry its trained ranges: each
activation quantizer's step `(max - min) / 255` must be some tensor's scale.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import recorded  # noqa: E402  paths as committed results hold them


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/digits/model.keras")
    parser.add_argument("--run-dir", default="runs/qat_digits")
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def _float_tflites(model, preprocessing, representative) -> dict[str, bytes]:
    from keras_vit.deploy import tflite
    from keras_vit.deploy.signatures import write_saved_model

    labels = [str(i) for i in range(10)]
    with tempfile.TemporaryDirectory() as tmp:
        write_saved_model(model, tmp, labels, preprocessing)
        return {
            kind: tflite.convert(tmp, kind, representative)
            for kind in ("float32", "int8")
        }


def _ranges_in_file(qat_model, content) -> float:
    """Share of the QAT model's activation quantizers whose trained step is
    a tensor scale of the `.tflite`."""
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter

    from keras_vit.models.qat import activation_quantizers

    tensors = Interpreter(model_content=content).get_tensor_details()
    scales = np.array(
        [s for t in tensors for s in t["quantization_parameters"]["scales"]]
    )
    quantizers = activation_quantizers(qat_model).values()
    found = [
        np.min(np.abs(scales * 255 / float(q.range_max - q.range_min) - 1)) < 1e-5
        for q in quantizers
    ]
    return float(np.mean(found))


def main(argv=None) -> dict:
    args = parse_args(argv)
    import keras
    import numpy as np

    from keras_vit.deploy.qat import int8_tflite
    from keras_vit.deploy.tflite import Runner
    from keras_vit.models.preprocessing import normalize_pixels, resize_pixels
    from keras_vit.training.recipes import load_recipe
    from keras_vit.training.sources import digits_arrays
    from keras_vit.training.trainer import train

    model = keras.saving.load_model(args.model, compile=False)
    metadata = json.loads((Path(args.model).parent / "metadata.json").read_text())
    pre = metadata["preprocessing"]
    arrays = digits_arrays()
    x_eval = np.asarray(resize_pixels(arrays["x_eval"], pre))
    x_train = np.asarray(resize_pixels(arrays["x_train"], pre))
    labels = arrays["y_eval"]

    def top1_keras(m):
        return np.argmax(m.predict(normalize_pixels(x_eval, pre), verbose=0), -1)

    def top1_file(content):
        return np.argmax(Runner(content)(x_eval)["logits"], -1)

    run = train(
        load_recipe(
            "qat_digits",
            {"model.pretrained": args.model, "run_dir": args.run_dir, "verbose": "0"},
        )
    )
    qat_model = run["qat_model"]
    files = _float_tflites(model, pre, x_train)
    files["qat_int8"] = int8_tflite(qat_model, x_train, pre)
    top1 = {
        "float_keras": top1_keras(model),
        "qat_keras": top1_keras(qat_model),
        **{name: top1_file(content) for name, content in files.items()},
    }
    rows = {}
    for name, predicted in top1.items():
        file = {"float_keras": "float32", "qat_keras": None}.get(name, name)
        rows[name] = {
            "accuracy": float(np.mean(predicted == labels)),
            "top1_agreement_with_float": float(
                np.mean(predicted == top1["float_keras"])
            ),
            "tflite_bytes": len(files[file]) if file else None,
        }
    rows["qat_int8"]["top1_agreement_with_qat_keras"] = float(
        np.mean(top1["qat_int8"] == top1["qat_keras"])
    )
    rows["qat_int8"]["trained_ranges_in_file"] = _ranges_in_file(
        qat_model, files["qat_int8"]
    )
    result = {
        "model": recorded(args.model),
        "qat_run": recorded(args.run_dir),
        "qat_steps": run["steps"],
        "held_out_images": len(labels),
        "calibration_images": len(x_train),
        "results": rows,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
