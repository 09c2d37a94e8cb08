"""A safetensors file is told from a pickle by parsing its header, not by its
first byte: the 8-byte little-endian header length of about one file in 256
begins with 0x80, pickle's PROTO opcode. Headers, dtypes and the shards of a
transformers index are checked by name, in one line."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers import REPO, assert_close
from safetensors.numpy import save_file

from keras_vit.errors import CheckpointError, UnsafeCheckpointError
from keras_vit.pretrained.convert import convert_checkpoint
from keras_vit.pretrained.readers import is_safetensors, read_checkpoint

FIXTURE = REPO / "tests" / "fixtures" / "timm_vit_map"


def write_with_header_low_byte(path, tensors: dict, low_byte: int) -> int:
    """Saves `tensors` with safetensors' own writer, padding the metadata
    until the header length's low byte is `low_byte`; returns the length."""
    for pad in range(2048):
        save_file(tensors, str(path), metadata={"pad": "x" * pad})
        length = int.from_bytes(path.read_bytes()[:8], "little")
        if length % 256 == low_byte:
            return length
    raise AssertionError("no padding gave the wanted header length")


def test_a_safetensors_file_starting_with_0x80_converts(tmp_path):
    tensors, _ = read_checkpoint(FIXTURE / "model.safetensors")
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "config.json").write_text((FIXTURE / "config.json").read_text())
    path = folder / "model.safetensors"
    length = write_with_header_low_byte(path, tensors, 0x80)
    assert path.read_bytes()[:1] == b"\x80"
    assert is_safetensors(path)
    read, _ = read_checkpoint(path)
    assert sorted(read) == sorted(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(read[name], value)
    # The whole conversion, against the fixture's source logits.
    parity = np.load(FIXTURE / "parity.npz")
    model = convert_checkpoint(folder)
    scale = float(np.max(np.abs(parity["logits"])))
    # 1e-4 of the logits' scale, the converters' parity bound.
    assert np.max(np.abs(np.asarray(model(parity["images"])) - parity["logits"])) < (
        1e-4 * scale
    )
    assert length % 256 == 0x80


@pytest.mark.parametrize(
    "content",
    [
        b"\x80\x04\x95\x0b\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94K\x01s.",
        b"\x80\x02}q\x00.",
        # A pickle padded to look like a length-prefixed JSON header.
        b"\x80\x00\x00\x00\x00\x00\x00\x00" + json.dumps({"a": 1}).encode().ljust(128),
    ],
)
def test_pickles_are_still_refused(tmp_path, content):
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    assert not is_safetensors(path)
    with pytest.raises(UnsafeCheckpointError, match="PyTorch pickle checkpoint"):
        read_checkpoint(path)


def test_header_checks_follow_safetensors(tmp_path):
    """What safetensors itself refuses is not taken for safetensors: data
    not tiling the file, a tensor shorter than its shape, a header past the
    end."""
    path = tmp_path / "model.safetensors"
    save_file({"w": np.ones((2, 3), "float32")}, str(path))
    assert is_safetensors(path)
    whole = path.read_bytes()
    (tmp_path / "extra.safetensors").write_bytes(whole + b"\0")
    assert not is_safetensors(tmp_path / "extra.safetensors")
    header = json.loads(whole[8 : 8 + int.from_bytes(whole[:8], "little")])
    header["w"]["shape"] = [2, 4]
    raw = json.dumps(header).encode()
    (tmp_path / "short.safetensors").write_bytes(
        len(raw).to_bytes(8, "little") + raw + whole[-24:]
    )
    assert not is_safetensors(tmp_path / "short.safetensors")
    (tmp_path / "past.safetensors").write_bytes((1 << 40).to_bytes(8, "little"))
    assert not is_safetensors(tmp_path / "past.safetensors")


def raw_safetensors(path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


def test_an_8_bit_float_tensor_is_named_as_unsupported(tmp_path):
    path = tmp_path / "model.safetensors"
    header = {"w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}
    raw_safetensors(path, header, b"\x38\x40\x44\x48")
    with pytest.raises(CheckpointError) as error:
        read_checkpoint(path)
    assert str(error.value) == (
        f"Tensor 'w' in {path} has dtype 'F8_E4M3', which keras_vit does not "
        "convert; supported: F16, BF16, F32, F64 (8-bit and smaller floats are "
        "not read)."
    )
    header["w"]["dtype"] = "F4"
    raw_safetensors(path, header, b"\0" * 4)
    with pytest.raises(CheckpointError, match="has dtype 'F4', which keras_vit"):
        read_checkpoint(path)


def test_a_deeply_nested_header_is_one_line(tmp_path):
    path = tmp_path / "model.safetensors"
    raw = b'{"w": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw)
    with pytest.raises(CheckpointError, match="nests JSON 200001 levels deep"):
        read_checkpoint(path)


def sharded(tmp_path, edit=None):
    """hf_vit saved as two shards and a transformers index; `edit(shards,
    weight_map)` changes them before they are written."""
    source = REPO / "tests" / "fixtures" / "hf_vit"
    tensors, _ = read_checkpoint(source / "model.safetensors")
    names = sorted(tensors)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": {n: tensors[n] for n in names[:half]},
        "model-00002-of-00002.safetensors": {n: tensors[n] for n in names[half:]},
    }
    weight_map = {n: f for f, part in shards.items() for n in part}
    if edit is not None:
        edit(shards, weight_map)
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text((source / "config.json").read_text())
    for file, part in shards.items():
        save_file(part, str(folder / file))
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


FIRST, SECOND = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def test_a_sharded_checkpoint_converts(tmp_path):
    folder = sharded(tmp_path)
    parity = np.load(REPO / "tests" / "fixtures" / "hf_vit" / "parity.npz")
    logits = np.asarray(convert_checkpoint(folder)(parity["images"]))
    assert_close(logits, parity["logits"], 1e-4)


def _duplicate(shards, weight_map):
    name = sorted(shards[FIRST])[0]
    shards[SECOND][name] = shards[FIRST][name] + 1.0


def _moved(shards, weight_map):
    name = sorted(shards[FIRST])[0]
    shards[SECOND][name] = shards[FIRST].pop(name)


def _unlisted(shards, weight_map):
    shards[SECOND]["extra.weight"] = np.ones(2, "float32")


@pytest.mark.parametrize(
    "edit,match",
    [
        (_duplicate, f"is stored in two shards, '{FIRST}' and '{SECOND}'"),
        (_moved, f"is in shard '{SECOND}', but model.safetensors.index.json names "
         f"'{FIRST}'"),
        (_unlisted, f"'extra.weight' is in shard '{SECOND}', but "
         "model.safetensors.index.json does not list it"),
        (lambda s, w: w.update({"x": None}), r"weight_map\['x'\] is null; expected "
         "the file name of a shard"),
        (lambda s, w: w.update({"x": 3}), r"weight_map\['x'\] is 3"),
        (lambda s, w: w.update({"x": "../model.safetensors"}), "expected the file "
         "name of a shard beside the index"),
        (lambda s, w: w.update({"x": "absent.safetensors"}), "names the shard "
         "'absent.safetensors', which is missing"),
        (lambda s, w: w.update({"x": FIRST}), r"lists 1 tensor\(s\) that its "
         r"shards lack: \['x'\]"),
    ],
    ids=["duplicate", "moved", "unlisted", "null", "int", "outside", "absent",
         "lacking"],
)  # fmt: skip
def test_shards_must_agree_with_their_index_by_name(tmp_path, edit, match):
    folder = sharded(tmp_path, edit)
    with pytest.raises(CheckpointError, match=match) as error:
        convert_checkpoint(folder)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "index,match",
    [
        ('{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}", "nests JSON"),
        ('{"weight_map": null}', "has no weight_map of tensor names"),
        ("[]", "holds a JSON list"),
        ("{", "is not valid JSON"),
    ],
    ids=["deep", "null", "list", "broken"],
)
def test_a_malformed_index_is_one_line(tmp_path, index, match):
    folder = sharded(tmp_path)
    (folder / "model.safetensors.index.json").write_text(index)
    with pytest.raises(CheckpointError, match=match) as error:
        read_checkpoint(folder)
    assert "\n" not in str(error.value)


def test_a_shard_that_is_a_fifo_is_not_opened(tmp_path):
    folder = sharded(tmp_path)
    (folder / SECOND).unlink()
    os.mkfifo(folder / SECOND)
    with pytest.raises(CheckpointError, match=r"which is a FIFO \(named pipe\)"):
        read_checkpoint(folder)
