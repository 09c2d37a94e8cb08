"""A safetensors file is told from a pickle by parsing its header, not by its
first byte: the 8-byte little-endian header length of about one file in 256
begins with 0x80, pickle's PROTO opcode."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import REPO
from safetensors.numpy import save_file

from keras_vit.errors import UnsafeCheckpointError
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
