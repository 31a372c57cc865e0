"""Numerically stable building blocks whose gradients never turn NaN.

The classic failure: ``jnp.where(x > 0, jnp.log(x), 0.0)`` has a finite value
but a NaN gradient at ``x = 0``, because the unselected branch's infinite
derivative is multiplied by a zero cotangent (``0 · ∞ = NaN``). The fix is
the *double where*: make the dangerous function see a safe input where it is
not selected. Everything here is safe under ``jit``, ``vmap``, ``grad`` and,
where they exist, second derivatives.

Masks follow ``jax.nn``: ``where=`` marks the entries that take part. Masked
logits are filled with ``finfo(dtype).min`` — never ``-inf``, because a fully
masked row would compute ``-inf - (-inf) = NaN``.

Example:
    >>> import jax, jax.numpy as jnp
    >>> float(jax.grad(lambda x: safe_sqrt(x))(0.0))
    0.0
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from jaxwise._checks import check_array, check_callable, check_float

__all__ = [
    "cosine_similarity",
    "cross_entropy",
    "double_where",
    "entropy",
    "log_softmax",
    "logit",
    "logsumexp",
    "mask_logits",
    "round_ste",
    "safe_log",
    "safe_norm",
    "safe_sqrt",
    "sinc",
    "softmax",
    "straight_through",
]

Array = jax.Array
Axis = int | tuple[int, ...] | None


# --------------------------------------------------------------------------
# Validation helpers (shapes and dtypes only: safe under jit)
# --------------------------------------------------------------------------


def _float_array(x: Any, name: str) -> Array:
    """``x`` as a floating JAX array; None, strings, objects, integers raise naming ``name``."""
    if not isinstance(x, Tracer):
        if not hasattr(x, "dtype"):
            check_array(x, name)  # rejects None, str, dict and ragged/object lists
        x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"`{name}` must be a floating-point array, got dtype {x.dtype}")
    return x


def _positive(x: Array) -> Array:
    """``x > 0``, but True where ``x`` is NaN: a NaN input goes through the function, stays NaN."""
    return ~(x <= 0)


def _check_mask(where: Any, shape: tuple[int, ...], name: str = "where") -> Array | None:
    if where is None:
        return None
    if not isinstance(where, Tracer):
        if not hasattr(where, "dtype"):
            check_array(where, name)
        where = jnp.asarray(where)
    if where.dtype != jnp.bool_:
        raise TypeError(f"`{name}` must be a boolean mask, got dtype {where.dtype}")
    try:
        broadcast = np.broadcast_shapes(where.shape, shape)
    except ValueError:
        broadcast = None
    if broadcast != tuple(shape):
        raise ValueError(
            f"`{name}` of shape {where.shape} does not broadcast to the input shape {shape}"
        )
    return jnp.broadcast_to(where, shape)


def _normalize_axis(axis: Axis, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    for a in axes:
        if not -ndim <= a < max(ndim, 1):
            raise ValueError(f"`axis` {axis} is out of range for an input with {ndim} dimensions")
    return tuple(a % max(ndim, 1) for a in axes)


# --------------------------------------------------------------------------
# Double where and the elementwise safe functions
# --------------------------------------------------------------------------


def double_where(
    fn: Callable[[Array], Array], x: Array, ok: Array, safe_value: Any, fill: Any
) -> Array:
    """``fn(x)`` where ``ok``, ``fill`` elsewhere — with finite gradients everywhere.

    Computes ``where(ok, fn(where(ok, x, safe_value)), fill)``: ``fn`` never
    sees an input outside its safe domain, so the unselected branch has a
    finite derivative and the zero cotangent cannot make it NaN.

    Args:
      fn: elementwise function, finite and differentiable at ``safe_value``.
      x: input array.
      ok: boolean array broadcastable to ``x``: where ``fn(x)`` is wanted.
      safe_value: an input at which ``fn`` is harmless (e.g. 1 for ``log``).
      fill: the output where ``not ok``.

    Returns:
      Array of ``x``'s broadcast shape.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> f = lambda x: double_where(jnp.log, x, x > 0, 1.0, 0.0)
        >>> float(jax.grad(f)(0.0)), float(jax.grad(f)(2.0))
        (0.0, 0.5)
    """
    check_callable(fn, "fn")
    if not hasattr(x, "dtype"):
        check_array(x, "x")  # rejects None, str, dict and ragged/object lists
    x = jnp.asarray(x)
    ok = jnp.asarray(ok) if not isinstance(ok, Tracer) else ok
    if ok.dtype != jnp.bool_:
        raise TypeError(f"`ok` must be a boolean array, got dtype {ok.dtype}")
    safe_x = jnp.where(ok, x, jnp.asarray(safe_value, x.dtype))
    out = fn(safe_x)
    return jnp.where(ok, out, jnp.asarray(fill, out.dtype))


def safe_sqrt(x: Array) -> Array:
    """``sqrt(x)`` for ``x > 0`` and 0 for ``x ≤ 0``, with gradient 0 there (not ∞).

    Safe at the singular point, not a filter: ``safe_sqrt(nan)`` is NaN.

    Example:
        >>> import jax
        >>> float(jax.grad(safe_sqrt)(0.0)), float(jax.grad(safe_sqrt)(4.0))
        (0.0, 0.25)
    """
    x = _float_array(x, "x")
    return double_where(jnp.sqrt, x, _positive(x), 1.0, 0.0)


def safe_log(x: Array, fill: float | None = None) -> Array:
    """``log(x)`` for ``x > 0``; a finite ``fill`` (default ``log(tiny)``) for ``x ≤ 0``, gradient 0.

    The default fill is the log of the smallest normal number of ``x``'s
    dtype (≈ −87.3 for float32; float16 and bfloat16 use their own): finite, so
    ``0 · safe_log(0) = 0``. A NaN input gives NaN.

    Example:
        >>> import jax
        >>> float(jax.grad(safe_log)(0.0)), float(jax.grad(safe_log)(0.5))
        (0.0, 2.0)
    """
    x = _float_array(x, "x")
    if fill is None:
        fill = float(np.log(float(jnp.finfo(x.dtype).tiny)))
    else:
        fill = check_float(fill, "fill")
    return double_where(jnp.log, x, _positive(x), 1.0, fill)


def sinc(x: Array) -> Array:
    """Normalised sinc ``sin(πx)/(πx)``, 1 at 0, exact first and second derivatives at 0.

    Same definition as ``numpy.sinc``. Near 0 a Taylor polynomial
    ``1 − (πx)²/6 + (πx)⁴/120`` replaces the quotient (its error is below
    float32 resolution there), so ``grad`` gives 0 and ``grad(grad)`` gives
    ``−π²/3`` at ``x = 0``.

    Example:
        >>> float(sinc(0.0)), round(float(sinc(0.5)), 6)
        (1.0, 0.63662)
    """
    x = _float_array(x, "x")
    px = jnp.pi * x
    small = jnp.abs(px) < 1e-2
    quotient = double_where(lambda t: jnp.sin(t) / t, px, ~small, 1.0, 0.0)
    sq = jnp.where(small, px, 0.0) ** 2
    taylor = 1.0 - sq / 6.0 + sq * sq / 120.0
    return jnp.where(small, taylor, quotient)


def entropy(p: Array, axis: Axis = -1, where: Array | None = None) -> Array:
    """Shannon entropy ``−Σ p log p`` (nats) with ``0 · log 0 = 0`` and finite gradients.

    A NaN probability makes the entropy NaN (bad input is not hidden).

    Args:
      p: probabilities, any shape.
      axis: the axis (or axes) summed over.
      where: optional boolean mask of entries taking part.

    Example:
        >>> round(float(entropy(jnp.array([0.5, 0.5, 0.0]))), 6)
        0.693147
    """
    p = _float_array(p, "p")
    mask = _check_mask(where, p.shape)
    _normalize_axis(axis, p.ndim)
    plogp = double_where(lambda t: t * jnp.log(t), p, _positive(p), 1.0, 0.0)
    return -jnp.sum(plogp, axis=axis, where=mask)


_LOGIT_CLIP = 20.0


def logit(p: Array) -> Array:
    """``log(p / (1 − p))``, clipped to ±20, with finite gradients at ``p ∈ {0, 1}``.

    Exact with derivative ``1 / (p (1 − p))`` for ``p`` strictly inside
    (0, 1) (where the value is within ±20); ``p ≤ 0`` gives −20 and
    ``p ≥ 1`` gives 20, both with gradient 0. ``logit(nan)`` is NaN.

    Example:
        >>> float(logit(0.5)), float(logit(1.0)), float(logit(0.0))
        (0.0, 20.0, -20.0)
    """
    p = _float_array(p, "p")
    inside = ~((p <= 0) | (p >= 1))  # NaN counts as inside: it stays NaN
    raw = double_where(lambda q: jnp.log(q) - jnp.log1p(-q), p, inside, 0.5, 0.0)
    edge = jnp.where(p >= 1, _LOGIT_CLIP, -_LOGIT_CLIP).astype(p.dtype)
    return jnp.where(inside, jnp.clip(raw, -_LOGIT_CLIP, _LOGIT_CLIP), edge)


# --------------------------------------------------------------------------
# Norms and cosine similarity
# --------------------------------------------------------------------------


def _unsafe_sumsq(sumsq: Array) -> Array:
    """Whether any plain sum of squares may have under- or overflowed.

    Exact zeros count too (a vector of 1e-30s squares to 0 in float32), so a
    batch containing zero vectors takes the max-scaled path.
    """
    fi = jnp.finfo(sumsq.dtype)
    sumsq = jax.lax.stop_gradient(sumsq)
    return jnp.any((sumsq < fi.tiny / fi.eps) | ~jnp.isfinite(sumsq))


def _sqrt0(v: Array) -> Array:
    """sqrt with a zero (not infinite) derivative at 0."""
    return double_where(jnp.sqrt, v, _positive(v), 1.0, 0.0)


def _scaled_norm(x: Array, axis: tuple[int, ...] | None) -> Array:
    """Norm with max-scaling (keepdims): exact for 1e-30 and 1e30 vectors alike."""
    scale = jax.lax.stop_gradient(jnp.max(jnp.abs(x), axis=axis, keepdims=True))
    safe_scale = jnp.where(_positive(scale), scale, 1.0)
    return safe_scale * _sqrt0(jnp.sum(jnp.square(x / safe_scale), axis=axis, keepdims=True))


def _norm_keepdims(x: Array, axis: tuple[int, ...] | None) -> Array:
    # Fast path: one pass computing Σx². Only if some row's sum is zero, tiny
    # or infinite (under/overflow possible) are all rows recomputed with
    # max-scaling; lax.cond skips that entirely in the common case (under
    # vmap both branches run, still correct).
    sumsq = jnp.sum(jnp.square(x), axis=axis, keepdims=True)
    return jax.lax.cond(_unsafe_sumsq(sumsq), lambda: _scaled_norm(x, axis), lambda: _sqrt0(sumsq))


def _squeeze(v: Array, axis: tuple[int, ...] | None, ndim: int) -> Array:
    return jnp.squeeze(v, axis=axis if axis is not None else tuple(range(ndim)))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _safe_norm(x: Array, axis: tuple[int, ...] | None, keepdims: bool) -> Array:
    norm = _norm_keepdims(x, axis)
    return norm if keepdims else _squeeze(norm, axis, x.ndim)


@_safe_norm.defjvp
def _safe_norm_jvp(
    axis: tuple[int, ...] | None, keepdims: bool, primals: tuple, tangents: tuple
) -> tuple:
    (x,), (tx,) = primals, tangents
    norm = _norm_keepdims(x, axis)
    # d‖x‖ = <x / ‖x‖, dx>, with the zero subgradient at x = 0 (double where).
    unit = double_where(lambda n: x / n, norm, _positive(norm), 1.0, 0.0)
    dnorm = jnp.sum(unit * tx, axis=axis, keepdims=True)
    if not keepdims:
        norm, dnorm = _squeeze(norm, axis, x.ndim), _squeeze(dnorm, axis, x.ndim)
    return norm, dnorm


def safe_norm(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    """Euclidean norm with a safe custom JVP: zero subgradient at the zero vector.

    ``jnp.linalg.norm`` has a NaN gradient at 0 (``x / ‖x‖ = 0/0``). Here the
    JVP rule is ``<x/‖x‖, dx>`` guarded by a double where, so it is itself
    differentiable (Hessian-vector products through it are finite), and the
    value is computed with max-scaling so that 1e-30 or 1e30 vectors neither
    underflow nor overflow.

    Args:
      x: float array.
      axis: axis or axes to reduce (``None``: all).
      keepdims: keep reduced axes with size 1.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> jax.grad(safe_norm)(jnp.zeros(3)).tolist(), float(safe_norm(jnp.array([3.0, 4.0])))
        ([0.0, 0.0, 0.0], 5.0)
    """
    x = _float_array(x, "x")
    axis = _normalize_axis(axis, x.ndim) if axis is not None else None
    return _safe_norm(x, axis, bool(keepdims))


def cosine_similarity(a: Array, b: Array, axis: int = -1) -> Array:
    """Cosine similarity along ``axis``; 0 (with finite gradients) when either vector is zero.

    A tiny but nonzero vector (e.g. 1e-30 in float32) is *not* treated as
    zero: both vectors are normalised with the max-scaled :func:`safe_norm`.

    Args:
      a, b: float arrays of the same (or broadcastable) shape.
      axis: the vector axis.

    Returns:
      Array with ``axis`` removed.

    Example:
        >>> import jax.numpy as jnp
        >>> float(cosine_similarity(jnp.array([1.0, 0.0]), jnp.array([2.0, 0.0])))
        1.0
        >>> float(cosine_similarity(jnp.zeros(2), jnp.array([2.0, 0.0])))
        0.0
    """
    a = _float_array(a, "a")
    b = _float_array(b, "b")
    if a.dtype != b.dtype:
        raise TypeError(f"`a` and `b` must have the same dtype, got {a.dtype} and {b.dtype}")
    try:
        shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError as err:
        raise ValueError(
            f"`a` of shape {a.shape} and `b` of shape {b.shape} do not broadcast"
        ) from err
    a, b = jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)
    axes = _normalize_axis(axis, len(shape))
    return _squeeze(_cosine(a, b, axes), axes, len(shape))


def _inverse(n: Array) -> Array:
    """1/n, and 0 (with zero derivative) where n = 0."""
    return double_where(lambda m: 1.0 / m, n, _positive(n), 1.0, 0.0)


def _cosine_value(a: Array, b: Array, axes: tuple[int, ...]) -> tuple[Array, Array, Array]:
    """(cos, 1/‖a‖, 1/‖b‖), keepdims; exact for tiny and huge vectors."""
    sa = jnp.sum(a * a, axis=axes, keepdims=True)
    sb = jnp.sum(b * b, axis=axes, keepdims=True)
    unsafe = _unsafe_sumsq(sa) | _unsafe_sumsq(sb)

    def plain() -> tuple[Array, Array, Array]:  # one pass: <a, b> / (‖a‖ ‖b‖)
        inv_a, inv_b = _inverse(_sqrt0(sa)), _inverse(_sqrt0(sb))
        return jnp.sum(a * b, axis=axes, keepdims=True) * inv_a * inv_b, inv_a, inv_b

    def scaled() -> tuple[Array, Array, Array]:  # normalise first (rare: zero, tiny or huge rows)
        inv_a, inv_b = _inverse(_scaled_norm(a, axes)), _inverse(_scaled_norm(b, axes))
        return jnp.sum((a * inv_a) * (b * inv_b), axis=axes, keepdims=True), inv_a, inv_b

    cos, inv_a, inv_b = jax.lax.cond(unsafe, scaled, plain)
    return jnp.clip(cos, -1.0, 1.0), inv_a, inv_b


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _cosine(a: Array, b: Array, axes: tuple[int, ...]) -> Array:
    return _cosine_value(a, b, axes)[0]


@_cosine.defjvp
def _cosine_jvp(axes: tuple[int, ...], primals: tuple, tangents: tuple) -> tuple[Array, Array]:
    # d cos = <b/‖b‖ − cos a/‖a‖, da>/‖a‖ + <a/‖a‖ − cos b/‖b‖, db>/‖b‖; 0 for a zero vector.
    (a, b), (ta, tb) = primals, tangents
    cos, inv_a, inv_b = _cosine_value(a, b, axes)
    da = jnp.sum((b * inv_b - cos * (a * inv_a)) * ta, axis=axes, keepdims=True) * inv_a
    db = jnp.sum((a * inv_a - cos * (b * inv_b)) * tb, axis=axes, keepdims=True) * inv_b
    return cos, da + db


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
    x: Array, axis: Axis = None, where: Array | None = None, keepdims: bool = False
) -> Array:
    """``log Σ exp(x)`` over ``axis``, stable, with a ``where=`` mask like ``jax.nn.logsumexp``.

    A fully masked reduction gives ``finfo(dtype).min`` (finite) instead of
    ``-inf``, and zero gradients.

    Example:
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


def softmax(x: Array, axis: Axis = -1, where: Array | None = None) -> Array:
    """Softmax over ``axis`` with a ``where=`` mask: masked entries are exactly 0.

    A fully masked row gives all zeros (``jax.nn.softmax`` gives NaN there in
    the gradient); gradients are finite everywhere.

    Example:
        >>> import jax.numpy as jnp
        >>> softmax(jnp.array([0.0, 0.0, 5.0]), where=jnp.array([True, True, False])).tolist()
        [0.5, 0.5, 0.0]
    """
    x = _float_array(x, "x")
    mask = _check_mask(where, x.shape)
    axes = _normalize_axis(axis, x.ndim)
    shifted, _ = _shifted(x, axes, mask)
    e = jnp.exp(shifted)
    if mask is None:
        return e / jnp.sum(e, axis=axes, keepdims=True)
    e = jnp.where(mask, e, 0.0)
    total = jnp.sum(e, axis=axes, keepdims=True)
    return double_where(lambda t: e / t, total, _positive(total), 1.0, 0.0)


def log_softmax(x: Array, axis: Axis = -1, where: Array | None = None) -> Array:
    """``x − logsumexp(x)`` over ``axis``, with a ``where=`` mask.

    Unmasked entries match ``jax.nn.log_softmax``; masked entries (and every
    entry of a fully masked row) are ``finfo(dtype).min`` — finite, so that
    ``p · log p`` and gradients stay NaN-free.

    Example:
        >>> import jax.numpy as jnp
        >>> [round(v, 4) for v in log_softmax(jnp.array([0.0, 0.0])).tolist()]
        [-0.6931, -0.6931]
    """
    x = _float_array(x, "x")
    mask = _check_mask(where, x.shape)
    axes = _normalize_axis(axis, x.ndim)
    shifted, _ = _shifted(x, axes, mask)
    total = jnp.sum(jnp.exp(shifted), axis=axes, keepdims=True, where=mask)
    if mask is None:
        return shifted - jnp.log(total)
    out = shifted - double_where(jnp.log, total, _positive(total), 1.0, 0.0)
    return jnp.where(mask & _positive(total), out, jnp.finfo(x.dtype).min)


def mask_logits(logits: Array, mask: Array) -> Array:
    """Fill masked-out logits with ``finfo(dtype).min`` (never ``-inf``).

    Works for float16/bfloat16 (their own ``finfo.min``, no overflow).

    Example:
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


def _check_labels(labels: Array, logits_shape: tuple[int, ...]) -> Array:
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
    logits: Array,
    labels: Array,
    *,
    class_mask: Array | None = None,
    weights: Array | None = None,
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
      weights: optional float ``(...)`` per-example weights.

    Returns:
      Scalar loss.

    Raises:
      ValueError: an empty batch, no classes, labels out of range, or shape mismatches.

    Example:
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


# --------------------------------------------------------------------------
# Straight-through estimators
# --------------------------------------------------------------------------


def straight_through(fn: Callable[[Array], Array]) -> Callable[[Array], Array]:
    """Wrap ``fn`` so its forward value is ``fn(x)`` and its gradient is the identity.

    ``fn`` must preserve shape and dtype (quantisers, rounding, sign, …).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> sign_ste = straight_through(jnp.sign)
        >>> float(sign_ste(-0.3)), float(jax.grad(sign_ste)(-0.3))
        (-1.0, 1.0)
    """
    check_callable(fn, "fn")

    def wrapped(x: Array) -> Array:
        x = _float_array(x, "x")
        y = fn(x)
        if jnp.shape(y) != x.shape:
            raise ValueError(
                f"straight_through: `fn` must preserve the shape {x.shape}, got {jnp.shape(y)}"
            )
        return x + jax.lax.stop_gradient(jnp.asarray(y, x.dtype) - x)

    wrapped.__name__ = f"straight_through_{getattr(fn, '__name__', 'fn')}"
    wrapped.__doc__ = f"Straight-through version of {getattr(fn, '__name__', 'fn')}."
    return wrapped


def round_ste(x: Array) -> Array:
    """``round(x)`` forward, identity gradient (the straight-through estimator).

    Example:
        >>> import jax
        >>> float(round_ste(1.7)), float(jax.grad(round_ste)(1.7))
        (2.0, 1.0)
    """
    x = _float_array(x, "x")
    return x + jax.lax.stop_gradient(jnp.round(x) - x)
