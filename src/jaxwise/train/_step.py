"""Donation-safe, NaN-guarded training steps and whole epochs as one compiled program."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxwise.optim import global_norm
from jaxwise.train._sharding import batch_sharding as _batch_sharding
from jaxwise.train._sharding import data_size as _data_size
from jaxwise.train._sharding import place_batch, place_state, replicated
from jaxwise.train._state import TrainState, type_signature
from jaxwise.tree import path_names

LossFn = Callable[..., Any]


class DonationError(ValueError):
    """A state cannot be donated safely (shared buffers, deleted arrays, or unusable donations)."""


def _buffer_ids(x: jax.Array) -> list[int]:
    try:
        return [shard.data.unsafe_buffer_pointer() for shard in x.addressable_shards]
    except Exception:  # noqa: BLE001 - deleted or exotic arrays: fall back to object identity
        return [id(x)]


def check_donatable(tree: Any, what: str = "state") -> None:
    """Raise :class:`DonationError` if ``tree`` cannot be donated to a jitted call.

    Catches, before XLA does (with a less helpful message), arrays that were
    already deleted (donated earlier and used again) and the same buffer
    appearing at two paths (``Attempt to donate the same buffer twice``),
    e.g. one ``zeros`` array used for both ``mu`` and ``nu``.

    Example:
        >>> import jax.numpy as jnp
        >>> z = jnp.zeros(3)
        >>> check_donatable({"mu": z, "nu": z})
        Traceback (most recent call last):
        ...
        jaxwise.train._step.DonationError: state: the same buffer appears at `mu` and `nu`; donating it would fail ("Attempt to donate the same buffer twice"); copy one of them (jnp.array(x, copy=True))
    """
    seen: dict[int, str] = {}
    for name, leaf in zip(path_names(tree), jax.tree.leaves(tree)):
        if not isinstance(leaf, jax.Array):
            continue
        if leaf.is_deleted():
            raise DonationError(
                f"{what}: the array at `{name}` was already deleted (donated to an earlier call); use the "
                "state returned by that call instead of the old one"
            )
        for buffer in _buffer_ids(leaf):
            if buffer in seen:
                raise DonationError(
                    f"{what}: the same buffer appears at `{seen[buffer]}` and `{name}`; donating it would fail "
                    '("Attempt to donate the same buffer twice"); copy one of them (jnp.array(x, copy=True))'
                )
            seen[buffer] = name


def _check_signature_stable(before: Any, after: Any) -> None:
    """Raise if a step changes the state's types (recompiles every step; donation unusable)."""
    changed = [
        f"`{a[0]}`: {a[2]}{list(a[1])}{'~weak' if a[3] else ''} → {b[2]}{list(b[1])}{'~weak' if b[3] else ''}"
        for a, b in zip(type_signature(before), type_signature(after))
        if a != b
    ]
    if len(type_signature(before)) != len(type_signature(after)):
        changed.append("the tree structure changes")
    if changed:
        raise DonationError(
            "the training step changes the state's type signature, so every step would recompile and "
            "the donated buffers could not be reused: " + "; ".join(changed)
        )


def _leading_size(data: Any, what: str) -> int:
    names, leaves = path_names(data), jax.tree.leaves(data)
    if not leaves:
        raise ValueError(f"`{what}` has no arrays")
    sizes = {}
    for name, leaf in zip(names, leaves):
        shape = jnp.shape(leaf)
        if len(shape) == 0:
            raise ValueError(f"`{what}` leaf `{name or '<root>'}` is a scalar; every leaf needs a leading example axis")
        sizes[name or "<root>"] = shape[0]
    if len(set(sizes.values())) != 1:
        listing = ", ".join(f"`{k}`: {v}" for k, v in sizes.items())
        raise ValueError(f"`{what}` arrays must share their leading (example) dimension, got {listing}")
    return next(iter(sizes.values()))


def _make_update(loss_fn: LossFn, optimizer: Any, *, has_aux: bool, skip_nonfinite: bool, with_key: bool,
                 batch_sharding: Any = None) -> Callable[[TrainState, Any], tuple[TrainState, dict[str, Any]]]:
    """The pure step ``(state, batch) -> (state, metrics)`` shared by steps and epochs."""

    def update(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, Any]]:
        if batch_sharding is not None:
            batch = jax.lax.with_sharding_constraint(batch, batch_sharding)
        key, step_key = jax.random.split(state.key) if with_key else (state.key, None)
        args = (state.params, batch, step_key) if with_key else (state.params, batch)
        out, grads = jax.value_and_grad(loss_fn, has_aux=has_aux)(*args)
        loss, aux = out if has_aux else (out, None)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = jax.tree.map(
            lambda p, u: (p + u.astype(p.dtype)).astype(p.dtype), state.params, updates
        )
        new = dataclasses.replace(state, step=state.step + 1, params=params, opt_state=opt_state, key=key)
        grad_norm = global_norm(grads)
        if skip_nonfinite:
            # One NaN/inf anywhere makes the global norm non-finite (as does an overflowing norm):
            # a single scalar test instead of one per leaf.
            ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
            new = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, state)  # skipped: bit-identical state
            skipped = (~ok).astype(jnp.int32)
        else:
            skipped = jnp.zeros((), jnp.int32)
        metrics = {"loss": loss, "grad_norm": grad_norm, "skipped": skipped}
        if has_aux:
            metrics["aux"] = aux
        return new, metrics

    return update


def _validate(loss_fn: Any, optimizer: Any, mesh: Any) -> None:
    if not callable(loss_fn):
        raise TypeError(f"`loss_fn` must be callable, got {type(loss_fn).__name__}")
    if not (callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))):
        raise TypeError(f"`optimizer` must have `init` and `update`, got {optimizer!r}")
    if mesh is not None:
        if not isinstance(mesh, Mesh):
            raise TypeError(f"`mesh` must be a jax.sharding.Mesh, got {type(mesh).__name__}")
        if "data" not in mesh.axis_names:
            raise ValueError(f"`mesh` needs an axis named 'data' to shard the batch over, got {mesh.axis_names}")


class _Compiled:
    """Common machinery: the jitted function plus first-call audits and mesh placement."""

    def __init__(self, fn: Callable[..., Any], *, donate: bool, mesh: Mesh | None, audit: bool) -> None:
        self.mesh = mesh
        self.audit = audit
        self._audited = False
        self.replicated = replicated(mesh) if mesh is not None else None
        self.batch_sharding = _batch_sharding(mesh) if mesh is not None else None
        self.jitted = jax.jit(fn, donate_argnames=("state",)) if donate else jax.jit(fn)

    def _place(self, state: TrainState, data: Any, data_sharding: Any) -> tuple[TrainState, Any]:
        if self.mesh is None:
            return state, data
        if getattr(state.step, "sharding", None) != self.replicated:
            state = place_state(state, self.replicated)
        return state, place_batch(data, data_sharding)

    def _first_call(self, state: TrainState, data: Any) -> tuple[TrainState, Any]:
        check_donatable(state)
        out_state, _ = jax.eval_shape(self.jitted, state, data)
        _check_signature_stable(state, out_state)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = self.jitted(state, data)
        for w in caught:
            if "donated buffers were not usable" in str(w.message):
                raise DonationError(f"donation audit: {w.message}")
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        self._audited = True
        return result


class TrainStep(_Compiled):
    """``step(state, batch) -> (state, metrics)``: one jitted, donating, NaN-guarded update.

    Attributes:
      jitted: the underlying ``jax.jit`` function (for ``.lower``, ``stage_report``…).
    """

    def __init__(self, loss_fn: LossFn, optimizer: Any, *, donate: bool, skip_nonfinite: bool, has_aux: bool,
                 mesh: Mesh | None, with_key: bool, audit: bool) -> None:
        batch_sharding = _batch_sharding(mesh) if mesh is not None else None
        update = _make_update(loss_fn, optimizer, has_aux=has_aux, skip_nonfinite=skip_nonfinite, with_key=with_key,
                              batch_sharding=batch_sharding)

        def train_step(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, Any]]:
            return update(state, batch)

        super().__init__(train_step, donate=donate, mesh=mesh, audit=audit)

    def __call__(self, state: TrainState, batch: Any) -> tuple[TrainState, dict[str, Any]]:
        if self.mesh is not None:
            n = _leading_size(batch, "batch")
            if n % _data_size(self.mesh):
                raise ValueError(
                    f"the global batch size {n} is not divisible by the {_data_size(self.mesh)} devices of the "
                    "mesh's 'data' axis"
                )
            state, batch = self._place(state, batch, self.batch_sharding)
        if self.audit and not self._audited:
            return self._first_call(state, batch)
        return self.jitted(state, batch)


def make_train_step(
    loss_fn: LossFn,
    optimizer: Any,
    *,
    donate: bool = True,
    skip_nonfinite: bool = True,
    has_aux: bool = False,
    mesh: Mesh | None = None,
    with_key: bool = False,
    audit: bool = True,
) -> TrainStep:
    """A jitted training step ``step(state, batch) -> (state, metrics)``.

    ``loss_fn(params, batch) -> loss`` (or ``(loss, aux)`` with ``has_aux``;
    with ``with_key=True`` it is called as ``loss_fn(params, batch, key)``
    with a fresh key split from ``state.key`` each step). The state is
    donated (``donate_argnames=("state",)``), the batch never is. ``metrics``
    has ``"loss"``, ``"grad_norm"`` and ``"skipped"`` (and ``"aux"``).

    With ``skip_nonfinite`` (default), a step whose loss or gradients are not
    finite (or whose gradient norm overflows) returns the input state unchanged — bit-identical, step counter
    included — and ``skipped = 1``: one bad batch cannot wipe the model.

    The first call audits the state (``audit=True``): shared or deleted
    buffers raise :class:`DonationError` naming their paths (instead of
    XLA's "donate the same buffer twice"), a step that would change the
    state's types (e.g. a weak-typed leaf) raises naming the leaf, and JAX's
    "Some donated buffers were not usable" warning becomes an error.

    With ``mesh`` (a ``jax.sharding.Mesh`` with a ``"data"`` axis) the batch
    is sharded over the devices and the state replicated: data parallelism
    with XLA inserting the gradient all-reduce.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxwise import optim
        >>> loss = lambda p, b: jnp.mean((b[0] @ p["w"] - b[1]) ** 2)
        >>> state = TrainState.create({"w": jnp.zeros(3)}, optim.sgd(0.1), jax.random.key(0))
        >>> step = make_train_step(loss, optim.sgd(0.1))
        >>> state, metrics = step(state, (jnp.ones((4, 3)), jnp.ones(4)))
        >>> int(state.step), int(metrics["skipped"])
        (1, 0)
    """
    _validate(loss_fn, optimizer, mesh)
    return TrainStep(loss_fn, optimizer, donate=donate, skip_nonfinite=skip_nonfinite, has_aux=has_aux,
                     mesh=mesh, with_key=with_key, audit=audit)


class TrainEpoch(_Compiled):
    """``epoch(state, data) -> (state, metrics)``: a whole shuffled epoch as one ``lax.scan`` program."""

    def __init__(self, loss_fn: LossFn, optimizer: Any, batch_size: int, *, donate: bool, skip_nonfinite: bool,
                 has_aux: bool, mesh: Mesh | None, with_key: bool, audit: bool) -> None:
        self.batch_size = batch_size
        batch_sharding = _batch_sharding(mesh) if mesh is not None else None
        update = _make_update(loss_fn, optimizer, has_aux=has_aux, skip_nonfinite=skip_nonfinite,
                              with_key=with_key, batch_sharding=batch_sharding)

        def train_epoch(state: TrainState, data: Any) -> tuple[TrainState, dict[str, Any]]:
            n = jax.tree.leaves(data)[0].shape[0]
            steps = n // batch_size  # the remainder (n % batch_size examples) is dropped this epoch
            key, shuffle_key = jax.random.split(state.key)
            # A uniformly random permutation: argsort of random bits (one sort; cheaper to compile than
            # jax.random.permutation's multi-round shuffle; ties among 32-bit keys are negligible).
            order = jnp.argsort(jax.random.bits(shuffle_key, (n,), jnp.uint32))
            order = order[: steps * batch_size].reshape(steps, batch_size)

            def body(carry: TrainState, idx: jax.Array) -> tuple[TrainState, dict[str, Any]]:
                batch = jax.tree.map(lambda x: jnp.take(x, idx, axis=0), data)
                return update(carry, batch)

            return jax.lax.scan(body, dataclasses.replace(state, key=key), order)

        super().__init__(train_epoch, donate=donate, mesh=mesh, audit=audit)

    def __call__(self, state: TrainState, data: Any) -> tuple[TrainState, dict[str, Any]]:
        n = _leading_size(data, "data")
        if self.batch_size > n:
            raise ValueError(f"`batch_size` {self.batch_size} is larger than the dataset ({n} examples)")
        if self.mesh is not None:
            state, data = self._place(state, data, self.replicated)
        if self.audit and not self._audited:
            return self._first_call(state, data)
        return self.jitted(state, data)


def make_train_epoch(
    loss_fn: LossFn,
    optimizer: Any,
    batch_size: int,
    *,
    donate: bool = True,
    skip_nonfinite: bool = True,
    has_aux: bool = False,
    mesh: Mesh | None = None,
    with_key: bool = False,
    audit: bool = True,
) -> TrainEpoch:
    """A whole epoch as one jitted program: ``epoch(state, data) -> (state, per-step metrics)``.

    ``data`` is a pytree of arrays sharing the leading (example) dimension,
    e.g. ``(X, Y)``; it is an argument (never captured, never donated). Inside
    the program: the state's key is split, the examples are permuted,
    ``n // batch_size`` fixed-shape mini-batches (of ``data``'s structure)
    are taken — the remainder is dropped, a different remainder each epoch —
    and the steps run in one ``lax.scan``. Metrics are stacked per step.
    Everything else is as in :func:`make_train_step`; with ``mesh`` the data
    is replicated and each mini-batch sharded over the ``"data"`` axis.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxwise import optim
        >>> loss = lambda p, b: jnp.mean((b[0] @ p["w"] - b[1]) ** 2)
        >>> state = TrainState.create({"w": jnp.zeros(3)}, optim.sgd(0.1), 0)
        >>> epoch = make_train_epoch(loss, optim.sgd(0.1), batch_size=4)
        >>> state, metrics = epoch(state, (jnp.ones((10, 3)), jnp.ones(10)))
        >>> int(state.step), metrics["loss"].shape
        (2, (2,))
    """
    _validate(loss_fn, optimizer, mesh)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive int, got {batch_size!r}")
    if mesh is not None and batch_size % _data_size(mesh):
        raise ValueError(
            f"`batch_size` {batch_size} is not divisible by the {_data_size(mesh)} devices of the mesh's 'data' axis"
        )
    return TrainEpoch(loss_fn, optimizer, batch_size, donate=donate, skip_nonfinite=skip_nonfinite,
                      has_aux=has_aux, mesh=mesh, with_key=with_key, audit=audit)

