"""Hybrid ViT: a CNN stem whose feature map is cut into 1x1 patches and fed to
exactly the transformer `ViT` uses (`vit.build_transformer`).

Two kinds of stem:

* the paper's ResNet-v2 with GroupNorm and weight-standardised convolutions
  ("R50" = blocks (3, 4, 9), output stride 16, as in R50+ViT-B/16; "R26" =
  (2, 2, 2, 2), stride 32), laid out like timm's `ResNetV2(preact=False,
  stem_type="same")` so timm hybrid checkpoints convert;
* `"cnn"`: `SmallCNN`'s stages of 3x3 convolutions (`cnn_widths`, batch
  norm, 2x2 pooling between stages), output stride `2 ** (stages - 1)`: a stem
  sized for small images (28x28 -> a 7x7 grid with three stages), where the
  ResNet's stride-4 entry (7x7 conv and pooling) would leave too little;
* any `keras.applications` model by name, cut at the requested output stride.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_vit.models.cnn import check_widths, conv_stages
from keras_vit.models.layers import Patches
from keras_vit.models.vit import (
    build_transformer,
    check_transformer_options,
    image_hw,
    image_input,
    parse_variant,
    split_architecture,
    split_variant,
)

register = keras.saving.register_keras_serializable(package="keras_vit")

# Blocks per stage; the output stride is 4 * 2 ** (stages - 1).
RESNET_STEMS = {
    "R26": (2, 2, 2, 2),
    "R50": (3, 4, 9),
}
CNN_STEM = "cnn"


@register
class StdConv2D(keras.layers.Layer):
    """2-D convolution with weight standardisation (BiT / ViT-hybrid ResNets).

    Each output filter of the kernel is normalised to zero mean and unit
    variance over `(kernel_h, kernel_w, in_channels)` before the convolution,
    in float32 (the eps is tiny). Padding is TensorFlow's `"same"`, which is
    what timm's `StdConv2dSame` reproduces, so converted weights match.

    Args:
        filters: int, output channels.
        kernel_size: int, side of the square kernel.
        strides: int, stride in both directions.
        use_bias: bool, add a bias after the convolution.
        epsilon: float, added to the filter variance (timm's hybrid ViTs use
            1e-8).

    Call arguments:
        x: `(batch, height, width, in_channels)`.

    Returns:
        `(batch, ceil(height / strides), ceil(width / strides), filters)`.
    """

    def __init__(
        self,
        filters: int,
        kernel_size: int,
        strides: int = 1,
        use_bias: bool = False,
        epsilon: float = 1e-8,
        **kwargs,
    ):
        super().__init__(**kwargs)
        for arg, value in (("filters", filters), ("kernel_size", kernel_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{arg}` must be a positive int, got {value!r}.")
        if isinstance(strides, bool) or not isinstance(strides, int) or strides < 1:
            raise ValueError(f"`strides` must be a positive int, got {strides!r}.")
        if not float(epsilon) > 0.0:
            raise ValueError(f"`epsilon` must be > 0, got {epsilon!r}.")
        self.filters = filters
        self.kernel_size = kernel_size
        self.strides = strides
        self.use_bias = bool(use_bias)
        self.epsilon = float(epsilon)

    def build(self, input_shape):
        self.kernel = self.add_weight(
            shape=(self.kernel_size, self.kernel_size, input_shape[-1], self.filters),
            initializer="he_normal",
            name="kernel",
        )
        if self.use_bias:
            self.bias = self.add_weight(
                shape=(self.filters,), initializer="zeros", name="bias"
            )

    def standardized_kernel(self):
        kernel = ops.cast(self.kernel, "float32")
        mean = ops.mean(kernel, axis=(0, 1, 2), keepdims=True)
        variance = ops.var(kernel, axis=(0, 1, 2), keepdims=True)
        return (kernel - mean) / ops.sqrt(variance + self.epsilon)

    def call(self, x):
        kernel = ops.cast(self.standardized_kernel(), x.dtype)
        y = ops.conv(x, kernel, strides=self.strides, padding="same")
        if self.use_bias:
            y = y + ops.cast(self.bias, y.dtype)
        return y

    def compute_output_shape(self, input_shape):
        def out(size):
            return None if size is None else -(-size // self.strides)

        return (input_shape[0], out(input_shape[1]), out(input_shape[2]), self.filters)

    def get_config(self):
        return {
            **super().get_config(),
            "filters": self.filters,
            "kernel_size": self.kernel_size,
            "strides": self.strides,
            "use_bias": self.use_bias,
            "epsilon": self.epsilon,
        }


def _group_norm(channels: int, groups: int, name: str):
    if channels % groups:
        raise ValueError(
            f"norm_groups={groups} does not divide the {channels} channels of "
            f"{name!r}; pick a divisor of every stage width."
        )
    # timm's GroupNormAct keeps torch's default eps.
    return keras.layers.GroupNormalization(groups=groups, epsilon=1e-5, name=name)


def resnet_v2_stem(
    images,
    blocks: tuple[int, ...],
    stem_width: int = 64,
    norm_groups: int = 32,
):
    """The hybrid ViT's ResNet (non-pre-activation bottlenecks, GroupNorm,
    weight-standardised convs) applied to `images`; returns the feature map.

    Stage `s` has `blocks[s]` bottlenecks of width `stem_width * 2**s` and
    output `4 * stem_width * 2**s`; the first stage keeps the stride-4 stem
    resolution, each later one halves it. Layers are named
    `stem_conv`, `stem_norm`, `stem_pool`, `stage{s}_block{b}_{conv1,norm1,...}`
    so that timm's `patch_embed.backbone.*` tensors map onto them by name.
    """
    x = StdConv2D(stem_width, 7, strides=2, name="stem_conv")(images)
    x = _group_norm(stem_width, norm_groups, "stem_norm")(x)
    x = keras.layers.ReLU(name="stem_relu")(x)
    x = keras.layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool")(x)
    in_channels = stem_width
    for s, depth in enumerate(blocks):
        width = stem_width * 2**s
        out_channels = 4 * width
        for b in range(depth):
            name = f"stage{s}_block{b}"
            stride = 2 if s > 0 and b == 0 else 1
            shortcut = x
            if b == 0 and (stride != 1 or in_channels != out_channels):
                shortcut = StdConv2D(
                    out_channels, 1, strides=stride, name=f"{name}_downsample_conv"
                )(x)
                shortcut = _group_norm(
                    out_channels, norm_groups, f"{name}_downsample_norm"
                )(shortcut)
            y = StdConv2D(width, 1, name=f"{name}_conv1")(x)
            y = _group_norm(width, norm_groups, f"{name}_norm1")(y)
            y = keras.layers.ReLU(name=f"{name}_relu1")(y)
            y = StdConv2D(width, 3, strides=stride, name=f"{name}_conv2")(y)
            y = _group_norm(width, norm_groups, f"{name}_norm2")(y)
            y = keras.layers.ReLU(name=f"{name}_relu2")(y)
            y = StdConv2D(out_channels, 1, name=f"{name}_conv3")(y)
            y = _group_norm(out_channels, norm_groups, f"{name}_norm3")(y)
            y = keras.layers.Add(name=f"{name}_add")([y, shortcut])
            x = keras.layers.ReLU(name=f"{name}_out")(y)
        in_channels = out_channels
    return x


def keras_application_names() -> list[str]:
    return sorted(
        n
        for n in dir(keras.applications)
        if n[:1].isupper() and callable(getattr(keras.applications, n))
    )


def application_stem(images, name: str, output_stride: int, weights: str | None = None):
    """A `keras.applications` model built on `images`, cut at the last layer
    whose output is at `output_stride` (e.g. ResNet50, stride 16:
    `conv4_block6_out`). Its layers join the caller's graph, so the whole
    hybrid stays one flat functional model."""
    valid = keras_application_names()
    if name not in valid:
        raise ValueError(
            f"Unknown stem {name!r}; valid stems are {sorted(RESNET_STEMS)} (the "
            f"paper's ResNet-v2) or a keras.applications model: {', '.join(valid)}."
        )
    height, width = images.shape[1:3]
    backbone = getattr(keras.applications, name)(
        include_top=False, weights=weights, input_tensor=images
    )
    target = (height // output_stride, width // output_stride)
    cut = None
    for layer in backbone.layers:
        shape = layer.output.shape
        if len(shape) == 4 and tuple(shape[1:3]) == target:
            cut = layer
    if cut is None:
        strides = sorted(
            {
                height // layer.output.shape[1]
                for layer in backbone.layers
                if len(layer.output.shape) == 4 and layer.output.shape[1]
            }
        )
        raise ValueError(
            f"{name} has no feature map at output_stride={output_stride} for a "
            f"{height}x{width} input; its strides are {strides}."
        )
    return cut.output


def _resnet_blocks(stem) -> tuple[tuple[int, ...] | None, str]:
    """`(blocks per stage or None for a keras.applications stem, the label
    the default model name uses)` for the `stem` argument."""
    if isinstance(stem, str) and stem in RESNET_STEMS:
        return RESNET_STEMS[stem], stem.lower()
    if isinstance(stem, (tuple, list)):
        blocks = tuple(stem)
        if not blocks or any(
            isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in blocks
        ):
            raise ValueError(
                f"A ResNet-v2 stem needs positive block counts per stage, got {stem!r}."
            )
        return blocks, "r" + "".join(str(b) for b in blocks)
    if isinstance(stem, str):
        return None, stem.lower()
    raise ValueError(
        f"`stem` must be 'R50', 'R26', a tuple of block counts or a "
        f"keras.applications name, got {stem!r}."
    )


def _stem_stride(blocks, output_stride, stem_weights) -> int:
    """The stem's output stride, which is the transformer's patch size."""
    if blocks is None:
        stride = 16 if output_stride is None else output_stride
        if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
            raise ValueError(f"`output_stride` must be a positive int, got {stride!r}.")
        return stride
    stride = 4 * 2 ** (len(blocks) - 1)
    if output_stride is not None and output_stride != stride:
        raise ValueError(
            f"A ResNet-v2 stem with {len(blocks)} stages has output stride "
            f"{stride}, not output_stride={output_stride}; change the stages."
        )
    if stem_weights is not None:
        raise ValueError(
            f"stem_weights={stem_weights!r} only applies to keras.applications "
            "stems; load ResNet-v2 hybrid weights with keras_vit.models.resolution."
        )
    return stride


def _stem_plan(stem, cnn_widths, output_stride, stem_weights):
    """`(ResNet blocks or None, CNN widths or None, name label, stride)`."""
    if not (isinstance(stem, str) and stem == CNN_STEM):
        blocks, label = _resnet_blocks(stem)
        return blocks, None, label, _stem_stride(blocks, output_stride, stem_weights)
    widths = check_widths(cnn_widths)
    stride = 2 ** (len(widths) - 1)
    if output_stride is not None and output_stride != stride:
        raise ValueError(
            f"The 'cnn' stem with {len(widths)} stages has output stride {stride}, "
            f"not output_stride={output_stride}; change cnn_widths."
        )
    if stem_weights is not None:
        raise ValueError(
            f"stem_weights={stem_weights!r} only applies to keras.applications "
            "stems; the 'cnn' stem starts random."
        )
    return None, widths, CNN_STEM, stride


def HybridViT(
    variant: str = "B",
    image_size: int | tuple[int, int] = 224,
    num_classes: int = 1000,
    *,
    stem: str | tuple[int, ...] = "R50",
    stem_width: int = 64,
    cnn_widths: tuple[int, ...] = (32, 64, 128),
    norm_groups: int = 32,
    output_stride: int | None = None,
    stem_weights: str | None = None,
    num_channels: int = 3,
    name: str | None = None,
    dynamic_size: bool = False,
    **options,
) -> keras.Model:
    """Builds a hybrid CNN + Vision Transformer as a functional `keras.Model`.

    Args:
        variant: transformer size from `VARIANTS` (`"B"`), optionally with the
            stem's output stride as its patch size (`"B/16"`, checked).
        image_size: int or `(height, width)`, divisible by the output stride.
        num_classes: int, size of the classification head.
        stem: `"R50"` or `"R26"` (the paper's ResNet-v2), a tuple of blocks
            per stage for another depth of that ResNet, or the name of a
            `keras.applications` model (`"ResNet50"`, `"EfficientNetB0"`...),
            or `"cnn"`: `SmallCNN`'s stages, for small images.
        stem_width: int, ResNet-v2 stem channels; stage `s` is
            `4 * stem_width * 2**s` wide (64 gives the paper's widths).
        cnn_widths: filters per stage of the `"cnn"` stem; its output stride
            is `2 ** (len(cnn_widths) - 1)` (28x28 -> 7x7 with three).
        norm_groups: int, GroupNorm groups of the ResNet-v2 stem.
        output_stride: int, where a `keras.applications` stem is cut
            (default 16). The ResNet-v2 stride follows from its stage count
            (4 * 2 ** (stages - 1)); passing another value is an error.
        stem_weights: `None` or `"imagenet"` for a `keras.applications` stem
            (`"imagenet"` downloads); the ResNet-v2 stem starts random or
            from a converted checkpoint (`keras_vit.models.resolution`).
        num_channels: int, image channels (3 for a pretrained applications
            stem).
        name: model name; defaults to e.g. `"vit_b_r50"`.
        dynamic_size: bool, accept any height and width that are multiples
            of the output stride, as `ViT(dynamic_size=True)` does
            (`image_size` is then the size the position embedding is made
            for); ResNet-v2 stems only, since a `keras.applications` stem is
            cut where its feature map has a given size. Other sizes are not
            refused: the stem's "same" convolutions give the ceiling grid.
        **options: as for `ViT`: `hidden_dim`, `num_layers`, `num_heads`,
            `mlp_dim` override the variant (the patch size is the stem's
            output stride); `include_top`, `pooling`, `distilled`,
            `drop_path_rate`, ... go to `vit.build_transformer`.

    Returns:
        A `keras.Model` from images `(batch, height, width, num_channels)` to
        float32 logits `(batch, num_classes)` (or features without top).
    """
    overrides, options = split_architecture(options)
    check_transformer_options(
        "HybridViT",
        options,
        hint=" (its patches are the stem's 1x1 features, so patch options "
        "such as shifted_patches do not apply)"
        if "shifted_patches" in options
        else "",
    )
    if "patch_size" in overrides:
        raise ValueError(
            f"HybridViT takes no patch_size (got {overrides['patch_size']!r}): "
            "its patches are the stem's 1x1 features; choose output_stride."
        )
    size, patch = split_variant(variant)
    arch = parse_variant(size, patch_size=1, **overrides)
    arch.pop("patch_size")
    blocks, widths, stem_label, stride = _stem_plan(
        stem, cnn_widths, output_stride, stem_weights
    )
    if patch and patch != stride:
        raise ValueError(
            f"variant {variant!r} asks for stride {patch}, but stem {stem!r} has "
            f"output stride {stride}."
        )
    height, width = image_hw(image_size)
    if height % stride or width % stride:
        raise ValueError(
            f"image_size {height}x{width} is not divisible by the stem's output "
            f"stride {stride}."
        )
    if name is None:
        name = f"vit_{(size or variant).lower()}_{stem_label}"
    if not isinstance(dynamic_size, bool):
        raise ValueError(f"`dynamic_size` must be True or False, got {dynamic_size!r}.")
    if dynamic_size and blocks is None and widths is None:
        raise ValueError(
            f"dynamic_size=True needs a ResNet-v2 stem ({sorted(RESNET_STEMS)} or "
            f"block counts); stem {stem!r} from keras.applications is cut at a "
            "fixed feature-map size. Use with_image_size for another size."
        )

    spatial = (None, None) if dynamic_size else (height, width)
    inputs = image_input(*spatial, num_channels)
    if widths is not None:
        features = conv_stages(inputs, widths)
    elif blocks is not None:
        features = resnet_v2_stem(inputs, blocks, stem_width, norm_groups)
    else:
        features = application_stem(inputs, stem, stride, stem_weights)
    # On their grid, the patches tell the encoder each image's grid.
    patches = Patches(1, flatten=not dynamic_size, name="patches")(features)
    return build_transformer(
        inputs,
        patches,
        (height // stride, width // stride),
        num_classes=num_classes,
        name=name,
        **arch,
        **options,
    )
