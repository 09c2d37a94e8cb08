"""`keras-vit`'s argument parser and entry point."""

from __future__ import annotations

import argparse
import contextlib
import functools
import signal
import sys
import threading

from keras_vit.cli.commands import (
    cmd_bench,
    cmd_convert,
    cmd_evaluate,
    cmd_export,
    cmd_info,
    cmd_predict,
    cmd_prune,
    cmd_train,
    cmd_visualize,
)
from keras_vit.cli.common import (
    PASS_THROUGH,
    Parser,
    UsageError,
    finite_float,
    image_size,
    user_error_line,
)

# What an interrupted command tells the user, by command; exit status is
# 128 + the signal number (130 for Ctrl-C, 143 for SIGTERM), as shells do.
_AFTER_INTERRUPT = {
    "train": "rerun the same command to resume from the last checkpoint",
    "export": "a version is published whole or not at all; rerun to export",
    "convert": "the output file is written whole or not at all; rerun",
}
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="keras-vit",
        description="Vision Transformers for Keras 3: train, evaluate, export, "
        "predict, convert weights, look inside, benchmark.",
    )
    parser.add_argument(
        "--traceback",
        action="store_true",
        help="show the full traceback on errors instead of one line",
    )
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=Parser
    )
    commands.required = True

    command = functools.partial(_command, commands)
    _add_pass_through(command)
    _add_evaluate(command)
    _add_export(command)
    _add_predict(command)
    _add_convert(command)
    _add_visualize(command)
    _add_info(command)
    _add_prune_command(command)
    return parser


def _command(commands, name, run, summary, description=None, **kwargs):
    sub = commands.add_parser(
        name, help=summary, description=description or summary, **kwargs
    )
    sub.set_defaults(run=run)
    return sub


def _add_pass_through(command) -> None:
    # Options go to the recipe loader / the benchmark as they are.
    command(
        "train",
        cmd_train,
        "train a recipe (see keras-vit train --help)",
        add_help=False,
    )
    command(
        "bench",
        cmd_bench,
        "throughput benchmark, bench/throughput.py (see keras-vit bench --help)",
        add_help=False,
    )


def _add_evaluate(command) -> None:
    evaluate = command(
        "evaluate",
        cmd_evaluate,
        "accuracy, top-5, confusion matrix, calibration",
        "Evaluates a .keras model on a held-out split: accuracy, top-5 accuracy, "
        "expected calibration error (15 bins); writes confusion_matrix.png and "
        "evaluation.json into --out. Pixels are normalised as the model's "
        "metadata.json says.",
    )
    evaluate.add_argument("model", help=".keras model file")
    evaluate.add_argument(
        "--data",
        default="digits",
        help="data source: digits, folder, tfrecord, tfds, arrays",
    )
    evaluate.add_argument(
        "--data-path", default="", help="folder / TFRecord folder / TFDS name / .npz"
    )
    evaluate.add_argument("--split", default="val", help="held-out split name")
    evaluate.add_argument("--batch-size", type=int, default=64)
    evaluate.add_argument("--out", default="evaluation", help="output folder")


def _add_export(command) -> None:
    export = command(
        "export",
        cmd_export,
        "SavedModel (TF Serving) and .tflite files",
        "Exports a .keras model to <root>/<name>/<version>/ (TF Serving layout), "
        "<root>/<name>*.tflite and metadata.json, each checked against the "
        "Keras model; the same export a recipe's run makes. Labels and "
        "preprocessing come from the metadata.json beside the model; in a "
        "training run's folder int8 is calibrated on its training images and "
        "every kind checked on its held-out split.",
    )
    export.add_argument("model", help=".keras model file")
    export.add_argument("--name", required=True, help="served model name")
    export.add_argument("--root", default="saved_models", help="export folder")
    export.add_argument("--version", type=int, help="default: the next one")
    export.add_argument(
        "--tflite",
        help="comma-separated kinds (float32, float16, "
        "dynamic_int8, int8, int16x8); default: all but int16x8, int8 only "
        "in a run's folder or with --representative; '' for none",
    )
    export.add_argument(
        "--representative",
        help=".npy of raw training pixels (n, h, w, c) to calibrate int8 "
        "(default in a run's folder: its training images)",
    )
    export.add_argument("--variant", help="variant for the metadata, e.g. Ti/16")
    export.add_argument(
        "--quantize",
        choices=("int8", "int4", "float8"),
        help="export a copy with Dense kernels quantized by model.quantize",
    )
    export.add_argument("--top-k", type=int, default=5)
    export.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        help="classify_images refuses images whose header declares more pixels "
        "(default 4096*4096)",
    )
    export.add_argument(
        "--mean", type=finite_float, help="normalisation mean (no metadata)"
    )
    export.add_argument(
        "--std", type=finite_float, help="normalisation std (no metadata)"
    )


def _add_predict(command) -> None:
    predict = command(
        "predict",
        cmd_predict,
        "top-k labels for image files",
        "Prints the top-k labels of each image from a SavedModel folder, a "
        ".tflite file or a .keras file with its metadata.json.",
    )
    predict.add_argument("model", help="SavedModel folder, .tflite or .keras")
    predict.add_argument("images", nargs="+", help="image files")
    predict.add_argument("--top-k", type=int, default=5)
    predict.add_argument(
        "--logits",
        action="store_true",
        help="print the model's logits instead of softmax probabilities",
    )


def _add_convert(command) -> None:
    convert = command(
        "convert",
        cmd_convert,
        "timm / Hugging Face / AugReg checkpoint to .keras",
        "Converts a ViT checkpoint (.safetensors, .npz, a folder with "
        "model.safetensors + config.json, or a Hugging Face Hub id) to a .keras "
        "model, detecting the architecture from the tensors.",
    )
    convert.add_argument(
        "checkpoint", help="file, folder, Hub id or short name (e.g. vit-b16)"
    )
    convert.add_argument("output", help="the .keras file to write")
    convert.add_argument(
        "--image-size", type=image_size, help="resample to this size (<= 1024)"
    )
    convert.add_argument("--num-classes", type=int, help="new zero-initialised head")
    convert.add_argument("--no-top", action="store_true", help="drop the head")
    convert.add_argument("--num-heads", type=int, help="if the checkpoint cannot tell")
    convert.add_argument("--sha256", help="expected sha256 of the checkpoint file")


def _add_visualize(command) -> None:
    visualize = command(
        "visualize",
        cmd_visualize,
        "attention maps and rollout of an image as PNGs",
        "Writes per-head attention maps (every block, or --block), the attention "
        "rollout (PNG and .npy) and, with --all, the position-embedding "
        "similarity and mean attention distance, for one image file.",
    )
    visualize.add_argument("model", help=".keras model file")
    visualize.add_argument("image", help="image file (PNG, JPEG, ...)")
    visualize.add_argument("--out", default="attention", help="output folder")
    visualize.add_argument("--block", type=int, help="only this block's maps")
    visualize.add_argument(
        "--all",
        action="store_true",
        help="also position similarity and attention distance",
    )
    visualize.add_argument(
        "--mean",
        type=finite_float,
        help="normalisation mean (default: metadata.json beside the model, else 0.5)",
    )
    visualize.add_argument(
        "--std",
        type=finite_float,
        help="normalisation std (default: metadata.json beside the model, else 0.5)",
    )


def _add_info(command) -> None:
    info = command(
        "info",
        cmd_info,
        "model summary, parameters and FLOPs",
        "Prints the model summary, its parameter count and the forward pass's "
        "GMACs / GFLOPs per image (every matmul and convolution, attention "
        "included; FLOPs = 2 x MACs).",
    )
    info.add_argument("model", help="a variant such as B/16, or a .keras file")
    info.add_argument("--image-size", type=image_size, default=224)
    info.add_argument("--num-classes", type=int, default=1000)
    info.add_argument("--num-channels", type=int, default=3)
    info.add_argument(
        "--hybrid-stem",
        help="build a HybridViT with this stem (R50, R26 or a keras.applications "
        "name); the variant is then a size such as B or B/16",
    )
    info.add_argument("--no-summary", action="store_true", help="skip the layer table")


def _add_prune_command(command) -> None:
    prune = command(
        "prune",
        cmd_prune,
        "remove attention heads and MLP units, then fine-tune",
        "Scores every head and MLP unit of a .keras ViT on training images of "
        "a recipe's data (Taylor importance, Michel et al. 2019; heads by the "
        "calibration loss of removing each), removes the "
        "lowest fraction, fine-tunes with the recipe's optimizer and writes an "
        "ordinary, smaller .keras model; prints the accuracies, parameters and "
        "MACs as JSON.",
    )
    prune.add_argument(
        "model", nargs="?", help=".keras model (default: the recipe's model.pretrained)"
    )
    prune.add_argument("--recipe", default="prune_digits", help="data and optimizer")
    prune.add_argument("--output", required=True, help="the .keras file to write")
    prune.add_argument("--fraction", type=float, default=0.25)
    prune.add_argument("--head-fraction", type=float, help="default: --fraction")
    prune.add_argument("--mlp-fraction", type=float, help="default: --fraction")
    prune.add_argument(
        "--finetune-steps", type=int, help="default: the recipe's total_steps"
    )
    prune.add_argument("--calibration-images", type=int, default=256)
    prune.add_argument(
        "--head-criterion",
        choices=("ablation", "taylor"),
        default="ablation",
        help="heads ranked by the measured loss of removing each (greedy) or by "
        "Taylor importance; MLP units always by Taylor importance",
    )


def main(argv: list[str] | None = None) -> int:
    """Runs `keras-vit` with `argv` (default: the command line); returns the
    exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    names = _command_names(parser)
    position = next((i for i, a in enumerate(argv) if a in names), None)
    command = argv[position] if position is not None else None
    show_traceback = "--traceback" in argv[: position if position is not None else None]
    prog = f"keras-vit {command}" if command else "keras-vit"
    received: list[int] = []
    try:
        with _signals_raise(received):
            status = _run(parser, argv, command, position)
    except SystemExit as exit_:  # --help
        status = exit_.code if isinstance(exit_.code, int) else 0
    except BaseException as error:
        if received:
            # Whatever the interrupt became on its way out (TensorFlow and
            # generators called from C++ may wrap or swallow it), it is
            # reported as what it was.
            return _interrupted(prog, command, received[0])
        message = user_error_line(error) if isinstance(error, Exception) else None
        if show_traceback or message is None:
            raise
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
    if received:  # the interrupt was absorbed somewhere: still one answer
        return _interrupted(prog, command, received[0])
    return status


def _run(parser, argv, command, position) -> int:
    if command in PASS_THROUGH:
        args = parser.parse_args(argv[: position + 1])
        args.options = argv[position + 1 :]
    else:
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            raise UsageError(
                f"unrecognized arguments: {' '.join(unknown)} "
                f"(see keras-vit {args.command} --help)"
            )
    return args.run(args)


@contextlib.contextmanager
def _signals_raise(received: list[int]):
    """Within the block, Ctrl-C and SIGTERM are recorded in `received` and
    raise KeyboardInterrupt, so `finally` blocks clean up temporary files
    (SIGTERM would otherwise end the process at once; a container's PID 1
    would ignore it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        received.append(signum)
        raise KeyboardInterrupt

    previous = {signum: signal.signal(signum, handler) for signum in _SIGNALS}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, signal.SIG_DFL if old is None else old)


def _interrupted(prog: str, command: str | None, signum: int) -> int:
    name = signal.Signals(signum).name
    after = _AFTER_INTERRUPT.get(command, "nothing it wrote is half-written")
    print(f"{prog}: interrupted ({name}); {after}.", file=sys.stderr)
    return 128 + signum


def _command_names(parser) -> set[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()
