"""logsumexp / softmax / log_softmax with masks, mask_logits and cross-entropy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from jaxwise._shared._checks import check_array
from jaxwise.numerics._core import (
    Array,
    ArrayLike,
    Axis,
    _check_mask,
    _float_array,
    _normalize_axis,
    _positive,
    double_where,
)

__all__ = ["cross_entropy", "log_softmax", "logsumexp", "mask_logits", "softmax"]


# --------------------------------------------------------------------------
# logsumexp / softmax / log_softmax with masks
# --------------------------------------------------------------------------


def _shifted(x: Array, axis: Axis, mask: Array | None) -> tuple[Array, Array]:
    """``(x − m, m)`` with ``m`` the masked max, non-finite max replaced by 0, no gradient."""
    if mask is None:
        m = jnp.max(x, axis=axis, keepdims=True)
    else:
        m = jnp.max(x, axis=axis, keepdims=True, where=mask, initial=jnp.finfo(x.dtype).min)
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, jnp.zeros_like(m)))
    shifted = x - m if mask is None else jnp.where(mask, x - m, 0.0)
    return shifted, m


def logsumexp(
    x: ArrayLike, axis: Axis = None, where: ArrayLike | None = None, keepdims: bool = False
) -> Array:
    """``log Σ exp(x)`` over ``axis``, stable, with a ``where=`` mask like ``jax.nn.logsumexp``.

    A fully masked reduction gives ``finfo(dtype).min`` (finite) instead of
    ``-inf``, and zero gradients.

    Args:
        x: floating-point array, any shape, not empty along ``axis``.
        axis: axis or axes to reduce (``None``: all).
        where: optional boolean mask, broadcastable to ``x``: the entries taking part.
        keepdims: keep reduced axes with size 1.

    Returns:
        ``x``'s shape without ``axis`` (size 1 there with ``keepdims``), ``x``'s dtype.

    Raises:
        TypeError: ``x`` is not a floating-point array or ``where`` is not boolean.
        ValueError: ``x`` is empty along ``axis``, ``axis`` is out of range, or ``where``
            does not broadcast to ``x``.

    Examples:
        >>> import jax.numpy as jnp
        >>> float(logsumexp(jnp.array([1000.0, 1000.0])))
        1000.6931762695312
    """
    x = _float_array(x, "x")
    mask = _check_mask(where, x.shape)
    axes = _normalize_axis(axis, x.ndim)
    if any(x.shape[a] == 0 for a in axes):
        raise ValueError(f"`x` of shape {x.shape} is empty along the reduced axis {axis}")
    shifted, m = _shifted(x, axes, mask)
    total = jnp.sum(jnp.exp(shifted), axis=axes, keepdims=True, where=mask)
    if mask is None:
        out = jnp.log(total) + m
    else:
        out = double_where(jnp.log, total, _positive(total), 1.0, 0.0) + m
        out = jnp.where(_positive(total), out, jnp.finfo(x.dtype).min)
    return out if keepdims else jnp.squeeze(out, axis=axes)


def softmax(x: ArrayLike, axis: Axis = -1, where: ArrayLike | None = None) -> Array:
    """Softmax over ``axis`` with a ``where=`` mask: masked entries are exactly 0.

    A fully masked row gives all zeros (``jax.nn.softmax`` gives NaN there in
    the gradient); gradients are finite everywhere. An empty input gives an empty
    output, as ``jax.nn.softmax`` does.

    Args:
        x: floating-point array, any shape.
        axis: axis or axes to normalise over.
        where: optional boolean mask, broadcastable to ``x``: the entries taking part.

    Returns:
        Probabilities of ``x``'s shape and dtype, summing to 1 over ``axis`` (0 on a fully
            masked row).

    Raises:
        TypeError: ``x`` is not a floating-point array or ``where`` is not boolean.
        ValueError: ``axis`` is out of range or ``where`` does not broadcast to ``x``.

    Examples:
        >>> import jax.numpy as jnp
        >>> softmax(jnp.array([0.0, 0.0, 5.0]), where=jnp.array([True, True, False])).tolist()
        [0.5, 0.5, 0.0]
    """
    x = _float_array(x, "x")
    mask = _check_mask(where, x.shape)
    axes = _normalize_axis(axis, x.ndim)
    if x.size == 0:
        return jnp.zeros_like(x)
    shifted, _ = _shifted(x, axes, mask)
    e = jnp.exp(shifted)
    if mask is None:
        return e / jnp.sum(e, axis=axes, keepdims=True)
    e = jnp.where(mask, e, 0.0)
    total = jnp.sum(e, axis=axes, keepdims=True)
    return double_where(lambda t: e / t, total, _positive(total), 1.0, 0.0)


def log_softmax(x: ArrayLike, axis: Axis = -1, where: ArrayLike | None = None) -> Array:
    """``x − logsumexp(x)`` over ``axis``, with a ``where=`` mask.

    Unmasked entries match ``jax.nn.log_softmax``; masked entries (and every
    entry of a fully masked row) are ``finfo(dtype).min`` — finite, so that
    ``p · log p`` and gradients stay NaN-free. An empty input gives an empty output, as
    ``jax.nn.log_softmax`` does.

    Args:
        x: floating-point array, any shape.
        axis: axis or axes to normalise over.
        where: optional boolean mask, broadcastable to ``x``: the entries taking part.

    Returns:
        Log-probabilities of ``x``'s shape and dtype.

    Raises:
        TypeError: ``x`` is not a floating-point array or ``where`` is not boolean.
        ValueError: ``axis`` is out of range or ``where`` does not broadcast to ``x``.

    Examples:
        >>> import jax.numpy as jnp
        >>> [round(v, 4) for v in log_softmax(jnp.array([0.0, 0.0])).tolist()]
        [-0.6931, -0.6931]
    """
    x = _float_array(x, "x")
    mask = _check_mask(where, x.shape)
    axes = _normalize_axis(axis, x.ndim)
    if x.size == 0:
        return jnp.zeros_like(x)
    shifted, _ = _shifted(x, axes, mask)
    total = jnp.sum(jnp.exp(shifted), axis=axes, keepdims=True, where=mask)
    if mask is None:
        return shifted - jnp.log(total)
    out = shifted - double_where(jnp.log, total, _positive(total), 1.0, 0.0)
    return jnp.where(mask & _positive(total), out, jnp.finfo(x.dtype).min)


def mask_logits(logits: ArrayLike, mask: ArrayLike) -> Array:
    """Fill masked-out logits with ``finfo(dtype).min`` (never ``-inf``).

    Works for float16/bfloat16 (their own ``finfo.min``, no overflow).

    Args:
        logits: floating-point array, any shape.
        mask: boolean array broadcastable to ``logits``: True where a logit is kept.

    Returns:
        ``logits``' shape and dtype, ``finfo(dtype).min`` where ``mask`` is False.

    Raises:
        TypeError: ``logits`` is not a floating-point array or ``mask`` is not boolean.
        ValueError: ``mask`` does not broadcast to ``logits``.

    Examples:
        >>> import jax.numpy as jnp
        >>> mask_logits(jnp.array([1.0, 2.0], jnp.float16), jnp.array([True, False])).tolist()
        [1.0, -65504.0]
    """
    logits = _float_array(logits, "logits")
    checked = _check_mask(mask, logits.shape, "mask")
    if checked is None:
        raise TypeError("`mask` must be a boolean mask, got None")
    return jnp.where(checked, logits, jnp.finfo(logits.dtype).min)


# --------------------------------------------------------------------------
# Cross-entropy
# --------------------------------------------------------------------------


def _check_labels(labels: ArrayLike, logits_shape: tuple[int, ...]) -> Array:
    if not isinstance(labels, Tracer):
        if not hasattr(labels, "dtype"):
            check_array(labels, "labels")
        labels = jnp.asarray(labels)
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"`labels` must be integer class indices, got dtype {labels.dtype}")
    if labels.shape != logits_shape[:-1]:
        raise ValueError(
            f"`labels` must have shape {logits_shape[:-1]} (logits shape without the class axis), "
            f"got {labels.shape}"
        )
    if not isinstance(labels, Tracer) and labels.size:
        host = np.asarray(labels)  # concrete: check on the host, never stage a reduction
        lo, hi = int(host.min()), int(host.max())
        if lo < 0 or hi >= logits_shape[-1]:
            raise ValueError(
                f"`labels` must be in [0, {logits_shape[-1]}), got values in [{lo}, {hi}]"
            )
    return labels


def cross_entropy(
    logits: ArrayLike,
    labels: ArrayLike,
    *,
    class_mask: ArrayLike | None = None,
    weights: ArrayLike | None = None,
) -> Array:
    """Mean softmax cross-entropy with integer labels, stable and NaN-free.

    ``nll_i = −log_softmax(logits_i)[labels_i]``; the result is
    ``mean_i nll_i``, or ``Σ w_i nll_i / Σ w_i`` with ``weights`` (0 when all
    weights are 0). Its gradient is ``(softmax − onehot) / B`` (times the
    normalised weights). Padding rows with weight 0 — even fully masked ones
    — contribute neither to the loss nor to the gradient.

    Half-precision logits (float16, bfloat16) are reduced in float32 and the loss is
    returned in the logits' dtype. A label in a masked class (probability 0, an infinite
    loss) is clamped to the finite ``nll = −log(finfo(float32).tiny) ≈ 87.3`` with zero
    gradient for that row, so one bad label cannot overflow the batch loss to ``inf``.
    An empty batch has no mean: it raises ``ValueError``.

    Args:
        logits: float ``(..., C)`` with ``C ≥ 1`` and at least one example.
        labels: int ``(...)`` in ``[0, C)``. Checked eagerly when concrete;
            under ``jit`` an out-of-range label gives a NaN loss (JAX's gather
            fill value) rather than a silently wrong one.
        class_mask: optional bool, broadcastable to ``logits``: classes that
            exist (e.g. padded vocabularies).
        weights: optional float ``(...)`` per-example weights, ``>= 0`` (checked when
            concrete: a negative weight would subtract its example's loss).

    Returns:
        Scalar loss, in ``logits``' dtype.

    Raises:
        ValueError: an empty batch, no classes, labels out of range, negative weights, or
            shape mismatches.

    Examples:
        >>> import jax.numpy as jnp
        >>> round(float(cross_entropy(jnp.zeros((2, 4)), jnp.array([1, 3]))), 4)
        1.3863
    """
    logits = _float_array(logits, "logits")
    if logits.ndim < 1:
        raise ValueError("`logits` must have a class axis, got a scalar")
    if logits.shape[-1] == 0 or int(np.prod(logits.shape[:-1])) == 0:
        raise ValueError(
            f"`logits` of shape {logits.shape} is empty: cross_entropy needs at least one "
            "example and one class (the mean of an empty batch is undefined)"
        )
    labels = _check_labels(labels, logits.shape)
    mask = _check_mask(class_mask, logits.shape, "class_mask")
    out_dtype = logits.dtype
    if jnp.finfo(logits.dtype).bits < 32:
        logits = logits.astype(jnp.float32)
    nll = _nll(logits, labels, mask)
    if weights is None:
        return jnp.mean(nll).astype(out_dtype)
    weights = _float_array(weights, "weights")
    if weights.shape != labels.shape:
        raise ValueError(
            f"`weights` must have the shape of `labels` {labels.shape}, got {weights.shape}"
        )
    if not isinstance(weights, Tracer) and bool(jnp.any(weights < 0)):
        raise ValueError(
            f"`weights` must be >= 0, got {float(jnp.min(weights))} (a negative weight would "
            "subtract its example's loss)"
        )
    weights = weights.astype(nll.dtype)
    total = jnp.sum(weights)
    weighted = jnp.sum(jnp.where(weights != 0, weights * nll, 0.0))
    loss = double_where(lambda t: weighted / t, total, total != 0, 1.0, 0.0)
    return loss.astype(out_dtype)


def _nll(logits: Array, labels: Array, mask: Array | None) -> Array:
    """Per-example ``logsumexp − picked logit`` (never materialises the full log-softmax)."""
    index = labels[..., None].astype(jnp.int32)
    # NaN if out of range under jit (JAX's fill value for a gather out of bounds)
    picked = jnp.take_along_axis(logits, index, axis=-1, wrap_negative_indices=False)[..., 0]
    lse = logsumexp(logits, axis=-1, where=mask)
    if mask is None:
        return lse - picked
    # a label in a masked class has probability 0: clamp its loss, no gradient
    allowed = jnp.take_along_axis(mask, index, axis=-1, mode="clip")[..., 0]
    clamp = -float(np.log(float(jnp.finfo(jnp.float32).tiny)))
    return double_where(lambda d: d, lse - picked, allowed, 0.0, clamp)
