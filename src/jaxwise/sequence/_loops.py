"""Bounded (differentiable) while loops, linear recurrences, piecewise functions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp

from jaxwise._shared._checks import check_callable, check_int
from jaxwise.sequence._common import Array, ArrayLike, as_array

C = TypeVar("C")
R = TypeVar("R")

__all__ = ["bounded_while", "linear_recurrence", "piecewise", "piecewise_select"]

# --------------------------------------------------------------------------
# Loops
# --------------------------------------------------------------------------


def bounded_while(
    cond_fun: Callable[[C], ArrayLike], body_fun: Callable[[C], C], init: C, max_steps: int
) -> tuple[C, Array]:
    """``lax.while_loop`` with at most ``max_steps`` iterations — reverse-mode differentiable.

    Runs a ``lax.scan`` of ``max_steps`` iterations; once ``cond_fun`` is
    False the carry is frozen (each iteration computes
    ``where(running, body(carry), carry)``). Same result and same number of
    body applications as ``lax.while_loop`` when it finishes within
    ``max_steps``.

    Args:
        cond_fun: ``carry -> bool scalar``: keep iterating while True.
        body_fun: ``carry -> carry`` (same structure, shapes and dtypes).
        init: the initial carry, any pytree of arrays.
        max_steps: the static iteration bound, >= 1.

    Returns:
        ``(carry, steps)`` with ``steps`` the int32 number of body applications.

    Raises:
        TypeError: ``cond_fun`` or ``body_fun`` is not callable, or ``max_steps`` not an int.
        ValueError: ``max_steps < 1``.

    Examples:
        Newton's method for √a; the gradient is 1/(2√a):

        >>> def sqrt(a):
        ...     cond = lambda x: jnp.abs(x * x - a) >= 1e-6 * a
        ...     x, _ = bounded_while(cond, lambda x: 0.5 * (x + a / x), a, 50)
        ...     return x
        >>> round(float(sqrt(16.0)), 5), round(float(jax.grad(sqrt)(16.0)), 5)
        (4.0, 0.125)
    """
    check_callable(cond_fun, "cond_fun")
    check_callable(body_fun, "body_fun")
    max_steps = check_int(max_steps, "max_steps", min_value=1)

    def step(state: tuple[C, Array], _: None) -> tuple[tuple[C, Array], None]:
        carry, steps = state
        running = jnp.asarray(cond_fun(carry), bool)
        # Double where: once finished, the body is evaluated at `init` (a valid input) and its
        # result discarded, so a body singular at the converged point cannot leak NaN gradients.
        safe = jax.tree.map(lambda c, i: jnp.where(running, c, i), carry, init)
        new = body_fun(safe)
        carry = jax.tree.map(lambda n, o: jnp.where(running, n, o), new, carry)
        return (carry, steps + running.astype(jnp.int32)), None

    (carry, steps), _ = jax.lax.scan(
        step, (init, jnp.zeros((), jnp.int32)), None, length=int(max_steps)
    )
    return carry, steps


def linear_recurrence(a: ArrayLike, b: ArrayLike, h0: ArrayLike | None = None) -> Array:
    """All ``h_t = a_t ⊙ h_{t−1} + b_t`` (``h_{−1} = h0``, default 0) by ``lax.associative_scan``.

    O(log T) depth: the composition of two steps is again a step,
    ``(a₁, b₁) ∘ (a₂, b₂) = (a₂ a₁, a₂ b₁ + b₂)``. Equal to the sequential
    scan (on CPU the sequential one is often faster; on accelerators the
    associative one parallelises over T).

    Args:
        a: float ``(T, …)``: the elementwise coefficients.
        b: float ``(T, …)``, ``a``'s shape: the inputs.
        h0: optional initial state, broadcastable to ``b[0]``; default 0.

    Returns:
        ``(T, …)`` states ``h_0 … h_{T-1}``, ``b``'s dtype.

    Raises:
        TypeError: ``a`` or ``b`` is not a floating-point array.
        ValueError: ``a`` and ``b`` differ in shape or are scalars.

    Examples:
        >>> linear_recurrence(jnp.asarray([0.5, 0.5, 0.5]), jnp.asarray([1.0, 1.0, 1.0])).tolist()
        [1.0, 1.5, 1.75]
    """
    a, b = as_array(a, "a", dtype_kind="f"), as_array(b, "b", dtype_kind="f")
    if a.shape != b.shape or a.ndim < 1:
        raise ValueError(
            f"`a` and `b` must have the same shape (T, …), got {a.shape} and {b.shape}"
        )
    if h0 is not None:
        b = b.at[0].add(a[0] * jnp.asarray(h0, b.dtype))

    def compose(left: tuple, right: tuple) -> tuple:
        a1, b1 = left
        a2, b2 = right
        return a2 * a1, a2 * b1 + b2

    return jax.lax.associative_scan(compose, (a, b))[1]


# --------------------------------------------------------------------------
# Piecewise functions
# --------------------------------------------------------------------------


def piecewise(index: ArrayLike, branches: Sequence[Callable[..., R]], *operands: Any) -> R:
    """``branches[index](*operands)`` via ``lax.switch`` (index clamped to the valid range).

    Under ``jit`` with a scalar index, only the chosen branch runs. Under
    ``vmap`` with a batched index, JAX turns ``switch`` into ``select_n``:
    **every branch is computed** for every element and the results
    selected — cost is the sum of the branches, and a branch that is invalid
    for some inputs (``log`` of a negative) still runs on them, so make
    branches safe (see [`double_where`][jaxwise.numerics.double_where]).

    Args:
        index: integer scalar (clamped to ``[0, len(branches) - 1]``).
        branches: functions of ``*operands`` returning the same structure, shapes and dtypes.
        *operands: the arguments passed to the chosen branch (any pytrees).

    Returns:
        The chosen branch's output.

    Raises:
        ValueError: ``branches`` is empty.
        TypeError: a branch is not callable.

    Examples:
        >>> piecewise(jnp.asarray(1), [lambda x: x + 1, lambda x: x * 10], 2.0).item()
        20.0
    """
    branches = list(branches)
    if not branches:
        raise ValueError("`branches` must not be empty")
    for i, b in enumerate(branches):
        check_callable(b, f"branches[{i}]")
    return jax.lax.switch(
        jnp.clip(jnp.asarray(index, jnp.int32), 0, len(branches) - 1), branches, *operands
    )


def piecewise_select(
    conditions: Sequence[ArrayLike], values: Sequence[ArrayLike], default: ArrayLike = 0.0
) -> Array:
    """Elementwise piecewise values: the first true condition picks its value (``jnp.select``).

    All ``values`` are computed everywhere (as under ``vmap``); guard them.

    Args:
        conditions: boolean arrays, broadcastable together with ``values``.
        values: one array per condition.
        default: the value where no condition holds.

    Returns:
        The broadcast shape of the conditions and values.

    Raises:
        ValueError: no conditions, or not as many conditions as values.

    Examples:
        >>> x = jnp.asarray([-2.0, 0.5, 3.0])
        >>> piecewise_select([x < 0, x < 1], [jnp.zeros(3), x], default=1.0).tolist()
        [0.0, 0.5, 1.0]
    """
    conditions, values = list(conditions), list(values)
    if len(conditions) != len(values) or not conditions:
        raise ValueError(
            f"need as many `conditions` as `values` (>= 1), got {len(conditions)} and {len(values)}"
        )
    return jnp.select(conditions, values, default)
