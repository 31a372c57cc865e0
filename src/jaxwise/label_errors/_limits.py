"""Bounds on what ``find_label_errors`` is asked to do, checked before anything is trained."""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["MEMORY_LIMIT", "check_folds_per_class", "check_memory", "max_classes"]
__all__ += ["warn_skipped_classes"]

MEMORY_LIMIT = 4 * 2**30  # bytes a call may plan to hold for its probabilities and models
_SLACK = 64  # classes beyond the largest label that a `num_classes` may add in any case


def max_classes(seen: int) -> int:
    """The largest ``num_classes`` accepted for labels in ``[0, seen)``: twice as many, or 64
    more, whichever is larger (classes with no row can never be judged)."""
    return max(2 * seen, seen + _SLACK)


def warn_skipped_classes(labels: np.ndarray, seen: int) -> None:
    """One warning when some class in ``[0, seen)`` has no row (``{0, 2, 5}`` → 6 classes)."""
    missing = np.flatnonzero(np.bincount(labels, minlength=seen) == 0)
    if missing.size:
        shown = ", ".join(str(int(c)) for c in missing[:8]) + (", …" if missing.size > 8 else "")
        warnings.warn(
            f"the labels skip {missing.size} of the classes 0..{seen - 1} (no row has {shown}): "
            f"they are treated as {seen} classes; relabel them to 0..{seen - missing.size - 1} "
            "or pass `num_classes` to say this is intended",
            UserWarning,
            stacklevel=3,
        )


def check_folds_per_class(labels: np.ndarray, folds: int, name: str = "Folds.n_splits") -> None:
    """``folds`` must not exceed the rows of the smallest class (present in ``labels``).

    ``name`` is the option as the caller's user spells it (`find_label_errors`'s
    ``Folds(n_splits)``).
    """
    counts = np.bincount(labels)
    present = np.flatnonzero(counts)
    smallest = int(present[np.argmin(counts[present])])
    if folds > counts[smallest]:
        raise ValueError(
            f"`{name}`={folds} is more than the {counts[smallest]} row(s) of class {smallest}: "
            f"a stratified split would leave some folds without that class; pass `{name}` at "
            f"most {counts[smallest]} (and at least 2), or gather more rows of that class"
        )


def check_memory(n: int, classes: int, width: int | None, repeats: int, models: int) -> None:
    """Refuse a call whose out-of-fold probabilities (``repeats × n × classes`` float64) and,
    for the default MLP, last-layer parameters with their gradient and Adam states (5 float32
    copies per model) would exceed `MEMORY_LIMIT`."""
    need = 8 * repeats * n * classes + (0 if width is None else 20 * models * (width + 1) * classes)
    if need > MEMORY_LIMIT:
        raise ValueError(
            f"`num_classes`={classes:,} with {n:,} rows and {models} fold models needs about "
            f"{need / 2**30:,.1f} GiB (limit {MEMORY_LIMIT / 2**30:.0f} GiB): pass fewer classes "
            "(the labels' own count), fewer repeats (`Folds.n_repeats`), or fewer rows"
        )
