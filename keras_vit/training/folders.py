"""What an image folder holds, listed before anything is read: the class
folders of a split and the image files of a class.

- Hidden entries (names starting with "."): `.ipynb_checkpoints/`,
  `.DS_Store`, macOS `._x.jpg` resource forks, are neither classes nor
  images.
- A class folder that is a link to its split folder or to a folder above it
  (it would list the classes as images of one class) is a ValueError naming
  it and its target.
- A class of the training split without one image file is a ValueError
  naming its folder: a class nobody can learn is a mistake (an empty folder
  in another split is allowed, as an absent one is).
- An entry with an image suffix that is not a readable file (a folder named
  `x.png`, a dangling link, a link loop) is a ValueError naming it, or with
  `on_error="skip"` left out with one warning that counts them and names the
  first.
"""

from __future__ import annotations

import errno
import os
import stat
import warnings
from pathlib import Path

from keras_vit.models.image_files import entry_problem

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")


def utf8_name(path: Path) -> str:
    """`path` as text; a name that is not UTF-8 (TF's string tensors need it)
    is a ValueError naming its raw bytes."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{os.fsencode(path)!r} is not a UTF-8 file or folder name; rename it "
            "(the data pipeline passes names as UTF-8 strings)."
        ) from None
    return text


def _visible(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def class_folders(root: Path) -> dict[str, Path]:
    """{class name: folder} of the split folder `root`, sorted by name."""
    top = root.resolve()
    found = {}
    for entry in _visible(root):
        if not entry.is_dir():
            continue
        target = entry.resolve()
        if target == top or target in top.parents:
            raise ValueError(
                f"class folder {utf8_name(entry)!r} is a link to {str(target)!r}, "
                f"which holds the split folder {str(root)!r} itself; remove the "
                "link or point it at a folder of images."
            )
        found[utf8_name(entry)[len(str(root)) + 1 :]] = entry
    return found


def _unreadable(path: Path) -> str | None:
    """Why an entry with an image suffix cannot be read as a file, or None."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return f"is a link to {os.readlink(path)!r}, which does not exist"
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "is a link that loops back on itself"
        return f"cannot be read ({error.strerror})"
    if stat.S_ISDIR(mode):
        return "is a folder, not an image file"
    if not stat.S_ISREG(mode):
        return entry_problem(path)  # names the kind: a FIFO, a device...
    return None


def image_files(
    folder: Path, split_root: Path, training: bool, on_error: str
) -> list[str]:
    """The image files of one class folder, sorted, as UTF-8 paths."""
    files, bad = [], []
    for entry in _visible(folder):
        if entry.suffix.lower() not in IMAGE_EXTENSIONS:
            continue
        why = _unreadable(entry)
        if why is None:
            files.append(utf8_name(entry))
        elif on_error == "skip":
            bad.append(f"{str(entry)!r} {why}")
        else:
            raise ValueError(
                f"{str(entry)!r} {why}; remove or fix it, or set "
                "data.on_error=skip to leave such entries out."
            )
    if bad:
        warnings.warn(
            f"left out {len(bad)} entr{'y' if len(bad) == 1 else 'ies'} of "
            f"{str(folder)!r} that are not image files (data.on_error=skip); "
            f"the first: {bad[0]}",
            stacklevel=2,
        )
    if training and not files:
        raise ValueError(
            f"class folder {str(folder)!r} of {str(split_root)!r} holds no image "
            f"files ({', '.join(IMAGE_EXTENSIONS)}); add images or remove the "
            "folder (every class of the training split needs some)."
        )
    return files
