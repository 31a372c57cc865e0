"""Validation helpers and the double where (the one mechanism behind every safe function)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jax.typing import ArrayLike

from jaxwise._shared._checks import check_array, check_callable, is_int

__all__ = ["Array", "ArrayLike", "Axis", "double_where"]

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
    spec: Any = axis
    if is_int(spec):
        axes: tuple[int, ...] = (int(spec),)
    elif isinstance(spec, (tuple, list)) and all(is_int(a) for a in spec):
        axes = tuple(int(a) for a in spec)
    else:
        raise TypeError(f"`axis` must be an int, a tuple of ints or None, got {axis!r}")
    for a in axes:
        if not -ndim <= a < max(ndim, 1):
            raise ValueError(f"`axis` {axis} is out of range for an input with {ndim} dimensions")
    return tuple(a % max(ndim, 1) for a in axes)


def _check_broadcasts(ok: tuple[int, ...], x: tuple[int, ...]) -> None:
    """Numpy's broadcasting rule, checked before tracing so the error names ``ok``."""
    for a, b in zip(reversed(ok), reversed(x)):
        if a != b and 1 not in (a, b):
            raise ValueError(
                f"`ok` must broadcast against `x`: got `ok` of shape {ok} and `x` of shape {x}"
            )


def double_where(
    fn: Callable[[Array], Array],
    x: ArrayLike,
    ok: ArrayLike,
    safe_value: ArrayLike,
    fill: ArrayLike,
) -> Array:
    """``fn(x)`` where ``ok``, ``fill`` elsewhere — with finite gradients everywhere.

    Computes ``where(ok, fn(where(ok, x, safe_value)), fill)``: ``fn`` never
    sees an input outside its safe domain, so the unselected branch has a
    finite derivative and the zero cotangent cannot make it NaN.

    Args:
        fn: elementwise function, finite and differentiable at ``safe_value``.
        x: input array (any shape and dtype ``fn`` accepts).
        ok: boolean array broadcastable to ``x``: where ``fn(x)`` is wanted.
        safe_value: a scalar input at which ``fn`` is harmless (e.g. 1 for ``log``), cast to
            ``x``'s dtype.
        fill: the output where ``not ok`` (a scalar, cast to the output's dtype).

    Returns:
        ``fn(x)`` where ``ok`` and ``fill`` elsewhere: the broadcast shape of ``x`` and ``ok``,
            the dtype of ``fn``'s output.

    Raises:
        TypeError: ``fn`` is not callable, ``x`` is not an array, or ``ok`` is not boolean.
        ValueError: ``ok``'s shape does not broadcast against ``x``'s.

    Examples:
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
    _check_broadcasts(ok.shape, x.shape)
    safe_x = jnp.where(ok, x, jnp.asarray(safe_value, x.dtype))
    out = fn(safe_x)
    return jnp.where(ok, out, jnp.asarray(fill, out.dtype))
