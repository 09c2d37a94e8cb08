"""Input pipeline throughput: images/s that keras_vit's training `tf.data`
stream delivers from an image folder and from TFRecords of JPEGs, with the
augmentation a ViT recipe uses, beside the model's own training images/s.

    python bench/input_pipeline.py --json bench/results/input_pipeline.json

The images are real photographs (scikit-learn's `china.jpg` and `flower.jpg`)
cut into random crops of 256-512 pixels a side and saved as JPEG (quality
90), so decoding costs what it costs on ImageNet-like data. Each pipeline is
timed after a warm-up, over whole batches, in alternating rounds; the report
names the CPU and its flags. A figure, not a test: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# Augmentation stages, each adding to the one before (timm / DeiT defaults).
STAGES = {
    "decode+resize": {},
    "+random resized crop, flip": {"crop_scale_min": 0.08, "flip": True},
    "+RandAugment(2, 0.5)": {"randaugment_ops": 2, "randaugment_magnitude": 0.5},
    "+MixUp 0.8 / CutMix 1.0": {"mixup_alpha": 0.8, "cutmix_alpha": 1.0},
}
SOURCES = ("folder", "tfrecord")
RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-images", type=int, default=256)
    parser.add_argument("--min-side", type=int, default=256)
    parser.add_argument("--max-side", type=int, default=512)
    parser.add_argument("--batches", type=int, default=8, help="timed per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--model-images-per-second",
        type=float,
        help="the model's training img/s to compare with; default: keras_vit's "
        "best in bench/results/ti16_224_b32_*.json",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    for name in ("image_size", "batch_size", "num_images", "batches", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 8 <= args.min_side <= args.max_side:
        parser.error("need 8 <= --min-side <= --max-side")
    return args


def make_images(num: int, min_side: int, max_side: int, seed: int = 0):
    """`num` uint8 RGB crops of the two bundled photos, sides in
    [min_side, max_side] (capped at the photo's size), and labels 0 / 1."""
    import numpy as np
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for i in range(num):
        photo = photos[i % len(photos)]
        h = int(rng.integers(min_side, max_side + 1))
        w = int(rng.integers(min_side, max_side + 1))
        h, w = min(h, photo.shape[0]), min(w, photo.shape[1])
        top = int(rng.integers(0, photo.shape[0] - h + 1))
        left = int(rng.integers(0, photo.shape[1] - w + 1))
        images.append(photo[top : top + h, left : left + w])
        labels.append(i % len(photos))
    return images, labels


def write_sources(root: Path, images, labels) -> dict[str, Path]:
    """The same JPEGs as an image folder and as TFRecord shards."""
    import tensorflow as tf

    from keras_vit.training.sources import TFRECORD_FEATURES

    folder = root / "folder" / "train"
    records = root / "tfrecord"
    records.mkdir(parents=True)
    shards = [
        tf.io.TFRecordWriter(str(records / f"train-{s:05d}-of-00004.tfrecord"))
        for s in range(4)
    ]
    assert set(TFRECORD_FEATURES) >= {"image/encoded", "image/class/label"}
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        encoded = tf.io.encode_jpeg(image, quality=90).numpy()
        path = folder / f"class_{label}" / f"{i:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encoded)
        example = tf.train.Example(
            features=tf.train.Features(
                feature={
                    "image/encoded": _bytes_feature(encoded),
                    "image/class/label": tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[label])
                    ),
                }
            )
        )
        shards[i % 4].write(example.SerializeToString())
    for shard in shards:
        shard.close()
    return {"folder": root / "folder", "tfrecord": records}


def _bytes_feature(value: bytes):
    import tensorflow as tf

    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def pipeline(source: str, path: Path, stage_options: dict, args):
    from keras_vit.training.config import DataConfig
    from keras_vit.training.data import make_train_dataset

    config = DataConfig(
        source=source,
        path=str(path),
        num_channels=3,
        mean=(0.5,),
        std=(0.5,),
        shuffle_buffer=64,
        num_classes=2,
        **stage_options,
    )
    dataset = make_train_dataset(config, args.image_size, args.batch_size, seed=0)
    return iter(dataset)


def images_per_second(batches, count: int, batch_size: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        images, _ = next(batches)
    images.numpy()  # the last batch is really computed
    return count * batch_size / (time.perf_counter() - start)


def model_training_rate(given: float | None) -> tuple[float | None, str]:
    if given:
        return given, "given on the command line"
    best, where = None, ""
    for file in sorted(RESULTS.glob("ti16_224_b32_*.json")):
        report = json.loads(file.read_text())
        for r in report["results"]:
            if r["mode"] == "train" and r["peer"] == "keras_vit":
                if best is None or r["images_per_second"] > best:
                    best = r["images_per_second"]
                    where = f"{file.name} ({r['setting']})"
    return best, where


def run(args) -> dict:
    import tensorflow as tf

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from throughput import environment, recorded_config

    images, labels = make_images(args.num_images, args.min_side, args.max_side)
    with tempfile.TemporaryDirectory(prefix="keras_vit_pipeline_") as tmp:
        paths = write_sources(Path(tmp), images, labels)
        stages, options = {}, {}
        for stage, extra in STAGES.items():
            options = {**options, **extra}
            stages[stage] = options
        keys = [(source, stage) for source in SOURCES for stage in stages]
        rates = {key: [] for key in keys}
        # A stream is built afresh for each timing and dropped after it: idle
        # streams would keep prefetching on the same cores, and a stream that
        # sat idle would start its timing with full buffers.
        for _ in range(args.rounds):
            for source, stage in keys:
                batches = pipeline(source, paths[source], stages[stage], args)
                images_per_second(batches, 2, args.batch_size)  # trace, fill
                rates[(source, stage)].append(
                    images_per_second(batches, args.batches, args.batch_size)
                )
                del batches
    model_rate, model_source = model_training_rate(args.model_images_per_second)
    results = []
    for (source, stage), values in rates.items():
        median = statistics.median(values)
        results.append(
            {
                "source": source,
                "stage": stage,
                "images_per_second": median,
                "rounds_images_per_second": values,
                "over_model_training": median / model_rate if model_rate else None,
            }
        )
    return {
        "config": recorded_config(args),
        "environment": environment(),
        "tf_data_autotune": True,
        "threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "model_training_images_per_second": model_rate,
        "model_training_source": model_source,
        "results": results,
    }


def format_table(report: dict) -> str:
    env, cfg = report["environment"], report["config"]
    lines = [
        f"input pipeline at {cfg['image_size']}x{cfg['image_size']}, batch "
        f"{cfg['batch_size']}, {cfg['num_images']} JPEGs of "
        f"{cfg['min_side']}-{cfg['max_side']} px; {env['cpu']} x{env['cpu_count']} "
        f"({', '.join(env['cpu_flags'])}); TF {env['tensorflow']}",
        "",
        f"| source | augmentation | img/s (median of {cfg['rounds']}) | rounds | "
        "x model training |",
        "| --- | --- | ---: | --- | ---: |",
    ]
    for r in report["results"]:
        rounds = " ".join(f"{v:.0f}" for v in r["rounds_images_per_second"])
        ratio = r["over_model_training"]
        lines.append(
            f"| {r['source']} | {r['stage']} | {r['images_per_second']:.0f} | "
            f"{rounds} | {f'{ratio:.1f}x' if ratio else 'n/a'} |"
        )
    rate = report["model_training_images_per_second"]
    if rate:
        lines.append(
            f"\nmodel training: {rate:.1f} img/s ({report['model_training_source']})"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(format_table(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
