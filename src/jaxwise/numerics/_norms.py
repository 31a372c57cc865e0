"""Norms and cosine similarity: max-scaled values, safe custom JVPs."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise.numerics._core import (
    Array,
    ArrayLike,
    Axis,
    _float_array,
    _normalize_axis,
    _positive,
    double_where,
)

__all__ = ["cosine_similarity", "safe_norm"]


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


def safe_norm(x: ArrayLike, axis: Axis = None, keepdims: bool = False) -> Array:
    """Euclidean norm with a safe custom JVP: zero subgradient at the zero vector.

    ``jnp.linalg.norm`` has a NaN gradient at 0 (``x / ‖x‖ = 0/0``). Here the
    JVP rule is ``<x/‖x‖, dx>`` guarded by a double where, so it is itself
    differentiable (Hessian-vector products through it are finite), and the
    value is computed with max-scaling so that 1e-30 or 1e30 vectors neither
    underflow nor overflow.

    Args:
        x: floating-point array, any shape.
        axis: axis or axes to reduce (``None``: all).
        keepdims: keep reduced axes with size 1.

    Returns:
        The norms: ``x``'s shape without ``axis`` (size 1 there with ``keepdims``), ``x``'s
            dtype. A reduction over no elements (an empty axis) is 0, as in
            ``numpy.linalg.norm``.

    Raises:
        TypeError: ``x`` is not floating point, or ``axis`` is not an int, a tuple of ints
            or None.
        ValueError: ``axis`` is out of range.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> jax.grad(safe_norm)(jnp.zeros(3)).tolist(), float(safe_norm(jnp.array([3.0, 4.0])))
        ([0.0, 0.0, 0.0], 5.0)
    """
    x = _float_array(x, "x")
    axis = _normalize_axis(axis, x.ndim) if axis is not None else None
    if x.size == 0:  # nothing to reduce (or nothing to return): the sum of no squares is 0
        reduced = tuple(range(x.ndim)) if axis is None else axis
        shape = tuple(1 if i in reduced else d for i, d in enumerate(x.shape))
        out = jnp.zeros(shape, x.dtype)
        return out if keepdims else jnp.squeeze(out, axis=reduced)
    return _safe_norm(x, axis, bool(keepdims))


def cosine_similarity(a: ArrayLike, b: ArrayLike, axis: int = -1) -> Array:
    """Cosine similarity along ``axis``; 0 (with finite gradients) when either vector is zero.

    A tiny but nonzero vector (e.g. 1e-30 in float32) is *not* treated as
    zero: both vectors are normalised with the max-scaled
    [`safe_norm`][jaxwise.numerics.safe_norm].

    Args:
        a: floating-point array.
        b: floating-point array of ``a``'s dtype, broadcastable with ``a``.
        axis: the vector axis.

    Returns:
        Array with ``axis`` removed. Empty vectors (``axis`` of size 0) are zero vectors:
            their similarity is 0.

    Raises:
        TypeError: non-floating or different dtypes, or a bad ``axis``.
        ValueError: shapes that do not broadcast, or ``axis`` out of range.

    Examples:
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
    if a.size == 0:  # empty vectors are zero vectors (or there is nothing to return)
        return jnp.zeros(tuple(d for i, d in enumerate(shape) if i not in axes), a.dtype)
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
