"""Out-of-fold probabilities: every fold model of every repeat trained at once, in one program.

The fold models train through `jaxwise.train`'s step, vmapped over models
(`jaxwise.label_errors._ensemble.fit_models`): each model shuffles its own training rows and
keeps its best epoch. Early stopping watches an *inner validation split* of each model's training
rows (one row in `INNER_VALIDATION`, stratified by label, drawn from the seed): the model
never trains on those rows, and never looks at the labels of the rows it judges. Each model
standardises its inputs with the mean and standard deviation of its training rows only, so
neither a held-out row's features nor its label influences the model that judges it. Rows
are padded up to a size ladder (the padding is never trained on, never predicted) and every
size-dependent setting comes from the padded size, so datasets of nearby sizes run the same
compiled program.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
import optax

from jaxwise._shared._checks import check_array, check_bool, check_callable, check_int
from jaxwise._shared._params import check_params
from jaxwise.buckets import bucket_for
from jaxwise.label_errors._ensemble import fit_models
from jaxwise.models import init_mlp
from jaxwise.numerics import cross_entropy
from jaxwise.train import TrainState

__all__ = ["OutOfFold", "out_of_fold_probabilities", "stratified_folds"]

# Early stopping validates each fold model on one row in INNER_VALIDATION of its training rows.
INNER_VALIDATION = 6

# Padded row counts: 16 · 2^(i/4) rounded up to a multiple of 16 (at most ~19 % padding).
_LADDER = tuple(sorted({16 * math.ceil(2 ** (i / 4)) for i in range(80)}))


@dataclasses.dataclass(frozen=True)
class OutOfFold:
    """Out-of-fold predictions of ``folds`` models trained at once.

    Attributes:
        probs: ``(n, num_classes)`` float64 probabilities, row ``i`` from the model of
            ``fold_of[i]``, which never trained on row ``i``.
        fold_of: ``(n,)`` int fold of each row.
        best_epoch: ``(folds,)`` the epoch (1-based) whose parameters each fold kept.
        val_loss: ``(epochs, folds)`` cross-entropy of each fold after each epoch on its
            validation rows (NaN once the fold has stopped and for epochs never run).
        params: the ``folds`` best parameter sets, stacked on a leading axis.
        validation: ``(folds, n)`` bool, the rows whose loss each fold model watched: with
            early stopping, its inner validation split (training rows it did not train on,
            never its held-out rows); with ``patience=None``, its held-out rows (a report
            only: the fold keeps its last epoch whatever they say).
    """

    probs: np.ndarray
    fold_of: np.ndarray
    best_epoch: np.ndarray
    val_loss: np.ndarray
    params: Any
    validation: np.ndarray


def stratified_folds(labels: np.ndarray, folds: int, seed: int = 0) -> np.ndarray:
    """``(n,)`` fold index of each row; every class is spread evenly over the folds.

    Fold sizes differ by at most one row.

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
    return _spread(labels, folds, np.random.default_rng(check_int(seed, "seed", min_value=0)))


def _spread(labels: np.ndarray, parts: int, rng: np.random.Generator) -> np.ndarray:
    """``(n,)`` part of each row: every class dealt in turn, so part ``j`` holds exactly
    ``len(range(j, n, parts))`` rows whatever the labels are."""
    part = np.empty(len(labels), np.int32)
    offset = 0
    for cls in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == cls))
        part[rows] = (np.arange(len(rows)) + offset) % parts
        offset += len(rows)
    return part


def inner_validation_rows(train: int) -> int:
    """How many of a fold model's ``train`` rows validate it (early stopping)."""
    return -(-train // INNER_VALIDATION)


def _inner_validation(
    y: np.ndarray, fold_of: np.ndarray, folds: int, seed: int
) -> tuple[np.ndarray, ...]:
    """The ``(n,)`` bool inner validation rows of each (repeat, fold) model, ``M`` of them.

    Stratified by the labels of the model's *training* rows only, from ``(seed, repeat,
    fold)``; their count depends only on how many rows the model trains on, so no other
    fold's labels can change it either.
    """
    out = np.zeros((fold_of.shape[0] * folds, fold_of.shape[1]), bool)
    for r, assign in enumerate(fold_of):
        for f in range(folds):
            train = np.flatnonzero(assign != f)
            part = _spread(y[train], INNER_VALIDATION, np.random.default_rng([seed, r, f]))
            out[r * folds + f, train[part == 0]] = True
    return tuple(out)


def padded_rows(n: int) -> int:
    """The padded row count of a dataset of ``n`` rows (the program's shape)."""
    return bucket_for(n, _LADDER)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """One model's parameter pytree as one flat float vector (hashable: a static argument).

    The optimizer then updates one array per model instead of every leaf, which keeps the
    compiled program (and its compile time) small.
    """

    treedef: Any
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    @classmethod
    def of(cls, tree: Any) -> _Layout:
        leaves, treedef = jax.tree.flatten(tree)
        return cls(
            treedef,
            tuple(tuple(leaf.shape) for leaf in leaves),
            tuple(str(np.dtype(leaf.dtype)) for leaf in leaves),
        )

    @property
    def dtype(self) -> Any:
        return jnp.result_type(*self.dtypes)

    def ravel(self, tree: Any) -> jax.Array:
        return jnp.concatenate(
            [jnp.ravel(leaf).astype(self.dtype) for leaf in jax.tree.leaves(tree)]
        )

    def unravel_host(self, flat: np.ndarray) -> Any:
        """NumPy: ``(M, P)`` flat vectors to one tree of ``(M, ...)`` arrays (no compilation)."""
        leaves, start = [], 0
        for shape, dtype in zip(self.shapes, self.dtypes):
            size = math.prod(shape)
            leaves.append(flat[:, start : start + size].reshape(-1, *shape).astype(dtype))
            start += size
        return jax.tree.unflatten(self.treedef, leaves)

    def unravel(self, flat: jax.Array) -> Any:
        leaves, start = [], 0
        for shape, dtype in zip(self.shapes, self.dtypes):
            size = math.prod(shape)
            leaves.append(flat[start : start + size].reshape(shape).astype(dtype))
            start += size
        return jax.tree.unflatten(self.treedef, leaves)


@dataclasses.dataclass(frozen=True)
class _FoldLoss:
    """``loss(flat params, (mean, inv_scale), (x, y)) -> (cross-entropy, same statistics)``.

    The standardisation statistics are the model's (constant) model state.
    """

    apply_fn: Callable[..., Any]
    layout: _Layout

    def logits(self, flat: jax.Array, stats: tuple[jax.Array, jax.Array], x: jax.Array) -> Any:
        mean, inv_scale = stats
        return self.apply_fn(self.layout.unravel(flat), (x - mean) * inv_scale)

    def __call__(self, flat: jax.Array, stats: Any, batch: tuple[jax.Array, jax.Array]) -> Any:
        x, y = batch
        return cross_entropy(self.logits(flat, stats, x).astype(jnp.float32), y), stats


@dataclasses.dataclass(frozen=True)
class _Spec:
    """Every static setting of the out-of-fold program."""

    loss: _FoldLoss
    init: Callable[[jax.Array], Any] | None
    optimizer: Any
    folds: int
    epochs: int
    patience: int | None
    batch_size: int


@dataclasses.dataclass(frozen=True)
class FoldTraining:
    """How every fold model trains: the options of `run_folds`, validated by its callers."""

    folds: int
    epochs: int
    batch_size: int
    optimizer: optax.GradientTransformation | None
    patience: int | None
    seed: int
    standardize: bool


@functools.partial(jax.jit, static_argnames=("spec",))
def _oof_program(
    start: jax.Array,
    x: jax.Array,
    y: jax.Array,
    assign: jax.Array,
    mean: jax.Array,
    inv_scale: jax.Array,
    held_rows: jax.Array,
    held_mask: jax.Array,
    val_rows: jax.Array,
    val_mask: jax.Array,
    seed: jax.Array,
    *,
    spec: _Spec,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Train every (repeat, fold) model and predict its held-out rows: one program.

    ``assign`` ``(R, n)``: each row's fold per repeat (``-1``: padding); ``val_rows`` and
    ``val_mask`` ``(M, v)``: the rows each model validates on and does not train on (its
    inner validation split; with ``patience=None`` its held-out rows). Returns the
    out-of-fold probabilities ``(R, n, k)``, each model's best epoch ``(M,)``, the
    validation history ``(epochs, M)`` and the best flat parameters ``(M, P)``.
    """
    repeats, n = assign.shape
    models = repeats * spec.folds
    layout = spec.loss.layout
    keys = jax.random.split(jax.random.key(seed), models)
    if spec.init is not None:
        params = jax.vmap(lambda k: layout.ravel(spec.init(k)))(keys)  # type: ignore[misc]
    else:
        params = jnp.broadcast_to(start, (models, start.shape[0]))
    with jax.numpy_dtype_promotion("standard"):  # Optax relies on standard promotion
        opt_state = jax.vmap(spec.optimizer.init)(params)
    states = TrainState(
        step=jnp.zeros((models,), jnp.int32),
        params=params,
        opt_state=opt_state,
        key=keys,
        model_state=(mean, inv_scale),
        tx=spec.optimizer,
    )
    fold_ids = jnp.arange(spec.folds)
    allowed = (assign[:, None, :] != fold_ids[None, :, None]) & (assign[:, None, :] >= 0)
    allowed = allowed.reshape(models, n)
    if spec.patience is not None:  # the inner validation rows are not trained on
        flat = jnp.where(val_mask, val_rows, n)  # n: out of bounds, dropped
        allowed = allowed.at[jnp.arange(models)[:, None], flat].set(False, mode="drop")

    def held_out(flat: jax.Array, stats: Any, rows_mask: tuple[jax.Array, jax.Array]) -> Any:
        rows, _ = rows_mask
        return spec.loss.logits(flat, stats, x[rows]).astype(jnp.float32)

    def validate(flat: jax.Array, stats: Any, rows_mask: tuple[jax.Array, jax.Array]) -> Any:
        rows, mask = rows_mask
        logits = held_out(flat, stats, rows_mask)
        return cross_entropy(logits, y[rows], weights=mask.astype(jnp.float32))

    with jax.numpy_dtype_promotion("standard"):
        fit = fit_models(
            spec.loss,
            states,
            (x, y),
            allowed,
            validate,
            (val_rows, val_mask),
            batch_size=spec.batch_size,
            epochs=spec.epochs,
            patience=spec.patience,
            model_state=True,
        )
    probs = jax.nn.softmax(
        jax.vmap(held_out)(fit.params, fit.model_state, (held_rows, held_mask)), axis=-1
    )  # (M, w, k)
    offset = (jnp.arange(models) // spec.folds * n)[:, None]
    flat_rows = jnp.where(held_mask, held_rows + offset, 0).reshape(-1)
    contrib = jnp.where(held_mask[..., None], probs, 0.0).reshape(-1, probs.shape[-1])
    out = jnp.zeros((repeats * n, probs.shape[-1]), jnp.float32).at[flat_rows].add(contrib)
    return out.reshape(repeats, n, -1), fit.best_epoch, fit.val_loss, fit.params


def _held_out(assign: np.ndarray, folds: int) -> tuple[np.ndarray, ...]:
    """``(M, n)`` bool rows held out by each (repeat, fold) model."""
    return tuple(assign[r] == f for r in range(assign.shape[0]) for f in range(folds))


def _row_lists(members: tuple[np.ndarray, ...], width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(M, width)`` indices of each model's ``True`` rows (padded with 0) and a mask."""
    rows = np.zeros((len(members), width), np.int32)
    mask = np.zeros((len(members), width), bool)
    for m, chosen in enumerate(members):
        found = np.flatnonzero(chosen)
        rows[m, : len(found)], mask[m, : len(found)] = found, True
    return rows, mask


def _train_statistics(
    x: np.ndarray, assign: np.ndarray, folds: int, standardize: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``(M, d)`` mean and inverse standard deviation of each model's training rows."""
    models, d = assign.shape[0] * folds, x.shape[1]
    if not standardize:
        return np.zeros((models, d), np.float32), np.ones((models, d), np.float32)
    x64 = x.astype(np.float64)
    mean, inv = np.empty((models, d)), np.empty((models, d))
    for r in range(assign.shape[0]):
        for f in range(folds):
            train = x64[(assign[r] != f) & (assign[r] >= 0)]
            std = train.std(axis=0)
            mean[r * folds + f] = train.mean(axis=0)
            inv[r * folds + f] = np.where(std > 0, 1.0 / np.where(std > 0, std, 1.0), 1.0)
    return mean.astype(np.float32), inv.astype(np.float32)


def run_folds(
    apply_fn: Callable[[Any, jax.Array], jax.Array],
    init: Any,
    x: np.ndarray,
    y: np.ndarray,
    fold_of: np.ndarray,
    training: FoldTraining,
) -> tuple[OutOfFold, ...]:
    """One `OutOfFold` per row of ``fold_of`` ``(R, n)``, from ONE program call.

    Arguments are validated by the callers; ``x`` float32, ``y`` int32.
    """
    folds, patience, seed = training.folds, training.patience, training.seed
    n, repeats = x.shape[0], fold_of.shape[0]
    n_pad = padded_rows(n)
    largest = max(int(np.bincount(assign, minlength=folds).max()) for assign in fold_of)
    width = max(largest, -(-n_pad // folds))  # stratified folds never exceed ⌈n_pad / folds⌉
    x_pad, y_pad, assign = _padded(x, y, fold_of, n_pad)
    mean, inv_scale = _train_statistics(x, fold_of, folds, training.standardize)
    held = _held_out(assign, folds)
    rows, mask = _row_lists(held, width)
    if patience is None:
        validation, (val_rows, val_mask) = held, (rows, mask)
    else:  # widths from the padded size only: nearby sizes share the program
        validation = _inner_validation(y, fold_of, folds, seed)
        val_rows, val_mask = _row_lists(
            tuple(np.pad(v, (0, n_pad - n)) for v in validation),
            inner_validation_rows(n_pad),
        )
    layout, start, init_fn = _initial_parameters(init)
    optimizer = training.optimizer
    spec = _Spec(
        _FoldLoss(apply_fn, layout),
        init_fn,
        optimizer if optimizer is not None else _default_optimizer(),
        folds,
        training.epochs,
        patience,
        training.batch_size,
    )
    probs, best_epoch, history, params = jax.device_get(
        _oof_program(
            start,
            x_pad,
            y_pad,
            assign,
            mean,
            inv_scale,
            rows,
            mask,
            val_rows,
            val_mask,
            np.uint32(seed),
            spec=spec,
        )
    )
    return tuple(
        OutOfFold(
            _normalised(probs[r, :n]),
            fold_of[r],
            np.asarray(best_epoch[r * folds : (r + 1) * folds]),
            np.asarray(history[:, r * folds : (r + 1) * folds]),
            layout.unravel_host(params[r * folds : (r + 1) * folds]),
            np.stack(validation[r * folds : (r + 1) * folds])[:, :n],
        )
        for r in range(repeats)
    )


def _padded(
    x: np.ndarray, y: np.ndarray, fold_of: np.ndarray, n_pad: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``x``, ``y`` and ``fold_of`` ``(R, n)`` padded with zero rows to ``n_pad`` rows; the
    padding rows are in no fold (``-1``)."""
    n = x.shape[0]
    assign = np.full((fold_of.shape[0], n_pad), -1, np.int32)
    assign[:, :n] = fold_of
    x_pad = np.zeros((n_pad, x.shape[1]), np.float32)
    x_pad[:n] = x
    y_pad = np.zeros(n_pad, np.int32)
    y_pad[:n] = y
    return x_pad, y_pad, assign


def _initial_parameters(init: Any) -> tuple[_Layout, np.ndarray, Callable | None]:
    """``(layout, start, init_fn)``: the flat parameter layout, the flattened initial
    parameters (empty when ``init`` is a function) and the init function (or ``None``)."""
    if callable(init):
        layout = _Layout.of(jax.eval_shape(lambda s: init(jax.random.key(s)), np.uint32(0)))
        return layout, np.zeros(0, np.float32), init
    check_params(init, "init")
    layout = _Layout.of(init)
    leaves = [np.asarray(leaf).reshape(-1) for leaf in jax.tree.leaves(init)]
    return layout, np.concatenate(leaves).astype(layout.dtype), None


def _normalised(probs: np.ndarray) -> np.ndarray:
    """``probs`` ``(n, k)`` in float64, each row summing to 1."""
    p = np.asarray(probs, np.float64)
    return p / p.sum(axis=1, keepdims=True)


def out_of_fold_probabilities(
    apply_fn: Callable[[Any, jax.Array], jax.Array],
    init: Any,
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    folds: int = 5,
    epochs: int = 60,
    batch_size: int = 128,
    optimizer: optax.GradientTransformation | None = None,
    patience: int | None = 10,
    standardize: bool = True,
    seed: int = 0,
    fold_of: npt.ArrayLike | None = None,
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
        batch_size: rows per step of each fold model (at most the rows a fold trains on,
            its inner validation rows excluded).
        optimizer: an Optax transformation (default ``adamw(1e-2, weight_decay=1e-4)``).
        patience: a fold stops (keeps its best epoch) after ``patience`` epochs without a
            lower loss on its inner validation split: one row in 6 of its *training* rows
            (stratified by label, from ``seed``), which it then does not train on. Its
            held-out rows, features and labels, never influence it, so a row's out-of-fold
            probabilities do not depend on its own label. ``None``: no early stopping, every
            fold trains on all its training rows and keeps its last epoch.
        standardize: each fold model standardises the features with the mean and standard
            deviation of its own training rows (never of the rows it judges); ``False`` for
            features already on one scale.
        seed: fold assignment, shuffling and (with a callable ``init``) initialisation.
        fold_of: ``(n,)`` explicit fold of each row in ``[0, folds)`` (default: stratified by
            label, from ``seed``).

    Returns:
        [`OutOfFold`][jaxwise.label_errors.OutOfFold].

    Raises:
        TypeError: an argument of the wrong type (``params``-like ``init`` included).
        ValueError: non-finite ``x``, mismatched rows, too few rows per fold, a bad
            ``fold_of`` or ``batch_size``.

    Examples:
        >>> import numpy as np
        >>> from jaxwise.data import make_blobs
        >>> from jaxwise.models import mlp_apply
        >>> x, y = make_blobs(100, n_features=2, n_classes=2, seed=0)
        >>> init = {"dense_0": {"w": np.zeros((2, 2), np.float32), "b": np.zeros(2, np.float32)}}
        >>> out = out_of_fold_probabilities(mlp_apply, init, x, y, folds=4, epochs=5, batch_size=20)
        >>> out.probs.shape, out.best_epoch.shape
        ((100, 2), (4,))
    """
    check_callable(apply_fn, "apply_fn")
    training = FoldTraining(
        folds=check_int(folds, "folds", min_value=2),
        epochs=check_int(epochs, "epochs", min_value=1),
        batch_size=batch_size,  # checked by check_fold_sizes
        optimizer=optimizer,
        patience=None if patience is None else check_int(patience, "patience", min_value=1),
        standardize=check_bool(standardize, "standardize"),
        seed=check_int(seed, "seed", min_value=0, max_value=2**32 - 1),
    )
    x_arr, y_arr = check_rows(x, y)
    fold_of = _fold_assignment(fold_of, y_arr, training.folds, training.seed)
    check_fold_sizes(fold_of[None], training.folds, batch_size, training.patience is not None)
    return run_folds(apply_fn, init, x_arr, y_arr, fold_of[None], training)[0]


def _fold_assignment(
    fold_of: npt.ArrayLike | None, y: np.ndarray, folds: int, seed: int
) -> np.ndarray:
    """``fold_of`` checked (shape of ``y``, values in ``[0, folds)``) as int32, or, for
    ``None``, folds stratified by label from ``seed``."""
    if fold_of is None:
        return stratified_folds(y, folds, seed)
    fold_of = np.asarray(check_array(fold_of, "fold_of", ndim=1, dtype_kind="iu"), np.int32)
    if fold_of.shape != y.shape or fold_of.min() < 0 or fold_of.max() >= folds:
        raise ValueError(f"`fold_of` must have shape {y.shape} and values in [0, {folds})")
    return fold_of


def check_rows(x: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """``x`` as finite float32 ``(n, d)`` and ``y`` as int32 ``(n,)``, or an error naming them."""
    x_arr = np.asarray(check_array(x, "x", ndim=2, dtype_kind="fiu", non_empty=True))
    y_arr = np.asarray(check_array(y, "y", ndim=1, dtype_kind="iu", non_empty=True), np.int32)
    if y_arr.shape[0] != x_arr.shape[0]:
        raise ValueError(f"`y` has {y_arr.shape[0]} rows but `x` has {x_arr.shape[0]}")
    x32 = x_arr.astype(np.float32)
    if not np.all(np.isfinite(x32)):
        raise ValueError("`x` must be finite (in float32)")
    return x32, y_arr


def trained_rows(train: int, early_stopping: bool) -> int:
    """How many of a fold model's ``train`` rows it takes steps on (the rest validate it)."""
    return train - inner_validation_rows(train) if early_stopping else train


def check_fold_sizes(
    fold_of: np.ndarray,
    folds: int,
    batch_size: int,
    early_stopping: bool,
    names: tuple[str, str] = ("folds", "batch_size"),
) -> None:
    """Every fold model must train on at least ``batch_size`` rows and judge at least one.

    ``names`` are the two options as the caller's user spells them (`find_label_errors`:
    ``("Folds.n_splits", "Training.batch_size")``).
    """
    check_int(batch_size, names[1], min_value=1)
    for assign in fold_of:
        sizes = np.bincount(assign, minlength=folds)
        if sizes.min() < 1:
            raise ValueError(
                f"every fold needs at least one row: {len(assign)} rows for `{names[0]}`={folds}"
            )
        train = trained_rows(len(assign) - int(sizes.max()), early_stopping)
        if batch_size > train:
            raise ValueError(
                f"`{names[1]}` {batch_size} is larger than the {train} rows a fold model trains "
                "on"
                + (
                    " (its other training rows validate it: early stopping)"
                    if early_stopping
                    else ""
                )
            )


@functools.cache
def _default_optimizer() -> Any:
    # Cached: the optimizer is a static argument, so one object means one compiled program.
    return optax.adamw(1e-2, weight_decay=1e-4)


@dataclasses.dataclass(frozen=True)
class mlp_init:
    """``init(key)`` of `jaxwise.models.init_mlp` with layer ``sizes`` (equal for equal sizes,
    so a rerun reuses the compiled program)."""

    sizes: tuple[int, ...]

    def __call__(self, key: jax.Array) -> Any:
        return init_mlp(key, self.sizes)
