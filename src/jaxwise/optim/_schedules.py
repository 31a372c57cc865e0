"""Learning-rate schedules: Optax's, with their arguments validated at construction.

A schedule maps the step count (an int32 array inside ``jit``) to a value; it is evaluated
inside the compiled program, so it never recompiles and never drifts from the optimizer's own
count. Each function returns Optax's schedule, called under standard dtype promotion (so it
also works under ``jax_numpy_dtype_promotion="strict"``): pass it to any Optax optimizer.

Examples:
    >>> sched = warmup_cosine_decay_schedule(0.0, 1e-2, 100, 1000, end_value=1e-4)
    >>> [round(float(sched(s)), 6) for s in (0, 50, 100, 1000)]
    [0.0, 0.005, 0.01, 0.0001]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import jax
import optax
from jax.typing import ArrayLike

from jaxwise._shared._checks import check_float, check_int
from jaxwise.optim._base import Scalar, Steps, hyper

# What the factories return: a function of the step count giving a Python float (a constant
# schedule) or a scalar array. An optax.Schedule (whose result type also admits complex
# numbers and arrays of any shape), so it goes wherever Optax takes one.
Schedule = Callable[[ArrayLike], float | jax.Array]


def _promoting(schedule: optax.Schedule) -> Schedule:
    def wrapped(count: ArrayLike) -> float | jax.Array:
        with jax.numpy_dtype_promotion("standard"):
            return cast(float | jax.Array, schedule(count))

    return wrapped


def constant_schedule(value: Scalar) -> Schedule:
    """Always ``value`` (``optax.constant_schedule``).

    Args:
        value: a finite number.

    Returns:
        The schedule, a function of the step count.

    Raises:
        TypeError: an argument has the wrong type (e.g. a bool, or a string for a number).
        ValueError: an argument is out of range, NaN or infinite.

    Examples:
        >>> constant_schedule(0.1)(123)
        0.1
    """
    return _promoting(optax.constant_schedule(hyper(value, "value")))


def linear_schedule(
    init_value: Scalar, end_value: Scalar, transition_steps: Steps, transition_begin: Steps = 0
) -> Schedule:
    """Linear from ``init_value`` to ``end_value`` over ``transition_steps`` steps.

    ``optax.linear_schedule``: constant before ``transition_begin``; ``transition_steps=0``
    gives a constant ``init_value``.

    Args:
        init_value: the value up to ``transition_begin``.
        end_value: the value from ``transition_begin + transition_steps`` on.
        transition_steps: the length of the ramp, >= 0.
        transition_begin: the step where the ramp starts, >= 0.

    Returns:
        The schedule, a function of the step count.

    Raises:
        TypeError: an argument has the wrong type (e.g. a bool, or a string for a number).
        ValueError: an argument is out of range, NaN or infinite.

    Examples:
        >>> [float(linear_schedule(1.0, 0.0, 4)(s)) for s in (0, 2, 4, 9)]
        [1.0, 0.5, 0.0, 0.0]
    """
    return _promoting(
        optax.linear_schedule(
            hyper(init_value, "init_value"),
            hyper(end_value, "end_value"),
            check_int(transition_steps, "transition_steps", min_value=0),
            check_int(transition_begin, "transition_begin", min_value=0),
        )
    )


def cosine_decay_schedule(
    init_value: Scalar, decay_steps: Steps, alpha: Scalar = 0.0, exponent: Scalar = 1.0
) -> Schedule:
    """Cosine decay from ``init_value`` to ``alpha * init_value`` over ``decay_steps``.

    ``optax.cosine_decay_schedule``.

    Args:
        init_value: the value at step 0.
        decay_steps: the length of the decay, >= 1.
        alpha: the final value as a fraction of ``init_value``, >= 0.
        exponent: the power applied to the cosine factor.

    Returns:
        The schedule, a function of the step count.

    Raises:
        TypeError: an argument has the wrong type (e.g. a bool, or a string for a number).
        ValueError: an argument is out of range, NaN or infinite.

    References:
        Loshchilov & Hutter, SGDR: Stochastic Gradient Descent with Warm Restarts, ICLR 2017,
        https://arxiv.org/abs/1608.03983

    Examples:
        >>> [round(float(cosine_decay_schedule(1.0, 10)(s)), 4) for s in (0, 5, 10, 20)]
        [1.0, 0.5, 0.0, 0.0]
    """
    return _promoting(
        optax.cosine_decay_schedule(
            hyper(init_value, "init_value"),
            check_int(decay_steps, "decay_steps", min_value=1),
            hyper(alpha, "alpha", min_value=0.0),
            hyper(exponent, "exponent"),
        )
    )


def warmup_cosine_decay_schedule(
    init_value: Scalar,
    peak_value: Scalar,
    warmup_steps: Steps,
    decay_steps: Steps,
    end_value: Scalar = 0.0,
    exponent: Scalar = 1.0,
) -> Schedule:
    """Linear warm-up to ``peak_value``, then cosine decay to ``end_value``.

    ``optax.warmup_cosine_decay_schedule``: ``decay_steps`` is the *total* length, warm-up
    included, so it must exceed ``warmup_steps``.

    Args:
        init_value: the value at step 0.
        peak_value: the value at the end of the warm-up.
        warmup_steps: the length of the linear warm-up, >= 0.
        decay_steps: the total length (warm-up included), > ``warmup_steps``.
        end_value: the value from ``decay_steps`` on.
        exponent: the power applied to the cosine factor.

    Returns:
        The schedule, a function of the step count.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: an argument is out of range, or ``warmup_steps >= decay_steps``.

    Examples:
        >>> s = warmup_cosine_decay_schedule(0.0, 1.0, 10, 110)
        >>> [round(float(s(t)), 4) for t in (0, 5, 10, 60, 110, 200)]
        [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]
    """
    warmup_steps = check_int(warmup_steps, "warmup_steps", min_value=0)
    decay_steps = check_int(decay_steps, "decay_steps", min_value=1)
    if warmup_steps >= decay_steps:
        raise ValueError(
            f"`warmup_steps` ({warmup_steps}) must be < `decay_steps` ({decay_steps}): decay_steps "
            "counts the warm-up too (Optax semantics) and must leave a decay phase"
        )
    return _promoting(
        optax.warmup_cosine_decay_schedule(
            hyper(init_value, "init_value"),
            hyper(peak_value, "peak_value"),
            warmup_steps,
            decay_steps,
            hyper(end_value, "end_value"),
            hyper(exponent, "exponent"),
        )
    )


def piecewise_constant_schedule(
    init_value: Scalar, boundaries_and_scales: dict[Steps, Scalar] | None = None
) -> Schedule:
    """``init_value`` times each scale once the count reaches its boundary.

    ``optax.piecewise_constant_schedule``.

    Args:
        init_value: the value before the first boundary.
        boundaries_and_scales: ``{step: scale}`` (steps >= 0, scales >= 0); ``None`` for a
            constant schedule.

    Returns:
        The schedule, a function of the step count.

    Raises:
        TypeError: ``boundaries_and_scales`` is not a dict, or a key or value has the wrong
            type.
        ValueError: a step or scale is negative, or a value is NaN or infinite.

    Examples:
        >>> s = piecewise_constant_schedule(1.0, {10: 0.1, 20: 0.5})
        >>> [round(float(s(t)), 4) for t in (0, 10, 15, 20, 30)]
        [1.0, 0.1, 0.1, 0.05, 0.05]
    """
    checked = None
    if boundaries_and_scales is not None:
        if not isinstance(boundaries_and_scales, dict):
            raise TypeError(
                "`boundaries_and_scales` must be a dict {step: scale}, got "
                f"{type(boundaries_and_scales).__name__}"
            )
        checked = {
            check_int(b, "boundaries_and_scales key", min_value=0): check_float(
                s, "boundaries_and_scales value", min_value=0.0
            )
            for b, s in boundaries_and_scales.items()
        }
    return _promoting(optax.piecewise_constant_schedule(hyper(init_value, "init_value"), checked))


def join_schedules(schedules: Sequence[optax.Schedule], boundaries: Sequence[int]) -> Schedule:
    """Run ``schedules[i]`` from ``boundaries[i-1]`` on, each seeing the steps since its boundary.

    ``optax.join_schedules``.

    Args:
        schedules: the schedules, one more than ``boundaries``.
        boundaries: the non-decreasing steps (>= 0) where each next schedule starts.

    Returns:
        The joined schedule, a function of the step count.

    Raises:
        TypeError: a schedule is not callable or a boundary is not an integer.
        ValueError: the lengths do not fit, or the boundaries decrease or are negative.

    Examples:
        >>> s = join_schedules([constant_schedule(1.0), linear_schedule(1.0, 0.0, 10)], [5])
        >>> [float(s(t)) for t in (0, 4, 5, 10, 15)]
        [1.0, 1.0, 1.0, 0.5, 0.0]
    """
    schedules, boundaries = list(schedules), list(boundaries)
    if len(schedules) != len(boundaries) + 1:
        raise ValueError(
            "`schedules` must be one longer than `boundaries`: need len(schedules) == "
            f"len(boundaries) + 1, got {len(schedules)} and {len(boundaries)}"
        )
    boundaries = [check_int(b, "boundaries", min_value=0) for b in boundaries]
    if any(a > b for a, b in zip(boundaries, boundaries[1:])):
        raise ValueError(f"`boundaries` must be non-decreasing, got {boundaries}")
    for i, s in enumerate(schedules):
        if not callable(s):
            raise TypeError(f"`schedules[{i}]` must be a schedule (callable), got {s!r}")
    return _promoting(optax.join_schedules(schedules, boundaries))
