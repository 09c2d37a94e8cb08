"""The `keras-vit` subcommands: each parses nothing itself and makes one
call into the package."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import re
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from keras_vit.cli.common import (
    REPO,
    UsageError,
    command_preprocessing,
    existing_path,
    load_keras_model,
    model_metadata,
    split_list,
)
from keras_vit.files import write_atomic


def cmd_train(args) -> int:
    from keras_vit.training import overrides as train_overrides
    from keras_vit.training import recipes

    options = list(args.options)
    if options[:1] in (["-h"], ["--help"]):
        print(TRAIN_HELP.format(recipes=", ".join(recipes.recipe_names())))
        return 0
    train_teacher = "--train-teacher" in options
    options = [o for o in options if o != "--train-teacher"]
    keys = recipes.keys_request(options)
    if keys is not None:
        print("\n".join(keys))
        return 0
    recipe = "digits"
    if options and not options[0].startswith("--"):
        recipe, options = options[0], options[1:]
    from keras_vit.training import report, teachers

    overrides = report.progress_verbosity(train_overrides.parse_overrides(options))
    config = recipes.load_recipe(recipe, overrides)
    config = teachers.prepare_teacher(config, train_missing=train_teacher)
    from keras_vit.training import trainer as training

    metadata = training.train(config)
    print(report.run_summary(metadata, config.export_root, config.data))
    return 0


TRAIN_HELP = """\
usage: keras-vit train [RECIPE] [--key value | --key=value | --set key=value]...

Trains a recipe (a name below: a file of keras-vit's recipes/ folder, or a
path to a .py file that defines get_config()): checkpoints and resumes in its
run folder (runs/RECIPE, runs/RECIPE-smoke with --smoke), evaluates on the
held-out split, saves model.keras and metadata.json, exports when the recipe
names an export. Shows Keras' progress bar in a terminal, one line per
evaluation otherwise, and ends with the files it made and what to run next.

recipes: {recipes} (default: digits)

  --smoke          a two-step run of the recipe
  --keys           list every config key that can be overridden, with its type
                   and its value in the recipe (other overrides applied)
  --train-teacher  a distillation recipe whose teacher file is missing trains
                   the teacher's recipe (distill.teacher_recipe) first, into
                   its own run folder, and says so
  --key value      override one key, e.g. --optim.learning_rate 1e-3
  --set key=value  the same, e.g. --set batch_size=128
"""


def cmd_evaluate(args) -> int:
    from keras_vit.analysis import evaluation
    from keras_vit.training import config as train_config
    from keras_vit.training import data as data_lib

    if args.batch_size < 1:
        raise UsageError(
            f"--batch-size {args.batch_size}: a batch holds at least 1 image"
        )
    model = load_keras_model(args.model)
    preprocessing = command_preprocessing(model, args.model, None, None)
    height, width = preprocessing["image_size"]
    config = train_config.DataConfig(
        source=args.data,
        path=args.data_path,
        eval_split=args.split,
        num_channels=preprocessing["num_channels"],
        mean=tuple(preprocessing["mean"]),
        std=tuple(preprocessing["std"]),
        pixel_scale=preprocessing["pixel_scale"],
        resize_method=preprocessing["resize_method"],
        # A converted checkpoint's centre crop (its metadata.json); the
        # pipeline scales both sides, without PIL's antialiasing.
        eval_crop=preprocessing.get("crop_fraction", 1.0),
    )
    dataset = data_lib.make_eval_dataset(config, (height, width), args.batch_size)
    labels = model_metadata(args.model).get("labels")
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

    from keras_vit.training import outputs

    model = load_keras_model(args.model)
    metadata = model_metadata(args.model)
    if not metadata.get("preprocessing") and (args.mean is None or args.std is None):
        raise UsageError(
            f"no metadata.json beside {args.model!r} says how pixels are "
            "normalised; pass --mean and --std as used in training"
        )
    preprocessing = command_preprocessing(model, args.model, args.mean, args.std)
    # A training run's folder: calibrate and check as the trainer does.
    run = outputs.run_export_settings(Path(args.model).parent)
    data = run.get("data")
    representative = None
    if args.representative:
        representative = np.load(
            existing_path(args.representative, "representative images")
        )
    kinds = split_list(args.tflite) if args.tflite is not None else None
    if kinds is None and args.quantize:
        kinds = []
        print(
            f"no .tflite files: a --quantize {args.quantize} export is a SavedModel "
            "only (export without --quantize for TFLite's own int8 kinds)"
        )
    if kinds is None:
        kinds = ["float32", "float16", "dynamic_int8"]
        if data is not None or representative is not None:
            kinds.append("int8")
        else:
            print(
                "int8 left out: no training run's config.json beside the model "
                "to calibrate on; pass --representative IMAGES.npy"
            )
    result = outputs.export_run(
        model,
        args.name,
        args.root,
        labels=metadata.get("labels"),
        preprocessing=preprocessing,
        data=None if representative is not None else data,
        seed=run.get("seed", 0),
        representative_images=representative,
        version=args.version,
        tflite=tuple(kinds),
        variant=args.variant or run.get("variant"),
        top_k=args.top_k,
        quantize=args.quantize,
        **({"max_pixels": args.max_pixels} if args.max_pixels is not None else {}),
    )
    print(f"exported {args.name} version {result['version']} under {args.root}")
    for name, size in sorted(result.get("files", {}).items()):
        print(f"  {Path(args.root) / name} ({size:,} bytes)")
    for artifact, figures in (result.get("parity") or {}).items():
        if isinstance(figures, dict):
            shown = ", ".join(
                f"{key} {value:.4g}"
                for key, value in figures.items()
                if isinstance(value, int | float)
            )
            print(f"  parity {artifact}: {shown}")
    return 0


def cmd_predict(args) -> int:
    from keras_vit.deploy import serving

    existing_path(args.model, "model")
    output = "logits" if args.logits else "probabilities"
    results = serving.iter_predict(
        args.model, args.images, top_k=args.top_k, output=output, verbose=True
    )
    digits = 6 if args.logits else 4
    # Each line as its batch is scored (flushed: a pipe sees it at once); a
    # file that fails stops the command there with its one-line error.
    for done, (image, top) in enumerate(zip(args.images, results, strict=True), 1):
        ranked = ", ".join(f"{label} {value:.{digits}f}" for label, value in top)
        print(f"{image}: {ranked}", flush=done % serving.PREDICT_BATCH == 0)
    sys.stdout.flush()
    return 0


def cmd_convert(args) -> int:
    from keras_vit.pretrained import convert
    from keras_vit.pretrained.hub import HubUnavailableError

    overrides = {}
    if args.num_heads is not None:
        overrides["num_heads"] = args.num_heads
    try:
        model = convert.convert_checkpoint(
            args.checkpoint,
            args.output,
            image_size=args.image_size,
            num_classes=args.num_classes,
            include_top=False if args.no_top else None,
            sha256=args.sha256,
            **overrides,
        )
    except (HubUnavailableError, ImportError) as error:
        # A named checkpoint without network or huggingface_hub: one line.
        raise UsageError(str(error)) from None
    print(f"wrote {args.output}: {model.name}, {model.count_params():,} parameters")
    return 0


def cmd_visualize(args) -> int:
    import numpy as np

    from keras_vit.analysis import visualize
    from keras_vit.deploy import serving
    from keras_vit.models import preprocessing as preprocessing_lib

    model = load_keras_model(args.model)
    preprocessing = command_preprocessing(model, args.model, args.mean, args.std)
    existing_path(args.image, "image")
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
    write_atomic(out / f"{stem}_rollout.npy", lambda path: np.save(path, rollout))
    written += [out / f"{stem}_rollout.png", out / f"{stem}_rollout.npy"]
    if args.all:
        path = out / "position_embedding_similarity.png"
        visualize.position_embedding_similarity(model, save_to=path)
        distance = visualize.mean_attention_distance(
            model, image, save_to=out / f"{stem}_attention_distance.png"
        )
        write_atomic(
            out / f"{stem}_attention_distance.npy", lambda path: np.save(path, distance)
        )
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
        model = load_keras_model(args.model)
    else:
        from keras_vit.models.hybrid import HybridViT
        from keras_vit.models.vit import ViT

        builder = ViT
        options = {}
        if args.hybrid_stem:
            builder = HybridViT
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
        # The benchmark compares other libraries and is not part of the wheel.
        raise UsageError(
            f"the benchmark is not installed ({path} is missing): it ships with "
            "the keras-vit-tf source checkout; there, run `pip install -e .` "
            "and then `keras-vit bench`, or `python bench/throughput.py`"
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


def cmd_prune(args) -> int:
    import keras

    from keras_vit.training import pruning
    from keras_vit.training.recipes import load_recipe

    config = load_recipe(args.recipe)
    source = args.model or config.model.pretrained
    if not source or not Path(source).is_file():
        raise ValueError(f"model {source!r} is not a .keras file.")
    if config.distill.teacher and config.distill.teacher == config.model.pretrained:
        # The recipe's teacher is the unpruned model: it follows --model.
        config = dataclasses.replace(
            config, distill=dataclasses.replace(config.distill, teacher=source)
        )
    model = keras.saving.load_model(source, compile=False)
    head = args.fraction if args.head_fraction is None else args.head_fraction
    mlp = args.fraction if args.mlp_fraction is None else args.mlp_fraction
    steps = config.total_steps if args.finetune_steps is None else args.finetune_steps
    pruned, report = pruning.prune_and_finetune(
        model, config, head, mlp, steps, args.calibration_images, args.head_criterion
    )
    report.pop("removed")
    report["source_params"] = int(model.count_params())
    write_atomic(args.output, lambda path: pruned.save(str(path)))
    report["output"] = args.output
    print(json.dumps(report, indent=2))
    return 0
