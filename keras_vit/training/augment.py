"""Train-time augmentation for `tf.data`, deterministic per element.

Every random draw is a pure function of `(seed, element index)` (or
`(seed, step)` for the batch-level MixUp / CutMix), so batch k of a training
stream is the same batch in every run and a resumed run can fast-forward with
`skip`. Keras' own augmentation layers (`RandAugment`, `MixUp`, `CutMix`) draw
from a stateful `SeedGenerator`; `ElementSeed` stands in for it and hands them
seeds derived from the element being transformed.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from keras.src.backend import random_seed_dtype
from keras.src.random.seed_generator import SeedGenerator


class ElementSeed(SeedGenerator):
    """A `SeedGenerator` without state: `next()` returns the seed of the
    element being traced, offset by how many draws the layer made before.

    Keras 3.15's image layers accept only an int or a `SeedGenerator` as
    seed; an int would give every element the same draw and the layer's own
    generator is a variable shared across `tf.data`'s parallel calls. `bind`
    is called inside the `map` function, so the draws follow the element.
    """

    def __init__(self):  # no state variable, on purpose
        self._element = None
        self._draws = 0

    def bind(self, seed) -> None:
        self._element = tf.cast(seed, random_seed_dtype())
        self._draws = 0

    def next(self, ordered=True):
        if self._element is None:
            raise RuntimeError("ElementSeed.bind(seed) must be called first.")
        self._draws += 1
        offset = tf.constant([0, 1_000_003], random_seed_dtype()) * self._draws
        return self._element + offset


def _use_seed(layer: keras.layers.Layer, seed: ElementSeed) -> keras.layers.Layer:
    for sub in [layer, *layer._flatten_layers(include_self=False)]:
        if hasattr(sub, "generator"):
            sub.generator = seed
    return layer


def random_resized_crop(
    image: tf.Tensor,
    size: tuple[int, int],
    seed: tf.Tensor,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    method: str = "bilinear",
) -> tf.Tensor:
    """Inception-style crop: a random box covering `scale` of the area with
    aspect ratio in `ratio`, resized to `size`. `(height, width, channels)`."""
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image),
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=seed,
        min_object_covered=0.0,
        aspect_ratio_range=ratio,
        area_range=scale,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    crop = tf.slice(image, begin, crop_size)
    crop.set_shape([None, None, image.shape[-1]])
    return tf.image.resize(crop, size, method=method)


class Augmenter:
    """The per-element and per-batch train-time augmentation of one run.

    Args:
        image_size: `(height, width)` the model takes.
        crop_scale: `(min, max)` area fraction for the random resized crop;
            `None` resizes the whole image instead.
        flip: random horizontal flips.
        randaugment_ops: number of RandAugment operations per image, 0 = off.
        randaugment_magnitude: RandAugment's `factor` in [0, 1].
        translate: largest random shift, as a fraction of the image side
            (0.125 at 16x16 is two pixels); 0 = off.
        rotate: largest random rotation in degrees; 0 = off.
        zoom: largest relative change of scale (0.1: 0.9x to 1.1x); 0 = off.
            Shift, rotation and zoom are one affine warp at the model's
            resolution (one interpolation, not three); pixels brought in
            from outside are 0, the background of digit data sets.
        elastic_alpha, elastic_sigma: an elastic distortion after the warp
            (Simard et al. 2003): a field of uniform [-1, 1] displacements,
            smoothed by a Gaussian of `elastic_sigma` pixels and scaled by
            `elastic_alpha` pixels; 0 = off. Simard's MNIST values are 34
            and 4.
        mixup_alpha, cutmix_alpha: Beta parameters; 0 = off. With both on,
            each batch uses one of them, chosen at random (as timm does).
        pixel_scale: images arrive as floats in `[0, pixel_scale]`.
        resize_method: interpolation for resizing.
        seed: the run's seed.
    """

    def __init__(
        self,
        image_size: tuple[int, int],
        *,
        crop_scale: tuple[float, float] | None = None,
        flip: bool = False,
        randaugment_ops: int = 0,
        randaugment_magnitude: float = 0.5,
        translate: float = 0.0,
        rotate: float = 0.0,
        zoom: float = 0.0,
        elastic_alpha: float = 0.0,
        elastic_sigma: float = 4.0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        pixel_scale: float = 255.0,
        resize_method: str = "bilinear",
        seed: int = 0,
    ):
        self.image_size = tuple(image_size)
        self.crop_scale = crop_scale
        self.flip = flip
        self.translate, self.rotate, self.zoom = translate, rotate, zoom
        self.elastic_alpha, self.elastic_sigma = elastic_alpha, elastic_sigma
        self.resize_method = resize_method
        self.seed = int(seed)
        self._element_seed = ElementSeed()
        self._batch_seed = ElementSeed()
        self.randaugment = None
        if randaugment_ops:
            self.randaugment = _use_seed(
                keras.layers.RandAugment(
                    value_range=(0, pixel_scale),
                    num_ops=randaugment_ops,
                    factor=randaugment_magnitude,
                    dtype="float32",
                ),
                self._element_seed,
            )
        # float32 whatever the global mixed-precision policy: augmentation
        # runs in tf.data, before the model casts its inputs.
        self.mixup = self.cutmix = None
        if mixup_alpha:
            self.mixup = _use_seed(
                keras.layers.MixUp(alpha=mixup_alpha, dtype="float32"), self._batch_seed
            )
        if cutmix_alpha:
            self.cutmix = _use_seed(
                keras.layers.CutMix(factor=cutmix_alpha, dtype="float32"),
                self._batch_seed,
            )

    def rand_augment(self, image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        """RandAugment with Keras' operations and magnitudes, running only the
        drawn operations.

        `keras.layers.RandAugment` computes all nine of its operations for
        each of the `num_ops` slots and keeps one with `where`: nine times
        the work. Here each slot draws its operation from `seed` and
        `tf.switch_case` runs that one alone: 42 vs 3.3 img/s for the Keras
        layer at 224x224, two operations, timed side by side in one process.
        """
        layer = self.randaugment
        operations = [getattr(layer, name) for name in type(layer)._AUGMENT_LAYERS]
        drawn = tf.random.stateless_uniform(
            (layer.num_ops,), seed, 0, len(operations), dtype=tf.int32
        )
        shape = image.shape
        for slot in range(layer.num_ops):
            branches = [
                lambda op=op, x=image: tf.cast(op(x, training=True), tf.float32)
                for op in operations
            ]
            image = tf.switch_case(drawn[slot], branches)
            image.set_shape(shape)
        return image

    @property
    def mixes_batches(self) -> bool:
        return self.mixup is not None or self.cutmix is not None

    def element(self, image: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
        """Augments one `(height, width, channels)` float image in pixel
        range; `index` is the element's position in the training stream."""
        base = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(index, tf.int64)])
        crop_seed, flip_seed, layer_seed = tf.unstack(
            tf.random.experimental.stateless_split(base, 3)
        )
        if self.crop_scale is not None:
            image = random_resized_crop(
                image,
                self.image_size,
                crop_seed,
                self.crop_scale,
                method=self.resize_method,
            )
        else:
            image = tf.image.resize(image, self.image_size, method=self.resize_method)
        if self.translate or self.rotate or self.zoom:
            # fold_in rather than a fourth split keeps the other draws (and so
            # earlier runs) unchanged.
            image = self.affine(
                image, tf.random.experimental.stateless_fold_in(base, 4)
            )
        if self.elastic_alpha:
            image = self.elastic(
                image, tf.random.experimental.stateless_fold_in(base, 5)
            )
        if self.flip:
            image = tf.image.stateless_random_flip_left_right(image, flip_seed)
        if self.randaugment is not None:
            choice_seed, layer_seed = tf.unstack(
                tf.random.experimental.stateless_split(layer_seed, 2)
            )
            self._element_seed.bind(layer_seed)
            image = self.rand_augment(image, choice_seed)
        return tf.cast(image, tf.float32)

    def affine(self, image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        """A random shift / rotation / zoom about the image centre."""
        height, width = self.image_size
        shift, angle, scale = tf.split(
            tf.random.stateless_uniform((4,), seed, -1.0, 1.0), [2, 1, 1]
        )
        shift = shift * self.translate * tf.constant([width, height], tf.float32)
        angle = angle[0] * (self.rotate * np.pi / 180.0)
        scale = 1.0 + scale[0] * self.zoom
        # The op maps each output pixel back to an input one: the inverse
        # rotation, divided by the scale, about the centre, minus the shift.
        cos, sin = tf.cos(angle) / scale, tf.sin(angle) / scale
        centre = tf.constant([(width - 1) / 2, (height - 1) / 2], tf.float32)
        moved = centre + shift
        transform = tf.stack(
            [
                cos,
                sin,
                centre[0] - cos * moved[0] - sin * moved[1],
                -sin,
                cos,
                centre[1] + sin * moved[0] - cos * moved[1],
                0.0,
                0.0,
            ]
        )
        return keras.ops.image.affine_transform(
            image, transform, interpolation="bilinear", fill_mode="constant"
        )

    def elastic(self, image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        """Simard's elastic distortion: every pixel moved by a smooth random
        field, sampled bilinearly, zeros brought in from outside.

        Written here rather than with `keras.ops.image.elastic_transform`:
        Keras 3.15 draws the horizontal and the vertical displacement from
        the same seed, so every pixel moves along the diagonal (the test
        suite checks that this field's two components differ).
        """
        height, width = self.image_size
        sigma = self.elastic_sigma
        radius = max(1, min(int(np.ceil(3 * sigma)), max(height, width) - 1))
        taps = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
        taps = tf.constant(taps / taps.sum(), tf.float32)
        noise = tf.random.stateless_uniform((1, height, width, 2), seed, -1.0, 1.0)
        # Separable Gaussian, each displacement component on its own.
        rows = tf.tile(tf.reshape(taps, (-1, 1, 1, 1)), (1, 1, 2, 1))
        cols = tf.tile(tf.reshape(taps, (1, -1, 1, 1)), (1, 1, 2, 1))
        field = tf.nn.depthwise_conv2d(noise, rows, (1, 1, 1, 1), "SAME")
        field = tf.nn.depthwise_conv2d(field, cols, (1, 1, 1, 1), "SAME")
        field = self.elastic_alpha * field[0]
        y, x = tf.meshgrid(
            tf.range(height, dtype=tf.float32),
            tf.range(width, dtype=tf.float32),
            indexing="ij",
        )
        where = [y + field[..., 1], x + field[..., 0]]
        channels = [
            keras.ops.image.map_coordinates(
                image[..., c], where, order=1, fill_mode="constant"
            )
            for c in range(image.shape[-1])
        ]
        return tf.stack(channels, axis=-1)

    def batch(self, images: tf.Tensor, labels: tf.Tensor, step: tf.Tensor):
        """MixUp / CutMix on a batch of normalised images and one-hot labels;
        returns soft labels."""
        if not self.mixes_batches:
            return images, labels
        # A seed stream apart from the per-element one.
        base = tf.stack(
            [tf.constant(self.seed, tf.int64) + 7919, tf.cast(step, tf.int64)]
        )
        choice_seed, layer_seed = tf.unstack(
            tf.random.experimental.stateless_split(base, 2)
        )
        self._batch_seed.bind(layer_seed)
        data = {"images": images, "labels": labels}

        def run(layer):
            out = layer(data, training=True)
            return tf.cast(out["images"], tf.float32), tf.cast(
                out["labels"], tf.float32
            )

        if self.mixup is not None and self.cutmix is not None:
            use_cutmix = tf.random.stateless_uniform((), choice_seed) < 0.5
            return tf.cond(
                use_cutmix, lambda: run(self.cutmix), lambda: run(self.mixup)
            )
        return run(self.mixup or self.cutmix)
