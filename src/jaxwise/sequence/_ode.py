"""Classical Runge-Kutta (RK4) integration in a ``lax.scan``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp

from jaxwise._shared._checks import check_callable, check_float, check_int
from jaxwise.sequence._common import Array, Tracer

Y = TypeVar("Y")

__all__ = ["odeint_rk4", "rk4_step"]


def _axpy(h: Any, k: Any, y: Any) -> Any:
    return jax.tree.map(lambda ki, yi: yi + h * ki, k, y)


def rk4_step(
    f: Callable[[Any, Y, Any], Y],
    t: float | Array,
    y: Y,
    h: float | Array,
    args: Any = None,
) -> Y:
    """One classical Runge-Kutta step of ``dy/dt = f(t, y, args)`` (pytree ``y``).

    Args:
        f: ``f(t, y, args)`` returning a pytree like ``y``.
        t: the time at the start of the step.
        y: the state, a pytree of float arrays.
        h: the step size.
        args: passed to ``f`` unchanged.

    Returns:
        The state after the step, ``y``'s structure, shapes and dtypes.

    Raises:
        TypeError: ``f`` is not callable.

    Examples:
        >>> round(float(rk4_step(lambda t, y, a: -y, 0.0, 1.0, 0.1)), 6)
        0.904837
    """
    check_callable(f, "f")
    k1 = f(t, y, args)
    k2 = f(t + h / 2, _axpy(h / 2, k1, y), args)
    k3 = f(t + h / 2, _axpy(h / 2, k2, y), args)
    k4 = f(t + h, _axpy(h, k3, y), args)
    return jax.tree.map(
        lambda yi, a, b, c, d: yi + (h / 6) * (a + 2 * b + 2 * c + d), y, k1, k2, k3, k4
    )


def _time_dtype(y0: Any) -> Any:
    """The state's floating dtype (float64 under x64 for a float64 state), float32 by default."""
    for leaf in jax.tree.leaves(y0):
        dtype = jnp.result_type(leaf)
        if jnp.issubdtype(dtype, jnp.floating):
            return dtype
    return jnp.dtype(jnp.float32)


def _check_scalar(value: Any, name: str) -> None:
    if isinstance(value, Tracer):
        if value.shape != ():
            raise ValueError(f"`{name}` must be a scalar, got shape {value.shape}")
        return
    check_float(value, name)


def odeint_rk4(
    f: Callable[[Any, Y, Any], Y],
    y0: Y,
    t0: float | Array,
    dt: float | Array,
    n_steps: int,
    args: Any = None,
) -> tuple[Y, Y]:
    """Integrate ``dy/dt = f(t, y, args)`` with ``n_steps`` RK4 steps of size ``dt`` (a scan).

    Step ``i`` starts at ``t_i = t0 + i · dt``, computed in the state's dtype (float64
    under x64 for a float64 state) from the step index — never by accumulating ``t += dt``,
    whose rounding error grows with the number of steps (20,000 float32 steps drift by
    ~6e-4) and caps the method's 4th-order convergence. Differentiable w.r.t. ``y0`` and
    ``args`` (backpropagation through the scan); batch over initial values with ``vmap``.

    Args:
        f: ``f(t, y, args)`` returning a pytree like ``y``.
        y0: initial state (a pytree of float arrays).
        t0: start time (finite; may be traced).
        dt: step size (finite; may be traced).
        n_steps: static int ≥ 1.
        args: passed to ``f`` unchanged.

    Returns:
        ``(y_T, trajectory)``: the final state and the ``n_steps`` states after
            each step (``y0`` excluded), each leaf of shape ``(n_steps, *leaf.shape)``.

    Raises:
        TypeError: ``f`` is not callable, ``n_steps`` not an int, or ``t0``/``dt`` not numbers.
        ValueError: ``n_steps < 1``, or ``t0``/``dt`` not finite scalars.

    Examples:
        Harmonic oscillator, one period:

        >>> f = lambda t, y, w: jnp.stack([y[1], -w**2 * y[0]])
        >>> yT, traj = odeint_rk4(f, jnp.asarray([1.0, 0.0]), 0.0, 2 * 3.14159265 / 1000, 1000, 1.0)
        >>> [round(abs(v), 4) for v in yT.tolist()], traj.shape
        ([1.0, 0.0], (1000, 2))
    """
    check_callable(f, "f")
    n_steps = check_int(n_steps, "n_steps", min_value=1)
    _check_scalar(t0, "t0")
    _check_scalar(dt, "dt")
    dtype = _time_dtype(y0)
    h = jnp.asarray(dt, dtype)
    times = jnp.asarray(t0, dtype) + jnp.arange(n_steps, dtype=dtype) * h

    def step(y: Y, t: Array) -> tuple[Y, Y]:
        y = rk4_step(f, t, y, h, args)
        return y, y

    return jax.lax.scan(step, y0, times)
