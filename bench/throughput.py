"""Side-by-side ViT throughput: keras_vit, keras-hub and timm in one process.

Every contestant gets the same synthetic batch already on the device and runs
in alternating rounds after its warm-up, so a load change on a shared machine
hits all of them alike. Training is forward + backward + AdamW update in one
`tf.function` (with and without XLA) or one eager PyTorch step; inference is
the forward pass in inference mode. The machine's matmul peak (float32 and
bfloat16) is measured in the same rounds, and each result is reported as
images/s, model FLOP/s and the fraction of that peak.

    keras-vit bench                       # a tiny model: a quick look
    python bench/throughput.py --variant Ti/16 --image-size 224 \
        --batch-size 32 --rounds 3 --iterations 5 --json bench/results.json

The defaults are a tiny run (2 blocks of Ti/16 at 64x64, batch 8, without
XLA), which shows the table in about a minute on 2 CPU cores; the
comparisons in the docs use the second command. A peer that is not
installed (keras-hub; torch and timm) is skipped with one line that says how
to get it: each is best measured from a venv of its own (keras-hub pulls
the full tensorflow).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import importlib.util
import json
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# Measure this checkout's keras_vit, whichever is installed.
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PEERS = ("keras_vit", "keras_hub", "timm")
MODES = ("train", "infer")
PRECISIONS = ("float32", "mixed_bfloat16")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--variant", default="Ti/16", help="keras_vit variant")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument(
        "--num-layers",
        type=int,
        default=2,
        help="override the variant's number of blocks (0: the variant's own)",
    )
    parser.add_argument("--precision", default="float32", choices=PRECISIONS)
    parser.add_argument(
        "--iterations", type=int, default=3, help="timed steps per round"
    )
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed steps before the rounds"
    )
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds")
    parser.add_argument(
        "--peers", default=",".join(PEERS), help=f"comma list from {PEERS}"
    )
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"comma list from {MODES}"
    )
    parser.add_argument(
        "--jit",
        default="off",
        choices=("both", "on", "off"),
        help="XLA settings tried for the TensorFlow peers",
    )
    parser.add_argument(
        "--intra-op-threads",
        type=int,
        default=0,
        help="TensorFlow intra-op threads (0: TensorFlow's default)",
    )
    parser.add_argument(
        "--inter-op-threads",
        type=int,
        default=0,
        help="TensorFlow inter-op threads (0: TensorFlow's default)",
    )
    parser.add_argument(
        "--matmul-size", type=int, default=1024, help="side of the peak matmul"
    )
    parser.add_argument(
        "--auto-check",
        action="store_true",
        help="also time keras_vit in the other precision, and report how the "
        "setting precision='auto', jit_compile='auto' chooses compares with "
        "keras_vit's best fixed setting",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    if args.num_layers is not None and args.num_layers < 0:
        parser.error(f"--num-layers must be >= 0, got {args.num_layers}")
    args.num_layers = args.num_layers or None  # 0: the variant's own depth
    args.peers = _split_choices(parser, "--peers", args.peers, PEERS)
    args.modes = _split_choices(parser, "--modes", args.modes, MODES)
    for name in ("image_size", "batch_size", "num_classes", "iterations", "rounds"):
        if getattr(args, name) < 1:
            parser.error(
                f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}"
            )
    if args.warmup < 1:
        # The first call traces (and for XLA compiles); it must not be timed.
        parser.error(f"--warmup must be >= 1, got {args.warmup}")
    return args


def _split_choices(parser, flag: str, value: str, valid: tuple[str, ...]):
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in valid]
    if bad or not items:
        parser.error(f"{flag} got {value!r}; valid values are {', '.join(valid)}")
    return items


# --------------------------------------------------------------------------
# Model FLOPs, counted from the architecture.


# --------------------------------------------------------------------------
# Memory.


def _proc_status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Resets the kernel's RSS high-water mark (Linux >= 4.0).

    Freed heap memory is first handed back to the system, so the growth seen
    during the next steps is their own working memory, not a gap that an
    earlier contestant left in the allocator.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mib() -> float:
    hwm = _proc_status_kib("VmHWM")
    if hwm is None:
        # ru_maxrss is the process lifetime peak, in KiB on Linux.
        hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return hwm / 1024


def rss_mib() -> float:
    rss = _proc_status_kib("VmRSS")
    return (rss or 0) / 1024


# --------------------------------------------------------------------------
# Contestants.


@dataclass
class Contestant:
    """One (mode, peer, setting) with a step that runs one batch to completion."""

    mode: str
    peer: str
    setting: str
    step: Callable[[], None]
    device_memory: Callable[[], float | None] = lambda: None
    reset_device_memory: Callable[[], None] = lambda: None
    rounds: list[float] = field(default_factory=list)
    warmup_seconds: float = 0.0
    peak_rss_mib: float = 0.0
    rss_growth_mib: float = 0.0
    device_peak_mib: float | None = None

    @property
    def label(self) -> str:
        return f"{self.peer} ({self.setting})"


def setting_label(jit: bool, precision: str | None = None) -> str:
    """ "jit" / "no jit", prefixed by the precision when it is not the run's."""
    label = "jit" if jit else "no jit"
    return f"{precision} {label}" if precision else label


def tf_contestants(
    peer, model, images, labels, modes, jit_settings, memory, precision=None
):
    import tensorflow as tf

    out = []
    for jit in jit_settings:
        setting = setting_label(jit, precision)
        if "train" in modes:
            train_step = _train_step(model, jit)
            # Only the scalar loss crosses to the host, once per step.
            out.append(
                Contestant(
                    "train",
                    peer,
                    setting,
                    lambda f=train_step: f(images, labels).numpy(),
                    *memory,
                )
            )
        if "infer" in modes:
            infer_step = tf.function(
                lambda x: model(x, training=False), jit_compile=jit
            )
            out.append(
                Contestant(
                    "infer",
                    peer,
                    setting,
                    lambda f=infer_step: f(images)[0, 0].numpy(),
                    *memory,
                )
            )
    return out


def _train_step(model, jit: bool):
    """Forward, backward and AdamW update as one TensorFlow function."""
    import keras
    import tensorflow as tf

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.AdamW(learning_rate=1e-4)
    optimizer.build(model.trainable_variables)

    @tf.function(jit_compile=jit)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return train_step


def tf_memory_probes():
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    if not gpus:
        return (lambda: None, lambda: None)
    name = gpus[0].name

    def peak():
        return tf.config.experimental.get_memory_info(name)["peak"] / 2**20

    return (peak, lambda: tf.config.experimental.reset_memory_stats(name))


def build_keras_vit(args, arch):
    import keras_vit

    return keras_vit.ViT(
        args.variant,
        image_size=args.image_size,
        num_classes=args.num_classes,
        num_layers=arch["num_layers"],
    )


def build_keras_hub(args, arch):
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(
        image_shape=(args.image_size, args.image_size, 3),
        patch_size=arch["patch_size"],
        num_layers=arch["num_layers"],
        num_heads=arch["num_heads"],
        hidden_dim=arch["hidden_dim"],
        mlp_dim=arch["mlp_dim"],
    )
    return keras_hub.models.ViTImageClassifier(
        backbone=backbone, num_classes=args.num_classes, head_dtype="float32"
    )


def timm_contestants(args, arch, modes):
    """timm's VisionTransformer of the same dimensions, PyTorch eager."""
    try:
        import torch
        from timm.models.vision_transformer import VisionTransformer
    except ImportError as err:
        return [], (
            f"torch/timm not importable in {sys.executable} ({err}); measure it "
            "with a Python that has them: pip install torch timm"
        )

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = VisionTransformer(
        img_size=args.image_size,
        patch_size=arch["patch_size"],
        embed_dim=arch["hidden_dim"],
        depth=arch["num_layers"],
        num_heads=arch["num_heads"],
        mlp_ratio=arch["mlp_dim"] / arch["hidden_dim"],
        num_classes=args.num_classes,
    ).to(device)
    images = torch.randn(
        args.batch_size, 3, args.image_size, args.image_size, device=device
    )
    labels = torch.randint(0, args.num_classes, (args.batch_size,), device=device)
    bf16 = args.precision == "mixed_bfloat16"

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    if device.type == "cuda":
        memory = (
            lambda: torch.cuda.max_memory_allocated() / 2**20,
            torch.cuda.reset_peak_memory_stats,
        )
    else:
        memory = (lambda: None, lambda: None)

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()

    def train_step():
        model.train()
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        sync()

    def infer_step():
        model.eval()
        with torch.inference_mode(), autocast():
            model(images)
        sync()

    setting = "eager"
    out = []
    if "train" in modes:
        out.append(Contestant("train", "timm", setting, train_step, *memory))
    if "infer" in modes:
        out.append(Contestant("infer", "timm", setting, infer_step, *memory))
    return out, None


# --------------------------------------------------------------------------
# Measurement.


def matmul_peak_gflops(dtype: str, n: int) -> float:
    """Best GFLOP/s of one large square matmul, result checked on the host."""
    import tensorflow as tf

    a = tf.cast(tf.random.normal((n, n)), dtype)
    b = tf.cast(tf.random.normal((n, n)), dtype)
    matmul = tf.function(tf.linalg.matmul)
    matmul(a, b)[0, 0].numpy()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        matmul(a, b)[0, 0].numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def matmul_shapes(arch: dict, image_size: int, batch_size: int, num_classes: int):
    """The forward pass's matrix products as `(name, count, lhs, rhs)` shapes.

    Backward repeats each product twice with the same multiply-adds (input
    and weight gradients), so training does three times this work.
    """
    p, d, mlp = arch["patch_size"], arch["hidden_dim"], arch["mlp_dim"]
    patches = (image_size // p) ** 2
    tokens = patches + 1
    rows = batch_size * tokens
    heads, head_dim = arch["num_heads"], d // arch["num_heads"]
    layers = arch["num_layers"]
    return [
        ("patch embedding", 1, (batch_size * patches, p * p * 3), (p * p * 3, d)),
        ("qkv", layers, (rows, d), (d, 3 * d)),
        ("q @ k^T", layers, (batch_size * heads, tokens, head_dim),
         (batch_size * heads, head_dim, tokens)),
        ("probs @ v", layers, (batch_size * heads, tokens, tokens),
         (batch_size * heads, tokens, head_dim)),
        ("proj", layers, (rows, d), (d, d)),
        ("fc1", layers, (rows, d), (d, mlp)),
        ("fc2", layers, (rows, mlp), (mlp, d)),
        ("head", 1, (batch_size, d), (d, num_classes)),
    ]  # fmt: skip


def matmul_seconds(shapes, dtype: str, repeats: int = 5) -> dict[str, float]:
    """Best time of each product alone, with or without XLA (whichever is
    faster)."""
    import tensorflow as tf

    out = {}
    for name, _, lhs, rhs in shapes:
        a = tf.cast(tf.random.normal(lhs), dtype)
        b = tf.cast(tf.random.normal(rhs), dtype)
        best = float("inf")
        for jit in (False, True):
            matmul = tf.function(tf.linalg.matmul, jit_compile=jit)
            matmul(a, b)[0, 0].numpy()
            for _ in range(repeats):
                # CPU ops run synchronously; fetching one element (not the
                # whole product, tens of MB) keeps the copy out of the time.
                start = time.perf_counter()
                matmul(a, b)[0, 0].numpy()
                best = min(best, time.perf_counter() - start)
        out[name] = best
    return out


def timed(contestant: Contestant, steps: int) -> float:
    contestant.reset_device_memory()
    reset_peak_rss()
    before = rss_mib()
    start = time.perf_counter()
    for _ in range(steps):
        contestant.step()
    seconds = time.perf_counter() - start
    contestant.peak_rss_mib = max(contestant.peak_rss_mib, peak_rss_mib())
    contestant.rss_growth_mib = max(contestant.rss_growth_mib, peak_rss_mib() - before)
    device_peak = contestant.device_memory()
    if device_peak is not None:
        contestant.device_peak_mib = max(contestant.device_peak_mib or 0, device_peak)
    return seconds


def recorded(value):
    """An argument as a result file records it: an absolute path inside the
    repository relative to its root, one outside it by its file name alone,
    so that a committed result names no machine's folders. Other values
    (relative paths included) are kept; `Path`s become strings."""
    if not isinstance(value, (str, Path)):
        return value
    path = Path(value)
    if not path.is_absolute():
        return str(value)
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return path.name


def recorded_config(args: argparse.Namespace) -> dict:
    """The parsed arguments of a benchmark, each as `recorded` writes it."""
    return {key: recorded(value) for key, value in vars(args).items()}


def recorded_command() -> str:
    """The command line that ran this process, its paths as `recorded`
    writes them (`--json=/x/y.json` included)."""
    words = [Path(sys.executable).name]
    for word in sys.argv:
        flag, equals, value = word.partition("=")
        if equals and flag.startswith("-"):
            words.append(f"{flag}={recorded(value)}")
        else:
            words.append(recorded(word))
    return " ".join(words)


def environment() -> dict:
    import keras
    import tensorflow as tf

    env = {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "cpu": _cpu_name(),
        "cpu_flags": cpu_flags_recorded(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default (on)"),
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    # Versions from the installed metadata: importing torch after TensorFlow
    # can crash the process, so a run without timm must not import it here.
    for module, dist in (
        ("keras_hub", "keras-hub"),
        ("torch", "torch"),
        ("timm", "timm"),
    ):
        try:
            env[module] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            env[module] = None
    return env


def cpu_flags_recorded() -> list[str]:
    """The instruction sets that decide CPU speed here (keras_vit.hardware)."""
    from keras_vit.hardware import CPU_FEATURES, cpu_flags

    return [flag for flag in CPU_FEATURES if flag in cpu_flags()]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(args: argparse.Namespace) -> dict:
    if "timm" in args.peers:
        # torch's triton extension crashes when it is loaded after TensorFlow.
        try:
            import timm  # noqa: F401
        except ImportError:
            pass  # timm_contestants says why it is skipped.
    import tensorflow as tf

    # Thread settings must be made before TensorFlow runs its first op.
    if args.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    if args.inter_op_threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)

    import keras

    from keras_vit.analysis.flops import vit_macs
    from keras_vit.hardware import bfloat16_refused_by_onednn, onednn_isa_cap
    from keras_vit.models.vit import parse_variant

    # Under a oneDNN ISA cap below bfloat16 on a CPU that has it (the AVX2
    # stand-in), TensorFlow hands bfloat16 to oneDNN, which aborts: bfloat16
    # is neither timed nor given a matmul peak there.
    bfloat16_refused = bfloat16_refused_by_onednn()
    if bfloat16_refused and "bfloat16" in args.precision:
        raise SystemExit(
            f"--precision {args.precision} cannot run under ONEDNN_MAX_CPU_ISA="
            f"{onednn_isa_cap()} on this bfloat16 CPU (TensorFlow hands it to "
            "oneDNN, which aborts): use --precision float32 or unset the cap."
        )
    if bfloat16_refused:
        print(
            f"bfloat16 not measured: ONEDNN_MAX_CPU_ISA={onednn_isa_cap()} caps "
            "oneDNN below it on this CPU",
            flush=True,
        )
    keras.config.set_dtype_policy(args.precision)
    arch = parse_variant(args.variant, num_layers=args.num_layers)
    if args.image_size % arch["patch_size"]:
        raise SystemExit(
            f"--image-size {args.image_size} is not divisible by the patch size "
            f"{arch['patch_size']} of {args.variant!r}."
        )
    # The same analytic count as `keras-vit info` (every matmul, attention
    # products included).
    macs = vit_macs(
        args.variant, args.image_size, args.num_classes, num_layers=args.num_layers
    )
    forward_flops = 2 * macs
    # Backward costs two forward passes (gradients of inputs and of weights).
    train_flops = 3 * forward_flops

    keras.utils.set_random_seed(0)
    images = tf.random.uniform((args.batch_size, args.image_size, args.image_size, 3))
    labels = tf.random.uniform(
        (args.batch_size,), maxval=args.num_classes, dtype=tf.int32
    )
    jit_settings = {"both": (True, False), "on": (True,), "off": (False,)}[args.jit]
    if args.auto_check:
        # The automatic choice is compared with every setting it can pick.
        jit_settings = (True, False)
    memory = tf_memory_probes()
    builders = {"keras_vit": build_keras_vit, "keras_hub": build_keras_hub}
    contestants, skipped, params = [], {}, {}
    for peer in args.peers:
        if peer == "timm":
            found, reason = timm_contestants(args, arch, args.modes)
            if reason:
                skipped["timm"] = reason
                print(f"skipping timm: {reason}", flush=True)
            contestants += found
            continue
        if peer == "keras_hub" and importlib.util.find_spec("keras_hub") is None:
            skipped[peer] = (
                f"keras_hub is not installed in {sys.executable}; measure it from a "
                "venv of its own: pip install keras-hub (it pulls the full "
                "tensorflow)"
            )
            print(f"skipping keras_hub: {skipped[peer]}", flush=True)
            continue
        model = builders[peer](args, arch)
        params[peer] = model.count_params()
        contestants += tf_contestants(
            peer, model, images, labels, args.modes, jit_settings, memory
        )
    if args.auto_check and "keras_vit" in args.peers:
        for other in PRECISIONS:
            if other == args.precision or (bfloat16_refused and "bfloat16" in other):
                continue
            keras.config.set_dtype_policy(other)
            model = build_keras_vit(args, arch)
            contestants += tf_contestants(
                "keras_vit",
                model,
                images,
                labels,
                args.modes,
                (True, False),
                memory,
                precision=other,
            )
        keras.config.set_dtype_policy(args.precision)

    for c in contestants:
        start = time.perf_counter()
        for _ in range(args.warmup):
            c.step()
        c.warmup_seconds = time.perf_counter() - start
        print(f"warm-up {c.mode:5s} {c.label}: {c.warmup_seconds:.1f} s", flush=True)

    peaks = {"float32": []} if bfloat16_refused else {"float32": [], "bfloat16": []}
    compute_dtype = "bfloat16" if args.precision == "mixed_bfloat16" else "float32"
    shapes = matmul_shapes(arch, args.image_size, args.batch_size, args.num_classes)
    shape_seconds = {name: float("inf") for name, *_ in shapes}
    for r in range(args.rounds):
        for dtype in peaks:
            peaks[dtype].append(matmul_peak_gflops(dtype, args.matmul_size))
        for name, seconds in matmul_seconds(shapes, compute_dtype).items():
            shape_seconds[name] = min(shape_seconds[name], seconds)
        for c in contestants:
            seconds = timed(c, args.iterations)
            c.rounds.append(args.iterations * args.batch_size / seconds)
        print(
            f"round {r + 1}/{args.rounds}: "
            + ", ".join(f"{c.mode} {c.label} {c.rounds[-1]:.1f}" for c in contestants),
            flush=True,
        )

    peak = {dtype: max(v) for dtype, v in peaks.items()}
    # The matmul-bound ceiling: images/s if the step were its matrix products
    # alone, each at the best speed it reached by itself in this run.
    forward_seconds = sum(count * shape_seconds[name] for name, count, *_ in shapes)
    ceiling = {
        "infer": args.batch_size / forward_seconds,
        "train": args.batch_size / (3 * forward_seconds),
    }
    results = []
    for c in contestants:
        ips = statistics.median(c.rounds)
        flops = (train_flops if c.mode == "train" else forward_flops) * ips
        results.append(
            {
                "mode": c.mode,
                "peer": c.peer,
                "setting": c.setting,
                "images_per_second": ips,
                "rounds_images_per_second": c.rounds,
                "gflops_per_second": flops / 1e9,
                "fraction_of_peak": flops / 1e9 / peak[compute_dtype],
                "fraction_of_ceiling": ips / ceiling[c.mode],
                "peak_rss_mib": c.peak_rss_mib,
                "rss_growth_mib": c.rss_growth_mib,
                "device_peak_mib": c.device_peak_mib,
                "warmup_seconds": c.warmup_seconds,
            }
        )
    return {
        "config": {
            "variant": args.variant,
            "image_size": args.image_size,
            "batch_size": args.batch_size,
            "num_classes": args.num_classes,
            "num_layers": arch["num_layers"],
            "precision": args.precision,
            "iterations": args.iterations,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "peers": args.peers,
            "modes": args.modes,
            "jit": args.jit,
            "command": recorded_command(),
        },
        "environment": environment(),
        "matmul_peak_gflops": peak,
        "matmul_peak_rounds_gflops": peaks,
        "peak_dtype": compute_dtype,
        "matmul_ceiling_images_per_second": ceiling,
        "matmul_seconds_per_batch": shape_seconds,
        "model": {
            "parameters": params,
            "forward_gmacs_per_image": macs / 1e9,
            "forward_gflops_per_image": forward_flops / 1e9,
            "train_gflops_per_image": train_flops / 1e9,
            "macs_by_part": macs,
        },
        "results": results,
        "ratios": ratios(results),
        "auto": auto_check(results, macs, args) if args.auto_check else None,
        "skipped": skipped,
    }


def auto_check(results: list[dict], macs: int, args) -> dict:
    """What precision='auto', jit_compile='auto' picks on this machine, its
    img/s and the ratio to keras_vit's best fixed setting, per mode."""
    from keras_vit.hardware import choose_settings

    choice = choose_settings(macs, "auto", "auto")
    precision = None if choice["precision"] == args.precision else choice["precision"]
    label = setting_label(choice["jit_compile"], precision)
    out = {"choice": choice, "setting": label}
    for mode in MODES:
        ours = {
            r["setting"]: r["images_per_second"]
            for r in results
            if r["mode"] == mode and r["peer"] == "keras_vit"
        }
        if label in ours:
            best = max(ours, key=ours.get)
            out[mode] = {
                "auto_images_per_second": ours[label],
                "best_setting": best,
                "best_images_per_second": ours[best],
                "auto_over_best": ours[label] / ours[best],
            }
    return out


def best_images_per_second(results: list[dict]) -> dict[tuple[str, str], float]:
    """Each (mode, peer)'s best setting, in images/s."""
    best: dict[tuple[str, str], float] = {}
    for r in results:
        key = (r["mode"], r["peer"])
        best[key] = max(best.get(key, 0.0), r["images_per_second"])
    return best


def ratios(results: list[dict]) -> dict:
    """keras_vit's best setting over each peer's best, per mode."""
    best = best_images_per_second(results)
    out = {}
    for mode in MODES:
        ours = best.get((mode, "keras_vit"))
        for peer in PEERS[1:]:
            theirs = best.get((mode, peer))
            if ours and theirs:
                out[f"{mode}_keras_vit_over_{peer}"] = ours / theirs
    return out


TARGETS = {
    "train_keras_vit_over_keras_hub": 1.3,
    "train_keras_vit_over_timm": 1.0,
    "infer_keras_vit_over_keras_hub": 1.2,
    "infer_keras_vit_over_timm": 1.2,
}


def format_table(report: dict) -> str:
    cfg, env = report["config"], report["environment"]
    peak = report["matmul_peak_gflops"]
    ceiling = report["matmul_ceiling_images_per_second"]
    model = report["model"]
    lines = [
        f"ViT {cfg['variant']} at {cfg['image_size']}, batch {cfg['batch_size']}, "
        f"{cfg['precision']}; {env['cpu']} x{env['cpu_count']}; "
        f"TF {env['tensorflow']}, Keras {env['keras']}, "
        f"keras-hub {env['keras_hub']}, torch {env['torch']}, timm {env['timm']}",
        "matmul peak: "
        + ", ".join(f"{dtype} {gflops:.0f} GFLOP/s" for dtype, gflops in peak.items())
        + "; model "
        f"{model['forward_gmacs_per_image']:.2f} GMACs = "
        f"{model['forward_gflops_per_image']:.2f} GFLOPs forward, "
        f"{model['train_gflops_per_image']:.2f} GFLOPs per training image",
        f"matmul-bound ceiling (the step's matrix products alone, each at its "
        f"own best speed in this run): train {ceiling['train']:.1f} img/s, "
        f"infer {ceiling['infer']:.1f} img/s",
        "",
        f"| mode | peer | setting | img/s (median of {cfg['rounds']}) | "
        f"rounds | GFLOP/s | of {report['peak_dtype']} peak | of ceiling | "
        "peak RSS MiB (+ in steps) | warm-up s |",
        "| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in report["results"]:
        rounds = " ".join(f"{v:.1f}" for v in r["rounds_images_per_second"])
        lines.append(
            f"| {r['mode']} | {r['peer']} | {r['setting']} | "
            f"{r['images_per_second']:.1f} | {rounds} | "
            f"{r['gflops_per_second']:.0f} | {r['fraction_of_peak']:.0%} | "
            f"{r['fraction_of_ceiling']:.0%} | "
            f"{r['peak_rss_mib']:.0f} (+{r['rss_growth_mib']:.0f}) | "
            f"{r['warmup_seconds']:.1f} |"
        )
    lines.append("")
    best = best_images_per_second(report["results"])
    for key, value in report["ratios"].items():
        target = TARGETS.get(key)
        goal = ""
        if target:
            mode, peer = key.split("_")[0], key.split("_over_")[1]
            needed = target * best[(mode, peer)]
            goal = (
                f" (target >= {target}x: {needed:.1f} img/s, "
                f"{needed / ceiling[mode]:.0%} of the ceiling)"
            )
        lines.append(f"{key}: {value:.2f}x{goal}")
    auto = report.get("auto")
    if auto:
        lines.append(f"auto setting: {auto['setting']} ({auto['choice']['reason']})")
        for mode in MODES:
            if mode in auto:
                a = auto[mode]
                lines.append(
                    f"{mode} auto {a['auto_images_per_second']:.1f} img/s vs best "
                    f"fixed {a['best_setting']} {a['best_images_per_second']:.1f}: "
                    f"{a['auto_over_best']:.2f}x (target >= 0.95x)"
                )
    for peer, reason in report["skipped"].items():
        lines.append(f"skipped {peer}: {reason}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
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
