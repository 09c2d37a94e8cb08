"""Rotary position embedding (RoPE) on the patch tokens' queries and keys,
written with `keras.ops` only.

keras_vit rotates in the "half" layout: channel `i` of a head pairs with
channel `i + head_dim / 2`. A checkpoint made with the interleaved layout
(pairs `2i, 2i + 1`, timm's default) is the same model once the query and
key channels of each head are permuted alike, which the converters do:
attention only reads `q . k`, which a common permutation leaves unchanged.
"""

from __future__ import annotations

from keras import ops


def rotate_half(x):
    half = x.shape[-1] // 2
    return ops.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x, rope):
    """Rotates the last `num_patches` tokens of `x`.

    Args:
        x: `(batch_heads, num_tokens, head_dim)` queries or keys.
        rope: `(2, num_patches, head_dim)`: the cosines then the sines, in the
            half layout, float32.

    Returns:
        `x` with its prefix tokens unchanged and its patch tokens rotated, in
        `x`'s dtype (the rotation itself runs in float32).
    """
    cos, sin = rope[0], rope[1]
    patches = ops.shape(cos)[0] if cos.shape[0] is None else cos.shape[0]
    tokens = ops.shape(x)[1] if x.shape[1] is None else x.shape[1]
    prefix, rotated = x[:, : tokens - patches], x[:, tokens - patches :]
    r32 = ops.cast(rotated, "float32")
    r32 = r32 * cos[None] + rotate_half(r32) * sin[None]
    return ops.concatenate([prefix, ops.cast(r32, x.dtype)], axis=1)
