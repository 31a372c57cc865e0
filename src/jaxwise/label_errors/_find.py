"""``find_label_errors``: rows ranked by how likely their label is wrong, by either method."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any, Literal

import jax
import numpy as np
import optax

from jaxwise._checks import check_array, check_bool, check_callable, check_choice, check_int
from jaxwise._params import check_params
from jaxwise.label_errors._confident import RANKINGS, LabelIssues, Ranking, confident_learning
from jaxwise.label_errors._gradnorm import gradnorm_issues
from jaxwise.label_errors._limits import (
    check_folds_per_class,
    check_memory,
    max_classes,
    warn_skipped_classes,
)
from jaxwise.label_errors._oof import (
    FoldTraining,
    check_fold_sizes,
    check_rows,
    mlp_init,
    padded_rows,
    run_folds,
    stratified_folds,
    trained_rows,
)
from jaxwise.models import mlp_apply

__all__ = ["find_label_errors"]

METHODS = ("oof", "gradnorm")


def find_label_errors(
    x: Any,
    y: Any,
    *,
    method: Literal["oof", "gradnorm"] = "oof",
    num_classes: int | None = None,
    ranked_by: Ranking = "self_confidence",
    standardize: bool = True,
    hidden: tuple[int, ...] = (64,),
    apply_fn: Callable[[Any, jax.Array], jax.Array] | None = None,
    init: Any = None,
    params: Any = None,
    folds: int = 5,
    repeats: int | None = None,
    epochs: int | None = None,
    batch_size: int | None = None,
    optimizer: optax.GradientTransformation | None = None,
    patience: int | None = 5,
    seed: int = 0,
) -> LabelIssues:
    """Rank rows of ``(x, y)`` by how likely their label is wrong.

    ``method="oof"`` (default): out-of-fold probabilities, one ranking score, and confident
    learning's estimate of how many labels are wrong. Every fold model of every repeated
    split trains at once in ONE compiled program (through `jaxwise.train`'s update path,
    vmapped over models), so each row is judged by models that never saw it (early stopping
    watches an inner validation split of each fold's training rows, never the held-out
    labels); the rows are
    ranked by ``ranked_by`` alone (self-confidence ``p(given)`` by default) and
    ``num_issues`` suggests where to cut (``issues.top(issues.num_issues)``). By default a
    ReLU MLP ``d → hidden → num_classes`` (`jaxwise.models`) is trained per fold; pass
    ``apply_fn`` and ``init`` to use any model — e.g. a Flax or Equinox model through
    `jaxwise.models.from_nnx`/`from_linen`/`from_equinox`:
    ``apply_fn=lambda p, xb: model.apply(p, model.model_state, xb)[0], init=model.params``.

    Rows are padded up to a size ladder (at most ~19 % more) and every size-dependent
    default comes from the padded size, so a dataset of a nearby size (same features and
    classes) reuses the compiled program. Across processes, JAX's persistent compilation
    cache loads it instead of compiling: set it once before the first call,

    ``jax.config.update("jax_compilation_cache_dir", "/path/to/cache")`` and
    ``jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)``

    (the CLI does this for you; see `jaxwise.jobs.persistent_cache`).

    ``method="gradnorm"``: the per-example gradient norm of the cross-entropy of a model
    already trained on every row (``params``, with ``apply_fn``; default the jaxwise MLP):
    a mislabeled row keeps a large gradient. Cheaper (no training here) but the model has
    seen every row. ``score`` is minus the gradient norm; confident learning flags nothing
    (``num_issues`` 0). For any other loss use
    [`hardest_examples`][jaxwise.label_errors.hardest_examples].

    Args:
        x: ``(n, d)`` features, finite in float32.
        y: ``(n,)`` given integer labels.
        method: ``"oof"`` or ``"gradnorm"``.
        num_classes: number of classes (default ``max(y) + 1``, with one ``UserWarning``
            when some class below it has no row: ``{0, 2, 5}`` is 6 classes).
        ranked_by: the one score of the whole ranking (``"oof"``): ``"self_confidence"``
            (default, measured best on the benchmark), ``"normalized_margin"`` or
            ``"confidence_weighted_entropy"``; see
            [`label_quality`][jaxwise.label_errors.label_quality].
        standardize: each fold model standardises the features with the mean and standard
            deviation of its own training rows — never of the rows it judges (``"oof"``).
            ``False`` for features already on one scale (raw features of different units can
            ruin the ranking).
        hidden: hidden widths of the default MLP (``"oof"``).
        apply_fn: ``apply_fn(params, x) -> logits`` for a batch ``x`` ``(b, d)``; a
            module-level function or a stable object (a static argument of the program).
            Default: `jaxwise.models.mlp_apply`.
        init: with ``"oof"``: the initial parameters of ``apply_fn`` (copied to every fold) or
            ``init(key) -> params``; see
            [`out_of_fold_probabilities`][jaxwise.label_errors.out_of_fold_probabilities].
        params: with ``"gradnorm"``: the trained parameters of ``apply_fn`` (required).
        folds: number of folds (``"oof"``).
        repeats: independent fold splits (seeds ``seed, seed + 1, …``) whose out-of-fold
            probabilities are averaged, all trained in the same program. Default by size: 4 up
            to 2,048 padded rows, 2 up to 8,192, then 1.
        epochs: maximum epochs per fold. Default by size: about 3,000 steps, 30 to 60 epochs.
        batch_size: rows per step of each fold model. Default by size: about ten steps per
            epoch, 16 to 128 rows.
        optimizer: an Optax transformation (default ``adamw(1e-2, weight_decay=1e-4)``); a
            static argument: pass the same object again to reuse the program.
        patience: each fold stops after ``patience`` epochs without a lower loss on its inner
            validation split — one in 6 of its *training* rows, stratified by label, drawn
            from ``seed``, not trained on — and keeps its best epoch; the labels it judges
            never choose its epoch. ``None``: every fold trains on all its training rows for
            ``epochs`` and keeps its last.
        seed: fold assignment, shuffling and initialisation.

    Returns:
        [`LabelIssues`][jaxwise.label_errors.LabelIssues] over all rows, most suspicious first
            (with ``"oof"``, the out-of-fold runs attached: one per repeat).

    Raises:
        TypeError: an argument of the wrong type; ``params`` with ``"oof"``, or ``init`` (or
            no ``params``) with ``"gradnorm"``; ``apply_fn`` without ``init`` with ``"oof"``.
        ValueError: labels outside ``[0, num_classes)``; a ``num_classes`` far beyond the
            labels (more than ``max(2 * (max(y) + 1), max(y) + 1 + 64)``) or needing more
            than 4 GiB (the probabilities, and the default MLP's last layer); ``folds`` above
            the rows of the smallest class; non-finite features, a fold too small for
            ``batch_size``, or a bad option value.

    Examples:
        >>> import numpy as np
        >>> from jaxwise.data import make_blobs, flip_labels
        >>> x, y = make_blobs(300, n_classes=3, seed=0)
        >>> noisy, flipped = flip_labels(y, 15, 3, seed=1)
        >>> found = find_label_errors(x, noisy, seed=0)
        >>> float(np.isin(found.top(15), flipped).mean()) >= 0.8
        True
    """
    check_choice(method, "method", METHODS)
    x_arr, y_arr, k = _labels_and_classes(x, y, num_classes)
    check_choice(ranked_by, "ranked_by", RANKINGS)
    standardize = check_bool(standardize, "standardize")
    if method == "gradnorm":
        return _gradnorm(x_arr, y_arr, k, apply_fn, init, params)
    apply_fn, init, width = _oof_model(x_arr, k, hidden, apply_fn, init, params)
    folds = check_int(folds, "folds", min_value=2)
    x32, y32 = check_rows(x_arr, y_arr)
    plan = _plan(int(x32.shape[0]), folds, repeats, epochs, batch_size, patience, seed)
    check_memory(int(x32.shape[0]), k, width, plan.repeats, plan.repeats * folds)
    check_folds_per_class(y32, folds)
    fold_of = np.stack([stratified_folds(y32, folds, seed + r) for r in range(plan.repeats)])
    check_fold_sizes(fold_of, folds, plan.batch_size, plan.patience is not None)
    training = FoldTraining(
        folds, plan.epochs, plan.batch_size, optimizer, plan.patience, plan.seed, standardize
    )
    runs = run_folds(apply_fn, init, x32, y32, fold_of, training)
    probs = np.mean([run.probs for run in runs], axis=0)
    if probs.shape[1] != k:
        raise ValueError(f"the model predicts {probs.shape[1]} classes but `num_classes` is {k}")
    issues = confident_learning(probs, y_arr, ranked_by=ranked_by)
    return dataclasses.replace(issues, oof=runs)


def _labels_and_classes(
    x: Any, y: Any, num_classes: int | None
) -> tuple[np.ndarray, np.ndarray, int]:
    """``x``, ``y`` checked and the class count: ``max(y) + 1`` (a warning when the labels skip
    classes) or ``num_classes``, refused when far beyond the labels."""
    y_arr = np.asarray(check_array(y, "y", ndim=1, dtype_kind="iu", non_empty=True))
    x_arr = np.asarray(check_array(x, "x", ndim=2, dtype_kind="fiu", non_empty=True))
    if y_arr.shape[0] != x_arr.shape[0]:
        raise ValueError(f"`y` has {y_arr.shape[0]} rows but `x` has {x_arr.shape[0]}")
    if y_arr.min() < 0:
        raise ValueError(f"`y` must be in [0, num_classes), got values in [{y_arr.min()}, …]")
    seen = int(y_arr.max()) + 1
    if num_classes is None:
        warn_skipped_classes(y_arr, seen)
        return x_arr, y_arr, seen
    k = check_int(num_classes, "num_classes", min_value=2)
    if seen > k:
        raise ValueError(f"`y` must be in [0, {k}), got values in [{y_arr.min()}, {seen - 1}]")
    if k > max_classes(seen):
        raise ValueError(
            f"`num_classes`={k:,} is far beyond the labels (largest {seen - 1}): at most "
            f"{max_classes(seen):,} for these labels; classes no row has cannot be judged"
        )
    return x_arr, y_arr, k


def _oof_model(
    x: np.ndarray,
    k: int,
    hidden: tuple[int, ...],
    apply_fn: Callable[[Any, jax.Array], jax.Array] | None,
    init: Any,
    params: Any,
) -> tuple[Callable[[Any, jax.Array], jax.Array], Any, int | None]:
    """The fold model ``(apply_fn, init, width of its last hidden layer or None)``."""
    if params is not None:
        raise TypeError(
            "`params` is for method='gradnorm' (a trained model); method='oof' trains its own "
            "fold models from `init`"
        )
    if (apply_fn is None) != (init is None):
        raise TypeError("pass both `apply_fn` and `init` for a custom model, or neither")
    if apply_fn is not None:
        return check_callable(apply_fn, "apply_fn"), init, None
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Iterable):
        raise TypeError(f"`hidden` must be a sequence of layer widths, got {hidden!r}")
    sizes = (int(x.shape[1]), *(check_int(h, "hidden", min_value=1) for h in hidden), k)
    return mlp_apply, mlp_init(sizes), sizes[-2]


@dataclasses.dataclass(frozen=True)
class _Plan:
    """The checked training options of one call (defaults filled from ``default_settings``)."""

    repeats: int
    epochs: int
    batch_size: int
    patience: int | None
    seed: int


def _plan(
    n: int,
    folds: int,
    repeats: int | None,
    epochs: int | None,
    batch_size: int | None,
    patience: int | None,
    seed: int,
) -> _Plan:
    auto = default_settings(n, folds)
    repeats = auto.repeats if repeats is None else check_int(repeats, "repeats", min_value=1)
    return _Plan(
        repeats=repeats,
        epochs=auto.epochs if epochs is None else check_int(epochs, "epochs", min_value=1),
        batch_size=(
            auto.batch_size
            if batch_size is None
            else check_int(batch_size, "batch_size", min_value=1)
        ),
        patience=None if patience is None else check_int(patience, "patience", min_value=1),
        seed=check_int(seed, "seed", min_value=0, max_value=2**32 - 1 - repeats),
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    """The size-dependent defaults of ``find_label_errors`` (from the padded row count)."""

    repeats: int
    epochs: int
    batch_size: int


def default_settings(n: int, folds: int) -> Settings:
    """Defaults for ``n`` rows, from the padded size only (nearby sizes share one program).

    About ten steps per epoch on small tables and batches of at most 128 rows (larger ones
    were measured no faster per epoch on CPU, and slower to converge); at least 30 epochs
    and about 3,000 steps per fold, at most 60 (early stopping ends most folds sooner);
    repeated fold splits where they are cheap: 4 up to 2,048 padded rows, 2 up to 8,192,
    then 1 (averaging them was measured to help most on small tables).
    """
    n_pad = padded_rows(n)
    train = n_pad * (folds - 1) // folds
    batch = int(min(128, max(16, 2 ** round(math.log2(max(train / 10, 1))))))
    smallest = trained_rows((n * (folds - 1)) // folds - 1, early_stopping=True)
    batch = min(batch, max(1, smallest), max(1, train // 2))
    steps = max(1, trained_rows(train, early_stopping=True) // batch)
    epochs = int(min(60, max(30, math.ceil(3000 / steps))))
    repeats = 4 if n_pad <= 2048 else 2 if n_pad <= 8192 else 1
    return Settings(repeats, epochs, batch)


def _gradnorm(
    x: Any,
    y: np.ndarray,
    k: int,
    apply_fn: Callable[[Any, jax.Array], jax.Array] | None,
    init: Any,
    params: Any,
) -> LabelIssues:
    if init is not None:
        raise TypeError(
            "`init` is for method='oof'; method='gradnorm' ranks by a trained model: pass its "
            "`params`"
        )
    if params is None:
        raise TypeError(
            "method='gradnorm' ranks rows by the gradient norm of a model trained on them: "
            "pass its trained `params` (and `apply_fn` unless it is the jaxwise MLP)"
        )
    check_params(params)
    apply_fn = mlp_apply if apply_fn is None else check_callable(apply_fn, "apply_fn")
    issues = gradnorm_issues(apply_fn, params, x, y)
    if issues.pred_probs.shape[1] != k:
        raise ValueError(
            f"the model predicts {issues.pred_probs.shape[1]} classes but `num_classes` is {k}"
        )
    return issues
