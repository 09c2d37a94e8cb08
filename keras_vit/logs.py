"""How much of TensorFlow's native (C++) logging keras_vit's programs show.

TensorFlow reads `TF_CPP_MIN_LOG_LEVEL` once, when its library loads, and
ignores later changes. Every keras_vit module loads TensorFlow through the
package root (`keras_vit/__init__.py` imports the models), so the `keras-vit`
command cannot set the level in its own module: the root calls
`quiet_native_logs_for_command()` before it imports anything else; it also
imports TensorFlow with the two notices that ignore the level filtered out
of stderr (`LOAD_NOTICES`). A program
that imports keras_vit as a library keeps TensorFlow's defaults. The recipe
scripts (recipes/*.py) set the same level themselves, before importing
keras_vit. A level the user set always wins.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

# 2 hides INFO and WARNING lines and keeps errors. A default run of the
# recipe otherwise prints ~40 of them (SavedModel loader progress five times,
# the TFLite converter's "Ignored output_format"), none of which a user can act
# on. TensorFlow prints its oneDNN notice at load whatever the level.
QUIET_LEVEL = "2"
# What TensorFlow 2.21 writes as it loads whatever TF_CPP_MIN_LOG_LEVEL says
# (tensorflow/tensorflow#100442), twice: its two native libraries,
# libtensorflow_framework.so.2 and libtensorflow_cc.so.2, each carry their own
# copy of absl's logging and of the oneDNN notice, and each prints both lines
# when it loads, before any Python code could set a level.
LOAD_NOTICES = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|I\d{4} [\d:.]+ +\d+ port\.cc:\d+\] oneDNN custom operations are on"
)
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


def import_tensorflow_without_load_notices() -> None:
    """Imports TensorFlow with the process's stderr (file descriptor 2, where
    native code writes) captured, then writes back every captured line except
    the `LOAD_NOTICES`, so that errors and Python warnings still show."""
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to capture: nothing would be shown anyway
        import tensorflow  # noqa: F401

        return
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            lines = capture.read().decode(errors="replace").splitlines(keepends=True)
            kept = [line for line in lines if not LOAD_NOTICES.match(line)]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


def quiet_native_logs_for_command() -> None:
    if not started_as_command(sys.argv[0], getattr(sys, "orig_argv", [])):
        return
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return  # the user chose what TensorFlow shows
    quiet_native_logs()
    import_tensorflow_without_load_notices()
