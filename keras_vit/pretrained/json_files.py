"""The files beside a checkpoint (config.json, the shard index,
preprocessor_config.json) and the safetensors header: what a path is, JSON
parsed with a nesting limit, and names listed in one line."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import numpy as np

from keras_vit.errors import CheckpointError

# The most read of a JSON file beside a checkpoint (configs and shard indexes
# are a few KB to a few hundred KB), as safetensors' own header limit.
MAX_JSON_BYTES = 100_000_000
# JSON nested deeper than this is refused before it is parsed: Python's parser
# recurses once per level (200,000 levels end in a RecursionError), and no
# config, index or safetensors header nests more than about 5 levels.
MAX_JSON_DEPTH = 64
# Names listed in one message: the first ten, then how many more.
MAX_LISTED = 10


def name_list(names, limit: int = MAX_LISTED) -> str:
    """`names` for a one-line message: the first `limit`, then a count."""
    names = list(names)
    shown = ", ".join(
        repr(n) if len(str(n)) <= 200 else repr(str(n)[:200]) + "..."
        for n in names[:limit]
    )
    more = f", ... and {len(names) - limit} more" if len(names) > limit else ""
    return f"[{shown}{more}]"


_FILE_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(path: Path) -> str | None:
    """What `path` is when it is not a regular file ("a folder", "a FIFO
    (named pipe)", "a link to a missing file", ...), None when it is one.
    Only `stat` is called: opening a FIFO to look would block."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a link to a missing file" if os.path.islink(path) else "missing"
    except OSError as error:  # a link loop, a name too long, no permission
        return f"not accessible ({error.strerror})"
    if stat.S_ISREG(mode):
        return None
    kind = next((k for test, k in _FILE_KINDS if test(mode)), "not a regular file")
    if os.path.islink(path):
        kind = f"a link to {os.path.realpath(path)}, {kind}"
    return kind


def require_regular_file(path: Path, role: str) -> None:
    """Refuses, in one line, a `path` that is not a readable regular file;
    `role` says what the file is for."""
    kind = file_kind(path)
    if kind is not None:
        raise CheckpointError(
            f"{path} is {kind}, not a regular file; {role}. Replace it with the "
            "file or remove it."
        )


def json_depth(raw: bytes) -> int:
    """The deepest nesting of `[` and `{` in JSON text, strings left out,
    without parsing it (linear time, no recursion)."""
    # The unrolled form of a string literal: linear, where an alternation
    # per character took 25 s on a 50 MB string.
    text = re.sub(rb'"[^"\\]*(?:\\.[^"\\]*)*"', b'""', raw, flags=re.DOTALL)
    codes = np.frombuffer(text, np.uint8)
    depth = deepest = 0
    for start in range(0, len(codes), 1 << 20):
        chunk = codes[start : start + (1 << 20)]
        step = np.isin(chunk, (0x5B, 0x7B)).astype(np.int64)
        step -= np.isin(chunk, (0x5D, 0x7D))
        running = depth + np.cumsum(step)
        deepest, depth = max(deepest, int(running.max())), int(running[-1])
    return deepest


def check_depth(raw: bytes, where: str) -> None:
    """Refuses JSON text nested deeper than `MAX_JSON_DEPTH`."""
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise CheckpointError(
            f"{where} nests JSON {depth} levels deep; at most {MAX_JSON_DEPTH} "
            "are read (a config or index nests a few levels)."
        )


def parse_json(raw: bytes, where: str):
    """`raw` parsed, or one line naming `where` and why not."""
    check_depth(raw, where)
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{where} is not UTF-8 text: {error}") from None
    except ValueError as error:
        raise CheckpointError(f"{where} is not valid JSON: {error}") from None


def read_json_file(path: Path, role: str, kind: type = dict):
    """A JSON file beside a checkpoint (config.json, the shard index,
    preprocessor_config.json): a regular file, at most 100 MB, parsed with a
    nesting limit, holding a `kind` at its top."""
    require_regular_file(path, role)
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise CheckpointError(
            f"{path} is {size} bytes; a JSON file beside a checkpoint is at most "
            f"{MAX_JSON_BYTES}."
        )
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise CheckpointError(f"{path} cannot be read: {error.strerror}.") from None
    value = parse_json(raw, str(path))
    if not isinstance(value, kind):
        raise CheckpointError(
            f"{path} holds a JSON {type(value).__name__}; expected an object of "
            "settings."
        )
    return value
