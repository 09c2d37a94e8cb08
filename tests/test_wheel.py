"""The package works from a wheel, away from the source tree: the wheel holds
the recipes (the top-level recipes/ folder, as keras_vit/recipes/), and
`python -m keras_vit.cli train digits --smoke` runs from an empty folder with
only the installed package on the path."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import REPO

# Not part of the package's sources: outputs, caches and the git folder.
NOT_SOURCES = shutil.ignore_patterns(
    ".git", "build", "dist", "runs", "saved_models", "*.egg-info", "__pycache__"
)


def pip(*args: str, cwd: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel (built from a copy of the sources, so the build's own
    folders stay out of the checkout) and a folder it is installed into."""
    tmp = tmp_path_factory.mktemp("wheel")
    shutil.copytree(REPO, tmp / "src", ignore=NOT_SOURCES)
    # No build isolation: it would download setuptools; the one in this
    # environment builds the wheel.
    pip(
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(tmp),
        ".",
        cwd=tmp / "src",
    )
    (wheel,) = tmp.glob("keras_vit_tf-*.whl")
    pip("install", "--no-deps", "--target", str(tmp / "site"), str(wheel), cwd=tmp)
    return wheel, tmp / "site"


@pytest.mark.slow
def test_wheel_holds_every_recipe_module(installed):
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    recipes = sorted((REPO / "recipes").glob("*.py"))
    assert len(recipes) >= 2
    for recipe in recipes:
        # The top-level recipes/ folder ships as keras_vit/recipes/.
        assert f"keras_vit/recipes/{recipe.name}" in names, recipe.name


@pytest.mark.slow
def test_installed_wheel_trains_a_recipe_from_an_empty_folder(installed, tmp_path):
    _, site = installed
    env = {**os.environ, "PYTHONPATH": str(site)}
    # Where `keras_vit` resolves (found, not imported) and what is on the path:
    # the installed copy only, not the checkout.
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.util, sys; "
            "print(importlib.util.find_spec('keras_vit').origin); "
            "print('\\n'.join(sys.path))",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert where[0] == str(site / "keras_vit" / "__init__.py")
    assert not any(p and Path(p).resolve() == REPO for p in where[1:])

    proc = subprocess.run(
        [sys.executable, "-m", "keras_vit.cli", "train", "digits", "--smoke"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "digits: done, held-out accuracy" in proc.stdout, proc.stdout
    # A smoke run has a folder of its own, beside the real run's.
    assert (tmp_path / "runs" / "digits-smoke" / "model.keras").is_file()


@pytest.mark.slow
def test_installed_wheel_bench_says_in_one_line_where_the_benchmark_is(
    installed, tmp_path
):
    _, site = installed
    proc = subprocess.run(
        [sys.executable, "-m", "keras_vit.cli", "bench"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    ours = [line for line in proc.stderr.splitlines() if line.startswith("keras-vit")]
    assert len(ours) == 1, proc.stderr
    assert ours[0].startswith("keras-vit bench: error: the benchmark is not installed")
    assert "source checkout" in ours[0] and "pip install -e ." in ours[0]
