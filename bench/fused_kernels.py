"""keras_vit's training step with and without its fused kernels, in one
process, and where the step's time goes.

The two steps are traced from the same model (one inside
`keras_vit.models.fused.disabled()`), then timed in alternating rounds, so a
change in machine load or clock hits both alike; the table shows the best
and every round. `--profile` also traces each step with `tf.profiler` and
sums the TensorFlow ops' own time by kind (matrix products, GELU, LayerNorm,
softmax, bias gradients, casts, optimizer, the rest). Op times are summed
over TensorFlow's inter-op threads, so they can exceed the wall time; the
fused kernels' own XLA executions are not TensorFlow ops and are counted as
the difference to the wall time.

    python bench/fused_kernels.py --variant Ti/16 --image-size 224 \\
        --batch-size 32 --precision mixed_bfloat16 --rounds 5 --profile \\
        --json bench/results/fused_kernels_ti16_224_b32.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = ("fused", "plain")
# Op-time kinds, first match wins: (kind, words in the op's scope or type).
KINDS = (
    ("variable reads", ("readvariableop",)),
    ("gelu", ("gelu", "erf")),
    ("layernorm", ("norm",)),
    ("softmax", ("softmax",)),
    ("optimizer", ("adam", "assign")),
    ("bias gradient", ("biasaddgrad",)),
    ("matmul", ("matmul",)),
    ("cast", (":cast",)),
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="Ti/16")
    parser.add_argument("--num-layers", type=int, default=0, help="0: the variant's")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--precision", choices=("float32", "mixed_bfloat16"), default="mixed_bfloat16"
    )
    parser.add_argument("--jit", action="store_true", help="compile the step")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def make_steps(args):
    import keras
    import tensorflow as tf

    import keras_vit
    from keras_vit.models import fused

    keras.mixed_precision.set_global_policy(args.precision)
    extra = {"num_layers": args.num_layers} if args.num_layers else {}
    model = keras_vit.ViT(
        args.variant, image_size=args.image_size, num_classes=1000, **extra
    )
    shape = (args.batch_size, args.image_size, args.image_size, 3)
    images = tf.random.stateless_uniform(shape, seed=(0, 1))
    labels = tf.random.stateless_uniform(
        (args.batch_size,), seed=(0, 2), maxval=1000, dtype=tf.int32
    )
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.AdamW(learning_rate=1e-4)
    optimizer.build(model.trainable_variables)

    def traced():
        @tf.function(jit_compile=args.jit)
        def train(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        return lambda: train(images, labels).numpy()

    steps = {"fused": traced(), "plain": traced()}
    steps["fused"]()  # traces with the fused kernels
    with fused.disabled():
        steps["plain"]()  # traces with the keras.ops graph
    return steps


def kind_of(name: str) -> str:
    for kind, words in KINDS:
        if any(word in name for word in words):
            return kind
    return "other ops"


def op_times(step, count: int) -> dict:
    """Seconds per step of TensorFlow's ops by kind, from a profiler trace."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    with tempfile.TemporaryDirectory(prefix="keras_vit_profile_") as logdir:
        tf.profiler.experimental.start(logdir)
        start = time.perf_counter()
        for _ in range(count):
            step()
        wall = (time.perf_counter() - start) / count
        tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        space.ParseFromString(next(Path(logdir).rglob("*.xplane.pb")).read_bytes())
    kinds = collections.Counter()
    for plane in space.planes:
        names = plane.event_metadata
        for line in plane.lines:
            for event in line.events:
                name = names[event.metadata_id].name
                # TensorFlow op events are "scope/op_name:OpType".
                if ":" not in name or "/" not in name:
                    continue
                low = name.lower()
                kind = next(
                    (k for k, words in KINDS if any(w in low for w in words)), None
                )
                kinds[kind or "other ops"] += event.duration_ps * 1e-12 / count
    return {"wall_seconds": wall, "op_seconds": dict(kinds.most_common())}


def run(args) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from throughput import environment, recorded_config

    steps = make_steps(args)
    rates = {name: [] for name in SETTINGS}
    for round_index in range(args.rounds):
        order = SETTINGS if round_index % 2 == 0 else SETTINGS[::-1]
        for name in order:
            steps[name]()  # one untimed step: caches warm for this setting
            start = time.perf_counter()
            for _ in range(args.steps):
                steps[name]()
            seconds = time.perf_counter() - start
            rates[name].append(args.steps * args.batch_size / seconds)
    report = {
        "config": recorded_config(args),
        "environment": environment(),
        "images_per_second": {name: max(v) for name, v in rates.items()},
        "rounds_images_per_second": rates,
        "fused_over_plain": max(rates["fused"]) / max(rates["plain"]),
    }
    if args.profile:
        report["profile"] = {name: op_times(steps[name], 2) for name in SETTINGS}
    return report


def format_table(report: dict) -> str:
    env, cfg = report["environment"], report["config"]
    lines = [
        f"{cfg['variant']} at {cfg['image_size']}, batch {cfg['batch_size']}, "
        f"{cfg['precision']}, XLA {'on' if cfg['jit'] else 'off'}; {env['cpu']} "
        f"x{env['cpu_count']} ({', '.join(env['cpu_flags'])}); TF {env['tensorflow']}",
        "",
        "| training step | best img/s | rounds |",
        "| --- | ---: | --- |",
    ]
    for name in SETTINGS:
        rounds = " ".join(f"{v:.1f}" for v in report["rounds_images_per_second"][name])
        lines.append(f"| {name} | {report['images_per_second'][name]:.1f} | {rounds} |")
    lines.append(f"\nfused / plain: {report['fused_over_plain']:.2f}x")
    for name, profile in report.get("profile", {}).items():
        parts = ", ".join(
            f"{kind} {seconds * 1e3:.0f}"
            for kind, seconds in profile["op_seconds"].items()
        )
        lines.append(
            f"{name}: wall {profile['wall_seconds'] * 1e3:.0f} ms a step; "
            f"op time, ms: {parts}"
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
