"""What a dynamic-size ViT costs under XLA when the image size changes:
`model.predict` with `compile(jit_compile=True)` on a sequence of sizes,
recording each call's time and the predict function's trace count:

    python bench/dynamic_size_xla.py --json bench/results/dynamic_size_xla.json

A size seen before reuses its compiled program; a new size compiles one (and
the second size seen also traces once more, with the size relaxed to
unknown). The fixed-size model at the first size is timed alongside.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# Measure this checkout's keras_vit, whichever is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = [(224, 224), (224, 224), (256, 256), (256, 256), (320, 192), (224, 224)]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="Ti/16")
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)

    import numpy as np

    import keras_vit

    rng = np.random.default_rng(0)
    options = dict(num_classes=10, num_layers=args.num_layers)
    result = {"variant": args.variant, "num_layers": args.num_layers}
    result["batch"] = args.batch
    models = {
        "dynamic": keras_vit.ViT(args.variant, 224, dynamic_size=True, **options),
        "fixed_224": keras_vit.ViT(args.variant, 224, **options),
    }
    for name, model in models.items():
        model.compile(jit_compile=True)
        calls = []
        for size in SIZES if name == "dynamic" else SIZES[:2]:
            x = rng.uniform(0, 1, (args.batch, *size, 3)).astype("float32")
            start = time.perf_counter()
            model.predict(x, batch_size=args.batch, verbose=0)
            seconds = time.perf_counter() - start
            traces = model.predict_function.experimental_get_tracing_count()
            calls.append({"size": list(size), "seconds": round(seconds, 3)})
            calls[-1]["traces"] = int(traces)
            print(name, size, f"{seconds:.2f} s", f"traces={traces}", flush=True)
        result[name] = calls
    result["machine"] = "2 shared CPU cores (other jobs running)"
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
