"""One line instead of a traceback, before any work where it can be: disk
full, a non-finite loss, names TensorFlow cannot write, oversized images; and
export settings that may change when a run resumes."""

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import keras
import numpy as np
import pytest
from test_training import tiny

from keras_vit.cli.main import main as cli_main
from keras_vit.deploy.export import export_model
from keras_vit.errors import NonFiniteLossError
from keras_vit.models.vit import MAX_IMAGE_SIZE, ViT
from keras_vit.training import run_folder
from keras_vit.training import trainer as training
from keras_vit.training.config import validate

TESTS = str(Path(__file__).parent)
RECIPE = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_training import tiny

def get_config():
    return tiny(Path({tmp!r}), total_steps=4)
"""
# Characters TensorFlow's SavedModel loader reads as glob patterns, and a
# control character.
BAD_CHARACTERS = ["[", "]", "*", "?", "\\", "\n"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def tiny_model():
    keras.utils.set_random_seed(0)
    return ViT(
        "Ti/4",
        image_size=8,
        num_classes=4,
        num_channels=1,
        hidden_dim=16,
        num_layers=1,
        num_heads=2,
        mlp_dim=32,
    )


@pytest.mark.parametrize("character", BAD_CHARACTERS, ids=repr)
def test_export_name_or_root_that_tf_cannot_write_is_refused_first(tmp_path, character):
    model = tiny_model()
    with pytest.raises(ValueError, match="choose a name and folder without them"):
        export_model(model, f"tiny{character}1", tmp_path / "exports")
    root = tmp_path / f"exports{character}1"
    with pytest.raises(ValueError, match="export root"):
        export_model(model, "tiny", root)
    assert list(tmp_path.iterdir()) == []  # not even an empty folder


@pytest.mark.parametrize("kind", ["float16", "dynamic_int8", "int8", "int16x8"])
def test_export_names_cannot_be_another_exports_files(tmp_path, kind):
    # `x_<kind>.tflite` is model x's file of that kind.
    with pytest.raises(ValueError, match=f"ends with '_{kind}': x_{kind}.tflite is"):
        export_model(tiny_model(), f"x_{kind}", tmp_path)
    with pytest.raises(ValueError, match=f"export_name 'x_{kind}' ends with"):
        validate(tiny(tmp_path, export_name=f"x_{kind}"))
    assert list(tmp_path.iterdir()) == []


def test_export_names_the_file_system_cannot_take_are_refused_first(tmp_path):
    with pytest.raises(ValueError, match="240 bytes long.*use at most 213 bytes"):
        export_model(tiny_model(), "n" * 240, tmp_path)
    export_model(tiny_model(), "n" * 213, tmp_path, tflite=("dynamic_int8",))
    assert (tmp_path / ("n" * 213 + "_dynamic_int8.tflite")).is_file()


def test_a_file_where_an_export_folder_goes_is_refused_first(tmp_path):
    (tmp_path / "plain").write_text("")
    with pytest.raises(ValueError, match="'.*plain' is not a folder.*for its root"):
        export_model(tiny_model(), "m", tmp_path / "plain" / "sub")
    (tmp_path / "m").write_text("")
    with pytest.raises(ValueError, match="'.*m' is not a folder.*model folder"):
        export_model(tiny_model(), "m", tmp_path)
    (tmp_path / "k.keras").mkdir()
    with pytest.raises(ValueError, match="k.keras' is a folder"):
        export_model(tiny_model(), "k", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.keras", "m", "plain"]


def test_predict_refuses_a_tflite_file_its_metadata_does_not_describe(tmp_path):
    from keras_vit.deploy.serving import predict

    export_model(tiny_model(), "x", tmp_path, tflite=("float32",))
    renamed = tmp_path / "x_float16.tflite"  # not a file of export x
    shutil.copy(tmp_path / "x.tflite", renamed)
    with pytest.raises(ValueError, match="is not one of the files .* describes"):
        predict(renamed, np.zeros((1, 8, 8, 1)))
    assert predict(tmp_path / "x.tflite", np.zeros((1, 8, 8, 1)))


def test_cli_export_to_a_bracketed_root_is_one_line(tmp_path, capsys):
    tiny_model().save(tmp_path / "tiny.keras")
    root = tmp_path / "out[1]"
    argv = ["export", str(tmp_path / "tiny.keras"), "--name", "tiny"]
    status = cli_main([*argv, "--root", str(root), "--mean", "0", "--std", "1"])
    assert status == 2
    line = one_line(capsys)
    assert line.startswith("keras-vit export: error: export root")
    assert "contains '[]'" in line
    assert not root.exists()


def test_training_refuses_a_bad_export_name_before_it_trains(tmp_path):
    with pytest.raises(ValueError, match="export_name 'digits\\[1\\]'"):
        training.train(tiny(tmp_path, export_name="digits[1]"))
    with pytest.raises(ValueError, match="export_root"):
        training.train(tiny(tmp_path, export_name="d", export_root="a*b"))
    assert list(tmp_path.iterdir()) == []  # no run folder either


def test_image_size_has_an_upper_bound(tmp_path, capsys):
    with pytest.raises(ValueError, match=f"model.image_size must be in \\[1, {1024}"):
        validate(tiny(tmp_path, **{"model.image_size": "4096"}))
    assert MAX_IMAGE_SIZE == 1024
    config = tiny(tmp_path)
    resized = dataclasses.replace(
        config,
        total_steps=4,
        model=dataclasses.replace(config.model, resize_at=((2, 2048),)),
    )
    with pytest.raises(ValueError, match="resize_at image_size must be in"):
        validate(resized)
    assert cli_main(["info", "Ti/16", "--image-size", "5000", "--no-summary"]) == 2
    line = one_line(capsys)
    assert "--image-size" in line and "outside [1, 1024]" in line


def test_export_quantize_may_change_on_resume(tmp_path):
    config = tiny(tmp_path)
    run_folder.prepare_run_folder(tmp_path / "run")
    run_folder.check_fingerprint(tmp_path / "run", config, 1, resumes=False)
    changed = dataclasses.replace(config, export_quantize="int8", export_name="d")
    run_folder.check_fingerprint(tmp_path / "run", changed, 1, resumes=True)
    assert "export_quantize" not in run_folder.fingerprint(changed, 1)


def test_non_finite_loss_is_one_line(tmp_path, monkeypatch, capsys):
    message = (
        "Training stopped at step 3: loss nan; nothing saved, the last good "
        "checkpoint is run/checkpoints/ckpt-00000002.weights.h5 (step 2)."
    )

    def diverging(config):
        raise NonFiniteLossError(message)

    monkeypatch.setattr(training, "train", diverging)
    recipe = tmp_path / "recipe.py"
    recipe.write_text(RECIPE.format(tests=TESTS, tmp=str(tmp_path)))
    assert cli_main(["train", str(recipe)]) == 2
    assert one_line(capsys) == f"keras-vit train: error: {message}"


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs: room for the run's small files, not a checkpoint."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command to make a small tmpfs")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_disk_full_during_training_is_one_line(small_disk, capsys):
    recipe = small_disk.parent / "recipe.py"
    recipe.write_text(RECIPE.format(tests=TESTS, tmp=str(small_disk)))
    assert cli_main(["train", str(recipe)]) == 2
    line = one_line(capsys)
    assert line.startswith("keras-vit train: error: no space left on the device")
    run_dir = small_disk / "run"
    # No half-written file a reader would take: every visible checkpoint is
    # listed in the manifest (with its checksum), no temporary file is left.
    checkpoints = run_dir / "checkpoints"
    visible = {p.name for p in checkpoints.glob("ckpt-*")}
    manifest = checkpoints / "checkpoints.json"
    entries = []
    if manifest.exists():
        entries = json.loads(manifest.read_text())["checkpoints"]
    listed = {entry["file"] for entry in entries}
    assert visible == listed
    assert not [p for p in small_disk.rglob("*") if ".tmp" in p.name]
    assert not (run_dir / "model.keras").exists()


def test_disk_full_during_export_is_one_line(small_disk, tmp_path, capsys):
    model = tiny_model()
    model.save(tmp_path / "tiny.keras")
    pixels = np.random.default_rng(0).uniform(0, 255, (4, 8, 8, 1)).astype("float32")
    np.save(tmp_path / "verify.npy", pixels)
    argv = ["export", str(tmp_path / "tiny.keras"), "--name", "tiny"]
    argv += ["--root", str(small_disk), "--mean", "0", "--std", "1"]
    assert cli_main(argv) == 2
    line = one_line(capsys)
    assert line.startswith("keras-vit export: error: no space left on the device")
    leftovers = [p for p in small_disk.rglob("*") if p.is_file()]
    assert leftovers == []  # the partial version was removed
    assert not (small_disk / "tiny").exists()  # and the folder it made
