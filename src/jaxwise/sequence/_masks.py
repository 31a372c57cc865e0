"""Masks from lengths, masked reductions, and segment reductions."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._shared._checks import check_int
from jaxwise.sequence._common import Array, ArrayLike, Tracer, as_array, as_float_array, concrete

__all__ = ["lengths_to_mask", "masked_mean", "masked_sum", "segment_mean", "segment_softmax"]


def lengths_to_mask(lengths: ArrayLike, max_len: int) -> Array:
    """``mask[..., t] = t < lengths[...]``: a bool mask of shape ``(*lengths.shape, max_len)``.

    Built from the lengths, never from ``value != 0`` (a real zero is not padding).
    Negative lengths or lengths above ``max_len`` raise when concrete.

    Args:
        lengths: integer array of any shape: the valid length of each sequence.
        max_len: the (static) length of the mask's last axis, >= 0.

    Returns:
        Boolean array of shape ``(*lengths.shape, max_len)``.

    Raises:
        TypeError: ``lengths`` is not an integer array or ``max_len`` not an integer.
        ValueError: a (concrete) length is negative or above ``max_len``.

    Examples:
        >>> lengths_to_mask(jnp.asarray([1, 3]), 3).tolist()
        [[True, False, False], [True, True, True]]
    """
    max_len = check_int(max_len, "max_len", min_value=0)
    lengths = as_array(lengths, "lengths", dtype_kind="iu")
    host = concrete(lengths)
    if host is not None and host.size:
        if host.min() < 0:
            raise ValueError(f"`lengths` must be >= 0, got {int(host.min())}")
        if host.max() > max_len:
            raise ValueError(f"`lengths` must be <= max_len={max_len}, got {int(host.max())}")
    return jnp.arange(max_len) < lengths[..., None]


def _check_mask_shape(x: Array, mask: Any, name: str = "mask") -> Array:
    mask = as_array(mask, name)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"`{name}` must be boolean, got dtype {mask.dtype}")
    try:
        shape = np.broadcast_shapes(mask.shape, x.shape)
    except ValueError:
        shape = None
    if shape != tuple(x.shape):
        raise ValueError(
            f"`{name}` of shape {mask.shape} does not broadcast to `x` of shape {x.shape}"
        )
    return jnp.broadcast_to(mask, x.shape)


def _accumulation_dtype(dtype: Any) -> Any:
    """float32 for half-precision inputs (their sums and counts overflow at 65,504)."""
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        return jnp.dtype(jnp.float32)
    return dtype


def masked_sum(x: ArrayLike, mask: ArrayLike, axis: int | tuple[int, ...] | None = None) -> Array:
    """Sum of the entries of ``x`` where ``mask`` is True (others contribute exactly 0, NaN too).

    Args:
        x: real (float, integer or bool) array, any shape.
        mask: boolean array broadcastable to ``x``.
        axis: axis or axes to sum over (``None``: all).

    Returns:
        ``x``'s shape without ``axis``, ``jnp.sum``'s dtype for ``x``.

    Raises:
        TypeError: ``x`` is not a real array or ``mask`` is not boolean.
        ValueError: ``mask`` does not broadcast to ``x``.

    Examples:
        >>> float(masked_sum(jnp.asarray([1.0, jnp.nan, 3.0]), jnp.asarray([True, False, True])))
        4.0
    """
    x = as_array(x, "x", dtype_kind="fiub")
    mask = _check_mask_shape(x, mask)
    return jnp.sum(jnp.where(mask, x, jnp.zeros((), x.dtype)), axis=axis)


def masked_mean(x: ArrayLike, mask: ArrayLike, axis: int | tuple[int, ...] | None = None) -> Array:
    """Mean over the masked entries; the denominator is ``max(1, count)``, so empty rows give 0.

    Numerator and denominator are both masked; gradients are finite even for fully masked
    rows. Sums and counts of half-precision inputs accumulate in float32 (a float16 count
    overflows past 65,504 entries); the result has ``x``'s dtype.

    Args:
        x: real array, any shape (integers and bools are averaged as float32).
        mask: boolean array broadcastable to ``x``.
        axis: axis or axes to average over (``None``: all).

    Returns:
        ``x``'s shape without ``axis``, ``x``'s floating dtype.

    Raises:
        TypeError: ``x`` is not a real array or ``mask`` is not boolean.
        ValueError: ``mask`` does not broadcast to ``x``.

    Examples:
        >>> m = jnp.asarray([[True, True, False], [False, False, False]])
        >>> masked_mean(jnp.asarray([[1.0, 3.0, 100.0], [5.0, 5.0, 5.0]]), m, axis=1).tolist()
        [2.0, 0.0]
    """
    x = as_float_array(x, "x")
    mask = _check_mask_shape(x, mask)
    acc = _accumulation_dtype(x.dtype)
    total = jnp.sum(jnp.where(mask, x, jnp.zeros((), x.dtype)).astype(acc), axis=axis)
    count = jnp.sum(mask.astype(acc), axis=axis)
    return (total / jnp.maximum(count, 1)).astype(x.dtype)


def _check_segments(values: Array, segment_ids: Any, num_segments: Any) -> Array:
    if isinstance(num_segments, Tracer):
        raise TypeError("`num_segments` must be a static Python int (it sets the output shape)")
    num_segments = check_int(num_segments, "num_segments", min_value=1)
    segment_ids = as_array(segment_ids, "segment_ids", dtype_kind="iu")
    if values.ndim < 1:
        raise ValueError(f"the values must have a leading (N,) axis, got shape {values.shape}")
    if segment_ids.shape != values.shape[:1]:
        raise ValueError(
            f"`segment_ids` must have shape {values.shape[:1]}, got {segment_ids.shape}"
        )
    host = concrete(segment_ids)
    if host is not None and host.size and (host.min() < 0 or host.max() >= num_segments):
        raise ValueError(
            f"`segment_ids` must be in [0, {num_segments}), got values in "
            f"[{int(host.min())}, {int(host.max())}] (jax.ops.segment_sum would silently drop them)"
        )
    return segment_ids


def segment_softmax(
    scores: ArrayLike,
    segment_ids: ArrayLike,
    num_segments: int,
    *,
    where: ArrayLike | None = None,
) -> Array:
    """Softmax of ``scores`` within each segment (e.g. attention over a node's edges).

    The per-segment max is subtracted (stable for scores of any size); empty segments are
    harmless; out-of-range ids raise when concrete. Like ``softmax(where=)``: entries with
    ``where`` False are exactly 0, and a segment with no finite score — fully masked, or all
    ``-inf`` — gives zeros (no NaN in values or gradients). A NaN score gives NaN for its
    segment (bad input is not hidden).

    Args:
        scores: float ``(N, …)``.
        segment_ids: int ``(N,)`` in ``[0, num_segments)``.
        num_segments: static int ≥ 1.
        where: optional bool mask broadcastable to ``scores``: entries taking part.

    Returns:
        ``(N, …)`` weights (``scores``' dtype) that sum to 1 over each non-empty segment.

    Raises:
        TypeError: ``scores`` is not floating point, ``segment_ids`` not integer,
            ``num_segments`` not a static int, or ``where`` not boolean.
        ValueError: shapes do not fit, or a (concrete) id is out of range.

    Examples:
        >>> segment_softmax(jnp.asarray([1.0, 1.0, 500.0]), jnp.asarray([0, 0, 1]), 3).tolist()
        [0.5, 0.5, 1.0]
    """
    scores = as_array(scores, "scores", dtype_kind="f")
    segment_ids = _check_segments(scores, segment_ids, num_segments)
    mask = None if where is None else _check_mask_shape(scores, where, "where")
    finfo = jnp.finfo(scores.dtype)
    masked = scores if mask is None else jnp.where(mask, scores, -jnp.inf)
    seg_max = jax.ops.segment_max(masked, segment_ids, num_segments, indices_are_sorted=False)
    seg_max = jax.lax.stop_gradient(
        jnp.where(jnp.isfinite(seg_max), seg_max, jnp.zeros((), finfo.dtype))
    )
    shifted = masked - seg_max[segment_ids]
    # exp(-inf) = 0: masked and -inf entries contribute nothing; a clamp keeps gradients finite.
    e = jnp.exp(
        jnp.maximum(shifted, finfo.min) if mask is None else jnp.where(mask, shifted, finfo.min)
    )
    if mask is not None:
        e = jnp.where(mask, e, jnp.zeros((), e.dtype))
    total = jax.ops.segment_sum(e, segment_ids, num_segments)
    # one reciprocal per segment (not per entry); 0 for empty segments, NaN totals stay NaN
    ok = ~(total <= 0)
    safe_total = jnp.where(ok, total, jnp.ones((), total.dtype))
    inverse = jnp.where(ok, 1 / safe_total, jnp.zeros((), e.dtype))
    return e * inverse[segment_ids]


def segment_mean(values: ArrayLike, segment_ids: ArrayLike, num_segments: int) -> Array:
    """Mean of ``values`` per segment; empty segments give 0.

    Args:
        values: real ``(N, …)`` array.
        segment_ids: int ``(N,)`` in ``[0, num_segments)``.
        num_segments: static int ≥ 1.

    Returns:
        ``(num_segments, …)`` means, ``values``' floating dtype (float32 for integers).

    Raises:
        TypeError: ``values`` is not real, ``segment_ids`` not integer, or ``num_segments``
            not a static int.
        ValueError: shapes do not fit, or a (concrete) id is out of range.

    Examples:
        >>> segment_mean(jnp.asarray([1.0, 3.0, 5.0]), jnp.asarray([0, 0, 2]), 3).tolist()
        [2.0, 0.0, 5.0]
    """
    values = as_float_array(values, "values")
    segment_ids = _check_segments(values, segment_ids, num_segments)
    acc = _accumulation_dtype(values.dtype)
    total = jax.ops.segment_sum(values.astype(acc), segment_ids, num_segments)
    count = jax.ops.segment_sum(jnp.ones(values.shape[:1], acc), segment_ids, num_segments)
    mean = total / jnp.maximum(count, 1).reshape((-1,) + (1,) * (values.ndim - 1))
    return mean.astype(values.dtype)
