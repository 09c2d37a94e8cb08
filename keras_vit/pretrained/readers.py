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
from keras_vit.pretrained.json_files import (
    check_depth,
    file_kind,
    name_list,
    parse_json,
    read_json_file,
)

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
# Float dtypes converted to float32; integers are read only for the
# position_ids buffer (and refused by name elsewhere).
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
INT_DTYPES = ("BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64")
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
        header = parse_json(raw, str(path))
    except CheckpointError:
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
        if header_len > MAX_SAFETENSORS_HEADER:
            raise CheckpointError(
                f"{path} declares a {header_len}-byte safetensors header; "
                f"safetensors reads at most {MAX_SAFETENSORS_HEADER}."
            )
        header_raw = f.read(header_len) if 0 < header_len <= size - 8 else b""
    check_depth(header_raw, f"the safetensors header of {path}")
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
    """Anything but a valid header entry is a damaged file; a dtype the
    converter does not read is named before any data is."""
    if not _valid_entry(meta):
        shown = json.dumps(meta)[:120]
        raise CheckpointError(
            f"{path} has a malformed safetensors header: entry {name[:200]!r} is "
            f'{shown}; expected {{"dtype": ..., "shape": [...], "data_offsets": '
            "[begin, end]}."
        )
    dtype = meta["dtype"]
    if dtype not in FLOAT_DTYPES + INT_DTYPES:
        raise CheckpointError(
            f"Tensor {name[:200]!r} in {path} has dtype {dtype[:40]!r}, which "
            f"keras_vit does not convert; supported: {', '.join(FLOAT_DTYPES)} "
            "(8-bit and smaller floats are not read)."
        )
    count = int(np.prod(meta["shape"], dtype=np.float64))
    begin, end = meta["data_offsets"]
    if end - begin != count * SAFETENSORS_ITEMSIZE[dtype]:
        raise CheckpointError(
            f"{path} has a malformed safetensors header: tensor {name[:200]!r} of "
            f"shape {meta['shape']} and dtype {dtype} spans {end - begin} bytes, "
            f"not {count * SAFETENSORS_ITEMSIZE[dtype]}."
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
    shard, beside it, of every tensor. Every tensor must be in the shard the
    index names and in no other: transformers reads each from its named
    shard only, so a second copy elsewhere is a damaged or mixed-up folder."""
    data = read_json_file(index, "it is the shard index of the checkpoint")
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(
            f"{index} has no weight_map of tensor names to shard files (got "
            f"{json.dumps(weight_map)[:80]})."
        )
    for tensor, name in weight_map.items():
        if not isinstance(name, str) or Path(name).name != name or name in ("", "."):
            raise CheckpointError(
                f"{index}: weight_map[{tensor[:200]!r}] is {json.dumps(name)[:80]}; "
                "expected the file name of a shard beside the index."
            )
    contents = {}
    for name in sorted(set(weight_map.values())):
        shard = index.parent / name
        kind = file_kind(shard)
        if kind is not None:
            raise CheckpointError(
                f"{index} names the shard {name!r}, which is {kind}, not a file "
                "beside it."
            )
        contents[name] = _read_safetensors(shard)
    owner: dict[str, str] = {}
    for name, part in contents.items():
        for tensor in part:
            if tensor in owner:
                raise CheckpointError(
                    f"Tensor {tensor!r} is stored in two shards, {owner[tensor]!r} "
                    f"and {name!r}; {index.name} names "
                    f"{weight_map.get(tensor)!r}. Refused: which copy is meant?"
                )
            owner[tensor] = name
    for tensor, name in owner.items():
        if weight_map.get(tensor) != name:
            named = weight_map.get(tensor)
            said = f"names {named!r}" if named else "does not list it"
            raise CheckpointError(
                f"Tensor {tensor!r} is in shard {name!r}, but {index.name} {said}."
            )
    missing = sorted(set(weight_map) - set(owner))
    if missing:
        raise CheckpointError(
            f"{index} lists {len(missing)} tensor(s) that its shards lack: "
            f"{name_list(missing)}."
        )
    return {t: v for part in contents.values() for t, v in part.items()}


def _checkpoint_in(folder: Path) -> Path:
    """The checkpoint file of a folder; a candidate name that is not a
    regular file (a folder, a FIFO) is refused rather than passed over."""
    found = []
    for name in (*CHECKPOINT_NAMES, INDEX):
        candidate = folder / name
        kind = file_kind(candidate)
        if kind == "missing":
            continue
        if kind is not None:
            raise CheckpointError(
                f"{candidate} is {kind}, not a checkpoint file; replace it with "
                "the file or remove it."
            )
        found.append(candidate)
    if not found:
        torch_files = [p for p in folder.iterdir() if p.suffix in TORCH_SUFFIXES]
        if torch_files:
            refuse_torch(torch_files[0])
        raise CheckpointError(
            f"{folder} holds no {' or '.join(CHECKPOINT_NAMES)}; files: "
            f"{name_list(sorted(p.name for p in folder.iterdir()))}."
        )
    return found[0]


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """Reads a checkpoint file (or a folder holding one, or the shards of a
    `model.safetensors.index.json`) with numpy.

    Returns `(tensors, config)`: float32 arrays by name, and the parsed
    `config.json` found beside the file (`{}` when there is none). A
    `config.json` that is there but is not a regular file holding a JSON
    object is refused: skipping it would guess what it says.
    """
    path = Path(path)
    if path.is_dir():
        path = _checkpoint_in(path)
    kind = file_kind(path)
    if kind == "missing":
        raise FileNotFoundError(f"No checkpoint at {str(path)!r}.")
    if kind is not None:
        raise CheckpointError(f"{path} is {kind}, not a checkpoint file.")
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
    if file_kind(config_path) != "missing":
        config = read_json_file(
            config_path, "the converter reads the architecture and labels from it"
        )
    return tensors, config
