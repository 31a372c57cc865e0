"""Audits around a donating call: every call is checked, before and after, for a few flag reads.

Donation hands the state's buffers to XLA to reuse for the new state. Three mistakes break it
silently or with a raw error: a buffer already deleted by an earlier call (JAX: "Array has been
deleted"), a batch that *is* part of the state (``step(state, state.params)``), and a live NumPy
view (``np.asarray(state.params["w"])`` on CPU shares memory): JAX then quietly skips donating
that buffer, keeping a stale copy alive. `Audit` turns each into a `DonationError`
naming the path, and checks for the same buffer at two paths on every call. The first call
additionally checks the optimizer against the state and the state's type signature (a step must
not change it).

The checks cost Python work per leaf, and the audit runs on every call, so when the state is the
very object the previous call returned (the training loop's case: distinct, live outputs of one
execution) the deleted-leaf and shared-buffer checks run only if the call fails, to name the
leaf at fault; the batch-is-state check and the after-call check run in one pass over the
leaves each. Every other call checks everything up front. The audit steps aside when there is
nothing to audit: inside the user's own ``jax.jit`` (the state is made of tracers; the outer
function donates, or not) and under ``jax.disable_jit()`` (nothing is compiled, so nothing is
donated: it says so once, as a ``RuntimeWarning``).
Every ``DonationError`` it raises is first published on ``jaxwise._shared._events`` as a
``DonationFailed`` (``jaxwise.watch`` subscribes); while
``jaxwise._shared._events.suspend_donation`` is open (``jaxwise watch --nans``, under which
nothing donates) the audit is off.
"""

from __future__ import annotations

import itertools
import operator
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import jax
import optax
from jax.core import Tracer

from jaxwise._errors import JaxwiseError
from jaxwise._shared._buffers import buffer_ids, donated_buffers, kept, off_host, unvouch, vouch
from jaxwise._shared._events import DonationFailed, donation_suspended, publish
from jaxwise.train._program._state import type_signature
from jaxwise.tree import path_names

__all__ = [
    "Audit",
    "DonationError",
    "check_donatable",
    "check_optimizer_fits",
]


class DonationError(JaxwiseError, ValueError):
    """A state cannot be donated safely (shared buffers, deleted arrays, or unusable donations).

    Args:
        message: what cannot be donated and why.
        argument: the path of the leaf at fault (``""`` when the error is not about one leaf).

    Attributes:
        result: when raised *after* a call (a donated buffer that stayed alive), the call's
            ``(state, metrics)``, which are valid: training can continue from them.
        argument: the path of the leaf at fault, e.g. ``"state.params['w']"`` (``""`` when the
            error is not about one leaf).
    """

    __module__ = "jaxwise.train"

    result: Any = None

    def __init__(self, message: str, *, argument: str = "") -> None:
        super().__init__(message)
        self.argument = argument


DonationError.__module__ = "jaxwise.train"


def _path(tree: Any, index: int) -> str:
    """The ``jax.tree_util.keystr`` path of leaf number ``index`` of ``tree``."""
    paths = jax.tree_util.tree_flatten_with_path(tree)[0]
    return jax.tree_util.keystr(paths[index][0]) if index < len(paths) else ""


def _leaf_path(tree: Any, leaf: Any) -> str:
    for i, other in enumerate(jax.tree.leaves(tree)):
        if other is leaf:
            return _path(tree, i)
    return ""


def _fail(err: DonationError, function: str = "") -> DonationError:
    """Publish ``err`` as a `DonationFailed` event; returns it, to be raised by the caller."""
    publish(DonationFailed(function=function, argument=err.argument, error=err))
    return err


def check_donatable(tree: Any, what: str = "state", *, function: str = "") -> None:
    """Raise `DonationError` if ``tree`` cannot be donated to a jitted call.

    Catches, before XLA does (with a less helpful message), arrays that were
    already deleted (donated earlier and used again) and the same buffer
    appearing at two paths (``Attempt to donate the same buffer twice``),
    e.g. one ``zeros`` array used for both ``mu`` and ``nu``.

    Args:
        tree: the pytree about to be donated (e.g. a ``TrainState``).
        what: its name in the message.
        function: the program it is donated to, for the published `DonationFailed` event.

    Raises:
        DonationError: a leaf was deleted, or one buffer appears at two paths.

    Examples:
        >>> import jax.numpy as jnp
        >>> z = jnp.zeros(3)
        >>> check_donatable({"mu": z, "nu": z})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        jaxwise.train.DonationError: state: the same buffer appears at `mu` and `nu`; ...
    """
    leaves = jax.tree.leaves(tree)
    seen: dict[int, int] = {}
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, jax.Array) or isinstance(leaf, Tracer):
            continue
        if leaf.is_deleted():
            name = path_names(tree)[i]
            raise _fail(
                DonationError(_deleted_message(what, name), argument=what + _path(tree, i)),
                function,
            )
        # A replicated array's shards may share one host buffer (CPU devices can alias one
        # NumPy source): only a buffer shared by two different leaves is a double donation.
        for buffer in set(buffer_ids(leaf)):
            if buffer in seen and seen[buffer] != i:
                names = path_names(tree)
                first, second = names[seen[buffer]], names[i]
                raise _fail(
                    DonationError(
                        f"{what}: the same buffer appears at `{first}` and `{second}`; donating "
                        'it would fail ("Attempt to donate the same buffer twice"); copy one of '
                        "them (jnp.array(x, copy=True))",
                        argument=what + _path(tree, i),
                    ),
                    function,
                )
            seen[buffer] = i


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


def check_optimizer_fits(
    optimizer: optax.GradientTransformation, params: optax.Params, opt_state: optax.OptState
) -> None:
    """``ValueError`` when ``opt_state`` is not what ``optimizer.init(params)`` builds.

    Compares tree structures (and then leaf shapes/dtypes) with ``jax.eval_shape``: nothing
    is computed or compiled. Catches a state created with one optimizer stepped with another.

    Args:
        optimizer: the step's optimizer.
        params: the state's parameters.
        opt_state: the state's optimizer state.

    Raises:
        ValueError: the structures differ, or a leaf's shape or dtype does; the message names
            both outlines and the first difference.

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


def _check_signature_stable(before: Any, after: Any, function: str = "") -> None:
    """Raise if a step changes the state's types (recompiles every step; donation unusable)."""
    old, new = type_signature(before), type_signature(after)
    changed = [f"`{a[0]}`: {_typ(a)} → {_typ(b)}" for a, b in zip(old, new) if a != b]
    if len(old) != len(new):
        changed.append("the tree structure changes")
    if changed:
        raise _fail(
            DonationError(
                "the training step changes the state's type signature, so every step would "
                "recompile and the donated buffers could not be reused: " + "; ".join(changed)
            ),
            function,
        )


_IS_DELETED = operator.methodcaller("is_deleted")

_LIVE_VIEW = (
    "kept its buffer through the donating call: something still holds it, so XLA could not "
    "reuse it and a second copy stays in memory (JAX says nothing). The usual cause is a live "
    "NumPy view: `np.asarray(...)` of a state array on CPU shares its memory. Keep host copies "
    "with `jaxwise.tree.host_copy(...)` (a real copy) instead. The call's result is in this "
    "error's `.result`"
)


_DISABLE_JIT = (
    "jaxwise: the donation audit is off under jax.disable_jit(): nothing is compiled, so "
    "nothing is donated"
)


def _state_of(result: Any) -> Any:
    """The state in a call's result (``(state, metrics)``, or the state itself)."""
    return result[0] if isinstance(result, tuple) and result else result


class Audit:
    """Per-call donation checks for a jitted ``fn(state, data)`` that donates ``state``.

    Each call runs `before`, the call (the first one through `first_call`), then
    `after`; a call made while tracing (the state holds tracers) or under
    ``jax.disable_jit()`` is not audited. ``function`` names the jitted program in the
    `DonationFailed` events it publishes.
    """

    def __init__(self, *, donate: bool, data_name: str, function: str = "") -> None:
        self.donate = donate
        self.function = function
        self.data_name = data_name
        self.first_done = False
        self._skip = False
        self._warned = False
        self._returned: Any = None  # a weak reference to the last result's state
        self._fast = False  # this call's state is the last result: its checks are deferred
        self._buffers: list[tuple[int, ...]] | None = None  # the donated CPU buffers
        self._leaves: list[Any] = []  # the state's leaves, from `before` to the end of `call`
        self._off_host = False  # the program's state lives off the host (no view can hold it)
        self._learn = False  # `after` learns `_off_host` from this call's result
        self._deferred = False  # this call's checks run only if it fails (`call`)

    def _skipped(self, leaves: list[Any], concrete: bool) -> bool:
        if donation_suspended() is not None:
            return True
        if not concrete and any(isinstance(leaf, Tracer) for leaf in leaves):
            return True  # inside the user's jit: that function donates, or not
        if jax.config.jax_disable_jit:
            if not self._warned:
                self._warned = True
                warnings.warn(_DISABLE_JIT, RuntimeWarning, stacklevel=4)
            return True
        return False

    def before(self, state: Any, data: Any) -> list[Any]:
        """Check the inputs; returns the state's leaves (to check after the call).

        When ``state`` is the very object the previous call returned (the training loop's
        usual case), its leaves are distinct, live outputs of one execution: the deleted-leaf
        and shared-buffer checks have nothing to find, so they run only if the call fails
        (`call`), where they turn JAX's error into a `DonationError`. The batch is always
        checked against the state.
        """
        self._fast = self._deferred = False
        if not self.donate:  # audit=False or donate=False: nothing to check, no leaves read
            self._skip = True
            return []
        returned = self._returned
        last = returned is not None and returned() is state
        if last and self._off_host and not self._skipped([], True):
            # The previous result, on accelerators: its leaves are distinct live outputs that
            # no NumPy view can hold, so the donation happens or XLA refuses the call (a
            # state leaf passed as data too); `call` names the cause then. Nothing is read.
            self._skip, self._fast, self._deferred, self._buffers = False, True, True, None
            return []
        leaves = jax.tree.leaves(state)
        self._skip = self._skipped(leaves, last)
        if self._skip:
            return leaves
        if not last:
            check_donatable(state, function=self.function)  # deleted leaves, one buffer twice
            self._learn = True
        self._check_data(state, leaves, data, last)
        self._fast = last
        self._buffers = donated_buffers(leaves)
        self._leaves = leaves if last else []  # what `call` vouches for
        return leaves

    def _check_data(self, state: Any, leaves: list[Any], data: Any, concrete: bool) -> None:
        """`DonationError` when a leaf of ``data`` is a leaf of the (donated) state."""
        data_leaves = jax.tree.leaves(data)
        if not data_leaves:
            return
        if concrete:  # leaves are jax.Arrays: compare identities without per-leaf Python code
            if len(data_leaves) <= 4:
                shared = any(
                    any(map(operator.is_, leaves, itertools.repeat(d))) for d in data_leaves
                )
            else:
                shared = not set(map(id, leaves)).isdisjoint(map(id, data_leaves))
            if not shared:
                return
        ids = {id(leaf): leaf for leaf in leaves if isinstance(leaf, jax.Array)}
        for leaf in data_leaves:
            if id(leaf) in ids:
                name = self._name_of(data, leaf)
                raise _fail(
                    DonationError(
                        f"`{self.data_name}` leaf `{name}` is the state leaf "
                        f"`{self._name_of(state, leaf)}`: the state is donated (its buffers are "
                        "reused for the result), so it cannot also be read as "
                        f"`{self.data_name}`; pass a copy (jnp.array(x, copy=True))",
                        argument=self.data_name + _leaf_path(data, leaf),
                    ),
                    self.function,
                )

    def call(self, fn: Callable[[Any, Any], Any], state: Any, data: Any) -> Any:
        """``fn(state, data)``; if it fails after a `before` that skipped the state checks (the
        state was the previous result), they run now and raise a `DonationError` when the
        failure was theirs (e.g. the state was donated to another program since)."""
        if not self._fast:
            return fn(state, data)
        # no view can hold these leaves (`donated_buffers`): a watch of `fn` need not look
        previous = vouch(self._leaves if self._buffers is None else None)
        try:
            return fn(state, data)
        except Exception:
            check_donatable(state, function=self.function)
            if self._deferred:
                self._check_data(state, jax.tree.leaves(state), data, True)
            raise
        finally:
            unvouch(previous)
            self._leaves = []  # hold no leaf between calls: a reference `before` would count

    def _remember(self, result: Any) -> None:
        try:
            self._returned = weakref.ref(result[0])
        except (TypeError, IndexError):  # not weak-referenceable, or not (state, metrics)
            self._returned = None

    def after(self, state: Any, leaves: list[Any], result: Any) -> None:
        """Every donated leaf must now be deleted; otherwise `DonationError` naming it."""
        if self._skip:
            return
        self._remember(result)
        if self._deferred:
            return  # off the host, the donation happened: the call would have failed
        if self._learn:  # once per new state (the first call): where its results live
            self._learn = False
            self._off_host = off_host(jax.tree.leaves(_state_of(result)))
        if self._fast and self._buffers is None:
            try:
                if all(map(_IS_DELETED, leaves)):
                    return  # every leaf was donated
            except AttributeError:  # a leaf that is not an array (put in by hand): see below
                pass
        out = _state_of(result)
        for index in kept(leaves, self._buffers, out):
            leaf = leaves[index]
            name = self._name_of(state, leaf)
            err = DonationError(
                f"the donated state leaf `{name}` {_LIVE_VIEW}",
                argument="state" + _leaf_path(state, leaf),
            )
            err.result = result
            raise _fail(err, self.function)

    def first_call(self, call: Callable[[Any, Any], Any], state: Any, data: Any) -> Any:
        """Type-signature check; JAX's donation warnings become errors."""
        out_state, _ = jax.eval_shape(call, state, data)
        _check_signature_stable(state, out_state, self.function)
        if self._skip:
            self.first_done = True
            return call(state, data)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = call(state, data)
        for w in caught:
            if "donated buffers were not usable" in str(w.message):
                raise _fail(DonationError(f"donation audit: {w.message}"), self.function)
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        self.first_done = True
        return result

    @staticmethod
    def _name_of(tree: Any, leaf: Any) -> str:
        for name, other in zip(path_names(tree), jax.tree.leaves(tree)):
            if other is leaf:
                return name or "<root>"
        return "?"
