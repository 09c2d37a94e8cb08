"""Looking inside a trained ViT: attention maps, rollout, position-embedding
similarity and mean attention distance, as arrays and as PNG pictures.

Everything works on any model built by keras_vit whose encoder is
`patch_encoder` followed by `block_0`, `block_1`, ... (`ViT` and
`HybridViT`): the stem (every layer up to `patch_encoder`) runs as a
sub-graph of the model, then each `TransformerBlock` is called in order with
`return_attention_scores=True`. The model's own layers and weights are used;
nothing is copied and the model is left unchanged.

Images are passed exactly as the model takes them (already resized and
normalised), one image `(height, width, channels)` or a batch. PNGs need
matplotlib (part of the main install; `pip install "keras-vit-tf[viz]"`
where it is missing); the arrays do not.
"""

from __future__ import annotations

import math
import weakref
from pathlib import Path

import keras
import numpy as np

from keras_vit.files import write_atomic
from keras_vit.models.blocks import TransformerBlock
from keras_vit.models.layers import PatchEncoder


def _encoder_layers(model: keras.Model) -> tuple[PatchEncoder, list[TransformerBlock]]:
    try:
        encoder = model.get_layer("patch_encoder")
    except ValueError:
        raise ValueError(
            f"Model {model.name!r} has no 'patch_encoder' layer; attention "
            "maps need a model built by keras_vit (ViT or HybridViT)."
        ) from None
    names = {layer.name for layer in model.layers}
    blocks = []
    while f"block_{len(blocks)}" in names:
        blocks.append(model.get_layer(f"block_{len(blocks)}"))
    if not isinstance(encoder, PatchEncoder) or not blocks:
        raise ValueError(
            f"Model {model.name!r} has no PatchEncoder 'patch_encoder' followed "
            "by TransformerBlocks 'block_0', 'block_1', ...; it was not built "
            "by keras_vit."
        )
    for block in blocks:
        if not isinstance(block, TransformerBlock):
            raise ValueError(
                f"Layer {block.name!r} of model {model.name!r} is a "
                f"{type(block).__name__}, not a TransformerBlock."
            )
    return encoder, blocks


# One stem model per model, reused across calls.
_STEMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _stem(model: keras.Model) -> keras.Model:
    """`model`'s graph from its inputs up to `patch_encoder`'s output: for a
    ViT `Patches` + `PatchEncoder`, for a hybrid the CNN, `Patches(1)` and
    `PatchEncoder`. Made of the existing nodes, so `model` is not changed."""
    stem = _STEMS.get(model)
    if stem is None:
        encoder, _ = _encoder_layers(model)
        stem = keras.Model(model.input, encoder.output, name=f"{model.name}_stem")
        _STEMS[model] = stem
    return stem


def _batch(model: keras.Model, images) -> np.ndarray:
    images = np.asarray(images, dtype="float32")
    expected = tuple(model.inputs[0].shape[1:])
    if images.shape == expected:
        images = images[None]
    if images.ndim != len(expected) + 1 or tuple(images.shape[1:]) != expected:
        raise ValueError(
            f"Images of shape {images.shape} do not fit model {model.name!r}, "
            f"which takes {expected} (one image) or (batch, *{expected}); "
            "resize and normalise them as in training first."
        )
    return images


def attention_scores(model: keras.Model, images) -> list[np.ndarray]:
    """Attention probabilities of every block for `images`.

    Args:
        model: a keras_vit `ViT` or `HybridViT`.
        images: one image `(height, width, channels)` or a batch, as the model
            takes them.

    Returns:
        One float32 array per block, `(batch, num_heads, num_tokens,
        num_tokens)`; row `q` of a head is the distribution over keys that
        token `q` attends to (rows sum to 1).
    """
    batch = _batch(model, images)
    encoder, blocks = _encoder_layers(model)
    for i, block in enumerate(blocks):
        # Blocks are called eagerly (a symbolic call would add nodes to the
        # shared layers), so check the model really chains them in order.
        expected = encoder.output if i == 0 else blocks[i - 1].output
        if block.input is not expected:
            previous = "patch_encoder" if i == 0 else blocks[i - 1].name
            raise ValueError(
                f"Block {block.name!r} of model {model.name!r} does not take the "
                f"output of {previous!r}; attention maps need the straight "
                "encoder patch_encoder -> block_0 -> block_1 -> ..."
            )
    x = _stem(model)(batch, training=False)
    scores = []
    for block in blocks:
        x, block_scores = block(x, training=False, return_attention_scores=True)
        scores.append(np.asarray(block_scores, dtype="float32"))
    return scores


def _chunks(batch: np.ndarray, size: int = 16):
    for start in range(0, len(batch), size):
        yield batch[start : start + size]


def grid_size(model: keras.Model) -> tuple[int, int]:
    """`(rows, cols)` of the model's patch grid."""
    encoder, _ = _encoder_layers(model)
    num_patches = encoder.input.shape[1]
    return encoder._resolve_grid(num_patches)


def _patch_rows(scores: np.ndarray, prefix: int, class_token: bool) -> np.ndarray:
    """What the image is pooled from: the class token's attention over the
    patches, or (no class token: GAP, MAP) the mean over patch queries.
    Prefix tokens (registers too, as in Darcet et al. 2024) are left out."""
    if class_token:
        return scores[..., 0, prefix:]
    return scores[..., prefix:, prefix:].mean(axis=-2)


def _without_registers(matrix: np.ndarray, encoder) -> np.ndarray:
    """A `(tokens, tokens)` attention matrix without the register tokens'
    rows and columns, rows renormalised: rollout then follows only what the
    class and patch tokens exchange."""
    start = encoder.num_embedded_prefix_tokens
    stop = start + encoder.num_register_tokens
    if stop == start:
        return matrix
    keep = np.r_[0:start, stop : len(matrix)]
    matrix = matrix[np.ix_(keep, keep)]
    return matrix / matrix.sum(axis=-1, keepdims=True)


def attention_maps(
    model: keras.Model, image, block: int = -1, save_to: str | Path | None = None
) -> np.ndarray:
    """Per-head attention of one block over the patch grid, for one image.

    For a model with a class token this is the class token's attention to
    every patch; without one (GAP pooling) it is the attention each patch
    receives, averaged over the patch queries.

    Args:
        model: a keras_vit `ViT` or `HybridViT`.
        image: `(height, width, channels)`, as the model takes it.
        block: int, index of the block (negative counts from the end).
        save_to: path of a PNG showing each head's map over the image.

    Returns:
        `(num_heads, rows, cols)` float32.
    """
    batch = _batch(model, image)
    if len(batch) != 1:
        raise ValueError(
            f"attention_maps takes one image, got a batch of {len(batch)}."
        )
    encoder, blocks = _encoder_layers(model)
    if not -len(blocks) <= block < len(blocks):
        raise ValueError(
            f"block {block} is out of range for a model with {len(blocks)} "
            f"blocks; valid: {-len(blocks)}..{len(blocks) - 1}."
        )
    scores = attention_scores(model, batch)[block][0]
    maps = _patch_rows(scores, encoder.num_prefix_tokens, encoder.class_token)
    maps = maps.reshape(len(maps), *grid_size(model))
    if save_to is not None:
        index = block % len(blocks)
        titles = [f"head {h}" for h in range(len(maps))]
        _save_overlays(
            batch[0], maps, titles, f"{model.name}: block {index} attention", save_to
        )
    return maps


def attention_rollout(
    model: keras.Model, image, save_to: str | Path | None = None
) -> np.ndarray:
    """Attention rollout over all blocks (Abnar & Zuidema, 2020), one image.

    Each block's attention is averaged over heads, the identity is added for
    the residual connection and rows are renormalised; the blocks' matrices
    are multiplied from the first to the last. The result is the class
    token's row over the patches (for a model without class token, the mean
    of the patch rows), normalised to sum to 1. Register tokens' rows and
    columns are removed from each block's matrix first (renormalised), so
    the rollout follows only the class and patch tokens.

    Returns:
        `(rows, cols)` float64 summing to 1.
    """
    batch = _batch(model, image)
    if len(batch) != 1:
        raise ValueError(
            f"attention_rollout takes one image, got a batch of {len(batch)}."
        )
    encoder, _ = _encoder_layers(model)
    rollout = None
    for scores in attention_scores(model, batch):
        mixed = _without_registers(scores[0].astype("float64").mean(axis=0), encoder)
        mixed = mixed + np.eye(len(mixed))
        mixed = mixed / mixed.sum(axis=-1, keepdims=True)
        rollout = mixed if rollout is None else mixed @ rollout
    # Registers are no longer in the rollout matrix.
    result = _patch_rows(
        rollout, encoder.num_embedded_prefix_tokens, encoder.class_token
    )
    result = (result / result.sum()).reshape(grid_size(model))
    if save_to is not None:
        _save_overlays(
            batch[0],
            result[None],
            ["rollout"],
            f"{model.name}: attention rollout",
            save_to,
        )
    return result


def position_embedding_similarity(
    model: keras.Model, save_to: str | Path | None = None
) -> np.ndarray:
    """Cosine similarity between the patches' position embeddings.

    As in the ViT paper's Figure 7 (centre): entry `[r, c]` is a
    `(rows, cols)` map of how similar patch `(r, c)`'s embedding is to every
    other patch's. Prefix-token embeddings are left out.

    Returns:
        `(rows, cols, rows, cols)` float32 in [-1, 1]; the PNG is a grid of
        grids.
    """
    encoder, _ = _encoder_layers(model)
    rows, cols = grid_size(model)
    table = np.asarray(encoder.pos_embedding, dtype="float32")[0]
    table = table[-rows * cols :]
    unit = table / np.maximum(np.linalg.norm(table, axis=-1, keepdims=True), 1e-12)
    similarity = (unit @ unit.T).reshape(rows, cols, rows, cols)
    if save_to is not None:
        _save_similarity_grid(similarity, f"{model.name}: position embedding", save_to)
    return similarity


def mean_attention_distance(
    model: keras.Model, images, save_to: str | Path | None = None
) -> np.ndarray:
    """Mean attention distance per block and head, in input pixels.

    As in the ViT paper's Figure 7 (right): for each patch query, the
    distance between patch centres weighted by the attention it pays to the
    other patches (prefix tokens left out, weights renormalised over the
    patches), averaged over queries and images. A patch spans
    `image_height / rows` by `image_width / cols` input pixels, so hybrid
    models are measured in input pixels too.

    Args:
        images: one image or a batch; more images give a steadier estimate.

    Returns:
        `(num_layers, num_heads)` float64.
    """
    batch = _batch(model, images)
    encoder, _ = _encoder_layers(model)
    rows, cols = grid_size(model)
    height, width = model.inputs[0].shape[1:3]
    y, x = np.meshgrid(
        (np.arange(rows) + 0.5) * height / rows,
        (np.arange(cols) + 0.5) * width / cols,
        indexing="ij",
    )
    centres = np.stack([y.ravel(), x.ravel()], axis=-1)
    distance = np.linalg.norm(centres[:, None] - centres[None], axis=-1)
    prefix = encoder.num_prefix_tokens
    total = 0.0
    # In chunks: a batch of B/16 scores at 224 is 1.9 MB per image and block.
    for chunk in _chunks(batch):
        per_block = []
        for scores in attention_scores(model, chunk):
            weights = scores[..., prefix:, prefix:].astype("float64")
            weights = weights / weights.sum(axis=-1, keepdims=True)
            per_query = (weights * distance).sum(axis=-1)
            per_block.append(per_query.mean(axis=2).sum(axis=0))
        total = total + np.stack(per_block)
    result = total / len(batch)
    if save_to is not None:
        _save_distance_plot(result, f"{model.name}: mean attention distance", save_to)
    return result


def _figure(width: float, height: float):
    """A matplotlib Figure drawn by the Agg canvas, without pyplot's global
    state (safe in notebooks and threads)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(
            "Saving PNGs needs matplotlib, which is not installed; install it "
            'with: pip install "keras-vit-tf[viz]" (the arrays work without it).'
        ) from None
    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path: str | Path) -> None:
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"save_to must be a .png path, got {str(path)!r}.")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(
        path, lambda temp: figure.savefig(temp, format="png", bbox_inches="tight")
    )


def _display(image: np.ndarray) -> np.ndarray:
    """Normalised model input -> [0, 1] for display (min-max per image)."""
    image = image.astype("float64")
    low, high = image.min(), image.max()
    image = (image - low) / (high - low) if high > low else np.zeros_like(image)
    if image.shape[-1] == 1:
        return image[..., 0]
    if image.shape[-1] != 3:
        return image.mean(axis=-1)
    return image


def _save_overlays(image, maps, titles, suptitle, path) -> None:
    shown = _display(image)
    height, width = image.shape[:2]
    count = len(maps) + 1
    columns = min(count, 5)
    lines = math.ceil(count / columns)
    figure = _figure(2.2 * columns, 2.4 * lines)
    figure.suptitle(suptitle, fontsize=9)
    panels = [(shown, "input", None)] + [
        (shown, t, m) for t, m in zip(titles, maps, strict=True)
    ]
    for i, (picture, title, heat) in enumerate(panels):
        axes = figure.add_subplot(lines, columns, i + 1)
        axes.imshow(picture, cmap="gray" if picture.ndim == 2 else None)
        if heat is not None:
            axes.imshow(
                heat,
                cmap="inferno",
                alpha=0.6,
                interpolation="bilinear",
                extent=(-0.5, width - 0.5, height - 0.5, -0.5),
            )
        axes.set_title(title, fontsize=8)
        axes.axis("off")
    _save(figure, path)


def _save_similarity_grid(similarity, suptitle, path) -> None:
    rows, cols = similarity.shape[:2]
    figure = _figure(max(3.0, 0.5 * cols), max(3.0, 0.5 * rows))
    figure.suptitle(suptitle, fontsize=9)
    for r in range(rows):
        for c in range(cols):
            axes = figure.add_subplot(rows, cols, r * cols + c + 1)
            axes.imshow(similarity[r, c], cmap="viridis", vmin=-1, vmax=1)
            axes.axis("off")
    _save(figure, path)


def _save_distance_plot(distance, suptitle, path) -> None:
    figure = _figure(4.0, 3.0)
    axes = figure.add_subplot(1, 1, 1)
    num_layers, num_heads = distance.shape
    for head in range(num_heads):
        axes.scatter(np.arange(num_layers), distance[:, head], s=12)
    axes.set_xlabel("block")
    axes.set_ylabel("mean attention distance (pixels)")
    axes.set_title(suptitle, fontsize=9)
    _save(figure, path)
