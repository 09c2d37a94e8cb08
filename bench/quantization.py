"""Held-out accuracy, size on disk and CPU latency of one trained model as
float32 and after `model.quantize` (int8, int4), side by side in one process:

    keras-vit train digits                   # runs/digits/model.keras
    python bench/quantization.py runs/digits/model.keras \
        --json bench/results/quantization_digits.json

Accuracy is on the digits held-out split (360 images) with the run's
preprocessing (its metadata.json). Latency is the median of alternating
rounds of a `tf.function` call per model (no XLA) at batch 1 and 32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Measure this checkout's keras_vit, whichever is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import recorded  # noqa: E402  paths as committed results hold them


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a trained digits .keras model")
    parser.add_argument("--modes", default="int8,int4")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)

    import keras
    import numpy as np
    import tensorflow as tf

    import keras_vit  # noqa: F401  registers the layers
    from keras_vit.models.preprocessing import normalize_pixels, resize_pixels
    from keras_vit.models.quantization import quantized_copy
    from keras_vit.training.sources import digits_arrays

    trained = keras.saving.load_model(args.model)
    # An uncompiled copy: the trained model also holds its optimizer state.
    model = trained.__class__.from_config(trained.get_config())
    model.set_weights(trained.get_weights())
    metadata = json.loads((Path(args.model).parent / "metadata.json").read_text())
    pre = metadata["preprocessing"]
    arrays = digits_arrays()
    x = np.asarray(normalize_pixels(resize_pixels(arrays["x_eval"], pre), pre))
    labels = arrays["y_eval"]
    models = {"float32": model}
    models.update({m: quantized_copy(model, m) for m in args.modes.split(",")})

    results, float_top1 = {}, None
    for name, m in models.items():
        top1 = np.argmax(m.predict(x, batch_size=64, verbose=0), -1)
        float_top1 = top1 if float_top1 is None else float_top1
        with tempfile.TemporaryDirectory() as tmp:
            m.save_weights(Path(tmp) / "m.weights.h5")
            size = (Path(tmp) / "m.weights.h5").stat().st_size
        results[name] = {
            "accuracy": float(np.mean(top1 == labels)),
            "top1_agreement_with_float32": float(np.mean(top1 == float_top1)),
            "weights_file_bytes": size,
        }
    for batch in (1, 32):
        inputs = tf.constant(x[:batch])
        fns = {
            n: tf.function(lambda t, m=m: m(t, training=False))
            for n, m in models.items()
        }
        times = {n: [] for n in fns}
        for fn in fns.values():
            fn(inputs)  # trace
        for _ in range(args.rounds):
            for n, fn in fns.items():
                start = time.perf_counter()
                fn(inputs).numpy()
                times[n].append(time.perf_counter() - start)
        for n in fns:
            results[n][f"latency_ms_batch{batch}"] = 1e3 * statistics.median(times[n])
    out = {
        "model": recorded(args.model),
        "held_out_images": int(len(labels)),
        "note": "2 shared CPU cores, other jobs running: compare ratios",
        "results": results,
    }
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
