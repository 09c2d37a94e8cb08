"""The files an export writes, by name, and the rules that keep two exports'
files apart: `<root>/<name>/`, `<root>/<name>.keras`, `<root>/<name>.tflite`
(float32) and `<root>/<name>_<kind>.tflite` for the other TFLite kinds.

Checked before any work (TensorFlow is not imported here, so a recipe's
config can be checked where only the trainer is installed)."""

from __future__ import annotations

import os
from pathlib import Path

from keras_vit.files import check_path_text

KINDS = ("float32", "float16", "dynamic_int8", "int8", "int16x8")
# The longest name beside `<name>`: `_dynamic_int8.tflite`, written first
# under a temporary name (`files.temporary_name`): ".<name>_dynamic_int8."
# + "<pid, up to 7 digits>-<8 hex>.tmp.tflite" = 42 bytes more than <name>.
_LONGEST_ADDITION = (
    len(".") + len("_dynamic_int8") + len(".1234567-12345678.tmp.tflite")
)


def file_name(name: str, kind: str) -> str:
    """`digits.tflite` for float32, `digits_<kind>.tflite` for the others."""
    return f"{name}.tflite" if kind == "float32" else f"{name}_{kind}.tflite"


def check_export_target(
    name, root, what: str = "export name", root_what: str = "export root"
) -> None:
    """ValueError for an export name or root that the export could not write,
    or whose files would be another export's: checked before any work, so
    nothing (not even a folder) is left. `what` and `root_what` are how the
    caller's users know the two (`export_name`, `export_root` in a recipe)."""
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise ValueError(
            f"{what} must be a non-empty file name without '/' that does not "
            f"start with '.', got {name!r}."
        )
    check_path_text(name, what)
    check_path_text(root, root_what)
    # Longest suffix first: "_dynamic_int8" also ends with "_int8".
    for kind in sorted(KINDS[1:], key=len, reverse=True):
        if name.endswith(f"_{kind}"):
            model = name[: -len(kind) - 1]
            raise ValueError(
                f"{what} {name!r} ends with '_{kind}': {file_name(name, 'float32')} "
                f"is also the {kind} file of a model named {model!r}, so the two "
                "exports would overwrite each other's files and predict could not "
                f"tell them apart. Choose another name, e.g. {model}-{kind}."
            )
    limit = _name_max(root)
    if len(os.fsencode(name)) + _LONGEST_ADDITION > limit:
        raise ValueError(
            f"{what} is {len(os.fsencode(name))} bytes long; the export writes "
            f"files named after it with up to {_LONGEST_ADDITION} bytes more, and "
            f"this file system takes {limit}: use at most "
            f"{limit - _LONGEST_ADDITION} bytes."
        )
    root = Path(root)
    for folder, role in ((root, "root"), (root / name, "model folder")):
        for path in (folder, *folder.parents):
            if path.exists() or path.is_symlink():
                if not path.is_dir():
                    raise ValueError(
                        f"{str(path)!r} is not a folder, and the export needs it "
                        f"as one for its {role} {str(folder)!r}: move it or "
                        "choose another root or name."
                    )
                break
    keras_file = root / f"{name}.keras"
    if keras_file.is_dir():
        raise ValueError(
            f"{str(keras_file)!r} is a folder, where the export writes its Keras "
            "model: move it or choose another name."
        )


def _name_max(root) -> int:
    """The longest file name (bytes) under `root`'s nearest existing folder."""
    for path in (Path(root).absolute(), *Path(root).absolute().parents):
        if path.is_dir():
            try:
                return os.pathconf(path, "PC_NAME_MAX")
            except (OSError, ValueError):
                break
    return 255


__all__ = ["KINDS", "check_export_target", "file_name"]
