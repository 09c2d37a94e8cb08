"""How much of TensorFlow's native (C++) logging keras_vit's programs show.

TensorFlow reads `TF_CPP_MIN_LOG_LEVEL` once, when its library loads, and
ignores later changes. Every keras_vit module loads TensorFlow through the
package root (`keras_vit/__init__.py` imports the models), so the `keras-vit`
command cannot set the level in its own module: the root calls
`quiet_native_logs_for_command()` before it imports anything else. A program
that imports keras_vit as a library keeps TensorFlow's defaults. The recipe
scripts (recipes/*.py) set the same level themselves, before importing
keras_vit. A level the user set always wins.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# 2 hides INFO and WARNING lines and keeps errors. A default run of the
# recipe otherwise prints ~40 of them (SavedModel loader progress five times,
# the TFLite converter's "Ignored output_format"), none of which a user can act
# on. TensorFlow prints its oneDNN notice at load whatever the level.
QUIET_LEVEL = "2"
COMMAND = "keras-vit"
COMMAND_MODULES = ("keras_vit.cli", "keras_vit.cli.__main__")
# Interpreter options that take a separate value (`python -X dev -m ...`).
OPTIONS_WITH_VALUE = ("-X", "-W", "--check-hash-based-pycs")


def started_as_command(argv0: str, orig_argv: list[str]) -> bool:
    """Whether this process is `keras-vit ...` or `python -m keras_vit.cli ...`."""
    if Path(argv0).stem == COMMAND:
        return True
    args = iter(orig_argv[1:])
    for arg in args:
        if arg == "-m":
            return next(args, None) in COMMAND_MODULES
        if arg in OPTIONS_WITH_VALUE:
            next(args, None)
        elif not arg.startswith("-") or arg == "-c":
            return False
    return False


def quiet_native_logs() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", QUIET_LEVEL)


def quiet_native_logs_for_command() -> None:
    if started_as_command(sys.argv[0], getattr(sys, "orig_argv", [])):
        quiet_native_logs()
