"""``find_label_errors``: rows ranked by how likely their label is wrong, by either method."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import numpy.typing as npt

from jaxwise._shared._checks import check_array, check_int
from jaxwise.label_errors._confident import LabelIssues, confident_learning
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
from jaxwise.label_errors._options import MLP, Classifier, Folds, Scoring, Training
from jaxwise.models import mlp_apply

__all__ = ["find_label_errors"]


def find_label_errors(
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    model: MLP | Classifier = MLP(),
    folds: Folds = Folds(),
    training: Training = Training(),
    scoring: Scoring = Scoring(),
    num_classes: int | None = None,
    seed: int = 0,
) -> LabelIssues:
    """Rank rows of ``(x, y)`` by how likely their label is wrong.

    Method ``"oof"`` (default): every fold model of every repeated split trains at once in
    ONE compiled program (`jaxwise.train`'s update path, vmapped over models), so each row is
    judged by models that never saw it (early stopping watches an inner split of each fold's
    training rows, never the held-out labels); the rows are ranked by one score and
    ``num_issues`` suggests where to cut (``issues.top(issues.num_issues)``). Rows are padded
    up to a size ladder (at most ~19 % more) and the size-dependent defaults come from the
    padded size, so a dataset of a nearby size reuses the program; across processes JAX's
    persistent compilation cache loads it (set ``jax_compilation_cache_dir`` and
    ``jax_persistent_cache_min_compile_time_secs=0`` first, as the CLI does). Method
    ``"gradnorm"``: minus the per-example gradient norm of a model trained on every row;
    for any other loss use [`hardest_examples`][jaxwise.label_errors.hardest_examples].

    Args:
        x: ``(n, d)`` features, finite in float32.
        y: ``(n,)`` given integer labels.
        model: the model: [`MLP`][jaxwise.label_errors.MLP] (default ``MLP(hidden=(64,))``)
            or any model as a [`Classifier`][jaxwise.label_errors.Classifier].
        folds: the cross-validation ([`Folds`][jaxwise.label_errors.Folds], default 5 folds).
        training: how each fold model trains ([`Training`][jaxwise.label_errors.Training]).
        scoring: the method and the ranking score ([`Scoring`][jaxwise.label_errors.Scoring]).
        num_classes: number of classes (default ``max(y) + 1``, with one ``UserWarning``
            when some class below it has no row: ``{0, 2, 5}`` is 6 classes).
        seed: fold assignment (repeat ``r`` from ``seed + r``), shuffling, initialisation.

    Returns:
        [`LabelIssues`][jaxwise.label_errors.LabelIssues] over all rows, most suspicious first
            (with ``"oof"``, the out-of-fold runs attached: one per repeat).

    Raises:
        TypeError: an option of the wrong type; a ``model`` with ``params`` for ``"oof"``, or
            without them (or with ``init``) for ``"gradnorm"``; a ``seed`` or
            ``num_classes`` not an int.
        ValueError: labels outside ``[0, num_classes)``; a ``num_classes`` far beyond the
            labels (more than ``max(2 * (max(y) + 1), max(y) + 1 + 64)``) or needing more
            than 4 GiB; ``n_splits`` above the rows of the smallest class; non-finite
            features; a fold too small for ``batch_size``; a negative ``seed``.

    Examples:
        >>> import numpy as np
        >>> from jaxwise.data import make_blobs, flip_labels
        >>> x, y = make_blobs(300, n_classes=3, seed=0)
        >>> noisy, flipped = flip_labels(y, 15, 3, seed=1)
        >>> found = find_label_errors(x, noisy, model=MLP(hidden=(64,)), folds=Folds(5))
        >>> float(np.isin(found.top(15), flipped).mean()) >= 0.8
        True
    """
    _check_types(model, folds, training, scoring)
    x_arr, y_arr, k = _labels_and_classes(x, y, num_classes)
    if scoring.method == "gradnorm":
        return _gradnorm(x_arr, y_arr, k, model)
    apply_fn, init, width = _oof_model(x_arr, k, model)
    x32, y32 = check_rows(x_arr, y_arr)
    repeats, fit = _plan(int(x32.shape[0]), model, folds, training, seed)
    check_memory(int(x32.shape[0]), k, width, repeats, repeats * fit.folds)
    check_folds_per_class(y32, fit.folds)
    fold_of = np.stack([stratified_folds(y32, fit.folds, fit.seed + r) for r in range(repeats)])
    names = ("Folds.n_splits", "Training.batch_size")
    check_fold_sizes(fold_of, fit.folds, fit.batch_size, fit.patience is not None, names)
    runs = run_folds(apply_fn, init, x32, y32, fold_of, fit)
    probs = np.mean([run.probs for run in runs], axis=0)
    if probs.shape[1] != k:
        raise ValueError(f"the model predicts {probs.shape[1]} classes but `num_classes` is {k}")
    issues = confident_learning(probs, y_arr, ranked_by=scoring.ranked_by)
    return dataclasses.replace(issues, oof=runs)


def _check_types(model: Any, folds: Any, training: Any, scoring: Any) -> None:
    """``TypeError`` for an option that is not its option object (e.g. ``folds=5``)."""
    expected = (
        ("model", model, (MLP, Classifier), "an MLP or a Classifier (e.g. MLP(hidden=(64,)))"),
        ("folds", folds, Folds, "a Folds (e.g. Folds(5))"),
        ("training", training, Training, "a Training (e.g. Training(epochs=30))"),
        ("scoring", scoring, Scoring, "a Scoring (e.g. Scoring(ranked_by='self_confidence'))"),
    )
    for name, value, kind, what in expected:
        if not isinstance(value, kind):
            raise TypeError(f"`{name}` must be {what}, got {type(value).__name__} {value!r:.60}")


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
    x: np.ndarray, k: int, model: MLP | Classifier
) -> tuple[Callable[[Any, jax.Array], jax.Array], Any, int | None]:
    """The fold model ``(apply_fn, init, width of its last hidden layer or None)``."""
    if model.params is not None:
        raise TypeError(
            f"`{type(model).__name__}.params` is for method='gradnorm' (a trained model); "
            "method='oof' trains its own fold models"
            + (" from `Classifier.init`" if isinstance(model, Classifier) else "")
        )
    if isinstance(model, Classifier):
        return model.apply_fn, model.init, None
    sizes = (int(x.shape[1]), *model.hidden, k)
    return mlp_apply, mlp_init(sizes), sizes[-2]


def _plan(
    n: int, model: MLP | Classifier, folds: Folds, training: Training, seed: int
) -> tuple[int, FoldTraining]:
    """``(repeats, the fold models' training)``: ``None`` options filled from
    ``default_settings``, ``seed`` checked."""
    auto = default_settings(n, folds.n_splits)
    repeats = auto.repeats if folds.n_repeats is None else folds.n_repeats
    return repeats, FoldTraining(
        folds=folds.n_splits,
        epochs=auto.epochs if training.epochs is None else training.epochs,
        batch_size=auto.batch_size if training.batch_size is None else training.batch_size,
        optimizer=training.optimizer,
        patience=training.patience,
        seed=check_int(seed, "seed", min_value=0, max_value=2**32 - 1 - repeats),
        standardize=model.standardize,
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


def _gradnorm(x: Any, y: np.ndarray, k: int, model: MLP | Classifier) -> LabelIssues:
    if isinstance(model, Classifier) and model.init is not None:
        raise TypeError(
            "`Classifier.init` is for method='oof'; method='gradnorm' ranks by a trained model: "
            "pass `Classifier(apply_fn, params=...)`"
        )
    if model.params is None:
        raise TypeError(
            "method='gradnorm' ranks rows by the gradient norm of a model trained on them: "
            "the model has no `params` (pass `MLP(params=...)` or `Classifier(apply_fn, "
            "params=...)`)"
        )
    apply_fn = model.apply_fn if isinstance(model, Classifier) else mlp_apply
    issues = gradnorm_issues(apply_fn, model.params, x, y)
    if issues.pred_probs.shape[1] != k:
        raise ValueError(
            f"the model predicts {issues.pred_probs.shape[1]} classes but `num_classes` is {k}"
        )
    return issues
