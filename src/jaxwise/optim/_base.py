"""The gradient-transformation protocol (Optax's), chaining, masks and validation."""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise.tree import path_names

Params = Any
Updates = Any
OptState = Any
Schedule = Callable[[jax.Array], jax.Array]
ScalarOrSchedule = float | jax.Array | Schedule
MaskOrFn = Any


class GradientTransformation(NamedTuple):
    """A pair of pure functions, exactly Optax's protocol.

    ``init(params) -> state`` and ``update(updates, state, params=None) ->
    (updates, state)``; states are NamedTuples (pytrees), so they travel
    through ``jit``, ``scan`` and donation. jaxwise and Optax transformations
    can be mixed freely inside either library's ``chain``.

    Example:
        >>> import jax.numpy as jnp
        >>> tx = GradientTransformation(lambda p: EmptyState(), lambda u, s, p=None: (u, s))
        >>> tx.update({"w": jnp.ones(2)}, tx.init(None))[0]["w"].tolist()
        [1.0, 1.0]
    """

    init: Callable[[Params], OptState]
    update: Callable[..., tuple[Updates, OptState]]


class EmptyState(NamedTuple):
    """The state of a stateless transformation."""


def identity() -> GradientTransformation:
    """Leave updates unchanged.

    Example:
        >>> identity().update(1.0, EmptyState())
        (1.0, EmptyState())
    """

    def init_fn(params: Params) -> EmptyState:
        del params
        return EmptyState()

    def update_fn(updates: Updates, state: EmptyState, params: Params | None = None) -> tuple[Updates, EmptyState]:
        del params
        return updates, state

    return GradientTransformation(init_fn, update_fn)


def _accepts_extra_args(update: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(update).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def chain(*transformations: Any) -> GradientTransformation:
    """Apply transformations in order; the state is the tuple of their states.

    Accepts jaxwise and Optax transformations alike (anything with
    ``init``/``update``). Extra keyword arguments given to ``update`` are
    forwarded to the transformations whose ``update`` accepts them (Optax's
    ``GradientTransformationExtraArgs``).

    Example:
        >>> import jax.numpy as jnp
        >>> tx = chain(scale(2.0), scale(-0.5))
        >>> float(tx.update(jnp.ones(()), tx.init(None))[0])
        -1.0
    """
    for i, tx in enumerate(transformations):
        if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
            raise TypeError(f"chain argument {i} must have `init` and `update` functions, got {type(tx).__name__}")
    extra = tuple(_accepts_extra_args(tx.update) for tx in transformations)

    def init_fn(params: Params) -> tuple[OptState, ...]:
        return tuple(tx.init(params) for tx in transformations)

    def update_fn(
        updates: Updates, state: tuple[OptState, ...], params: Params | None = None, **extra_args: Any
    ) -> tuple[Updates, tuple[OptState, ...]]:
        if len(state) != len(transformations):
            raise ValueError(f"`state` has {len(state)} entries but the chain has {len(transformations)} transformations")
        new_state = []
        for tx, s, takes_extra in zip(transformations, state, extra):
            if takes_extra:
                updates, s = tx.update(updates, s, params, **extra_args)
            else:
                updates, s = tx.update(updates, s, params)
            new_state.append(s)
        return updates, tuple(new_state)

    return GradientTransformation(init_fn, update_fn)


def scale(step_size: Any) -> GradientTransformation:
    """Multiply updates by a fixed scalar ``step_size`` (in each leaf's dtype).

    Example:
        >>> import jax.numpy as jnp
        >>> scale(0.5).update({"w": jnp.ones(2)}, EmptyState())[0]["w"].tolist()
        [0.5, 0.5]
    """
    _check_finite_scalar(step_size, "step_size")

    def init_fn(params: Params) -> EmptyState:
        del params
        return EmptyState()

    def update_fn(updates: Updates, state: EmptyState, params: Params | None = None) -> tuple[Updates, EmptyState]:
        del params
        return jax.tree.map(lambda g: jnp.asarray(step_size, g.dtype) * g, updates), state

    return GradientTransformation(init_fn, update_fn)


def apply_updates(params: Params, updates: Updates) -> Params:
    """``params + updates`` leaf by leaf, keeping each parameter's dtype.

    Example:
        >>> import jax.numpy as jnp
        >>> apply_updates({"w": jnp.ones(2, jnp.bfloat16)}, {"w": jnp.full(2, 0.5)})["w"].dtype
        dtype(bfloat16)
    """
    return jax.tree.map(
        lambda p, u: jnp.asarray(p + jnp.asarray(u, jnp.asarray(p).dtype)).astype(jnp.asarray(p).dtype),
        params,
        updates,
    )


def global_norm(updates: Updates) -> jax.Array:
    """L2 norm of all leaves together: ``sqrt(Σ_leaves Σ x²)``.

    Example:
        >>> import jax.numpy as jnp
        >>> float(global_norm({"a": jnp.asarray([3.0]), "b": jnp.asarray([4.0])}))
        5.0
    """
    leaves = jax.tree.leaves(updates)
    if not leaves:
        return jnp.zeros((), jnp.float32)
    # Accumulate in float32 (float64 if any leaf is float64): bf16 sums stay accurate.
    dtype = jnp.float64 if any(x.dtype == jnp.float64 for x in leaves) else jnp.float32
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(dtype))) for x in leaves))


def safe_increment(count: jax.Array) -> jax.Array:
    """``count + 1``, saturating at the dtype's maximum (never wraps negative)."""
    count = jnp.asarray(count)
    top = jnp.iinfo(count.dtype).max
    return jnp.where(count < top, count + 1, top).astype(count.dtype)


# --------------------------------------------------------------------------
# Validation of hyper-parameters (only when concrete: traced values pass)
# --------------------------------------------------------------------------


def _concrete(value: Any) -> float | None:
    if isinstance(value, bool):
        raise TypeError(f"expected a number, got the bool {value!r}")
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (np.ndarray, np.generic)) and np.ndim(value) == 0:
        return float(value)
    if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer) and value.ndim == 0:
        return float(value)
    return None


def _check_finite_scalar(value: Any, name: str) -> None:
    v = _concrete(value)
    if v is not None and not np.isfinite(v):
        raise ValueError(f"`{name}` must be finite, got {value!r}")


def check_nonnegative(value: Any, name: str) -> None:
    """Raise ValueError if a concrete ``value`` is negative or not finite."""
    if callable(value):
        return
    v = _concrete(value)
    if v is not None and (not np.isfinite(v) or v < 0):
        raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}")


def check_positive(value: Any, name: str) -> None:
    """Raise ValueError if a concrete ``value`` is not > 0."""
    v = _concrete(value)
    if v is not None and (not np.isfinite(v) or v <= 0):
        raise ValueError(f"`{name}` must be a finite number > 0, got {value!r}")


def check_decay(value: Any, name: str) -> None:
    """Raise ValueError if a concrete decay rate is outside [0, 1)."""
    v = _concrete(value)
    if v is not None and not 0.0 <= v < 1.0:
        raise ValueError(f"`{name}` must be in [0, 1), got {value!r}")


# --------------------------------------------------------------------------
# Masks
# --------------------------------------------------------------------------


def resolve_mask(mask: MaskOrFn, params: Params, name: str = "mask") -> Any:
    """The mask as a tree with exactly ``params``'s structure (bool leaves).

    ``mask`` is a bool tree with the structure of ``params`` (or a prefix of
    it), or a function ``params -> such a tree``. A mismatch raises
    ``ValueError`` naming the first differing path.
    """
    tree = mask(params) if callable(mask) else mask
    try:
        full = jax.tree.map(lambda m, sub: jax.tree.map(lambda _: m, sub), tree, params)
    except (ValueError, TypeError) as err:
        raise ValueError(f"`{name}` does not match the params: {_first_difference(tree, params)}") from err
    for leaf in jax.tree.leaves(full):
        if not isinstance(leaf, (bool, np.bool_)) and not (hasattr(leaf, "dtype") and leaf.dtype == jnp.bool_):
            raise TypeError(f"`{name}` leaves must be bools, got {type(leaf).__name__}")
    return full


def _first_difference(mask: Any, params: Params) -> str:
    mask_names = path_names(mask)
    param_names = path_names(params)
    for m, p in zip(mask_names, param_names):
        if m != p and not p.startswith(m + "."):
            return f"first mismatching path: mask has `{m}`, params have `{p}`"
    if len(mask_names) > len(param_names):
        return f"first mismatching path: mask has extra `{mask_names[len(param_names)]}`"
    if len(mask_names) < len(param_names):
        return f"first mismatching path: params have `{param_names[len(mask_names)]}` missing from the mask"
    return "the tree structures differ"


def select(mask_leaf: Any, on: Callable[[], jax.Array], off: jax.Array) -> jax.Array:
    """``on()`` where the mask leaf is True, ``off`` elsewhere (static when the mask is a Python bool)."""
    if isinstance(mask_leaf, (bool, np.bool_)):
        return on() if mask_leaf else off
    return jnp.where(mask_leaf, on(), off)
