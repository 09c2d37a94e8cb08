"""What an image folder holds besides images: hidden entries are neither
classes nor images; an empty training class, a class linked to its own
split, a folder named like an image, a dangling link and a link loop are
each one ValueError naming the path, or (entries, on_error=skip) left out
with a warning that counts them."""

import os

import numpy as np
import pytest
from PIL import Image

from keras_vit.cli.main import main as cli_main
from keras_vit.training import data as data_lib
from keras_vit.training.config import DataConfig


def folder(root, splits, on_error="raise"):
    """`splits`: {split: {class: number of 8x8 grey PNGs}}."""
    for split, classes in splits.items():
        for k, (name, count) in enumerate(classes.items()):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = np.full((8, 8), 40 * k + i, "uint8")
                Image.fromarray(pixels).save(root / split / name / f"{i}.png")
    return DataConfig(
        source="folder", path=str(root), num_channels=1, on_error=on_error
    )


def eval_count(config):
    return sum(len(x) for x, _ in data_lib.make_eval_dataset(config, 8, 64))


def test_hidden_entries_are_not_classes_or_images(tmp_path):
    config = folder(tmp_path, {"train": {"a": 2, "b": 2}, "val": {"a": 1, "b": 1}})
    for split in ("train", "val"):
        (tmp_path / split / ".ipynb_checkpoints").mkdir()
        (tmp_path / split / ".ipynb_checkpoints" / "0-checkpoint.png").write_bytes(
            (tmp_path / "train" / "a" / "0.png").read_bytes()
        )
    (tmp_path / "val" / "a" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (tmp_path / "val" / "a" / "._0.png").write_bytes(b"\0\5\26\7 AppleDouble")
    assert data_lib.class_names(config) == ["a", "b"]
    assert eval_count(config) == 2


def test_empty_training_class_is_refused_by_name(tmp_path):
    config = folder(tmp_path, {"train": {"a": 2, "b": 2}, "val": {"a": 1, "b": 1}})
    (tmp_path / "train" / "empty").mkdir()
    (tmp_path / "train" / "empty" / "notes.txt").write_text("todo")
    with pytest.raises(ValueError, match="empty' of .*holds no image files") as error:
        list(data_lib.make_train_dataset(config, 8, 2, seed=0).take(1))
    assert str(tmp_path / "train" / "empty") in str(error.value)
    # An empty folder in the held-out split is as good as an absent one.
    (tmp_path / "train" / "empty" / "0.png").write_bytes(
        (tmp_path / "train" / "a" / "0.png").read_bytes()
    )
    (tmp_path / "val" / "empty").mkdir()
    assert eval_count(config) == 2


def test_class_linked_to_its_split_is_refused(tmp_path):
    config = folder(tmp_path, {"train": {"a": 2, "b": 2}, "val": {"a": 1, "b": 1}})
    os.symlink(tmp_path / "train", tmp_path / "train" / "c")
    with pytest.raises(ValueError, match="holds the split folder") as error:
        data_lib.class_names(config)
    assert str(tmp_path / "train" / "c") in str(error.value)
    os.remove(tmp_path / "train" / "c")
    os.symlink(tmp_path, tmp_path / "train" / "c")  # the dataset root
    with pytest.raises(ValueError, match="holds the split folder"):
        data_lib.class_names(config)
    # A link to a folder of images elsewhere is an ordinary class.
    os.remove(tmp_path / "train" / "c")
    os.symlink(tmp_path / "val" / "b", tmp_path / "train" / "c")
    assert data_lib.class_names(config) == ["a", "b", "c"]


def bad_entries(class_folder):
    (class_folder / "x.png").mkdir()
    os.symlink(class_folder / "gone.png", class_folder / "dangling.png")
    os.symlink(class_folder / "loop2.jpg", class_folder / "loop1.jpg")
    os.symlink(class_folder / "loop1.jpg", class_folder / "loop2.jpg")


@pytest.mark.parametrize(
    "name, why",
    [
        ("x.png", "is a folder, not an image file"),
        ("dangling.png", "gone.png', which does not exist"),
        ("loop1.jpg", "loops back on itself"),
    ],
)
def test_entries_that_are_not_files_are_named(tmp_path, name, why):
    folder(tmp_path, {"train": {"a": 2, "b": 2}, "val": {"a": 1, "b": 1}})
    bad_entries(tmp_path / "val" / "b")
    # Only this one entry stays, so the error is about it.
    for other in ("x.png", "dangling.png", "loop1.jpg", "loop2.jpg"):
        if other != name and not (name == "loop1.jpg" and other == "loop2.jpg"):
            path = tmp_path / "val" / "b" / other
            path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
    config = DataConfig(source="folder", path=str(tmp_path), num_channels=1)
    with pytest.raises(ValueError, match=why) as error:
        eval_count(config)
    assert str(tmp_path / "val" / "b" / name) in str(error.value)
    assert "on_error=skip" in str(error.value)


def test_entries_that_are_not_files_are_skipped_and_counted(tmp_path):
    config = folder(
        tmp_path,
        {"train": {"a": 2, "b": 2}, "val": {"a": 1, "b": 1}},
        on_error="skip",
    )
    bad_entries(tmp_path / "val" / "b")
    with pytest.warns(UserWarning, match=r"left out 4 entries of .*val/b'.*the first"):
        assert eval_count(config) == 2


def test_cli_train_names_the_bad_entry_in_one_line(tmp_path, capsys):
    folder(tmp_path, {"train": {"a": 2, "b": 2}, "val": {"a": 1, "b": 1}})
    (tmp_path / "train" / "a" / "x.png").mkdir()
    argv = ["train", "digits", "--smoke", "--run_dir", str(tmp_path / "run")]
    argv += ["--export_name", "", "--data.source", "folder"]
    argv += ["--data.path", str(tmp_path), "--data.num_channels", "1"]
    code = cli_main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "x.png' is a folder" in err


def test_a_fifo_named_like_an_image_is_named_and_never_opened(tmp_path):
    config = folder(tmp_path, {"train": {"a": 2, "b": 2}, "val": {"a": 1, "b": 1}})
    os.mkfifo(tmp_path / "val" / "b" / "pipe.png")
    # Opening it for reading would block until a writer came.
    with pytest.raises(ValueError, match=r"pipe.png' is a FIFO \(named pipe\), not"):
        eval_count(config)
    skipping = DataConfig(**{**vars(config), "on_error": "skip"})
    with pytest.warns(UserWarning, match=r"left out 1 entry .*pipe.png' is a FIFO"):
        assert eval_count(skipping) == 2
