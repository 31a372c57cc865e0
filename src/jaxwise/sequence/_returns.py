"""Discounted, TD(λ) and GAE returns: one reverse linear recurrence each.

Every estimator here is ``g_t = b_t + a_t · g_{t+1}`` once its coefficients are computed
vectorised over the whole trajectory; the reverse ``lax.scan`` then carries one scalar and
reads two numbers per step (rlax's scans read three and recompute the mixing each step).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxwise.sequence._common import Array, ArrayLike, as_array, check_rate

__all__ = ["discounted_returns", "gae", "lambda_returns"]


def _per_step(name: str, value: Any, length: int | None, dtype: Any = None) -> Array:
    """A 1-D per-step array (float, int or bool values), cast to ``dtype``."""
    arr = as_array(value, name, dtype_kind="fiub")
    if arr.ndim != 1:
        raise ValueError(
            f"`{name}` must be 1-D (one trajectory; batch with vmap), got shape {arr.shape}"
        )
    if length is not None and arr.shape[0] != length:
        raise ValueError(
            f"`{name}` must have length {length} (one entry per step), got {arr.shape[0]}"
        )
    return arr if dtype is None else arr.astype(dtype)


def _rewards(rewards: Any) -> tuple[Array, Any, int]:
    r = _per_step("rewards", rewards, None)
    if r.shape[0] == 0:
        raise ValueError("`rewards` must not be empty (a trajectory has at least one step)")
    dtype = r.dtype if jnp.issubdtype(r.dtype, jnp.floating) else jnp.float32
    return r.astype(dtype), dtype, int(r.shape[0])


def _truncation(
    truncated: Any, next_values: Any, length: int, dtype: Any
) -> tuple[Array, Array] | None:
    if truncated is None:
        return None
    if next_values is None:
        raise ValueError("`truncated` needs `next_values` (the value estimates to bootstrap from)")
    cut = _per_step("truncated", truncated, length, dtype)
    return cut, _per_step("next_values", next_values, length, dtype)


def _reverse_linear(a: Array, b: Array, last: Array) -> Array:
    """All ``g_t = b_t + a_t g_{t+1}`` with ``g_T = last``, by a reverse scan.

    Unrolled 8 steps per loop iteration: the body is two scalar flops, so on CPU the loop
    overhead dominates (measured 0.85x the time of ``unroll=1`` in bench_sequence.py).
    """

    def step(future: Array, ab: tuple[Array, Array]) -> tuple[Array, Array]:
        g = ab[1] + ab[0] * future
        return g, g

    return jax.lax.scan(step, last, (a, b), reverse=True, unroll=8)[1]


def discounted_returns(
    rewards: ArrayLike,
    dones: ArrayLike,
    gamma: float | Array,
    *,
    truncated: ArrayLike | None = None,
    next_values: ArrayLike | None = None,
) -> Array:
    """``G_t = r_t + γ (1 − d_t) G_{t+1}`` by a reverse ``lax.scan``.

    Truncation is not termination: at a step cut by a time limit
    (``truncated[t] = 1``, ``dones[t] = 0``) the return bootstraps from the
    value of the true next state, ``G_t = r_t + γ next_values[t]``, instead of
    being treated as terminal (the common RL bug). With ``next_values`` the
    last step also bootstraps (``G_{T-1} = r + γ next_values[T-1]`` unless
    done); without, the trajectory is assumed to end there.

    Args:
        rewards: 1-D ``(T,)``, ``T ≥ 1``.
        dones: 1-D ``(T,)`` 0/1 or bool: true terminations.
        gamma: discount in [0, 1] (may be traced).
        truncated: optional 1-D 0/1 flags of time-limit cuts.
        next_values: optional ``(T,)`` estimates ``V(s_{t+1})`` of each step's
            actual next state (required with ``truncated``).

    Returns:
        ``(T,)`` returns, ``rewards``' floating dtype (float32 for integer rewards).

    Raises:
        TypeError: an input is not a real array, or a rate is not a number.
        ValueError: a shape does not fit (1-D, one entry per step), ``rewards`` is empty, a
            rate is outside [0, 1], or ``truncated`` comes without ``next_values``.

    Examples:
        >>> r, d = jnp.asarray([1.0, 1.0, 1.0]), jnp.zeros(3)
        >>> discounted_returns(r, d, 0.5, truncated=jnp.asarray([0.0, 1.0, 0.0]),
        ...                    next_values=jnp.asarray([0.0, 10.0, 0.0])).tolist()
        [4.0, 6.0, 1.0]
    """
    r, dtype, length = _rewards(rewards)
    discount = jnp.asarray(check_rate(gamma, "gamma"), dtype) * (
        1 - _per_step("dones", dones, length, dtype)
    )
    boot = None if next_values is None else _per_step("next_values", next_values, length, dtype)
    last = jnp.zeros((), dtype) if boot is None else boot[-1]
    cut = _truncation(truncated, next_values, length, dtype)
    if cut is None:
        return _reverse_linear(discount, r, last)
    c, v = cut
    return _reverse_linear(discount * (1 - c), r + discount * c * v, last)


def lambda_returns(
    rewards: ArrayLike,
    dones: ArrayLike,
    values: ArrayLike,
    gamma: float | Array,
    lam: float | Array,
    *,
    truncated: ArrayLike | None = None,
    next_values: ArrayLike | None = None,
) -> Array:
    """TD(λ) returns ``G_t = r_t + γ (1 − d_t) [(1 − λ) V_{t+1} + λ G_{t+1}]``.

    Bootstrapped from ``values[-1]`` at the end of the trajectory.

    ``values[t]`` is ``V(s_{t+1})`` (as in ``rlax.lambda_returns``). λ = 1 gives the
    bootstrapped discounted return; λ = 0 the one-step TD target. With ``truncated`` (time
    limits, as in [`discounted_returns`][jaxwise.sequence.discounted_returns]) a cut step
    bootstraps from the true next state, ``G_t = r_t + γ (1 − d_t) next_values[t]``, and no
    λ-mixing crosses the cut.

    Args:
        rewards: 1-D ``(T,)``.
        dones: 1-D ``(T,)`` 0/1 or bool: true terminations.
        values: 1-D ``(T,)``: ``values[t]`` is ``V(s_{t+1})``.
        gamma: discount in [0, 1] (may be traced).
        lam: λ in [0, 1] (may be traced).
        truncated: optional 0/1 flags of time-limit cuts; needs ``next_values``.
        next_values: ``(T,)`` values of each step's actual next state (with ``truncated``).

    Returns:
        ``(T,)`` λ-returns, ``rewards``' floating dtype (float32 for integer rewards).

    Raises:
        TypeError: an input is not a real array, or a rate is not a number.
        ValueError: a shape does not fit (1-D, one entry per step), ``rewards`` is empty, a
            rate is outside [0, 1], or ``truncated`` comes without ``next_values``.

    Examples:
        >>> lambda_returns(jnp.ones(2), jnp.zeros(2), jnp.asarray([4.0, 8.0]), 0.5, 0.0).tolist()
        [3.0, 5.0]
    """
    r, dtype, length = _rewards(rewards)
    discount = jnp.asarray(check_rate(gamma, "gamma"), dtype) * (
        1 - _per_step("dones", dones, length, dtype)
    )
    v = _per_step("values", values, length, dtype)
    lam = jnp.asarray(check_rate(lam, "lam"), dtype)
    cut = _truncation(truncated, next_values, length, dtype)
    b = r + discount * (1 - lam) * v
    a = discount * lam
    if cut is not None:
        c, nv = cut
        b = r + discount * ((1 - c) * (1 - lam) * v + c * nv)
        a = a * (1 - c)
    return _reverse_linear(a, b, v[-1])


def gae(
    rewards: ArrayLike,
    dones: ArrayLike,
    values: ArrayLike,
    gamma: float | Array,
    lam: float | Array,
    *,
    truncated: ArrayLike | None = None,
    next_values: ArrayLike | None = None,
) -> Array:
    """Generalized advantage estimates (Schulman et al., 2016) of one trajectory.

    ``δ_t = r_t + γ (1 − d_t) V(s_{t+1}) − V(s_t)`` and ``A_t = δ_t + γ λ (1 − d_t) A_{t+1}``
    with ``A_T = 0``: equal to ``rlax.truncated_generalized_advantage_estimation(rewards,
    gamma * (1 - dones), lam, values)``. With ``truncated`` (time limits), a cut step uses
    the true next state's value ``next_values[t]`` instead of ``values[t + 1]`` (which is the
    value of the reset state) and the advantage recursion stops there.

    Args:
        rewards: 1-D ``(T,)``.
        dones: 1-D ``(T,)`` 0/1 or bool: true terminations.
        values: 1-D ``(T + 1,)``: ``V(s_0) … V(s_T)`` (the last one bootstraps).
        gamma: discount in [0, 1] (may be traced).
        lam: λ in [0, 1] (may be traced).
        truncated: optional 0/1 flags of time-limit cuts; needs ``next_values``.
        next_values: ``(T,)`` values of each step's actual next state (with ``truncated``).

    Returns:
        ``(T,)`` advantages (add ``values[:-1]`` for the λ-return targets), ``rewards``'
            floating dtype (float32 for integer rewards).

    Raises:
        TypeError: an input is not a real array, or a rate is not a number.
        ValueError: a shape does not fit (1-D, one entry per step), ``rewards`` is empty, a
            rate is outside [0, 1], or ``truncated`` comes without ``next_values``.

    References:
        Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage
        Estimation", ICLR 2016. https://arxiv.org/abs/1506.02438

    Examples:
        >>> gae(jnp.ones(2), jnp.zeros(2), jnp.asarray([0.0, 0.0, 4.0]), 0.5, 1.0).tolist()
        [2.5, 3.0]
    """
    r, dtype, length = _rewards(rewards)
    discount = jnp.asarray(check_rate(gamma, "gamma"), dtype) * (
        1 - _per_step("dones", dones, length, dtype)
    )
    v = _per_step("values", values, length + 1, dtype)
    lam = jnp.asarray(check_rate(lam, "lam"), dtype)
    following = v[1:]
    a = discount * lam
    cut = _truncation(truncated, next_values, length, dtype)
    if cut is not None:
        c, nv = cut
        following = (1 - c) * following + c * nv
        a = a * (1 - c)
    delta = r + discount * following - v[:-1]
    return _reverse_linear(a, delta, jnp.zeros((), dtype))
