"""The `keras-vit` command: one entry point for the package's jobs.

Each subcommand parses its arguments and makes one call into the package:

    train      keras_vit.training.trainer.train(recipe config)
    evaluate   keras_vit.analysis.evaluation.evaluate(model, held-out data)
    export     keras_vit.deploy.export.export_model(model, name, ...)
    predict    keras_vit.deploy.export.predict(model path, images, top_k)
    convert    keras_vit.pretrained.convert_checkpoint(checkpoint, out.keras)
    visualize  keras_vit.analysis.visualize attention maps / rollout PNGs
    bench      bench/throughput.py (source checkouts)
    info       model summary, parameter count and FLOPs

A user mistake (a missing file, a bad option or value) prints one line,
`keras-vit <command>: error: ...`, on stderr and exits with status 2;
`keras-vit --traceback <command> ...` shows the Python traceback instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import re
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO = Path(__file__).resolve().parents[1]
# Subcommands whose options belong to the code they run, passed through as is.
PASS_THROUGH = ("train", "bench")
# keras_vit's recipes normalise [0, 1] pixels as (x - 0.5) / 0.5.
DEFAULT_MEAN = 0.5
DEFAULT_STD = 0.5


class UsageError(Exception):
    """A mistake in what the user asked for: reported in one line, exit 2."""


# Errors caused by what the user passed in (files, values), not by a bug.
USER_ERRORS = (UsageError, ValueError, FileNotFoundError, IsADirectoryError)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def _existing(path: str, what: str) -> Path:
    result = Path(path)
    if not result.exists():
        raise UsageError(f"{what} {path!r} does not exist")
    return result


def _load_keras_model(path: str):
    import keras

    import keras_vit.models  # noqa: F401  registers the layers

    source = _existing(path, "model")
    if source.suffix != ".keras":
        raise UsageError(
            f"model {path!r} is not a .keras file; this command takes a model "
            "saved with model.save('name.keras')"
        )
    return keras.saving.load_model(source)


def _metadata(model_path: str) -> dict:
    """The training or export `metadata.json` that belongs to a model, or {}."""
    from keras_vit.deploy import serving

    try:
        path = serving.find_metadata(model_path)
    except ValueError:
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise UsageError(f"{path} is not valid JSON: {error}") from None


def _preprocessing(model, model_path: str, mean, std) -> dict:
    """The pixels -> model input constants: `--mean/--std` win, then the
    model's metadata.json, then keras_vit's recipe default (x - 0.5) / 0.5."""
    from keras_vit.models import preprocessing as preprocessing_lib

    given = dict(_metadata(model_path).get("preprocessing") or {})
    if not given and mean is None and std is None:
        print(
            f"note: no metadata.json beside {model_path}; normalising pixels as "
            f"(x / 255 - {DEFAULT_MEAN}) / {DEFAULT_STD} (set --mean / --std)"
        )
    given.setdefault("mean", DEFAULT_MEAN)
    given.setdefault("std", DEFAULT_STD)
    if mean is not None:
        given["mean"] = mean
    if std is not None:
        given["std"] = std
    return preprocessing_lib.normalize_preprocessing(model, given)


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def cmd_train(args) -> int:
    from keras_vit.training import config as train_config
    from keras_vit.training import recipes

    options = list(args.options)
    if options[:1] in (["-h"], ["--help"]):
        print(TRAIN_HELP.format(recipes=", ".join(recipes.recipe_names())))
        return 0
    if options[:1] == ["--keys"]:
        print("\n".join(train_config.config_keys()))
        return 0
    recipe = "digits"
    if options and not options[0].startswith("--"):
        recipe, options = options[0], options[1:]
    config = recipes.load_recipe(recipe, train_config.parse_overrides(options))
    from keras_vit.training import trainer as training

    metadata = training.train(config)
    print(f"accuracy={metadata['accuracy']:.4f} run_dir={metadata['run_dir']}")
    return 0


TRAIN_HELP = """\
usage: keras-vit train [RECIPE] [--key value | --key=value | --set key=value]...

Trains a recipe (keras_vit/training/recipes/RECIPE.py, or a path to a config file) with
keras_vit.training.trainer.train: checkpoints and resumes in its run folder, evaluates
on the held-out split, saves model.keras and metadata.json, exports when the
recipe names an export.

recipes: {recipes} (default: digits)

  --smoke          a two-step run of the recipe
  --keys           list every config key that can be overridden
  --key value      override one key, e.g. --optim.learning_rate 1e-3
  --set key=value  the same, e.g. --set batch_size=128
"""


def cmd_evaluate(args) -> int:
    from keras_vit.analysis import evaluation
    from keras_vit.training import data as data_lib

    model = _load_keras_model(args.model)
    preprocessing = _preprocessing(model, args.model, None, None)
    height, width = preprocessing["image_size"]
    config = data_lib.DataConfig(
        source=args.data,
        path=args.data_path,
        eval_split=args.split,
        num_channels=preprocessing["num_channels"],
        mean=tuple(preprocessing["mean"]),
        std=tuple(preprocessing["std"]),
        pixel_scale=preprocessing["pixel_scale"],
        resize_method=preprocessing["resize_method"],
    )
    dataset = data_lib.make_eval_dataset(config, (height, width), args.batch_size)
    labels = _metadata(args.model).get("labels")
    out = Path(args.out)
    result = evaluation.evaluate(
        model,
        dataset,
        labels=labels,
        confusion_png=out / "confusion_matrix.png",
        report_json=out / "evaluation.json",
    )
    print(result.summary())
    print(f"wrote {out / 'confusion_matrix.png'} and {out / 'evaluation.json'}")
    return 0


def cmd_export(args) -> int:
    import numpy as np

    from keras_vit.deploy import export

    model = _load_keras_model(args.model)
    metadata = _metadata(args.model)
    if not metadata.get("preprocessing") and (args.mean is None or args.std is None):
        raise UsageError(
            f"no metadata.json beside {args.model!r} says how pixels are "
            "normalised; pass --mean and --std as used in training"
        )
    preprocessing = _preprocessing(model, args.model, args.mean, args.std)
    representative = None
    if args.representative:
        representative = np.load(
            _existing(args.representative, "representative images")
        )
    kinds = _split(args.tflite) if args.tflite is not None else None
    if kinds is None:
        kinds = ["float32", "float16", "dynamic_int8"]
        kinds += ["int8"] if representative is not None else []
    result = export.export_model(
        model,
        args.name,
        args.root,
        version=args.version,
        labels=metadata.get("labels"),
        preprocessing=preprocessing,
        representative_images=representative,
        tflite=tuple(kinds),
        variant=args.variant,
        top_k=args.top_k,
    )
    print(f"exported {args.name} version {result['version']} under {args.root}")
    for name, size in sorted(result.get("files", {}).items()):
        print(f"  {Path(args.root) / name} ({size:,} bytes)")
    return 0


def cmd_predict(args) -> int:
    from keras_vit.deploy import export

    _existing(args.model, "model")
    results = export.predict(args.model, args.images, top_k=args.top_k)
    for image, top in zip(args.images, results, strict=True):
        ranked = ", ".join(f"{label} {probability:.4f}" for label, probability in top)
        print(f"{image}: {ranked}")
    return 0


def cmd_convert(args) -> int:
    from keras_vit import pretrained

    overrides = {}
    if args.num_heads is not None:
        overrides["num_heads"] = args.num_heads
    model = pretrained.convert_checkpoint(
        args.checkpoint,
        args.output,
        image_size=args.image_size,
        num_classes=args.num_classes,
        include_top=False if args.no_top else None,
        sha256=args.sha256,
        **overrides,
    )
    print(f"wrote {args.output}: {model.name}, {model.count_params():,} parameters")
    return 0


def cmd_visualize(args) -> int:
    import numpy as np

    from keras_vit.analysis import visualize
    from keras_vit.deploy import serving
    from keras_vit.models import preprocessing as preprocessing_lib

    model = _load_keras_model(args.model)
    preprocessing = _preprocessing(model, args.model, args.mean, args.std)
    _existing(args.image, "image")
    pixels = serving.load_pixels(args.image, preprocessing)
    image = np.asarray(preprocessing_lib.normalize_pixels(pixels, preprocessing))[0]
    out = Path(args.out)
    stem = Path(args.image).stem
    num_blocks = len(visualize.attention_scores(model, image))
    if args.block is not None and not -num_blocks <= args.block < num_blocks:
        raise UsageError(
            f"--block {args.block} is out of range; the model has {num_blocks} "
            f"blocks (valid: {-num_blocks}..{num_blocks - 1})"
        )
    blocks = range(num_blocks) if args.block is None else [args.block % num_blocks]
    written = []
    for block in blocks:
        path = out / f"{stem}_attention_block{block}.png"
        visualize.attention_maps(model, image, block=block, save_to=path)
        written.append(path)
    rollout = visualize.attention_rollout(
        model, image, save_to=out / f"{stem}_rollout.png"
    )
    np.save(out / f"{stem}_rollout.npy", rollout)
    written += [out / f"{stem}_rollout.png", out / f"{stem}_rollout.npy"]
    if args.all:
        path = out / "position_embedding_similarity.png"
        visualize.position_embedding_similarity(model, save_to=path)
        distance = visualize.mean_attention_distance(
            model, image, save_to=out / f"{stem}_attention_distance.png"
        )
        np.save(out / f"{stem}_attention_distance.npy", distance)
        written += [
            path,
            out / f"{stem}_attention_distance.png",
            out / f"{stem}_attention_distance.npy",
        ]
    for path in written:
        print(f"wrote {path}")
    return 0


def cmd_info(args) -> int:
    from keras_vit.analysis import flops

    if args.model.endswith(".keras"):
        model = _load_keras_model(args.model)
    else:
        from keras_vit import models as keras_vit

        builder = keras_vit.ViT
        options = {}
        if args.hybrid_stem:
            builder = keras_vit.HybridViT
            options["stem"] = args.hybrid_stem
        model = builder(
            args.model,
            image_size=args.image_size,
            num_classes=args.num_classes,
            num_channels=args.num_channels,
            **options,
        )
    if not args.no_summary:
        model.summary(line_length=100)
    macs, uncounted = flops.macs_by_layer(model)
    total = sum(macs.values())
    print(f"model: {model.name}")
    print(f"input: {tuple(model.inputs[0].shape[1:])}")
    print(f"parameters: {model.count_params():,}")
    print(
        f"forward pass per image: {total / 1e9:.2f} GMACs = "
        f"{2 * total / 1e9:.2f} GFLOPs (matmuls and convolutions, attention "
        "included)"
    )
    if uncounted:
        print(f"not counted (no FLOP formula): {', '.join(uncounted)}")
    return 0


def _bench_module():
    path = REPO / "bench" / "throughput.py"
    if not path.exists():
        raise UsageError(
            f"{path} is not here: `keras-vit bench` runs from a source checkout "
            "of keras_vit installed with pip install -e ."
        )
    spec = importlib.util.spec_from_file_location("keras_vit_bench_throughput", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def cmd_bench(args) -> int:
    throughput = _bench_module()
    # Its own parser checks the options first, so a bad one is one line here.
    err, out = io.StringIO(), io.StringIO()
    try:
        with redirect_stderr(err), redirect_stdout(out):
            throughput.parse_args(args.options)
    except SystemExit as exit_:
        if exit_.code == 0:  # --help
            # Its parser is named after sys.argv[0]; name it as run here.
            help_text = re.sub(
                r"^usage: \S+", "usage: keras-vit bench", out.getvalue(), count=1
            )
            print(help_text, end="")
            return 0
        lines = err.getvalue().strip().splitlines() or ["bad options"]
        message = lines[-1].split("error: ", 1)[-1]
        raise UsageError(f"{message} (see keras-vit bench --help)") from None
    return int(throughput.main(args.options) or 0)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
        dest="command", metavar="COMMAND", parser_class=_Parser
    )
    commands.required = True

    def command(name, run, summary, description=None, **kwargs):
        sub = commands.add_parser(
            name, help=summary, description=description or summary, **kwargs
        )
        sub.set_defaults(run=run)
        return sub

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

    export = command(
        "export",
        cmd_export,
        "SavedModel (TF Serving) and .tflite files",
        "Exports a .keras model to <root>/<name>/<version>/ (TF Serving layout), "
        "<root>/<name>*.tflite and metadata.json. Labels and preprocessing come "
        "from the metadata.json beside the model (a training run's).",
    )
    export.add_argument("model", help=".keras model file")
    export.add_argument("--name", required=True, help="served model name")
    export.add_argument("--root", default="saved_models", help="export folder")
    export.add_argument("--version", type=int, help="default: the next one")
    export.add_argument(
        "--tflite",
        help="comma-separated kinds (float32, float16, "
        "dynamic_int8, int8); default: all, int8 only with "
        "--representative; '' for none",
    )
    export.add_argument(
        "--representative",
        help=".npy of raw training pixels (n, h, w, c) to calibrate int8",
    )
    export.add_argument("--variant", help="variant for the metadata, e.g. Ti/16")
    export.add_argument("--top-k", type=int, default=5)
    export.add_argument("--mean", type=float, help="normalisation mean (no metadata)")
    export.add_argument("--std", type=float, help="normalisation std (no metadata)")

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

    convert = command(
        "convert",
        cmd_convert,
        "timm / Hugging Face / AugReg checkpoint to .keras",
        "Converts a ViT checkpoint (.safetensors, .npz, a folder with "
        "model.safetensors + config.json, or a Hugging Face Hub id) to a .keras "
        "model, detecting the architecture from the tensors.",
    )
    convert.add_argument("checkpoint", help="file, folder or Hub id")
    convert.add_argument("output", help="the .keras file to write")
    convert.add_argument("--image-size", type=int, help="resample to this size")
    convert.add_argument("--num-classes", type=int, help="new zero-initialised head")
    convert.add_argument("--no-top", action="store_true", help="drop the head")
    convert.add_argument("--num-heads", type=int, help="if the checkpoint cannot tell")
    convert.add_argument("--sha256", help="expected sha256 of the checkpoint file")

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
        type=float,
        help="normalisation mean (default: metadata.json beside the model, else 0.5)",
    )
    visualize.add_argument(
        "--std",
        type=float,
        help="normalisation std (default: metadata.json beside the model, else 0.5)",
    )

    info = command(
        "info",
        cmd_info,
        "model summary, parameters and FLOPs",
        "Prints the model summary, its parameter count and the forward pass's "
        "GMACs / GFLOPs per image (every matmul and convolution, attention "
        "included; FLOPs = 2 x MACs).",
    )
    info.add_argument("model", help="a variant such as B/16, or a .keras file")
    info.add_argument("--image-size", type=int, default=224)
    info.add_argument("--num-classes", type=int, default=1000)
    info.add_argument("--num-channels", type=int, default=3)
    info.add_argument(
        "--hybrid-stem",
        help="build a HybridViT with this stem (R50, R26 or a keras.applications "
        "name); the variant is then a size such as B or B/16",
    )
    info.add_argument("--no-summary", action="store_true", help="skip the layer table")
    _add_prune_command(command)
    return parser


def cmd_prune(args) -> int:
    import keras

    from keras_vit.training import pruning
    from keras_vit.training.recipes import load_recipe

    config = load_recipe(args.recipe)
    source = args.model or config.model.pretrained
    if not source or not Path(source).is_file():
        raise ValueError(f"model {source!r} is not a .keras file.")
    model = keras.saving.load_model(source, compile=False)
    head = args.fraction if args.head_fraction is None else args.head_fraction
    mlp = args.fraction if args.mlp_fraction is None else args.mlp_fraction
    steps = config.total_steps if args.finetune_steps is None else args.finetune_steps
    pruned, report = pruning.prune_and_finetune(
        model, config, head, mlp, steps, args.calibration_images
    )
    report.pop("removed")
    report["source_params"] = int(model.count_params())
    pruned.save(args.output)
    report["output"] = args.output
    print(json.dumps(report, indent=2))
    return 0


def _add_prune_command(command) -> None:
    prune = command(
        "prune",
        cmd_prune,
        "remove attention heads and MLP units, then fine-tune",
        "Scores every head and MLP unit of a .keras ViT on training images of "
        "a recipe's data (Taylor importance, Michel et al. 2019), removes the "
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


def main(argv: list[str] | None = None) -> int:
    """Runs `keras-vit` with `argv` (default: the command line); returns the
    exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    names = _command_names(parser)
    position = next((i for i, a in enumerate(argv) if a in names), None)
    command = argv[position] if position is not None else None
    show_traceback = "--traceback" in argv[: position if position is not None else None]
    try:
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
    except SystemExit as exit_:  # --help
        return exit_.code if isinstance(exit_.code, int) else 0
    except USER_ERRORS as error:
        if show_traceback:
            raise
        prog = f"keras-vit {command}" if command else "keras-vit"
        message = " ".join(str(error).split()) or type(error).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2


def _command_names(parser) -> set[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


if __name__ == "__main__":
    sys.exit(main())
