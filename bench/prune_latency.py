"""TFLite batch-1 latency of a ViT before and after structured pruning.

Builds a randomly initialised ViT, removes `--head-fraction` of its heads and
`--mlp-fraction` of its MLP units (Taylor scores on random calibration images,
`keras_vit.training.pruning`), exports both with `keras_vit.export_model`
(SavedModel + float32 TFLite, parity checked on export) and times one image
through each `.tflite` in alternating rounds:

    python bench/prune_latency.py --variant Ti/16 --image-size 224 \
        --json bench/results/prune_latency_ti16_224.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="Ti/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--head-fraction", type=float, default=0.5)
    parser.add_argument("--mlp-fraction", type=float, default=0.5)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def run(args, root: Path) -> dict:
    import keras
    import numpy as np

    from keras_vit.analysis.flops import count_macs
    from keras_vit.deploy import tflite as tflite_lib
    from keras_vit.deploy.export import export_model
    from keras_vit.models.vit import ViT
    from keras_vit.training import pruning

    keras.utils.set_random_seed(0)
    model = ViT(args.variant, image_size=args.image_size, num_classes=1000)
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(0).normal(0, 0.02, head.kernel.shape))
    rng = np.random.default_rng(1)
    shape = (args.image_size, args.image_size, 3)
    pixels = rng.uniform(0, 255, (8, *shape)).astype("float32")
    images = (pixels / 255.0 - 0.5) / 0.5
    labels = rng.integers(0, 1000, len(images))
    pruned, _ = pruning.prune(
        model, images, labels, args.head_fraction, args.mlp_fraction, batch_size=4
    )
    report = {"variant": args.variant, "image_size": args.image_size, "models": {}}
    runners = {}
    for name, m in (("unpruned", model), ("pruned", pruned)):
        metadata = export_model(
            m,
            name,
            root,
            preprocessing={"mean": 0.5, "std": 0.5, "pixel_scale": 255.0},
            tflite=("float32",),
            verify_images=pixels,
        )
        blocks = pruning.transformer_blocks(m)
        report["models"][name] = {
            "params": int(m.count_params()),
            "macs": int(count_macs(m)),
            "heads": sum(b.num_heads for b in blocks),
            "mlp_units": sum(b.mlp_dim for b in blocks),
            "tflite_bytes": metadata["files"][f"{name}.tflite"],
            "parity": metadata["parity"],
            "latencies_ms": [],
        }
        runners[name] = tflite_lib.Runner(
            root / f"{name}.tflite", num_threads=args.threads
        )
    one = pixels[:1]
    for runner in runners.values():
        for _ in range(3):
            runner(one)
    for _ in range(args.rounds):
        for name, runner in runners.items():
            for _ in range(args.iterations):
                start = time.perf_counter()
                runner(one)
                report["models"][name]["latencies_ms"].append(
                    1000 * (time.perf_counter() - start)
                )
    for entry in report["models"].values():
        entry["median_ms"] = round(statistics.median(entry.pop("latencies_ms")), 3)
    models = report["models"]
    report["latency_ratio"] = round(
        models["pruned"]["median_ms"] / models["unpruned"]["median_ms"], 3
    )
    report["threads"] = args.threads
    report["note"] = "shared 2-core machine; alternating rounds, medians"
    return report


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        report = run(args, Path(tmp))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
