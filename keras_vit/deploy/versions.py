"""Version folders of an exported model (`<root>/<name>/<version>/`, TF
Serving's layout): numbering, reserving a number before the slow export so
that two exports of one name never take the same, and clearing what an
export that died left behind. Versions are never overwritten."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# `.<version>.reserved/`: a version number claimed by an export in progress.
RESERVED_SUFFIX = ".reserved"


def remove_stale_partials(model_dir: Path) -> None:
    """Deletes half-written versions left by an export that died (its process
    is gone); a live export's folder is left alone."""
    for reservation in model_dir.glob(f".*{RESERVED_SUFFIX}"):
        try:
            os.kill(int((reservation / "pid").read_text()), 0)
        except ProcessLookupError:
            shutil.rmtree(reservation, ignore_errors=True)
        except (OSError, ValueError):
            continue
    for partial in model_dir.glob(".*.partial-*"):
        try:
            pid = int(partial.name.rsplit("-", 2)[-2])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(partial, ignore_errors=True)
        except (ValueError, PermissionError):
            continue


def taken_versions(model_dir: Path) -> list[int]:
    """Finished versions and versions another export has reserved."""
    taken = []
    for path in model_dir.iterdir():
        name = path.name.removeprefix(".").removesuffix(RESERVED_SUFFIX)
        if name.isdigit() and (
            path.name.isdigit() or path.name.endswith(RESERVED_SUFFIX)
        ):
            taken.append(int(name))
    return taken


def next_version(model_dir: Path) -> int:
    return max(taken_versions(model_dir), default=0) + 1


def claim_version(model_dir: Path, name: str, version: int | None):
    """Reserves a version with `os.mkdir` (atomic: of two exports of one
    name, one gets each number) before the slow work; returns `(version,
    reservation folder)`. An explicit version that exists or is reserved is
    a ValueError."""
    for _ in range(100):
        candidate = next_version(model_dir) if version is None else version
        reservation = model_dir / f".{candidate}{RESERVED_SUFFIX}"
        final = model_dir / str(candidate)
        try:
            if final.exists():
                raise FileExistsError
            os.mkdir(reservation)
        except FileExistsError:
            if version is None:
                continue  # another export took it a moment ago: take the next
            raise ValueError(
                f"Version {version} of {name!r} already exists or is being "
                f"exported by another process ({final}); versions are never "
                "overwritten, pass a new version (or none for the next)."
            ) from None
        (reservation / "pid").write_text(str(os.getpid()))
        if final.exists():  # finished between the check and the mkdir
            shutil.rmtree(reservation, ignore_errors=True)
            continue
        return candidate, reservation
    raise ValueError(f"could not reserve a version of {name!r} in {model_dir}.")


def is_latest(model_dir: Path, version: int) -> bool:
    return version >= max(taken_versions(model_dir), default=0)
