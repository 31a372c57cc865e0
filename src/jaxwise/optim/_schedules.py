"""Learning-rate schedules, with Optax's signatures and semantics.

A schedule maps the step count (an int32 array inside ``jit``) to a value;
it is evaluated inside the compiled program, so it never recompiles and
never drifts from the optimizer's own count.

Example:
    >>> sched = warmup_cosine_decay_schedule(0.0, 1e-2, warmup_steps=100, decay_steps=1000, end_value=1e-4)
    >>> [round(float(sched(s)), 6) for s in (0, 50, 100, 1000)]
    [0.0, 0.005, 0.01, 0.0001]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxwise.optim._base import Schedule, check_nonnegative


def _check_steps(value: Any, name: str, *, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"`{name}` must be {'> 0' if positive else '>= 0'}, got {value}")


def _as_float(count: jax.Array | int) -> jax.Array:
    """The step count in the default float dtype (float64 under x64): no int32 overflow."""
    return jnp.asarray(count).astype(jnp.result_type(float))


def constant_schedule(value: float) -> Schedule:
    """Always ``value``.

    Example:
        >>> constant_schedule(0.1)(123)
        0.1
    """
    return lambda count: value


def linear_schedule(init_value: float, end_value: float, transition_steps: int, transition_begin: int = 0) -> Schedule:
    """Linear from ``init_value`` to ``end_value`` over ``transition_steps`` after ``transition_begin``.

    ``transition_steps <= 0`` gives a constant ``init_value`` (as in Optax).

    Example:
        >>> [float(linear_schedule(1.0, 0.0, 4)(s)) for s in (0, 2, 4, 9)]
        [1.0, 0.5, 0.0, 0.0]
    """
    _check_steps(transition_begin, "transition_begin")
    if isinstance(transition_steps, bool) or not isinstance(transition_steps, int):
        raise TypeError(f"`transition_steps` must be an int, got {transition_steps!r}")
    if transition_steps <= 0:
        return lambda count: init_value

    def schedule(count: jax.Array) -> jax.Array:
        count = jnp.clip(_as_float(count) - transition_begin, 0, transition_steps)
        frac = 1 - count / transition_steps
        return (init_value - end_value) * frac + end_value

    return schedule


def cosine_decay_schedule(init_value: float, decay_steps: int, alpha: float = 0.0, exponent: float = 1.0) -> Schedule:
    """Cosine decay from ``init_value`` to ``alpha · init_value`` over ``decay_steps``, then constant.

    References:
      Loshchilov & Hutter, SGDR: Stochastic Gradient Descent with Warm
      Restarts, ICLR 2017, https://arxiv.org/abs/1608.03983

    Example:
        >>> [round(float(cosine_decay_schedule(1.0, 10)(s)), 4) for s in (0, 5, 10, 20)]
        [1.0, 0.5, 0.0, 0.0]
    """
    _check_steps(decay_steps, "decay_steps", positive=True)
    check_nonnegative(alpha, "alpha")

    def schedule(count: jax.Array) -> jax.Array:
        count = jnp.minimum(_as_float(count), float(decay_steps))
        cosine = 0.5 * (1 + jnp.cos(jnp.pi * count / float(decay_steps)))
        return init_value * ((1 - alpha) * cosine**exponent + alpha)

    return schedule


def warmup_cosine_decay_schedule(
    init_value: float,
    peak_value: float,
    warmup_steps: int,
    decay_steps: int,
    end_value: float = 0.0,
    exponent: float = 1.0,
) -> Schedule:
    """Linear warm-up to ``peak_value``, then cosine decay to ``end_value``.

    As in Optax, ``decay_steps`` is the *total* length including the warm-up:
    the cosine part lasts ``decay_steps − warmup_steps`` steps.

    Example:
        >>> s = warmup_cosine_decay_schedule(0.0, 1.0, 10, 110)
        >>> [round(float(s(t)), 4) for t in (0, 5, 10, 60, 110, 200)]
        [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]
    """
    _check_steps(warmup_steps, "warmup_steps")
    _check_steps(decay_steps, "decay_steps", positive=True)
    if warmup_steps > decay_steps:
        raise ValueError(
            f"`warmup_steps` ({warmup_steps}) must be <= `decay_steps` ({decay_steps}): decay_steps counts "
            "the warm-up too (Optax semantics)"
        )
    if warmup_steps == decay_steps:
        raise ValueError(f"`decay_steps` ({decay_steps}) must exceed `warmup_steps` to leave a decay phase")
    alpha = 0.0 if peak_value == 0.0 else end_value / peak_value
    return join_schedules(
        [
            linear_schedule(init_value, peak_value, warmup_steps),
            cosine_decay_schedule(peak_value, decay_steps - warmup_steps, alpha, exponent),
        ],
        [warmup_steps],
    )


def piecewise_constant_schedule(init_value: float, boundaries_and_scales: dict[int, float] | None = None) -> Schedule:
    """``init_value`` multiplied by each scale once the count reaches its boundary.

    Example:
        >>> s = piecewise_constant_schedule(1.0, {10: 0.1, 20: 0.5})
        >>> [round(float(s(t)), 4) for t in (0, 10, 15, 20, 30)]
        [1.0, 0.1, 0.1, 0.05, 0.05]
    """
    items = sorted((boundaries_and_scales or {}).items())
    for boundary, factor in items:
        _check_steps(boundary, "boundaries_and_scales key")
        check_nonnegative(factor, "boundaries_and_scales value")

    def schedule(count: jax.Array) -> jax.Array:
        value = jnp.asarray(init_value, jnp.result_type(float))
        for boundary, factor in items:
            value = jnp.where(count >= boundary, value * factor, value)
        return value

    return schedule


def join_schedules(schedules: Sequence[Schedule], boundaries: Sequence[int]) -> Schedule:
    """Run ``schedules[i]`` from ``boundaries[i-1]``, each seeing the steps since its boundary.

    Example:
        >>> s = join_schedules([constant_schedule(1.0), linear_schedule(1.0, 0.0, 10)], [5])
        >>> [float(s(t)) for t in (0, 4, 5, 10, 15)]
        [1.0, 1.0, 1.0, 0.5, 0.0]
    """
    schedules, boundaries = list(schedules), list(boundaries)
    if len(schedules) != len(boundaries) + 1:
        raise ValueError(f"need len(schedules) == len(boundaries) + 1, got {len(schedules)} and {len(boundaries)}")
    for b in boundaries:
        _check_steps(b, "boundaries")
    if any(a > b for a, b in zip(boundaries, boundaries[1:])):
        raise ValueError(f"`boundaries` must be non-decreasing, got {boundaries}")
    for s in schedules:
        if not callable(s):
            raise TypeError(f"every schedule must be callable, got {s!r}")

    def schedule(step: jax.Array) -> jax.Array:
        output = schedules[0](step)
        for boundary, fn in zip(boundaries, schedules[1:]):
            output = jnp.where(step < boundary, output, fn(step - boundary))
        return output

    return schedule
