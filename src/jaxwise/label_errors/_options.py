"""The options of ``find_label_errors``, grouped by what they configure.

A fold model (`MLP`, or any model as a `Classifier`), the cross-validation (`Folds`), the
training of every fold model (`Training`) and the score the rows are ranked by (`Scoring`).
Each is a small frozen dataclass that checks its fields when it is built (a ``TypeError`` or
``ValueError`` naming the field), and whose defaults are ``find_label_errors``' defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, Literal

import jax
import optax

from jaxwise._shared._checks import check_bool, check_callable, check_choice, check_int
from jaxwise._shared._params import check_params
from jaxwise.label_errors._confident import RANKINGS, Ranking

__all__ = ["MLP", "Classifier", "Folds", "Scoring", "Training"]

METHODS = ("oof", "gradnorm")


@dataclasses.dataclass(frozen=True, eq=False)
class MLP:
    """jaxwise's ReLU MLP ``d → hidden → num_classes`` as the model (the default).

    With method ``"oof"`` every fold model is a fresh MLP of these widths
    (`jaxwise.models.init_mlp`, initialised per fold from the call's ``seed``). With method
    ``"gradnorm"`` pass the trained ``params`` of a `jaxwise.models.init_mlp` model instead
    (its widths come from them; ``hidden`` is not used).

    Args:
        hidden: hidden layer widths, each ``>= 1`` (``()``: a linear model).
        standardize: each fold model standardises the features with the mean and standard
            deviation of its own training rows, never of the rows it judges (``"oof"``).
            ``False`` for features already on one scale (raw features of different units can
            ruin the ranking).
        params: the trained parameters (a pytree of float arrays, ``dense_i/{w, b}``) for
            method ``"gradnorm"``; ``None`` (default) for ``"oof"``, which trains its own.

    Raises:
        TypeError: ``hidden`` not a sequence of ints, ``standardize`` not a bool, or
            ``params`` not a pytree of float arrays.
        ValueError: a width below 1, or ``params`` without array leaves.

    Examples:
        >>> MLP(hidden=[32, 16]).hidden
        (32, 16)
        >>> MLP(hidden=(0,))
        Traceback (most recent call last):
        ...
        ValueError: `MLP.hidden` must be >= 1, got 0
    """

    hidden: tuple[int, ...] = (64,)
    standardize: bool = True
    params: Any = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        hidden = self.hidden
        if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Iterable):
            raise TypeError(f"`MLP.hidden` must be a sequence of layer widths, got {hidden!r}")
        widths = tuple(check_int(h, "MLP.hidden", min_value=1) for h in hidden)
        object.__setattr__(self, "hidden", widths)
        object.__setattr__(self, "standardize", check_bool(self.standardize, "MLP.standardize"))
        if self.params is not None:
            check_params(self.params, "MLP.params")


@dataclasses.dataclass(frozen=True, eq=False)
class Classifier:
    """Any model as ``apply_fn(params, x) -> logits``, to train (``init``) or trained (``params``).

    With method ``"oof"`` give ``init``: the initial parameters (copied to every fold model)
    or ``init(key) -> params`` (each fold its own). With method ``"gradnorm"`` give the
    trained ``params``. A Flax or Equinox model goes through `jaxwise.models.from_nnx` /
    `from_linen` / `from_equinox`:
    ``Classifier(lambda p, xb: m.apply(p, m.model_state, xb)[0], init=m.params)``.

    Args:
        apply_fn: ``apply_fn(params, x) -> logits`` ``(b, num_classes)`` for a batch ``x``
            ``(b, d)``; a module-level function or a stable object (a static argument of the
            compiled program: the same object reuses it).
        init: the initial parameters (a pytree of float arrays) or ``init(key) -> params``;
            for method ``"oof"``.
        params: the trained parameters (a pytree of float arrays); for method ``"gradnorm"``.
        standardize: each fold model standardises the features with the mean and standard
            deviation of its own training rows (``"oof"``); ``False`` for features already on
            one scale.

    Raises:
        TypeError: ``apply_fn`` not callable; both or neither of ``init`` and ``params``;
            ``init``/``params`` not a pytree of float arrays; ``standardize`` not a bool.
        ValueError: ``init``/``params`` without array leaves.

    Examples:
        >>> import numpy as np
        >>> from jaxwise.models import mlp_apply
        >>> w = {"dense_0": {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}}
        >>> Classifier(mlp_apply, init=w).standardize
        True
        >>> Classifier(mlp_apply)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: `Classifier` needs `init` (a model to train, method 'oof') or `params` ...
    """

    apply_fn: Callable[[Any, jax.Array], jax.Array]
    init: Any = dataclasses.field(default=None, repr=False)
    params: Any = dataclasses.field(default=None, repr=False)
    standardize: bool = True

    def __post_init__(self) -> None:
        check_callable(self.apply_fn, "Classifier.apply_fn")
        if (self.init is None) == (self.params is None):
            raise TypeError(
                "`Classifier` needs `init` (a model to train, method 'oof') or `params` (a "
                "trained model, method 'gradnorm')"
                + (", not both" if self.init is not None else "")
            )
        if self.init is not None and not callable(self.init):
            check_params(self.init, "Classifier.init")
        if self.params is not None:
            check_params(self.params, "Classifier.params")
        standardize = check_bool(self.standardize, "Classifier.standardize")
        object.__setattr__(self, "standardize", standardize)


FoldModel = MLP | Classifier


@dataclasses.dataclass(frozen=True)
class Folds:
    """The cross-validation: ``n_splits`` stratified folds, ``n_repeats`` independent splits.

    The names are scikit-learn's (``RepeatedStratifiedKFold(n_splits=, n_repeats=)``). Each
    split is stratified by label and drawn from the call's ``seed`` (repeat ``r`` from
    ``seed + r``); the out-of-fold probabilities of the repeats are averaged, and every fold
    model of every repeat trains in the same compiled program.

    Args:
        n_splits: number of folds, ``>= 2`` (at most the rows of the smallest class).
        n_repeats: independent fold splits, ``>= 1``. ``None`` (default): by size, 4 up to
            2,048 padded rows, 2 up to 8,192, then 1.

    Raises:
        TypeError: a field that is not an int (or ``None`` for ``n_repeats``).
        ValueError: ``n_splits`` below 2 or ``n_repeats`` below 1.

    Examples:
        >>> Folds(10, n_repeats=2)
        Folds(n_splits=10, n_repeats=2)
        >>> Folds(1)
        Traceback (most recent call last):
        ...
        ValueError: `Folds.n_splits` must be >= 2, got 1
    """

    n_splits: int = 5
    n_repeats: int | None = None

    def __post_init__(self) -> None:
        n_splits = check_int(self.n_splits, "Folds.n_splits", min_value=2)
        object.__setattr__(self, "n_splits", n_splits)
        if self.n_repeats is not None:
            repeats = check_int(self.n_repeats, "Folds.n_repeats", min_value=1)
            object.__setattr__(self, "n_repeats", repeats)


@dataclasses.dataclass(frozen=True)
class Training:
    """How every fold model trains (method ``"oof"``); ``None`` fields default by size.

    The size-dependent defaults come from the padded row count, so a dataset of a nearby size
    (same features and classes) reuses the compiled program.

    Args:
        epochs: maximum epochs per fold model, ``>= 1``. ``None``: about 3,000 steps, 30 to
            60 epochs.
        batch_size: rows per step of each fold model, ``>= 1`` (at most the rows it trains
            on). ``None``: about ten steps per epoch, 16 to 128 rows.
        optimizer: an Optax ``GradientTransformation`` (default ``None``:
            ``adamw(1e-2, weight_decay=1e-4)``); a static argument of the program, so pass
            the same object again to reuse it.
        patience: each fold model stops after ``patience`` epochs (``>= 1``) without a lower
            loss on its inner validation split — one in 6 of its *training* rows, stratified
            by label, drawn from the call's ``seed``, not trained on — and keeps its best
            epoch; the labels it judges never choose its epoch. ``None``: every fold model
            trains on all its training rows for ``epochs`` and keeps its last.

    Raises:
        TypeError: an int field that is not an int (nor ``None``), or an ``optimizer``
            without ``init`` and ``update``.
        ValueError: ``epochs``, ``batch_size`` or ``patience`` below 1.

    Examples:
        >>> import optax
        >>> Training(epochs=20, optimizer=optax.sgd(0.1)).patience
        5
        >>> Training(patience=0)
        Traceback (most recent call last):
        ...
        ValueError: `Training.patience` must be >= 1, got 0
    """

    epochs: int | None = None
    batch_size: int | None = None
    optimizer: optax.GradientTransformation | None = None
    patience: int | None = 5

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "patience"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, check_int(value, f"Training.{name}", min_value=1))
        opt = self.optimizer
        if opt is not None and not (
            callable(getattr(opt, "init", None)) and callable(getattr(opt, "update", None))
        ):
            raise TypeError(
                "`Training.optimizer` must be an Optax GradientTransformation (with `init` and "
                f"`update`), got {type(opt).__name__}"
            )


@dataclasses.dataclass(frozen=True)
class Scoring:
    """How the rows are scored and ranked.

    Args:
        method: ``"oof"`` (default): out-of-fold probabilities of fold models that never saw
            the row, ranked by ``ranked_by``, with confident learning's estimate of how many
            labels are wrong. ``"gradnorm"``: the per-example gradient norm of the
            cross-entropy of a model already trained on every row (the model's ``params``);
            cheaper, but the model has seen every row, and nothing is flagged.
        ranked_by: the one score of the whole ranking (``"oof"``): ``"self_confidence"``
            (default, measured best on the benchmark), ``"normalized_margin"`` or
            ``"confidence_weighted_entropy"``; see
            [`label_quality`][jaxwise.label_errors.label_quality].

    Raises:
        ValueError: a ``method`` or ``ranked_by`` not among those listed.

    Examples:
        >>> Scoring(ranked_by="normalized_margin")
        Scoring(method='oof', ranked_by='normalized_margin')
        >>> Scoring(method="cleanlab")
        Traceback (most recent call last):
        ...
        ValueError: `Scoring.method` must be one of 'oof', 'gradnorm', got 'cleanlab'
    """

    method: Literal["oof", "gradnorm"] = "oof"
    ranked_by: Ranking = "self_confidence"

    def __post_init__(self) -> None:
        check_choice(self.method, "Scoring.method", METHODS)
        check_choice(self.ranked_by, "Scoring.ranked_by", RANKINGS)
