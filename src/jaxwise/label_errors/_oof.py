"""Out-of-fold probabilities: ``folds`` models trained at once, each row predicted by the model
that never saw it.

``vmap`` over ``folds`` parameter sets in one compiled, scanned program, each masked to its
training folds; each fold stops early on its held-out part (its best epoch's parameters are
kept).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from jaxwise._checks import check_array, check_callable, check_int
from jaxwise._params import check_params
from jaxwise.models import init_mlp

__all__ = ["OutOfFold", "out_of_fold_probabilities", "stratified_folds"]


@dataclasses.dataclass(frozen=True)
class OutOfFold:
    """Out-of-fold predictions of ``folds`` models trained at once.

    Attributes:
      probs: ``(n, num_classes)`` float64 probabilities, row ``i`` from the model of
        ``fold_of[i]``, which never trained on row ``i``.
      fold_of: ``(n,)`` int fold of each row.
      best_epoch: ``(folds,)`` the epoch (1-based) whose parameters each fold kept.
      val_loss: ``(epochs, folds)`` held-out cross-entropy of each fold after each epoch
        (NaN once the fold has stopped; the loop ends when every fold has stopped).
      params: the ``folds`` best parameter sets, stacked on a leading axis.
    """

    probs: np.ndarray
    fold_of: np.ndarray
    best_epoch: np.ndarray
    val_loss: np.ndarray
    params: Any


def stratified_folds(labels: np.ndarray, folds: int, seed: int = 0) -> np.ndarray:
    """``(n,)`` fold index of each row; every class is spread evenly over the folds.

    Args:
      labels: ``(n,)`` labels.
      folds: number of folds (>= 1).
      seed: the shuffle's seed (>= 0).

    Returns:
      ``(n,)`` int32 fold indices in ``[0, folds)``.

    Examples:
        >>> stratified_folds(np.array([0, 0, 1, 1, 0, 1]), 2, seed=0).tolist().count(0)
        3
    """
    labels = np.asarray(check_array(labels, "labels", ndim=1))
    folds = check_int(folds, "folds", min_value=1)
    rng = np.random.default_rng(check_int(seed, "seed", min_value=0))
    fold_of = np.empty(len(labels), np.int32)
    offset = 0
    for cls in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == cls))
        fold_of[rows] = (np.arange(len(rows)) + offset) % folds
        offset += len(rows)
    return fold_of


def _nll(logits: jax.Array, labels: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.take_along_axis(logp, labels[:, None], axis=1)[:, 0]


@functools.partial(
    jax.jit, static_argnames=("apply_fn", "tx", "epochs", "batch_size", "folds", "patience")
)
def _train_folds(
    params: Any,
    x: jax.Array,
    y: jax.Array,
    fold_of: jax.Array,
    fold_rows: jax.Array,
    fold_mask: jax.Array,
    key: jax.Array,
    *,
    apply_fn: Callable[..., Any],
    tx: Any,
    epochs: int,
    batch_size: int,
    folds: int,
    patience: int,
) -> tuple[Any, jax.Array, jax.Array]:
    """All folds, all epochs: one program. Returns (best params, best epoch, val loss history)."""
    n = x.shape[0]
    steps = n // batch_size
    fold_ids = jnp.arange(folds)
    # Each fold's held-out rows, padded to one width: evaluating them costs n forward rows per
    # epoch in all (not folds × n).
    x_held, y_held = x[fold_rows], y[fold_rows]  # (folds, m, d), (folds, m)
    held_count = jnp.maximum(fold_mask.sum(axis=1), 1).astype(jnp.float32)

    def fold_loss(p: Any, k: jax.Array, xb: jax.Array, yb: jax.Array, fb: jax.Array) -> jax.Array:
        w = (fb != k).astype(jnp.float32)
        return jnp.sum(w * _nll(apply_fn(p, xb), yb)) / jnp.maximum(jnp.sum(w), 1.0)

    def step(carry: tuple, idx: jax.Array) -> tuple:
        p, opt, active = carry
        xb, yb, fb = x[idx], y[idx], fold_of[idx]
        grads = jax.vmap(jax.grad(fold_loss), in_axes=(0, 0, None, None, None))(
            p, fold_ids, xb, yb, fb
        )
        with jax.numpy_dtype_promotion("standard"):  # Optax relies on standard promotion
            updates, new_opt = jax.vmap(tx.update)(grads, opt, p)
        new_p = optax.apply_updates(p, updates)
        keep = functools.partial(_select, active)
        return (jax.tree.map(keep, new_p, p), jax.tree.map(keep, new_opt, opt), active), None

    def epoch(carry: tuple) -> tuple:
        p, opt, best_p, best_loss, best_epoch, waited, number, history = carry
        ekey = jax.random.fold_in(key, number)
        order = jax.random.permutation(ekey, n)[: steps * batch_size].reshape(steps, batch_size)
        active = waited < patience
        (p, opt, _), _ = jax.lax.scan(step, (p, opt, active), order)
        nll = jax.vmap(lambda q, xh, yh: _nll(apply_fn(q, xh), yh))(p, x_held, y_held)
        val = jnp.sum(jnp.where(fold_mask, nll, 0.0), axis=1) / held_count
        better = active & ((val < best_loss) | (patience > epochs))
        best_p = jax.tree.map(functools.partial(_select, better), p, best_p)
        best_epoch = jnp.where(better, number + 1, best_epoch)
        waited = jnp.where(better, 0, waited + 1)
        history = history.at[number].set(jnp.where(active, val, jnp.nan))
        best_loss = jnp.where(better, val, best_loss)
        return p, opt, best_p, best_loss, best_epoch, waited, number + 1, history

    def unfinished(carry: tuple) -> jax.Array:
        # Stop as soon as every fold has stopped early (or after `epochs`).
        return (carry[6] < epochs) & jnp.any(carry[5] < patience)

    with jax.numpy_dtype_promotion("standard"):
        opt = jax.vmap(tx.init)(params)
    init = (
        params,
        opt,
        params,
        jnp.full((folds,), jnp.inf),
        jnp.zeros((folds,), jnp.int32),
        jnp.zeros((folds,), jnp.int32),
        jnp.zeros((), jnp.int32),
        jnp.full((epochs, folds), jnp.nan),
    )
    carry = jax.lax.while_loop(unfinished, epoch, init)
    return carry[2], carry[4], carry[7]


def _select(flag: jax.Array, new: jax.Array, old: jax.Array) -> jax.Array:
    """Per-fold ``where``: ``flag`` has shape (folds,), leaves (folds, ...)."""
    return jnp.where(flag.reshape(flag.shape + (1,) * (new.ndim - 1)), new, old)


@functools.partial(jax.jit, static_argnames=("apply_fn",))
def _predict_folds(
    params: Any, x: jax.Array, fold_of: jax.Array, *, apply_fn: Callable[..., Any]
) -> jax.Array:
    probs = jax.vmap(lambda q: jax.nn.softmax(apply_fn(q, x).astype(jnp.float32)))(
        params
    )  # (folds, n, k)
    return probs[fold_of, jnp.arange(x.shape[0])]


def out_of_fold_probabilities(
    apply_fn: Callable[[Any, jax.Array], jax.Array],
    init: Any,
    x: Any,
    y: Any,
    *,
    folds: int = 5,
    epochs: int = 60,
    batch_size: int = 128,
    optimizer: Any = None,
    patience: int | None = 10,
    seed: int = 0,
    fold_of: Any = None,
) -> OutOfFold:
    """Train ``folds`` models at once (one compiled program) and predict each row out of fold.

    Args:
      apply_fn: ``apply_fn(params, x) -> logits`` for a batch ``x`` of shape ``(b, d)``;
        a module-level function or a stable object (it is a static argument of the program).
      init: the initial parameters (copied to every fold), or ``init(key) -> params`` to give
        each fold its own initialisation.
      x: ``(n, d)`` features.
      y: ``(n,)`` integer labels in ``[0, k)``.
      folds: number of folds (≥ 2).
      epochs: maximum epochs.
      batch_size: rows per step (each fold sees the ``(folds − 1) / folds`` of a batch that
        it trains on).
      optimizer: an Optax transformation (default ``adamw(3e-3, weight_decay=1e-4)``).
      patience: a fold stops (keeps its best epoch) after ``patience`` epochs without a
        lower held-out loss. ``None``: no early stopping, every fold keeps its last epoch —
        then a row's out-of-fold probabilities do not depend on its own label at all (with
        early stopping, the held-out labels choose one epoch per fold).
      seed: fold assignment, shuffling and (with a callable ``init``) initialisation.
      fold_of: ``(n,)`` explicit fold of each row in ``[0, folds)`` (default: stratified by
        label, from ``seed``).

    Returns:
      [`OutOfFold`][jaxwise.label_errors.OutOfFold].

    Raises:
      TypeError: an argument of the wrong type (``params``-like ``init`` included).
      ValueError: an argument out of range, or fewer than 2 rows per fold.
    """
    check_callable(apply_fn, "apply_fn")
    folds = check_int(folds, "folds", min_value=2)
    epochs = check_int(epochs, "epochs", min_value=1)
    patience = epochs + 1 if patience is None else check_int(patience, "patience", min_value=1)
    seed = check_int(seed, "seed", min_value=0, max_value=2**32 - 1)
    x = np.asarray(check_array(x, "x", ndim=2, dtype_kind="fiu", non_empty=True), np.float32)
    y = np.asarray(check_array(y, "y", ndim=1, dtype_kind="iu"), np.int32)
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"`y` has {y.shape[0]} rows but `x` has {x.shape[0]}")
    if not np.all(np.isfinite(x)):
        raise ValueError("`x` must be finite")
    n = x.shape[0]
    if n < 2 * folds:
        raise ValueError(f"need at least 2 rows per fold: {n} rows for `folds`={folds}")
    batch_size = check_int(batch_size, "batch_size", min_value=1, max_value=n)
    if fold_of is None:
        fold_of = stratified_folds(y, folds, seed)
    else:
        fold_of = np.asarray(check_array(fold_of, "fold_of", ndim=1, dtype_kind="iu"), np.int32)
        if fold_of.shape != y.shape or fold_of.min() < 0 or fold_of.max() >= folds:
            raise ValueError(f"`fold_of` must have shape {y.shape} and values in [0, {folds})")
    key = jax.random.key(seed)
    init_key, train_key = jax.random.split(key)
    if callable(init):
        params = jax.vmap(init)(jax.random.split(init_key, folds))
    else:
        check_params(init, "init")
        params = jax.tree.map(lambda a: jnp.broadcast_to(a, (folds, *jnp.shape(a))), init)
    # One flat vector per fold: the optimizer then updates one array instead of every leaf,
    # which keeps the compiled program (and its compile time) small.
    flat, unravel = _ravel_folds(params)
    tx = optimizer if optimizer is not None else _default_optimizer()
    flat_apply = _FlatApply(apply_fn, unravel)
    fold_rows, fold_mask = _held_out_rows(fold_of, folds)
    best, best_epoch, history = _train_folds(
        flat,
        x,
        y,
        fold_of,
        fold_rows,
        fold_mask,
        train_key,
        apply_fn=flat_apply,
        tx=tx,
        epochs=epochs,
        batch_size=batch_size,
        folds=folds,
        patience=patience,
    )
    probs = np.asarray(_predict_folds(best, x, fold_of, apply_fn=flat_apply), np.float64)
    return OutOfFold(
        probs / probs.sum(axis=1, keepdims=True),
        fold_of,
        np.asarray(best_epoch),
        np.asarray(history),
        jax.vmap(unravel)(best),
    )


def _held_out_rows(fold_of: np.ndarray, folds: int) -> tuple[np.ndarray, np.ndarray]:
    """``(folds, m)`` row indices of each fold (padded with row 0) and the mask of real ones."""
    members = [np.flatnonzero(fold_of == k) for k in range(folds)]
    width = max(1, max(len(m) for m in members))
    rows = np.zeros((folds, width), np.int32)
    mask = np.zeros((folds, width), bool)
    for k, m in enumerate(members):
        rows[k, : len(m)], mask[k, : len(m)] = m, True
    return rows, mask


def _ravel_folds(params: Any) -> tuple[jax.Array, Callable[[jax.Array], Any]]:
    """``(folds, P)`` flat parameters and the function that rebuilds one fold's tree."""
    one = jax.tree.map(lambda a: a[0], params)
    _, unravel = jax.flatten_util.ravel_pytree(one)
    flat = jax.vmap(lambda p: jax.flatten_util.ravel_pytree(p)[0])(params)
    return flat, unravel


@dataclasses.dataclass(frozen=True)
class _FlatApply:
    """``apply_fn`` on a flat parameter vector; equal and hashed by the function and the
    tree layout (``ravel_pytree``'s ``unravel`` is hashable), so reruns reuse the program."""

    apply_fn: Callable[..., Any]
    unravel: Callable[[jax.Array], Any]

    def __call__(self, flat: jax.Array, x: jax.Array) -> jax.Array:
        return self.apply_fn(self.unravel(flat), x)


@functools.cache
def _default_optimizer() -> Any:
    # Cached: the optimizer is a static argument, so one object means one compiled program.
    return optax.adamw(3e-3, weight_decay=1e-4)


def _mlp_init(sizes: tuple[int, ...]) -> Callable[[jax.Array], Any]:
    """``init(key)`` for `jaxwise.models.init_mlp` with layer ``sizes`` (one stable object)."""
    return functools.partial(_init_mlp_from_key, sizes=sizes)


def _init_mlp_from_key(key: jax.Array, sizes: tuple[int, ...]) -> Any:
    return init_mlp(key, sizes)
