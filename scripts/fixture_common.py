"""Helpers shared by the fixture scripts (scripts/make_fixtures.py,
scripts/fixtures_whole.py, scripts/make_family_fixtures.py and
scripts/make_hf_family_fixtures.py): seeded random tensors, their digest, test
images, and the parity file. numpy alone, except the torch helpers, which
import torch when called; tests/test_weights.py loads this file to rebuild a
fixture's tensors without torch."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np


def random_state_dict(names_and_shapes, seed: int) -> dict[str, np.ndarray]:
    """Seeded float32 values for each `(name, shape)`, with numpy only.

    Norm scales are around 1, every other tensor around 0 with stddev 0.02.
    `RandomState` streams are frozen across numpy versions, so the test
    rebuilds the same values as this script.
    """
    rs = np.random.RandomState(seed)
    out = {}
    for name, shape in names_and_shapes:
        values = rs.standard_normal(tuple(shape))
        leaf = name.replace("/", ".").split(".")
        is_scale = len(shape) == 1 and (
            leaf[-1] == "scale"
            or (leaf[-1] == "weight" and any("norm" in part for part in leaf))
        )
        if is_scale:
            values = 1.0 + 0.1 * values
        else:
            values = 0.02 * values
        out[name] = values.astype("float32")
    return out


def digest(tensors: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(np.ascontiguousarray(tensors[name]).tobytes())
    return h.hexdigest()


def images(shape, seed: int) -> np.ndarray:
    return np.random.RandomState(seed).standard_normal(shape).astype("float32")


def randomize(model, seed: int) -> None:
    import torch

    state = model.state_dict()
    values = random_state_dict([(k, tuple(v.shape)) for k, v in state.items()], seed)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in values.items()})


def randomize_scaled(model, seed: int, scales=("gamma",)) -> None:
    """Weights scaled by fan-in (activations of order 1), biases, tokens and
    position tables of order 0.1-0.5, norm scales (and tensors ending in
    one of `scales`: LayerScale) around 1, so that every nonlinearity works
    away from zero and a wrong activation or norm shows in the outputs."""
    import torch

    rs = np.random.RandomState(seed)
    state = {}
    for name, tensor in model.state_dict().items():
        shape = tuple(tensor.shape)
        if not tensor.is_floating_point():  # index buffers (position_ids)
            state[name] = tensor
            continue
        values = rs.standard_normal(shape)
        if tensor.ndim >= 2 and not name.endswith(("_token", "pos_embed", "latent")):
            values = values / np.sqrt(np.prod(shape[1:]))
        elif "norm" in name and name.endswith("weight") or name.endswith(scales):
            values = 1.0 + 0.1 * values
        elif tensor.ndim >= 2:
            values = 0.5 * values
        else:
            values = 0.1 * values
        state[name] = torch.from_numpy(np.asarray(values, dtype="float32"))
    model.load_state_dict(state)


def torch_logits(model, x_nhwc: np.ndarray) -> np.ndarray:
    import torch

    model.eval()
    with torch.no_grad():
        out = model(torch.from_numpy(x_nhwc.transpose(0, 3, 1, 2).copy()))
    out = getattr(out, "logits", out)
    return out.numpy().astype("float32")


def write_parity(folder: Path, x: np.ndarray, logits: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "parity.npz", images=x, logits=logits)


def jax_vit_tensors(
    prefix: str,
    hidden: int,
    depth: int,
    heads: int,
    mlp: int,
    patch: int,
    tokens: int,
    classes: int,
    big_vision: bool,
    class_token: bool,
) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of a vit_jax (AugReg) or big_vision ViT `.npz`."""
    hd = hidden // heads
    spec = [
        ("embedding/kernel", (patch, patch, 3, hidden)),
        ("embedding/bias", (hidden,)),
    ]
    if class_token:
        spec.append(("cls", (1, 1, hidden)))
    spec.append(
        (
            "pos_embedding"
            if big_vision
            else "Transformer/posembed_input/pos_embedding",
            (1, tokens, hidden),
        )
    )
    mha, ln2, mlp_name = (
        ("MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0")
        if big_vision
        else ("MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3")
    )
    block = [
        ("LayerNorm_0/scale", (hidden,)),
        ("LayerNorm_0/bias", (hidden,)),
        *[
            (f"{mha}/{n}/kernel", (hidden, heads, hd))
            for n in ("query", "key", "value")
        ],
        *[(f"{mha}/{n}/bias", (heads, hd)) for n in ("query", "key", "value")],
        (f"{mha}/out/kernel", (heads, hd, hidden)),
        (f"{mha}/out/bias", (hidden,)),
        (f"{ln2}/scale", (hidden,)),
        (f"{ln2}/bias", (hidden,)),
        (f"{mlp_name}/Dense_0/kernel", (hidden, mlp)),
        (f"{mlp_name}/Dense_0/bias", (mlp,)),
        (f"{mlp_name}/Dense_1/kernel", (mlp, hidden)),
        (f"{mlp_name}/Dense_1/bias", (hidden,)),
    ]
    if big_vision:
        # nn.scan over blocks: one tensor per name with a leading depth axis.
        spec += [(f"Transformer/encoderblock/{n}", (depth, *s)) for n, s in block]
    else:
        spec += [
            (f"Transformer/encoderblock_{i}/{n}", s)
            for i in range(depth)
            for n, s in block
        ]
    spec += [
        ("Transformer/encoder_norm/scale", (hidden,)),
        ("Transformer/encoder_norm/bias", (hidden,)),
        ("head/kernel", (hidden, classes)),
        ("head/bias", (classes,)),
    ]
    return [(prefix + n, s) for n, s in spec]
