"""Gradient transformations: schedules, momentum, Adam, Lion, weight decay, clipping, freezing."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxwise.optim._base import (
    EmptyState,
    GradientTransformation,
    MaskOrFn,
    Params,
    ScalarOrSchedule,
    Schedule,
    Updates,
    check_decay,
    check_nonnegative,
    check_positive,
    global_norm,
    identity,
    resolve_mask,
    safe_increment,
    scale,
    select,
)


class ScaleByScheduleState(NamedTuple):
    """State of :func:`scale_by_schedule`."""

    count: jax.Array  # shape=(), dtype=int32: number of updates so far


def scale_by_schedule(step_size_fn: Schedule) -> GradientTransformation:
    """Multiply updates by ``step_size_fn(count)``, evaluated inside ``jit``.

    The count lives in the state as an int32 array (so the schedule never
    recompiles and never drifts); the schedule sees the pre-increment count
    (0 on the first update), as in Optax.

    Example:
        >>> import jax.numpy as jnp
        >>> tx = scale_by_schedule(lambda count: 1.0 / (1.0 + count.astype(jnp.float32)))
        >>> s = tx.init(None)
        >>> u, s = tx.update(jnp.ones(()), s); u2, s = tx.update(jnp.ones(()), s)
        >>> float(u), float(u2), int(s.count)
        (1.0, 0.5, 2)
    """
    if not callable(step_size_fn):
        raise TypeError(f"`step_size_fn` must be a schedule (a function of the step count), got {step_size_fn!r}")

    def init_fn(params: Params) -> ScaleByScheduleState:
        del params
        return ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates: Updates, state: ScaleByScheduleState, params: Params | None = None) -> tuple:
        del params
        step_size = step_size_fn(state.count)
        updates = jax.tree.map(lambda g: jnp.asarray(step_size, dtype=g.dtype) * g, updates)
        return updates, ScaleByScheduleState(count=safe_increment(state.count))

    return GradientTransformation(init_fn, update_fn)


def scale_by_learning_rate(learning_rate: ScalarOrSchedule | None, *, flip_sign: bool = True) -> GradientTransformation:
    """Multiply by ``−learning_rate`` (a constant or a schedule); ``None`` is the identity.

    Example:
        >>> import jax.numpy as jnp
        >>> round(float(scale_by_learning_rate(0.1).update(jnp.ones(()), EmptyState())[0]), 6)
        -0.1
    """
    if learning_rate is None:
        return identity()
    sign = -1 if flip_sign else 1
    if callable(learning_rate):
        return scale_by_schedule(lambda count: sign * learning_rate(count))
    check_nonnegative(learning_rate, "learning_rate")
    return scale(sign * learning_rate)


class TraceState(NamedTuple):
    """State of :func:`trace`."""

    trace: Params  # like params: the momentum buffer


def trace(decay: float, nesterov: bool = False, accumulator_dtype: Any | None = None) -> GradientTransformation:
    """Momentum: ``t ← g + decay · t``; the update is ``t`` (or ``g + decay · t`` with Nesterov).

    Example:
        >>> import jax.numpy as jnp
        >>> tx = trace(0.9)
        >>> u, s = tx.update(jnp.ones(()), tx.init(jnp.zeros(()))); u, s = tx.update(jnp.ones(()), s)
        >>> round(float(u), 6)
        1.9
    """
    check_decay(decay, "decay")

    def init_fn(params: Params) -> TraceState:
        return TraceState(trace=jax.tree.map(lambda p: jnp.zeros_like(p, dtype=accumulator_dtype), params))

    def update_fn(updates: Updates, state: TraceState, params: Params | None = None) -> tuple:
        del params
        new_trace = jax.tree.map(lambda g, t: g + decay * t, updates, state.trace)
        out = jax.tree.map(lambda g, t: g + decay * t, updates, new_trace) if nesterov else new_trace
        if accumulator_dtype is not None:
            new_trace = jax.tree.map(lambda t: t.astype(accumulator_dtype), new_trace)
        return out, TraceState(trace=new_trace)

    return GradientTransformation(init_fn, update_fn)


class ScaleByAdamState(NamedTuple):
    """State of :func:`scale_by_adam`."""

    count: jax.Array  # shape=(), dtype=int32
    mu: Updates  # first moment, like params
    nu: Updates  # second moment, like params


def _bias_correction(moment: Updates, decay: float, count: jax.Array) -> Updates:
    dtype = jnp.result_type(float)  # float32, or float64 under x64: as Optax's `decay**count`
    correction = 1 - jnp.asarray(decay, dtype) ** count.astype(dtype)
    return jax.tree.map(lambda t: t / correction.astype(t.dtype), moment)


def scale_by_adam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    mu_dtype: Any | None = None,
    *,
    nesterov: bool = False,
) -> GradientTransformation:
    """Adam's rescaling with bias correction (Kingma & Ba, 2015).

    ``m ← b1·m + (1−b1)·g``, ``v ← b2·v + (1−b2)·g²``,
    ``u = m̂ / (sqrt(v̂ + eps_root) + eps)`` with ``m̂ = m / (1 − b1ᵗ)`` and
    ``v̂ = v / (1 − b2ᵗ)``. Without bias correction the first step would be
    ``(1−b1)/sqrt(1−b2) ≈ 3.16`` times too large; here it is ``±1``.
    ``nesterov=True`` is NAdam (Dozat, 2016).

    References:
      Kingma & Ba, Adam: A Method for Stochastic Optimization, ICLR 2015,
      https://arxiv.org/abs/1412.6980

    Example:
        >>> import jax.numpy as jnp
        >>> tx = scale_by_adam()
        >>> [round(v, 4) for v in tx.update(jnp.asarray([0.5, -3.0]), tx.init(jnp.zeros(2)))[0].tolist()]
        [1.0, -1.0]
    """
    check_decay(b1, "b1")
    check_decay(b2, "b2")
    check_nonnegative(eps, "eps")
    check_nonnegative(eps_root, "eps_root")

    def init_fn(params: Params) -> ScaleByAdamState:
        mu = jax.tree.map(lambda p: jnp.zeros_like(p, dtype=mu_dtype), params)
        nu = jax.tree.map(jnp.zeros_like, params)
        return ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=mu, nu=nu)

    def update_fn(updates: Updates, state: ScaleByAdamState, params: Params | None = None) -> tuple:
        del params
        mu = jax.tree.map(lambda g, m: (1 - b1) * g + b1 * m, updates, state.mu)
        nu = jax.tree.map(lambda g, v: (1 - b2) * (g * g) + b2 * v, updates, state.nu)
        count = safe_increment(state.count)
        if nesterov:
            mu_hat = jax.tree.map(
                lambda m, g: b1 * m + (1 - b1) * g,
                _bias_correction(mu, b1, safe_increment(count)),
                _bias_correction(updates, b1, count),
            )
        else:
            mu_hat = _bias_correction(mu, b1, count)
        nu_hat = _bias_correction(nu, b2, count)
        out = jax.tree.map(lambda m, v: m / (jnp.sqrt(v + eps_root) + eps), mu_hat, nu_hat)
        if mu_dtype is not None:
            mu = jax.tree.map(lambda m: m.astype(mu_dtype), mu)
        nu = jax.tree.map(lambda v, old: v.astype(old.dtype), nu, state.nu)
        return out, ScaleByAdamState(count=count, mu=mu, nu=nu)

    return GradientTransformation(init_fn, update_fn)


class ScaleByLionState(NamedTuple):
    """State of :func:`scale_by_lion`."""

    count: jax.Array  # shape=(), dtype=int32
    mu: Updates  # momentum, like params


def scale_by_lion(b1: float = 0.9, b2: float = 0.99, mu_dtype: Any | None = None) -> GradientTransformation:
    """Lion's sign update (Chen et al., 2023), exactly as ``optax.scale_by_lion``.

    The direction ``sign((1−b1)·g + b1·m)`` is computed *before* the momentum
    update ``m ← (1−b2)·g + b2·m``; every coordinate moves by exactly ±1
    (0 where the interpolation is exactly 0).

    References:
      Chen et al., Symbolic Discovery of Optimization Algorithms, 2023,
      https://arxiv.org/abs/2302.06675

    Example:
        >>> import jax.numpy as jnp
        >>> tx = scale_by_lion()
        >>> tx.update(jnp.asarray([0.001, -5.0]), tx.init(jnp.zeros(2)))[0].tolist()
        [1.0, -1.0]
    """
    check_decay(b1, "b1")
    check_decay(b2, "b2")

    def init_fn(params: Params) -> ScaleByLionState:
        return ScaleByLionState(
            count=jnp.zeros([], jnp.int32), mu=jax.tree.map(lambda p: jnp.zeros_like(p, dtype=mu_dtype), params)
        )

    def update_fn(updates: Updates, state: ScaleByLionState, params: Params | None = None) -> tuple:
        del params
        direction = jax.tree.map(lambda g, m: jnp.sign((1.0 - b1) * g + b1 * m), updates, state.mu)
        mu = jax.tree.map(lambda g, m: (1 - b2) * g + b2 * m, updates, state.mu)
        if mu_dtype is not None:
            mu = jax.tree.map(lambda m: m.astype(mu_dtype), mu)
        return direction, ScaleByLionState(count=safe_increment(state.count), mu=mu)

    return GradientTransformation(init_fn, update_fn)


class AddDecayedWeightsState(NamedTuple):
    """State of :func:`add_decayed_weights` (a count, used by scheduled decay)."""

    count: jax.Array  # shape=(), dtype=int32


def add_decayed_weights(weight_decay: ScalarOrSchedule = 0.0, mask: MaskOrFn | None = None) -> GradientTransformation:
    """Decoupled weight decay: ``u ← u + weight_decay · params`` on the masked leaves.

    Put it after the adaptive rescaling (``scale_by_adam``) and before
    ``scale_by_learning_rate``: that is AdamW (Loshchilov & Hutter, 2019),
    whose decay is *not* normalised away by ``sqrt(v̂)`` as L2 + Adam's is.

    Args:
      weight_decay: a constant >= 0 or a schedule of the step count.
      mask: ``None`` (all leaves), a bool tree like the params (or a prefix),
        or a function ``params -> bool tree``; e.g. weights only:
        ``jaxwise.tree.mask_by_path(params, r"\\.w$")``. A structure mismatch
        raises at the first ``update`` naming the first differing path.

    References:
      Loshchilov & Hutter, Decoupled Weight Decay Regularization, ICLR 2019,
      https://arxiv.org/abs/1711.05101

    Example:
        >>> import jax.numpy as jnp
        >>> tx = add_decayed_weights(0.1, mask={"w": True, "b": False})
        >>> p = {"w": jnp.ones(()), "b": jnp.ones(())}
        >>> u, _ = tx.update({"w": jnp.zeros(()), "b": jnp.zeros(())}, tx.init(p), p)
        >>> round(float(u["w"]), 6), float(u["b"])
        (0.1, 0.0)
    """
    check_nonnegative(weight_decay, "weight_decay")
    if mask is not None and not callable(mask):
        jax.tree.leaves(mask)  # a tree: validated against params at init/update

    def init_fn(params: Params) -> AddDecayedWeightsState:
        if mask is not None:
            resolve_mask(mask, params)
        return AddDecayedWeightsState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates: Updates, state: AddDecayedWeightsState, params: Params | None = None) -> tuple:
        if params is None:
            raise ValueError("add_decayed_weights needs `params`: call update(updates, state, params)")
        rate = weight_decay(state.count) if callable(weight_decay) else weight_decay
        full_mask = resolve_mask(mask, params) if mask is not None else jax.tree.map(lambda _: True, params)
        updates = jax.tree.map(
            lambda g, p, m: select(m, lambda: g + jnp.asarray(rate, g.dtype) * p.astype(g.dtype), g),
            updates, params, full_mask,
        )
        return updates, AddDecayedWeightsState(count=safe_increment(state.count))

    return GradientTransformation(init_fn, update_fn)


def clip_by_global_norm(max_norm: float) -> GradientTransformation:
    """Rescale all updates together so that their global L2 norm is at most ``max_norm``.

    Identical to ``optax.clip_by_global_norm`` (updates pass unchanged when
    the norm is below ``max_norm``).

    Example:
        >>> import jax.numpy as jnp
        >>> u, _ = clip_by_global_norm(1.0).update({"a": jnp.asarray([3.0, 4.0])}, EmptyState())
        >>> u["a"].tolist()
        [0.6000000238418579, 0.800000011920929]
    """
    check_positive(max_norm, "max_norm")

    def init_fn(params: Params) -> EmptyState:
        del params
        return EmptyState()

    def update_fn(updates: Updates, state: EmptyState, params: Params | None = None) -> tuple:
        del params
        norm = global_norm(updates)
        keep = norm < max_norm
        updates = jax.tree.map(
            lambda t: jax.lax.select(keep, t, (t / norm.astype(t.dtype)) * jnp.asarray(max_norm, t.dtype)), updates
        )
        return updates, state

    return GradientTransformation(init_fn, update_fn)


def freeze(mask: MaskOrFn) -> GradientTransformation:
    """Set the updates of frozen (``mask`` True) leaves to exactly zero.

    Put it *last* in a chain: then nothing — weight decay included — moves a
    frozen parameter, which stays bit-identical (the zero is ``−0.0``, the
    exact additive identity, so even a ``−0.0`` parameter keeps its sign bit).

    Example:
        >>> import jax.numpy as jnp
        >>> tx = freeze({"w": True, "b": False})
        >>> u, _ = tx.update({"w": jnp.ones(()), "b": jnp.ones(())}, tx.init({"w": 0.0, "b": 0.0}))
        >>> float(u["w"]), float(u["b"])
        (-0.0, 1.0)
    """
    if mask is None:
        raise ValueError("`mask` must be a bool tree or a function of params, got None")

    def init_fn(params: Params) -> EmptyState:
        resolve_mask(mask, params)
        return EmptyState()

    def update_fn(updates: Updates, state: EmptyState, params: Params | None = None) -> tuple:
        if callable(mask) and params is None:
            raise ValueError("freeze with a mask function needs `params`: call update(updates, state, params)")
        full_mask = resolve_mask(mask, params if callable(mask) else updates)
        updates = jax.tree.map(lambda g, m: select(m, lambda: jnp.full_like(g, -0.0), g), updates, full_mask)
        return updates, state

    return GradientTransformation(init_fn, update_fn)


