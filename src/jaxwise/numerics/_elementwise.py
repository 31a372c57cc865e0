"""Elementwise safe functions and straight-through estimators."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._shared._checks import check_callable, check_float
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

__all__ = ["entropy", "logit", "round_ste", "safe_log", "safe_sqrt", "sinc", "straight_through"]


def safe_sqrt(x: ArrayLike) -> Array:
    """``sqrt(x)`` for ``x > 0`` and 0 for ``x ≤ 0``, with gradient 0 there (not ∞).

    Safe at the singular point, not a filter: ``safe_sqrt(nan)`` is NaN.

    Args:
        x: floating-point array, any shape.

    Returns:
        An array of ``x``'s shape and dtype.

    Raises:
        TypeError: ``x`` is not a floating-point array.

    Examples:
        >>> import jax
        >>> float(jax.grad(safe_sqrt)(0.0)), float(jax.grad(safe_sqrt)(4.0))
        (0.0, 0.25)
    """
    x = _float_array(x, "x")
    return double_where(jnp.sqrt, x, _positive(x), 1.0, 0.0)


def safe_log(x: ArrayLike, fill: float | None = None) -> Array:
    """``log(x)`` for ``x > 0``; a finite ``fill`` (default ``log(tiny)``) for ``x ≤ 0``, grad 0.

    The default fill is the log of the smallest normal number of ``x``'s
    dtype (≈ −87.3 for float32; float16 and bfloat16 use their own): finite, so
    ``0 · safe_log(0) = 0``. A NaN input gives NaN.

    Args:
        x: floating-point array, any shape.
        fill: the value where ``x ≤ 0`` (a finite float); ``None`` for ``log(finfo.tiny)``.

    Returns:
        An array of ``x``'s shape and dtype.

    Raises:
        TypeError: ``x`` is not a floating-point array, or ``fill`` is not a float.

    Examples:
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


def sinc(x: ArrayLike) -> Array:
    """Normalised sinc ``sin(πx)/(πx)``, 1 at 0, exact first and second derivatives at 0.

    Same definition as ``numpy.sinc``. Near 0 a Taylor polynomial
    ``1 − (πx)²/6 + (πx)⁴/120`` replaces the quotient (its error is below
    float32 resolution there), so ``grad`` gives 0 and ``grad(grad)`` gives
    ``−π²/3`` at ``x = 0``.

    Args:
        x: floating-point array, any shape.

    Returns:
        An array of ``x``'s shape and dtype.

    Raises:
        TypeError: ``x`` is not a floating-point array.

    Examples:
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


def entropy(p: ArrayLike, axis: Axis = -1, where: ArrayLike | None = None) -> Array:
    """Shannon entropy ``−Σ p log p`` (nats) with ``0 · log 0 = 0`` and finite gradients.

    A NaN probability makes the entropy NaN (bad input is not hidden).

    Args:
        p: floating-point probabilities, any shape.
        axis: the axis (or axes) summed over; ``None`` for all.
        where: optional boolean mask, broadcastable to ``p``: the entries taking part.

    Returns:
        ``p``'s shape without ``axis``, ``p``'s dtype.

    Raises:
        TypeError: ``p`` is not a floating-point array or ``where`` is not boolean.
        ValueError: ``axis`` is out of range or ``where`` does not broadcast to ``p``.

    Examples:
        >>> round(float(entropy(jnp.array([0.5, 0.5, 0.0]))), 6)
        0.693147
    """
    p = _float_array(p, "p")
    mask = _check_mask(where, p.shape)
    _normalize_axis(axis, p.ndim)
    plogp = double_where(lambda t: t * jnp.log(t), p, _positive(p), 1.0, 0.0)
    return -jnp.sum(plogp, axis=axis, where=mask)


_LOGIT_CLIP = 20.0


def logit(p: ArrayLike) -> Array:
    """``log(p / (1 − p))``, clipped to ±20, with finite gradients at ``p ∈ {0, 1}``.

    Exact with derivative ``1 / (p (1 − p))`` for ``p`` strictly inside
    (0, 1) (where the value is within ±20); ``p ≤ 0`` gives −20 and
    ``p ≥ 1`` gives 20, both with gradient 0. ``logit(nan)`` is NaN.

    Args:
        p: floating-point probabilities, any shape.

    Returns:
        An array of ``p``'s shape and dtype, in [−20, 20].

    Raises:
        TypeError: ``p`` is not a floating-point array.

    Examples:
        >>> float(logit(0.5)), float(logit(1.0)), float(logit(0.0))
        (0.0, 20.0, -20.0)
    """
    p = _float_array(p, "p")
    inside = ~((p <= 0) | (p >= 1))  # NaN counts as inside: it stays NaN
    raw = double_where(lambda q: jnp.log(q) - jnp.log1p(-q), p, inside, 0.5, 0.0)
    edge = jnp.where(p >= 1, _LOGIT_CLIP, -_LOGIT_CLIP).astype(p.dtype)
    return jnp.where(inside, jnp.clip(raw, -_LOGIT_CLIP, _LOGIT_CLIP), edge)


# --------------------------------------------------------------------------
# Straight-through estimators
# --------------------------------------------------------------------------


def straight_through(fn: Callable[[Array], Array]) -> Callable[[Array], Array]:
    """Wrap ``fn`` so its forward value is ``fn(x)`` and its gradient is the identity.

    ``fn`` must preserve shape and dtype (quantisers, rounding, sign, …).

    Args:
        fn: elementwise function of one floating-point array, returning the same shape.

    Returns:
        A function of ``x`` (floating point, any shape) returning ``fn(x)`` in ``x``'s dtype,
            whose derivative is the identity; it raises ``TypeError`` for a non-float ``x`` and
            ``ValueError`` when ``fn`` changes the shape.

    Raises:
        TypeError: ``fn`` is not callable.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> sign_ste = straight_through(jnp.sign)
        >>> float(sign_ste(-0.3)), float(jax.grad(sign_ste)(-0.3))
        (-1.0, 1.0)
    """
    check_callable(fn, "fn")

    def wrapped(x: ArrayLike) -> Array:
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


def round_ste(x: ArrayLike) -> Array:
    """``round(x)`` forward, identity gradient (the straight-through estimator).

    Args:
        x: floating-point array, any shape.

    Returns:
        ``round(x)``: ``x``'s shape and dtype.

    Raises:
        TypeError: ``x`` is not a floating-point array.

    Examples:
        >>> import jax
        >>> float(round_ste(1.7)), float(jax.grad(round_ste)(1.7))
        (2.0, 1.0)
    """
    x = _float_array(x, "x")
    return x + jax.lax.stop_gradient(jnp.round(x) - x)
