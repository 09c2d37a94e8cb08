"""Reading checkpoint files without running code from them.

Tensors are read with numpy only (`safetensors.numpy`, `np.load` with
`allow_pickle=False`); PyTorch's `.bin` / `.pt` files are refused, because
unpickling one runs whatever code it carries.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np

from keras_vit.errors import CheckpointError, UnsafeCheckpointError

TORCH_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
CHECKPOINT_NAMES = ("model.safetensors", "model.npz")
# transformers' `save_pretrained` above its shard size: model-0000k-of-n
# files and this index.
INDEX = "model.safetensors.index.json"


def refuse_torch(path: Path) -> None:
    raise UnsafeCheckpointError(
        f"{path} is a PyTorch pickle checkpoint. keras_vit does not open these: "
        "unpickling runs arbitrary code from the file. Convert it to "
        "safetensors where torch is installed, e.g. `from safetensors.torch "
        "import save_file; save_file(state_dict, 'model.safetensors')`, or "
        "download the repository's model.safetensors instead."
    )


# safetensors' own limit on the JSON header (100 MB).
MAX_SAFETENSORS_HEADER = 100_000_000
# Bytes per element of safetensors' dtypes (sub-byte float4/6 kinds aside).
SAFETENSORS_ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip


def is_safetensors(path: Path) -> bool:
    """Whether `path` passes the checks safetensors makes when it opens a
    file: an 8-byte little-endian header length that fits the file, a JSON
    object header, and tensors whose byte ranges tile the data section
    exactly, each as long as its dtype and shape say.

    The first byte alone cannot tell: a header length whose low byte is 0x80
    starts the file with pickle's PROTO opcode.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            return False
        header_len = int.from_bytes(prefix, "little")
        if not 2 <= header_len <= min(MAX_SAFETENSORS_HEADER, size - 8):
            return False
        raw = f.read(header_len)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    if not isinstance(header, dict):
        return False
    header.pop("__metadata__", None)
    spans = []
    for meta in header.values():
        if not _valid_entry(meta) or meta["dtype"] not in SAFETENSORS_ITEMSIZE:
            return False
        begin, end = meta["data_offsets"]
        count = int(np.prod(meta["shape"], dtype=np.int64))
        if end - begin != count * SAFETENSORS_ITEMSIZE[meta["dtype"]]:
            return False
        spans.append((begin, end))
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            return False
        position = end
    return 8 + header_len + position == size


def _is_torch_file(path: Path, head: bytes) -> bool:
    if path.suffix.lower() in TORCH_SUFFIXES:
        return True
    if head[:1] == b"\x80":
        # Pickle's PROTO opcode, or a safetensors header length ending in 0x80.
        return not is_safetensors(path)
    if head[:2] == b"PK":
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except zipfile.BadZipFile:
            return False
        return any(n.endswith("data.pkl") or n.endswith(".pkl") for n in names)
    return False


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    # ml_dtypes (a Keras dependency) teaches numpy "bfloat16", the dtype in
    # which safetensors >= 0.8 returns BF16 tensors.
    import ml_dtypes  # noqa: F401
    from safetensors import safe_open

    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        header_len = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        header_raw = f.read(header_len) if 0 < header_len <= size - 8 else b""
    try:
        header = json.loads(header_raw)
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise CheckpointError(
            f"{path} is not a readable safetensors file (bad or truncated header)."
        )
    header.pop("__metadata__", None)
    for name, meta in header.items():
        _check_header_entry(path, name, meta)
    data_len = max((t["data_offsets"][1] for t in header.values()), default=0)
    if 8 + header_len + data_len > size:
        raise CheckpointError(
            f"{path} is truncated: its header describes {8 + header_len + data_len} "
            f"bytes, the file has {size}."
        )
    tensors = {}
    try:
        with safe_open(str(path), framework="numpy") as f:
            for name in header:
                tensors[name] = f.get_tensor(name)
    except CheckpointError:
        raise
    except Exception as error:  # safetensors raises its own error types
        raise CheckpointError(
            f"{path} is not a valid safetensors file: {error}"
        ) from None
    return tensors


def _is_float(dtype) -> bool:
    # bfloat16 (ml_dtypes) is not a numpy floating subtype.
    return np.issubdtype(dtype, np.floating) or dtype.name == "bfloat16"


def _valid_entry(meta) -> bool:
    """A safetensors header entry is `{"dtype": str, "shape": [int, ...],
    "data_offsets": [begin, end]}`."""
    offsets = meta.get("data_offsets") if isinstance(meta, dict) else None
    shape = meta.get("shape") if isinstance(meta, dict) else None
    return (
        isinstance(meta, dict)
        and isinstance(meta.get("dtype"), str)
        and isinstance(shape, list)
        and all(isinstance(d, int) and d >= 0 for d in shape)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) for o in offsets)
        and 0 <= offsets[0] <= offsets[1]
    )


def _check_header_entry(path: Path, name: str, meta) -> None:
    """Anything but a valid header entry is a damaged file."""
    if not _valid_entry(meta):
        shown = json.dumps(meta)[:120]
        raise CheckpointError(
            f"{path} has a malformed safetensors header: entry {name!r} is {shown}; "
            'expected {"dtype": ..., "shape": [...], "data_offsets": [begin, end]}.'
        )


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        if f.read(6) == b"\x93NUMPY":
            raise CheckpointError(
                f"{path} is a single .npy array, not an .npz archive of named "
                "tensors; save the weights with np.savez(path, **named_arrays)."
            )
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (zipfile.BadZipFile, EOFError, OSError) as error:
        raise CheckpointError(
            f"{path} is not a readable .npz file (truncated or corrupt): {error}"
        ) from None
    except ValueError as error:
        raise CheckpointError(
            f"{path} holds object arrays, which need pickle; refused: {error}"
        ) from None


def _read_file(path: Path) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        head = f.read(8)
    if _is_torch_file(path, head):
        refuse_torch(path)
    if path.suffix == ".npz" or head[:2] == b"PK":
        return _read_npz(path)
    if path.suffix == ".safetensors" or len(head) == 8:
        return _read_safetensors(path)
    raise CheckpointError(f"{path} is empty or too short to be a checkpoint.")


def _read_sharded(index: Path) -> dict[str, np.ndarray]:
    """transformers' sharded safetensors: the index's `weight_map` names the
    shard, beside it, of every tensor."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(
            f"{index} is not a safetensors index with a weight_map: {error!r}"
        ) from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index} has an empty or malformed weight_map.")
    tensors = {}
    for name in sorted(set(weight_map.values())):
        shard = index.parent / str(name)
        if Path(str(name)).name != name or not shard.is_file():
            raise CheckpointError(
                f"{index} names the shard {name!r}, which is not a file beside it."
            )
        tensors.update(_read_safetensors(shard))
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise CheckpointError(
            f"{index} lists tensor(s) that its shards lack: {missing[:5]}."
        )
    return tensors


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """Reads a checkpoint file (or a folder holding one, or the shards of a
    `model.safetensors.index.json`) with numpy.

    Returns `(tensors, config)`: float32 arrays by name, and the parsed
    `config.json` found beside the file (`{}` when there is none).
    """
    path = Path(path)
    if path.is_dir():
        found = [path / n for n in (*CHECKPOINT_NAMES, INDEX) if (path / n).is_file()]
        if not found:
            torch_files = [p for p in path.iterdir() if p.suffix in TORCH_SUFFIXES]
            if torch_files:
                refuse_torch(torch_files[0])
            raise CheckpointError(
                f"{path} holds no {' or '.join(CHECKPOINT_NAMES)}; files: "
                f"{sorted(p.name for p in path.iterdir())}."
            )
        path = found[0]
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint at {str(path)!r}.")
    tensors = _read_sharded(path) if path.name == INDEX else _read_file(path)
    for name, value in tensors.items():
        # The index buffer older transformers releases saved (0, 1, ...):
        # integers by nature, kept as they are for the layouts to leave out.
        if name.endswith("position_ids") and value.dtype.kind in "iu":
            continue
        if not _is_float(value.dtype):
            raise CheckpointError(
                f"Tensor {name!r} in {path} has dtype {value.dtype}; expected floats."
            )
        tensors[name] = value.astype("float32")
    config_path = path.parent / "config.json"
    config = {}
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text())
        except ValueError as error:
            raise CheckpointError(f"{config_path} is not valid JSON: {error}") from None
    return tensors, config
