"""Dense features: the patch tokens of chosen encoder blocks, as grids for
detection and segmentation heads or as token sequences (timm's
`forward_intermediates`, keras-hub's `pyramid_outputs`)."""

from __future__ import annotations

import keras
from keras import ops

from keras_vit.models.sublayers import register

OUTPUTS = ("grid", "tokens")


@register
class PatchTokens(keras.layers.Layer):
    """Drops the prefix tokens and, with a grid size, lays the patch tokens
    out on the patch grid.

    Args:
        num_prefix_tokens: int, class/distillation tokens in front to drop.
        grid_size: `(rows, cols)` or None; None keeps the token sequence.

    Call arguments:
        x: `(batch, num_prefix_tokens + rows * cols, hidden_dim)`.

    Returns:
        `(batch, rows, cols, hidden_dim)` with a grid size, else
        `(batch, rows * cols, hidden_dim)`.
    """

    def __init__(
        self,
        num_prefix_tokens: int = 0,
        grid_size: tuple[int, int] | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if int(num_prefix_tokens) < 0:
            raise ValueError(
                f"`num_prefix_tokens` must be >= 0, got {num_prefix_tokens!r}."
            )
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.grid_size = None if grid_size is None else tuple(int(g) for g in grid_size)

    def call(self, x):
        x = x[:, self.num_prefix_tokens :]
        if self.grid_size is None:
            return x
        return ops.reshape(x, (-1, *self.grid_size, x.shape[-1]))

    def compute_output_shape(self, input_shape):
        if self.grid_size is None:
            tokens = input_shape[1]
            tokens = None if tokens is None else tokens - self.num_prefix_tokens
            return (input_shape[0], tokens, input_shape[-1])
        return (input_shape[0], *self.grid_size, input_shape[-1])

    def get_config(self):
        return {
            **super().get_config(),
            "num_prefix_tokens": self.num_prefix_tokens,
            "grid_size": self.grid_size,
        }


def _block_layers(model: keras.Model) -> list[keras.layers.Layer]:
    blocks = {}
    for layer in model.layers:
        prefix, _, index = layer.name.partition("_")
        if prefix == "block" and index.isdigit():
            blocks[int(index)] = layer
    if not blocks:
        raise ValueError(
            f"Model {model.name!r} has no 'block_<i>' layers; feature_extractor "
            "needs a keras_vit ViT or HybridViT."
        )
    return [blocks[i] for i in sorted(blocks)]


def feature_extractor(
    model: keras.Model,
    blocks=(-1,),
    output: str = "grid",
    include_prefix: bool = False,
) -> keras.Model:
    """A model from the same images to the chosen blocks' token features.

    It shares `model`'s layers (and weights). A class-token model computes
    only the prefix tokens in its last block; when the last block is
    requested it is run again on all tokens, otherwise it is not run at all.

    Args:
        model: a keras_vit `ViT` or `HybridViT`.
        blocks: int or ints, 0-based block indices as in the layer names
            `block_0`, ...; negative ones count from the end (`-1`: last).
        output: `"grid"` for `(batch, rows, cols, hidden_dim)` patch grids, or
            `"tokens"` for `(batch, num_tokens, hidden_dim)` sequences.
        include_prefix: keep the class/distillation tokens in front of the
            patch tokens; only with `output="tokens"`.

    Returns:
        A `keras.Model` whose outputs are a dict `{"block_<i>": features}`.
    """
    if output not in OUTPUTS:
        raise ValueError(f"`output` must be 'grid' or 'tokens', got {output!r}.")
    if include_prefix and output == "grid":
        raise ValueError(
            "`include_prefix=True` needs output='tokens'; a grid holds only the "
            "patch tokens."
        )
    if output == "grid" and None in tuple(model.inputs[0].shape[1:3]):
        raise ValueError(
            f"output='grid' needs a fixed image size, but {model.name!r} is a "
            "dynamic-size model; use output='tokens' (any size), or "
            "with_image_size(model, size) for grids at one size."
        )
    layers = _block_layers(model)
    count = len(layers)
    wanted = [blocks] if isinstance(blocks, int) else list(blocks)
    if not wanted:
        raise ValueError("`blocks` must name at least one block.")
    indices = []
    for b in wanted:
        if isinstance(b, bool) or not isinstance(b, int) or not -count <= b < count:
            raise ValueError(
                f"Block index {b!r} is out of range for {count} blocks; valid are "
                f"0..{count - 1} or -{count}..-1."
            )
        indices.append(b % count)
    encoder = model.get_layer("patch_encoder")
    prefix = encoder.num_prefix_tokens
    grid = encoder.grid_size if output == "grid" else None
    outputs = {}
    for i in indices:
        block = layers[i]
        tokens = block.output
        # A RoPE block also takes the rotary tables (`rope=`).
        arguments = block._inbound_nodes[0].arguments
        block_input = arguments.args[0]
        if tokens.shape[1] != block_input.shape[1]:
            # The last block of a class-token model kept only the prefix.
            rope = {k: v for k, v in arguments.kwargs.items() if k == "rope"}
            tokens = block(block_input, **rope)
        drop = 0 if include_prefix else prefix
        outputs[block.name] = PatchTokens(drop, grid, name=f"{block.name}_{output}")(
            tokens
        )
    return keras.Model(model.input, outputs, name=f"{model.name}_features")


__all__ = ["PatchTokens", "feature_extractor"]
