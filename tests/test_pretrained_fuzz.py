"""Seeded mutations of real checkpoint folders (timm and Hugging Face): the
bytes and entries of the safetensors header, the numbers, switches, keys and
nesting of config.json. Each case either converts to the same model as the
unmutated source, or is refused with one line (a ValueError): never another
exception, never a silently different model."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from helpers import FLOAT32_PARITY, REPO

from keras_vit.pretrained.convert import convert_checkpoint

FIXTURES = REPO / "tests" / "fixtures"
SOURCES = ("hf_vit", "timm_vit_map")
CASES = 200
SEED = 1729
# Numbers only the config tells (the tensors fit any value): a valid new
# value gives another model, which must then be the one the config states.
CONFIG_ONLY = {"num_heads": "num_heads", "num_attention_heads": "num_heads"}


def leaves(node, path=()):
    """`(path, value)` of every leaf of a JSON value."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from leaves(value, (*path, i))
    else:
        yield path, node


def keys(node, path=()):
    """The path of every key of every object in a JSON value."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*path, key)
            yield from keys(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from keys(value, (*path, i))


def replace(node, path, value):
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value


def pick(rng, items):
    items = list(items)
    return items[int(rng.integers(len(items)))]


def number_for(rng, value):
    return pick(
        rng,
        [
            value + 1, value - 1, value * 2, -value, 0, 1, 2.5, 1e300,
            math.nan, math.inf, -math.inf, True, False, "7", None, 10**30,
        ],
    )  # fmt: skip


def mutate_config(rng, config: dict):
    """One change to `config`; returns (description, new config or text)."""
    kind = pick(rng, ["number", "flag", "key", "nesting"])
    if kind == "number":
        found = [
            (p, v)
            for p, v in leaves(config)
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
        path, value = pick(rng, found)
        new = number_for(rng, value)
        replace(config, path, new)
        return f"config {path}: {value!r} -> {new!r}", config
    if kind == "flag":
        found = [(p, v) for p, v in leaves(config) if isinstance(v, (bool, str))]
        path, value = pick(rng, found)
        new = pick(rng, [0, 1, "true", "false", None, [value], not value])
        replace(config, path, new)
        return f"config {path}: {value!r} -> {new!r}", config
    if kind == "key":
        path = pick(rng, keys(config))
        parent = config
        for step in path[:-1]:
            parent = parent[step]
        value = parent.pop(path[-1])
        if rng.random() < 0.5:
            parent[f"{path[-1]}_x"] = value
            return f"config key {path} renamed", config
        return f"config key {path} deleted", config
    choice = int(rng.integers(3))
    if choice == 0:
        path, value = pick(rng, leaves(config))
        new = pick(rng, [[value], {"v": value}])
        replace(config, path, new)
        return f"config {path}: {value!r} -> {new!r}", config
    if choice == 1:
        depth = int(pick(rng, [65, 1000, 100_000]))
        text = json.dumps(config)[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}"
        return f"config nested {depth} deep", text
    return "config wrapped in a list", [config]


def mutate_header(rng, data: bytes):
    """One change to the safetensors header; returns (description, bytes)."""
    length = int.from_bytes(data[:8], "little")
    header, body = json.loads(data[8 : 8 + length]), data[8 + length :]
    if rng.random() < 0.5:
        mutated = bytearray(data)
        position = int(rng.integers(8 + length))
        byte = int(rng.integers(256))
        mutated[position] = byte if byte != mutated[position] else byte ^ 1
        return f"header byte {position} -> {mutated[position]}", bytes(mutated)
    name = pick(rng, sorted(k for k in header if k != "__metadata__"))
    entry = header[name]
    kind = pick(rng, ["shape", "dtype", "offsets", "rename", "wrap", "drop", "deep"])
    if kind == "shape" and entry["shape"]:
        entry["shape"][int(rng.integers(len(entry["shape"])))] += 1
    elif kind == "dtype":
        entry["dtype"] = pick(rng, ["F16", "F8_E4M3", "I32", "BF16", "X", 7])
    elif kind == "offsets":
        entry["data_offsets"] = [o + int(rng.integers(1, 9)) for o in entry[
            "data_offsets"]]  # fmt: skip
    elif kind == "rename":
        header[name + "_x"] = header.pop(name)
    elif kind == "wrap":
        header[name] = [entry]
    elif kind == "drop":
        entry.pop(pick(rng, sorted(entry)))
    else:
        header[name] = json.loads("[" * 100 + "]" * 100)
    raw = json.dumps(header).encode()
    return f"header entry {name!r}: {kind}", len(raw).to_bytes(8, "little") + raw + body


def follows_config(model, config) -> bool:
    """Whether every block has the head count `config` states."""
    args = config.get("model_args", config) if isinstance(config, dict) else {}
    heads = args.get("num_heads", args.get("num_attention_heads"))
    return heads is not None and model.get_layer("block_0").num_heads == heads


def outcome(folder, images, expected, config, what) -> str:
    """'refused', 'same', or 'follows' (a config-only number changed and the
    model has it); fails the test on anything else."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = convert_checkpoint(folder)
        except ValueError as error:
            message = str(error)
            assert message and "\n" not in message, message
            return "refused"
    logits = np.asarray(model(images, training=False))
    scale = float(np.max(np.abs(expected)))
    same = logits.shape == expected.shape and np.all(
        np.abs(logits - expected) <= FLOAT32_PARITY * scale
    )
    if same:
        return "same"
    if any(f"'{key}'" in what for key in CONFIG_ONLY) and follows_config(model, config):
        return "follows"
    # A head count nothing states is guessed with a warning: different, but
    # said so.
    said = [str(w.message) for w in caught if "assuming" in str(w.message)]
    assert said, "converted to a different model without a word"
    return "guessed"


def test_mutated_checkpoints_convert_the_same_or_are_refused(tmp_path):
    rng = np.random.default_rng(SEED)
    sources = {}
    for name in SOURCES:
        parity = np.load(FIXTURES / name / "parity.npz")
        reference = convert_checkpoint(FIXTURES / name)
        images = parity["images"][:1]
        sources[name] = (
            (FIXTURES / name / "model.safetensors").read_bytes(),
            json.loads((FIXTURES / name / "config.json").read_text()),
            images,
            np.asarray(reference(images, training=False)),
        )
    counts = {"refused": 0, "same": 0, "follows": 0, "guessed": 0}
    for case in range(CASES):
        name = SOURCES[case % len(SOURCES)]
        data, config, images, expected = sources[name]
        config = json.loads(json.dumps(config))
        if rng.random() < 0.4:
            what, data = mutate_header(rng, data)
        else:
            what, config = mutate_config(rng, config)
        folder = tmp_path / f"case{case}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(data)
        text = config if isinstance(config, str) else json.dumps(config)
        (folder / "config.json").write_text(text)
        try:
            counts[outcome(folder, images, expected, config, what)] += 1
        except Exception as error:  # noqa: BLE001 - names the case that failed
            pytest.fail(f"case {case} of {name} ({what}): {type(error).__name__}: "
                        f"{str(error)[:300]}")  # fmt: skip
    # Both outcomes occur: the mutations reach past the first check.
    assert counts["refused"] >= 40 and counts["same"] >= 20, counts
