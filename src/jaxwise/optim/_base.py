"""Optax's protocol with jaxwise's checks: wrapping, validation, masks, apply_updates, norms.

Every jaxwise optimizer *is* an Optax one: an ``optax.GradientTransformationExtraArgs``
whose ``init``/``update`` are Optax's own, run under JAX's standard dtype promotion (so they
also work for users who turn on ``jax_numpy_dtype_promotion="strict"``), with the state left
exactly as Optax builds it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxwise._shared._checks import check_array, check_bool, check_float
from jaxwise.tree import mask_by_path, path_names

GradientTransformation = optax.GradientTransformation
GradientTransformationExtraArgs = optax.GradientTransformationExtraArgs
EmptyState = optax.EmptyState
safe_increment = optax.safe_increment

Params = optax.Params
P = TypeVar("P", bound=Params)
Updates = optax.Updates
OptState = optax.OptState
Schedule = optax.Schedule
Scalar = float | np.floating | np.integer | jax.Array  # a Python, NumPy or 0-d JAX number
ScalarOrSchedule = Scalar | Schedule
Steps = int | np.integer  # a Python or NumPy integer
Hyper = float | jax.Array  # a validated hyper-parameter: a Python float, or a JAX array as given
# a bool, a regex over dotted leaf paths, a bool tree (or a prefix of one), or params -> those
MaskOrFn = bool | str | re.Pattern[str] | Params | Callable[[Params], Params | str]


def wrap(
    tx: optax.GradientTransformation, *, needs_params: str | None = None
) -> optax.GradientTransformationExtraArgs:
    """``tx`` with its functions run under standard dtype promotion; the state is untouched.

    Args:
        tx: any Optax transformation.
        needs_params: when set, ``update`` without ``params`` raises ``ValueError`` naming it
            (Optax would fail deep inside a ``tree.map``).

    Returns:
        The same transformation with Optax's extra-arguments protocol.
    """
    inner = optax.with_extra_args_support(tx)

    def init_fn(params: Params) -> OptState:
        with jax.numpy_dtype_promotion("standard"):
            return inner.init(params)

    def update_fn(
        updates: Updates, state: OptState, params: Params | None = None, **extra_args: Any
    ) -> tuple[Updates, OptState]:
        if needs_params is not None and params is None:
            raise ValueError(f"{needs_params} needs `params`: call update(updates, state, params)")
        with jax.numpy_dtype_promotion("standard"):
            return inner.update(updates, state, params, **extra_args)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def identity() -> optax.GradientTransformationExtraArgs:
    """Leave updates unchanged (``optax.identity``).

    Returns:
        A transformation with an empty state.

    Examples:
        >>> import jax.numpy as jnp
        >>> tx = identity()
        >>> tx.update(jnp.ones(2), tx.init(None))[0].tolist()
        [1.0, 1.0]
    """
    return wrap(optax.identity())


def chain(*args: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
    """Apply transformations in order (``optax.chain``); the state is the tuple of their states.

    Accepts jaxwise and Optax transformations alike; extra keyword arguments of ``update``
    reach the transformations that take them.

    Args:
        *args: the transformations, applied first to last.

    Returns:
        One transformation whose state is the tuple of the states of ``args``.

    Raises:
        TypeError: an argument is not a transformation (no ``init``/``update``).

    Examples:
        >>> import jax.numpy as jnp
        >>> tx = chain(scale(2.0), scale(-0.5))
        >>> float(tx.update(jnp.ones(()), tx.init(None))[0])
        -1.0
    """
    for i, tx in enumerate(args):
        if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
            raise TypeError(
                f"chain argument {i} must be a GradientTransformation (with `init` and `update`), "
                f"got {type(tx).__name__}"
            )
    return wrap(optax.chain(*args))


def scale(step_size: Scalar) -> optax.GradientTransformationExtraArgs:
    """Multiply updates by a fixed scalar ``step_size`` (``optax.scale``).

    Args:
        step_size: a finite number (a Python, NumPy or 0-d JAX scalar).

    Returns:
        A transformation with an empty state.

    Raises:
        TypeError: ``step_size`` is not a number.
        ValueError: ``step_size`` is NaN or infinite.

    Examples:
        >>> import jax.numpy as jnp
        >>> tx = scale(0.5)
        >>> tx.update({"w": jnp.ones(2)}, tx.init(None))[0]["w"].tolist()
        [0.5, 0.5]
    """
    return wrap(optax.scale(hyper(step_size, "step_size")))


def apply_updates(params: P, updates: Updates) -> P:
    """``params + updates`` leaf by leaf, keeping each parameter's dtype (``optax.apply_updates``).

    Args:
        params: a pytree of arrays.
        updates: a pytree with the structure and leaf shapes of ``params``.

    Returns:
        The new parameters: ``params``' structure, each leaf in its own dtype.

    Raises:
        ValueError: the two trees differ in structure or in a leaf's shape; the message names
            the first differing path (e.g. updates of another model, or a state's
            ``opt_state`` passed by mistake).
        TypeError: a leaf is not an array.

    Examples:
        >>> import jax.numpy as jnp
        >>> apply_updates({"w": jnp.ones(2, jnp.bfloat16)}, {"w": jnp.full(2, 0.5)})["w"].dtype
        dtype(bfloat16)
    """
    if jax.tree.structure(params) != jax.tree.structure(updates):
        raise ValueError(
            "`updates` must have the structure of `params`: "
            + tree_difference(params, updates, "params", "updates")
        )
    for name, p, u in zip(path_names(params), jax.tree.leaves(params), jax.tree.leaves(updates)):
        check_array(p, f"params.{name}" if name else "params")
        check_array(u, f"updates.{name}" if name else "updates")
        if np.shape(p) != np.shape(u):
            where = f" at `{name}`" if name else ""
            raise ValueError(
                f"`updates` must have the shapes of `params`: {np.shape(u)} for "
                f"{np.shape(p)}{where}"
            )
    with jax.numpy_dtype_promotion("standard"):
        return cast(P, optax.apply_updates(params, updates))


def global_norm(updates: Updates) -> jax.Array:
    """L2 norm of all leaves together, ``sqrt(Σ_leaves Σ x²)``, accumulated in float32 or wider.

    Unlike ``optax.tree.norm`` a bfloat16/float16 tree is summed in float32 (float64 if any
    leaf is float64), so the norm of a large low-precision tree stays accurate.

    Args:
        updates: any pytree of arrays.

    Returns:
        A scalar array, float32 (float64 when a leaf is float64).

    Raises:
        TypeError: a leaf is not an array.

    Examples:
        >>> import jax.numpy as jnp
        >>> float(global_norm({"a": jnp.asarray([3.0]), "b": jnp.asarray([4.0])}))
        5.0
    """
    leaves = [check_array(x, "updates") for x in jax.tree.leaves(updates)]
    if not leaves:
        return jnp.zeros((), jnp.float32)
    dtype = jnp.float64 if any(jnp.asarray(x).dtype == jnp.float64 for x in leaves) else jnp.float32
    with jax.numpy_dtype_promotion("standard"):
        return jnp.asarray(optax.tree.norm([jnp.asarray(x).astype(dtype) for x in leaves]), dtype)


def tree_difference(
    a: Params, b: Params, a_name: str, b_name: str, *, a_is_prefix: bool = False
) -> str:
    """A one-line description of where two trees first differ (by dotted path).

    With ``a_is_prefix``, a leaf of ``a`` covers every leaf of ``b`` below its path.

    Examples:
        >>> tree_difference({"w": 1, "b": 2}, {"w": 1, "bias": 2}, "mask", "params")
        '`mask` has `b` where `params` has `bias`'
    """
    names_a, names_b = path_names(a), path_names(b)
    if a_is_prefix:

        def covers(x: str, y: str) -> bool:
            return y == x or y.startswith(x + ".")

        extra = [x for x in names_a if not any(covers(x, y) for y in names_b)]
        missing = [y for y in names_b if not any(covers(x, y) for x in names_a)]
        if extra and missing:
            return f"`{a_name}` has `{extra[0]}` where `{b_name}` has `{missing[0]}`"
        if extra:
            return f"`{a_name}` has `{extra[0]}`, which `{b_name}` does not have"
        if missing:
            return f"`{b_name}` has `{missing[0]}`, which `{a_name}` does not cover"
    else:
        for x, y in zip(names_a, names_b):
            if x != y:
                return f"`{a_name}` has `{x}` where `{b_name}` has `{y}`"
        if len(names_a) > len(names_b):
            return f"`{a_name}` has `{names_a[len(names_b)]}`, missing from `{b_name}`"
        if len(names_a) < len(names_b):
            return f"`{b_name}` has `{names_b[len(names_a)]}`, missing from `{a_name}`"
    return (
        f"same leaf paths but different node types: {jax.tree.structure(a)} vs "
        f"{jax.tree.structure(b)}"
    )


# --------------------------------------------------------------------------
# Hyper-parameter validation (concrete values; traced values pass unchecked)
# --------------------------------------------------------------------------


def hyper(
    value: Any,
    name: str,
    *,
    min_value: float | None = None,
    max_value: float | None = None,
    min_inclusive: bool = True,
    max_inclusive: bool = True,
) -> Hyper:
    """A validated scalar hyper-parameter, as Optax should receive it.

    NumPy scalars and 0-d arrays become Python floats; JAX arrays (concrete or traced, e.g.
    from ``optax.inject_hyperparams``) are passed on unchanged, concrete ones checked.
    NaN and infinity are rejected, bools too.
    """
    check_float(
        value,
        name,
        min_value=min_value,
        max_value=max_value,
        min_inclusive=min_inclusive,
        max_inclusive=max_inclusive,
        allow_traced=True,
    )
    return value if isinstance(value, jax.Array) else float(value)


def decay_rate(value: Any, name: str) -> Hyper:
    """A decay rate (``b1``, ``b2``, ``momentum``) in ``[0, 1)``."""
    return hyper(value, name, min_value=0.0, max_value=1.0, max_inclusive=False)


def rate_or_schedule(value: Any, name: str, *, allow_none: bool = False) -> Any:
    """A number ``>= 0`` or a schedule (a callable of the step count)."""
    if value is None:
        if allow_none:
            return None
        raise ValueError(f"`{name}` must be a number >= 0 or a schedule, got None")
    if callable(value):
        return value
    return hyper(value, name, min_value=0.0)


def dtype_or_none(value: Any, name: str) -> np.dtype | None:
    """``None`` or something ``jnp.dtype`` accepts; ``TypeError`` naming ``name`` otherwise."""
    if value is None:
        return None
    try:
        return jnp.dtype(value)
    except TypeError as err:
        raise TypeError(f"`{name}` must be a dtype or None, got {value!r}") from err


def adam_moments(
    b1: Any, b2: Any, eps: Any, eps_root: Any, mu_dtype: Any
) -> tuple[Hyper, Hyper, Hyper, Hyper, np.dtype | None]:
    """Adam's moment hyper-parameters, validated: ``(b1, b2, eps, eps_root, mu_dtype)``.

    Optax's positional order in ``optax.adam``, ``optax.adamw`` and ``optax.scale_by_adam``.
    """
    return (
        decay_rate(b1, "b1"),
        decay_rate(b2, "b2"),
        hyper(eps, "eps", min_value=0.0),
        hyper(eps_root, "eps_root", min_value=0.0),
        dtype_or_none(mu_dtype, "mu_dtype"),
    )


def flag(value: Any, name: str) -> bool:
    """A Python/NumPy bool."""
    return check_bool(value, name)


# --------------------------------------------------------------------------
# Masks: bool trees, prefixes, functions of the params, and path regexes
# --------------------------------------------------------------------------


def mask_fn(mask: MaskOrFn, name: str = "mask") -> Callable[[Params], Params]:
    """A function ``tree -> full bool tree`` for ``optax.masked``, checked against the tree.

    ``mask`` may be a bool (all leaves), a regex string or compiled pattern searched in the
    dotted leaf paths (``r"\\.w$"``, see `jaxwise.tree.path_names`), a bool tree with the
    params' structure or a prefix of it, or a function ``params -> such a tree``. A tree
    that does not fit raises ``ValueError`` naming the first differing path.
    """
    if mask is None:
        raise ValueError(
            f"`{name}` must be a bool tree, a path regex or a function of params, got None"
        )
    if isinstance(mask, (str, re.Pattern)):
        try:
            pattern = re.compile(mask)
        except re.error as err:
            raise ValueError(
                f"`{name}` is not a valid regular expression: {mask!r} ({err})"
            ) from err
        return lambda tree: mask_by_path(tree, pattern)
    return lambda tree: resolve_mask(mask, tree, name)


def resolve_mask(mask: MaskOrFn, tree: Params, name: str = "mask") -> Params:
    """The mask as a tree of Python bools with exactly ``tree``'s structure."""
    given = mask(tree) if callable(mask) else mask
    if isinstance(given, (str, re.Pattern)):
        return mask_by_path(tree, given)
    try:
        full = jax.tree.map(lambda m, sub: jax.tree.map(lambda _: m, sub), given, tree)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"`{name}` does not match the params: "
            + tree_difference(given, tree, name, "params", a_is_prefix=True)
        ) from err
    names = path_names(full)
    out = []
    for path, leaf in zip(names, jax.tree.leaves(full)):
        if isinstance(leaf, (bool, np.bool_)):
            out.append(bool(leaf))
        elif getattr(leaf, "shape", None) == () and getattr(leaf, "dtype", None) == np.bool_:
            out.append(bool(leaf))  # a concrete 0-d bool array
        else:
            raise TypeError(f"`{name}` leaves must be bools, got {type(leaf).__name__} at `{path}`")
    return jax.tree.unflatten(jax.tree.structure(full), out)
