"""Runs a recipe: `python recipes/train.py [RECIPE] [--key value | --set key=value]...`

RECIPE is a name in keras_vit/training/recipes/ (default: digits) or a path to a config
file. Every config key can be overridden, e.g.

    python recipes/train.py digits --optim.learning_rate 1e-3 --set batch_size=128
    python recipes/train.py digits --smoke       # a two-step run
    python recipes/train.py digits --keys        # every key, its type and value
    python recipes/train.py mnist5k_deit --train-teacher  # its CNN teacher first

Progress: Keras' progress bar in a terminal, one line per epoch otherwise
(`--verbose 0|1|2` chooses). TensorFlow's native INFO and WARNING lines are
hidden unless TF_CPP_MIN_LOG_LEVEL is set. The run ends with a summary: the
held-out accuracy, where the model and each export were written, and the
commands that predict with or serve them.
"""

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# Before TensorFlow loads, as keras_vit.logs explains: errors only.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from keras_vit.training.config import parse_overrides  # noqa: E402
from keras_vit.training.recipes import keys_request, load_recipe  # noqa: E402
from keras_vit.training.report import progress_verbosity, run_summary  # noqa: E402


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    train_teacher = "--train-teacher" in argv
    argv = [a for a in argv if a != "--train-teacher"]
    recipe, overrides = "digits", argv
    if argv and not argv[0].startswith("--"):
        recipe, overrides = argv[0], argv[1:]
    from keras_vit.cli.common import user_error_line

    try:
        keys = keys_request(argv)
        if keys is not None:
            print("\n".join(keys))
            return 0
        config = load_recipe(recipe, progress_verbosity(parse_overrides(overrides)))
        from keras_vit.training.teachers import prepare_teacher
        from keras_vit.training.trainer import train

        config = prepare_teacher(config, train_missing=train_teacher)

        metadata = train(config)
    except Exception as error:
        # The package's own errors (config, checkpoint, run folder, image
        # decoding) in one line; anything else keeps its traceback.
        message = user_error_line(error)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2
    print(run_summary(metadata, config.export_root))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
