"""The SavedModel's serving graphs and its TF Serving warm-up records.

Signatures of the SavedModel:

- `serving_default`: `pixels` float32 `(batch, H, W, C)` raw pixel values in
  `[0, pixel_scale]` at exactly the exported size -> `logits` and
  `probabilities` float32 `(batch, num_classes)`. The graph normalises
  (`(pixels / pixel_scale - mean) / std`) and checks the shape and that every
  pixel lies in `[0, pixel_scale]` (1% slack for rounding; NaN and Inf are
  outside); a wrong size or channel count, or a pixel out of range, is an
  `InvalidArgumentError` that names the expected shape or range and the values
  found, never clipped. A batch of 0 images returns empty outputs. TF Serving
  only checks dtypes, so these checks live in the graph; the shape check has
  a twin in builtin TFLite ops (`Graphs.builtin_shape_guard`) that survives
  conversion, so a `.tflite` file refuses a wrong shape by itself. A dynamic-size model
  (`ViT(dynamic_size=True)`) takes `(batch, H, W, C)` of any H and W that are
  multiples of its patch size (or stem stride): the check names the multiple.
- `classify_images`: `images` string `(batch,)` of encoded JPEG or PNG files of
  any size -> top-k `class_ids` int32, `labels` string and `probabilities`
  float32, each `(batch, k)`. Images are decoded to C channels and resized to
  H x W inside the graph (`resize_method`, as in training); for a
  dynamic-size model H x W is its nominal size, the `image_size` it was built
  with (`metadata.json`'s `image_size`). Before decoding,
  the size the header declares (JPEG SOF, PNG IHDR) is checked against
  `max_pixels` (export argument, default `image_bytes.DEFAULT_MAX_PIXELS`,
  recorded in the metadata): a larger image, or bytes that are not a JPEG or
  PNG, is an `InvalidArgumentError` naming the declared size or the byte
  count, never the bytes themselves. So is a request longer than
  `image_bytes.encoded_bound` for its declared size (4 x its raw pixels +
  256 KiB): the graph cannot inflate a PNG with a bounded output, but this
  bounds what a zlib bomb costs (~1032x the bytes beyond the image).
"""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from keras_vit.deploy.checks import PIXEL_RANGE_SLACK, SERVING_INPUT
from keras_vit.deploy.serving import (
    BYTES_INPUT,
    BYTES_SIGNATURE,
    ends_in_softmax,
    prediction_log_bytes,
)
from keras_vit.models import fused, image_bytes
from keras_vit.models.precision import in_float32
from keras_vit.models.preprocessing import normalize_pixels, resize_pixels
from keras_vit.models.resolution import input_stride, is_dynamic_size

WARMUP_FILE = "tf_serving_warmup_requests"


class Graphs:
    """The serving functions, built around one model and its constants."""

    def __init__(
        self,
        model,
        labels,
        preprocessing,
        top_k,
        max_pixels: int = image_bytes.DEFAULT_MAX_PIXELS,
    ):
        if isinstance(max_pixels, bool) or not isinstance(max_pixels, int):
            raise ValueError(f"max_pixels must be an int >= 1, got {max_pixels!r}.")
        if max_pixels < 1:
            raise ValueError(f"max_pixels must be an int >= 1, got {max_pixels!r}.")
        self.max_pixels = max_pixels
        self.model = model
        self.labels = labels
        self.pre = preprocessing
        self.top_k = min(int(top_k), len(labels))
        self.softmax_inside = ends_in_softmax(model)
        h, w = preprocessing["image_size"]
        channels = preprocessing["num_channels"]
        # The size images are decoded and resized to.
        self.shape = [h, w, channels]
        self.shape_text = f"(batch, {h}, {w}, {channels})"
        # What `serving_default` takes; a dynamic-size model any multiple.
        self.input_shape = list(self.shape)
        self.multiple = None
        if is_dynamic_size(model):
            self.input_shape = [None, None, channels]
            self.multiple = input_stride(model)
            rows, cols = self.multiple
            multiples = (
                f"H and W multiples of {rows}"
                if rows == cols
                else f"H a multiple of {rows} and W of {cols}"
            )
            self.shape_text = f"(batch, H, W, {channels}) with {multiples}"

    def scores(self, pixels):
        x = normalize_pixels(pixels, self.pre)
        out = tf.cast(self.model(x, training=False), tf.float32)
        if self.softmax_inside:
            return {"probabilities": out}
        return {"logits": out, "probabilities": tf.nn.softmax(out, axis=-1)}

    def checked(self, pixels):
        """`pixels` after in-graph checks of shape and finiteness."""
        shape = tf.shape(pixels)
        # Padding keeps the comparison valid for any rank; rank is checked too.
        padded = tf.concat([shape, [-1, -1, -1, -1]], axis=0)[1:4]
        if self.multiple is None:
            good_sizes = tf.reduce_all(tf.equal(padded, self.shape))
        else:
            sizes = padded[:2]
            good_sizes = tf.reduce_all(
                [
                    tf.equal(padded[2], self.shape[2]),
                    tf.reduce_all(sizes > 0),
                    tf.reduce_all(tf.equal(sizes % self.multiple, 0)),
                ]
            )
        good_shape = tf.logical_and(tf.equal(tf.size(shape), 4), good_sizes)
        shape_check = tf.debugging.Assert(
            good_shape,
            [f"`{SERVING_INPUT}` must have shape {self.shape_text}; got shape", shape],
            summarize=8,
        )
        scale = self.pre["pixel_scale"]
        slack = PIXEL_RANGE_SLACK * scale
        with tf.control_dependencies([shape_check]):
            # NaN fails both comparisons, so this also refuses NaN and Inf.
            in_range = tf.reduce_all(
                tf.logical_and(pixels >= -slack, pixels <= scale + slack)
            )
            range_check = tf.debugging.Assert(
                in_range,
                [
                    f"`{SERVING_INPUT}` must be finite raw pixel values in "
                    f"[0, {scale:g}]; got values from",
                    tf.reduce_min(pixels),
                    "to",
                    tf.reduce_max(pixels),
                ],
            )
        with tf.control_dependencies([shape_check, range_check]):
            pixels = tf.identity(pixels)
        if self.multiple is None:
            pixels = self.builtin_shape_guard(pixels)
        return pixels

    def builtin_shape_guard(self, pixels):
        """`pixels`, reshaped to their own shape read through a GATHER that
        is out of bounds unless that shape is `(batch, H, W, C)`.

        The Assert above is no TFLite builtin and the converter drops it, and
        LiteRT's signature runner resizes the input to whatever it is given.
        This guard survives conversion (SHAPE, EQUAL, GATHER, RESHAPE are
        builtins) and makes LiteRT fail the call (GATHER refuses an index
        past the end) instead of answering for a wrong channel count, size or
        rank. It compares the whole runtime shape with one built from its own
        batch entry: slicing the static H, W, C out of `tf.shape` would let
        the converter fold the comparison to a constant `True`."""
        shape = tf.shape(pixels)
        expected = tf.concat([shape[:1], self.shape], axis=0)
        offset = tf.reduce_max(tf.abs(shape - expected))
        checked_shape = tf.gather(shape, tf.range(4) + offset)
        guarded = tf.reshape(pixels, checked_shape)
        # The converter types the guarded tensor from its runtime shape
        # (?x?x?x?); a convolution needs its channel count known to become a
        # TFLite CONV_2D ("tf.Conv2D op is neither a custom op nor a flex
        # op" for a hybrid or CNN). A SLICE of the whole tensor with static
        # sizes gives that type back (the converter folds a second RESHAPE
        # into the first, and the guard with it; EnsureShape is no builtin).
        return tf.slice(guarded, [0, 0, 0, 0], [-1, *self.shape])

    def serving_default(self, pixels):
        return self.scores(self.checked(pixels))

    def decode(self, encoded):
        # The header's declared size is checked before any decoder runs, so a
        # small file that declares a huge image costs microseconds; so is the
        # length against what that size needs (`REQUEST_ALLOWANCE`): a small
        # declared image cannot carry a long zlib stream. How far a stream
        # inflates no graph op can bound: a PNG within that length still
        # costs TF's decoder up to ~1032x the bytes it holds beyond the image.
        encoded, fmt = image_bytes.check_declared_size(
            encoded,
            f"an image in `{BYTES_INPUT}`",
            self.max_pixels,
            (image_bytes.JPEG, image_bytes.PNG),
            allowance=image_bytes.REQUEST_ALLOWANCE,
        )
        channels = self.shape[2]
        # The accurate integer IDCT (libjpeg's ISLOW, PIL's default) rather
        # than TF's fast one, so the graph sees the pixels a client sees
        # when it opens the file (the fast one flipped ~1% of top-1s here).
        image = tf.cond(
            tf.equal(fmt, image_bytes.JPEG),
            lambda: image_bytes.decode_jpeg(
                encoded, channels, dct_method="INTEGER_ACCURATE"
            ),
            lambda: tf.io.decode_png(encoded, channels=channels),
        )
        image = tf.cast(image, tf.float32) * (self.pre["pixel_scale"] / 255.0)
        return tf.ensure_shape(resize_pixels(image[None], self.pre)[0], self.shape)

    def classify_images(self, images):
        # Another rank than 1 flows on as an empty batch, so that the check
        # below is the error the caller sees (ops that need rank 1 would
        # otherwise fail first, with a message about strided slices).
        shape = tf.shape(images)
        rank_ok = tf.equal(tf.size(shape), 1)
        rank_check = tf.debugging.Assert(
            rank_ok,
            [
                f"`{BYTES_INPUT}` must be a 1-D batch of encoded image files, shape "
                "(batch,); got shape",
                shape,
            ],
        )
        with tf.control_dependencies([rank_check]):
            images = tf.cond(
                rank_ok,
                lambda: tf.reshape(images, [-1]),
                lambda: tf.zeros([0], tf.string),
            )
        pixels = tf.map_fn(
            self.decode,
            images,
            fn_output_signature=tf.TensorSpec(self.shape, tf.float32),
        )
        probabilities = self.scores(pixels)["probabilities"]
        top = tf.math.top_k(probabilities, k=self.top_k)
        return {
            "class_ids": top.indices,
            "labels": tf.gather(tf.constant(self.labels), top.indices),
            "probabilities": top.values,
        }


def write_saved_model(
    model,
    path,
    labels,
    preprocessing,
    top_k=5,
    max_pixels: int = image_bytes.DEFAULT_MAX_PIXELS,
) -> None:
    """Writes the SavedModel with both signatures to `path` (not atomic; see
    `export_model`); `classify_images` refuses images that declare more than
    `max_pixels` pixels. A model computing in bfloat16 or float16 is written
    as its float32 twin (`models.precision.float32_copy`: TFLite converts no
    bfloat16 graph). Traced with the fused kernels off (`fused.disabled`,
    even within `fused.inference()`): the SavedModel holds no XLA function,
    which TF Serving runs only behind its experimental
    `--xla_cpu_compilation_enabled` flag."""
    model = in_float32(model)
    with fused.disabled():
        _write_saved_model(model, path, labels, preprocessing, top_k, max_pixels)


def _write_saved_model(model, path, labels, preprocessing, top_k, max_pixels):
    graphs = Graphs(model, labels, preprocessing, top_k, max_pixels)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "serving_default",
        graphs.serving_default,
        input_signature=[
            tf.TensorSpec([None, *graphs.input_shape], tf.float32, name=SERVING_INPUT)
        ],
    )
    archive.add_endpoint(
        BYTES_SIGNATURE,
        graphs.classify_images,
        # Any rank: with `[None]` TF folds the rank check to "true" at trace
        # time, yet a loaded signature does not enforce the declared shape, so
        # a scalar would fail deep in `map_fn` instead of at the check.
        input_signature=[tf.TensorSpec(None, tf.string, name=BYTES_INPUT)],
    )
    archive.write_out(str(path), verbose=False)


def write_warmup_requests(path, name: str, pixels, preprocessing: dict) -> Path:
    """Writes `assets.extra/tf_serving_warmup_requests` (a TFRecord file of
    PredictionLogs) under the SavedModel at `path`: one request per signature,
    one image each (`pixels`, raw, at the model size), which TF Serving runs
    before it serves (`--enable_model_warmup`, on by default)."""
    pixels = np.asarray(pixels, dtype="float32")[None]
    as_uint8 = np.clip(
        np.round(pixels[0] * (255.0 / preprocessing["pixel_scale"])), 0, 255
    ).astype("uint8")
    png = tf.io.encode_png(as_uint8).numpy()
    records = [
        prediction_log_bytes(
            name, "serving_default", {SERVING_INPUT: tf.make_tensor_proto(pixels)}
        ),
        prediction_log_bytes(
            name,
            BYTES_SIGNATURE,
            {BYTES_INPUT: tf.make_tensor_proto([png], dtype=tf.string)},
        ),
    ]
    target = Path(path) / "assets.extra" / WARMUP_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(target)) as writer:
        for record in records:
            writer.write(record)
    return target
