"""Audits around a donating call: every call is checked, before and after, for a few flag reads.

Donation hands the state's buffers to XLA to reuse for the new state. Three mistakes break it
silently or with a raw error: a buffer already deleted by an earlier call (JAX: "Array has been
deleted"), a batch that *is* part of the state (``step(state, state.params)``), and a live NumPy
view (``np.asarray(state.params["w"])`` on CPU shares memory): JAX then quietly skips donating
that buffer, keeping a stale copy alive. :class:`Audit` turns each into a :class:`DonationError`
naming the path. The first call additionally checks the optimizer against the state and the
state's type signature (a step must not change it).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax

from jaxwise.train._state import type_signature
from jaxwise.tree import path_names

__all__ = ["Audit", "DonationError", "check_donatable", "check_optimizer_fits"]


class DonationError(ValueError):
    """A state cannot be donated safely (shared buffers, deleted arrays, or unusable donations).

    Attributes:
      result: when raised *after* a call (a donated buffer that stayed alive), the call's
        ``(state, metrics)``, which are valid: training can continue from them.
    """

    __module__ = "jaxwise.train"

    result: Any = None


def _buffer_ids(x: jax.Array) -> list[int]:
    try:
        return [shard.data.unsafe_buffer_pointer() for shard in x.addressable_shards]
    except Exception:
        return [id(x)]


def check_donatable(tree: Any, what: str = "state") -> None:
    """Raise :class:`DonationError` if ``tree`` cannot be donated to a jitted call.

    Catches, before XLA does (with a less helpful message), arrays that were
    already deleted (donated earlier and used again) and the same buffer
    appearing at two paths (``Attempt to donate the same buffer twice``),
    e.g. one ``zeros`` array used for both ``mu`` and ``nu``.

    Examples:
        >>> import jax.numpy as jnp
        >>> z = jnp.zeros(3)
        >>> check_donatable({"mu": z, "nu": z})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        jaxwise.train.DonationError: state: the same buffer appears at `mu` and `nu`; ...
    """
    seen: dict[int, str] = {}
    for name, leaf in zip(path_names(tree), jax.tree.leaves(tree)):
        if not isinstance(leaf, jax.Array):
            continue
        if leaf.is_deleted():
            raise DonationError(_deleted_message(what, name))
        for buffer in _buffer_ids(leaf):
            if buffer in seen:
                raise DonationError(
                    f"{what}: the same buffer appears at `{seen[buffer]}` and `{name}`; donating "
                    'it would fail ("Attempt to donate the same buffer twice"); copy one of them '
                    "(jnp.array(x, copy=True))"
                )
            seen[buffer] = name


def _deleted_message(what: str, name: str) -> str:
    return (
        f"{what}: the array at `{name}` was already deleted (donated to an earlier call); use the "
        "state "
        "returned by that call instead of the old one"
    )


def _first_difference(a: Any, b: Any) -> str:
    """The first differing path between two trees' structures, as readable text."""
    pa = jax.tree_util.tree_flatten_with_path(a)[0]
    pb = jax.tree_util.tree_flatten_with_path(b)[0]
    for (path_a, _), (path_b, _) in zip(pa, pb):
        if path_a != path_b:
            return (
                f"first difference: `{jax.tree_util.keystr(path_a)}` in the state vs "
                f"`{jax.tree_util.keystr(path_b)}` from the optimizer"
            )
    return f"the state has {len(pa)} leaves, the optimizer's state {len(pb)}"


def _outline(tree: Any) -> str:
    """A short outline of a tree's node types, e.g. ``(ScaleByAdamState, EmptyState)``."""
    if isinstance(tree, (tuple, list)) and not hasattr(tree, "_fields"):
        inner = ", ".join(_outline(t) for t in tree)
        return f"({inner}{',' if len(tree) == 1 else ''})"
    return type(tree).__name__


def check_optimizer_fits(optimizer: Any, params: Any, opt_state: Any) -> None:
    """``ValueError`` when ``opt_state`` is not what ``optimizer.init(params)`` builds.

    Compares tree structures (and then leaf shapes/dtypes) with ``jax.eval_shape``: nothing
    is computed or compiled. Catches a state created with one optimizer stepped with another.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> p = {"w": jnp.ones(2)}
        >>> check_optimizer_fits(optax.sgd(0.1), p, optax.adam(0.1).init(p))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: the step's `optimizer` does not fit the state's `opt_state` ...
    """
    expected = jax.eval_shape(optimizer.init, params)
    got_def, want_def = jax.tree.structure(opt_state), jax.tree.structure(expected)
    if got_def != want_def:
        raise ValueError(
            "the step's `optimizer` does not fit the state's `opt_state` (was the state created "
            f"with another optimizer?): the state holds {_outline(opt_state)}, the optimizer "
            f"builds {_outline(expected)}; {_first_difference(opt_state, expected)}. Create the "
            "state and the step with the same optimizer"
        )
    for name, have, want in zip(
        path_names(opt_state), jax.tree.leaves(opt_state), jax.tree.leaves(expected)
    ):
        if jax.numpy.shape(have) != want.shape or jax.numpy.result_type(have) != want.dtype:
            raise ValueError(
                "the step's `optimizer` does not fit the state's `opt_state` at "
                f"`opt_state.{name}`: the state has "
                f"{jax.numpy.result_type(have)}{list(jax.numpy.shape(have))}, the optimizer builds "
                f"{want.dtype}{list(want.shape)} for these params"
            )


def _typ(entry: tuple[str, tuple[int, ...], str, bool]) -> str:
    return f"{entry[2]}{list(entry[1])}{'~weak' if entry[3] else ''}"


def _check_signature_stable(before: Any, after: Any) -> None:
    """Raise if a step changes the state's types (recompiles every step; donation unusable)."""
    old, new = type_signature(before), type_signature(after)
    changed = [f"`{a[0]}`: {_typ(a)} → {_typ(b)}" for a, b in zip(old, new) if a != b]
    if len(old) != len(new):
        changed.append("the tree structure changes")
    if changed:
        raise DonationError(
            "the training step changes the state's type signature, so every step would recompile "
            "and "
            "the donated buffers could not be reused: " + "; ".join(changed)
        )


_LIVE_VIEW = (
    "was not deleted by the donating call: something still holds its buffer, so JAX silently "
    "skipped the donation (a second copy stays in memory and the old state stays readable). The "
    "usual cause is a live NumPy view: `np.asarray(...)` of a state array on CPU shares its "
    "memory. Keep host copies with `jaxwise.tree.host_copy(...)` (a real copy) instead. The "
    "call's result is in this error's `.result`"
)


class Audit:
    """Per-call donation checks for a jitted ``fn(state, data)`` that donates ``state``."""

    def __init__(self, *, donate: bool, data_name: str) -> None:
        self.donate = donate
        self.data_name = data_name
        self.first_done = False

    def before(self, state: Any, data: Any) -> list[Any]:
        """Check the inputs; returns the state's leaves (to check after the call)."""
        leaves = jax.tree.leaves(state)
        if not self.donate:
            return leaves
        ids = {}
        for leaf in leaves:
            if isinstance(leaf, jax.Array):
                if leaf.is_deleted():
                    raise DonationError(_deleted_message("state", self._name_of(state, leaf)))
                ids[id(leaf)] = leaf
        for leaf in jax.tree.leaves(data):
            if id(leaf) in ids:
                raise DonationError(
                    f"`{self.data_name}` leaf `{self._name_of(data, leaf)}` is the state leaf "
                    f"`{self._name_of(state, leaf)}`: the state is donated (its buffers are reused "
                    "for the "
                    f"result), so it cannot also be read as `{self.data_name}`; pass a copy "
                    "(jnp.array(x, copy=True))"
                )
        return leaves

    def after(self, state: Any, leaves: list[Any], result: Any) -> None:
        """Every donated leaf must now be deleted; otherwise :class:`DonationError` naming it."""
        if not self.donate:
            return
        for leaf in leaves:
            if isinstance(leaf, jax.Array) and not leaf.is_deleted():
                err = DonationError(
                    f"the donated state leaf `{self._name_of(state, leaf)}` {_LIVE_VIEW}"
                )
                err.result = result
                raise err

    def first_call(self, call: Callable[[Any, Any], Any], state: Any, data: Any) -> Any:
        """Shared-buffer and type-signature checks; JAX's donation warnings become errors."""
        if self.donate:
            check_donatable(state)
        out_state, _ = jax.eval_shape(call, state, data)
        _check_signature_stable(state, out_state)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = call(state, data)
        for w in caught:
            if "donated buffers were not usable" in str(w.message):
                raise DonationError(f"donation audit: {w.message}")
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        self.first_done = True
        return result

    @staticmethod
    def _name_of(tree: Any, leaf: Any) -> str:
        for name, other in zip(path_names(tree), jax.tree.leaves(tree)):
            if other is leaf:
                return name or "<root>"
        return "?"
