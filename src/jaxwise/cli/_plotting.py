"""PNG plots for the CLI jobs (matplotlib's Agg canvas; never touches pyplot's global state).

Every function writes its PNG atomically (a temporary file renamed into
place), so an interrupted run never leaves a half-written image over a good one.

Examples:
    >>> import tempfile, pathlib, numpy as np
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "cm.png"
    >>> _ = plot_confusion(out, np.asarray([[5, 1], [0, 4]]), ("a", "b"))
    >>> out.read_bytes()[:4] == b"\\x89PNG"
    True
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxwise._shared._atomic import atomic_write
from jaxwise._shared._extras import require

__all__ = [
    "confusion_focus",
    "plot_confusion",
    "plot_curves",
    "plot_decision_boundary",
    "plot_training",
]

MAX_CONFUSION_CLASSES = 20

_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


_FEATURE = "jaxwise's plots (or --no-plots)"


def _figure(width: float, height: float) -> Any:
    agg = require("matplotlib.backends.backend_agg", extra="cli", feature=_FEATURE)
    figure = require("matplotlib.figure", extra="cli", feature=_FEATURE)
    fig = figure.Figure(figsize=(width, height), dpi=110)
    agg.FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: str | os.PathLike[str]) -> Path:
    """Write the PNG atomically; on failure no temporary file is left (a full disk: ENOSPC
    naming ``path``) and an earlier plot at ``path`` is untouched."""
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))


def plot_training(
    path: str | os.PathLike[str],
    step_losses: np.ndarray,
    steps_per_epoch: int,
    learning_rates: np.ndarray,
    title: str = "training loss",
) -> Path:
    """Loss per step and per-epoch mean (log scale), with the learning-rate schedule beneath."""
    losses = np.asarray(step_losses, np.float64)
    steps = np.arange(1, len(losses) + 1)
    fig = _figure(7.5, 5.5)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    positive = np.where(losses > 0, losses, np.nan)
    top.semilogy(steps, positive, lw=0.6, alpha=0.45, color=_COLOURS[0], label="per step")
    n_epochs = len(losses) // max(steps_per_epoch, 1)
    if n_epochs:
        epoch_means = (
            losses[: n_epochs * steps_per_epoch].reshape(n_epochs, steps_per_epoch).mean(1)
        )
        top.semilogy(
            (np.arange(n_epochs) + 1) * steps_per_epoch,
            epoch_means,
            lw=2,
            color=_COLOURS[1],
            label="epoch mean",
        )
    top.set(ylabel="cross-entropy (log)", title=title)
    top.legend(loc="upper right")
    top.grid(alpha=0.3, which="both")
    bottom.plot(steps, np.asarray(learning_rates)[: len(steps)], color=_COLOURS[2])
    bottom.set(xlabel="step", ylabel="learning rate")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def plot_decision_boundary(
    path: str | os.PathLike[str],
    predict_proba: Callable[[np.ndarray], np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    highlight: Sequence[int] = (),
    inset_radius: float = 0.25,
    title: str = "decision boundary",
) -> Path:
    """Predicted class regions, the points, circled ``highlight`` points, a zoom near the origin.

    ``predict_proba`` maps ``(M, 2)`` float32 points to ``(M, C)`` probabilities.
    """
    x, y = np.asarray(x), np.asarray(y)
    lo, hi = x.min(0) - 0.15, x.max(0) + 0.15
    fig = _figure(7.0, 6.5)
    ax = fig.add_subplot(1, 1, 1)
    _regions(ax, predict_proba, lo, hi, 300)
    _points(ax, x, y, highlight, size=9)
    ax.set(
        xlim=(lo[0], hi[0]),
        ylim=(lo[1], hi[1]),
        title=title,
        xlabel="x₁",
        ylabel="x₂",
        aspect="equal",
    )
    inset = ax.inset_axes([0.66, 0.66, 0.32, 0.32])
    r = inset_radius
    _regions(inset, predict_proba, np.array([-r, -r]), np.array([r, r]), 200)
    _points(inset, x, y, highlight, size=14)
    inset.set(xlim=(-r, r), ylim=(-r, r), xticks=[], yticks=[], aspect="equal")
    inset.set_title("near the origin", fontsize=8)
    ax.indicate_inset_zoom(inset, edgecolor="black")
    fig.tight_layout()
    return _save(fig, path)


def _regions(
    ax: Any,
    predict_proba: Callable[[np.ndarray], np.ndarray],
    lo: np.ndarray,
    hi: np.ndarray,
    n: int,
) -> None:
    colors = require("matplotlib.colors", extra="cli", feature=_FEATURE)
    gx, gy = np.meshgrid(np.linspace(lo[0], hi[0], n), np.linspace(lo[1], hi[1], n))
    grid = np.stack([gx.ravel(), gy.ravel()], axis=1).astype(np.float32)
    probs = np.asarray(predict_proba(grid))
    classes = probs.shape[1]
    cmap = colors.ListedColormap(_COLOURS[:classes])
    ax.contourf(
        gx,
        gy,
        probs.argmax(1).reshape(gx.shape),
        levels=np.arange(classes + 1) - 0.5,
        cmap=cmap,
        alpha=0.25,
    )


def _points(ax: Any, x: np.ndarray, y: np.ndarray, highlight: Sequence[int], size: float) -> None:
    for c in np.unique(y):
        sel = y == c
        ax.scatter(
            x[sel, 0],
            x[sel, 1],
            s=size,
            color=_COLOURS[int(c) % len(_COLOURS)],
            edgecolors="none",
            label=f"class {int(c)}",
        )
    if len(highlight):
        idx = np.asarray(highlight)
        ax.scatter(
            x[idx, 0],
            x[idx, 1],
            s=size * 14,
            facecolors="none",
            edgecolors="black",
            linewidths=1.4,
            label="hardest examples",
        )


def confusion_focus(matrix: np.ndarray, max_classes: int = MAX_CONFUSION_CLASSES) -> np.ndarray:
    """Indices of the classes a confusion plot shows: all of them, or the most confused ones.

    With more than ``max_classes`` classes, the classes are ranked by their
    largest off-diagonal count (as true or predicted class), ties broken by
    support, and the top ``max_classes`` are kept (sorted by index). Cost:
    O(k²) NumPy work, no per-cell Python loop.

    Examples:
        >>> m = np.diag([5, 5, 5, 5]); m[2, 3] = 4
        >>> confusion_focus(m, 2).tolist()
        [2, 3]
    """
    matrix = np.asarray(matrix)
    k = matrix.shape[0]
    if k <= max_classes:
        return np.arange(k)
    off = matrix * (1 - np.eye(k, dtype=matrix.dtype))
    worst = np.maximum(off.max(0), off.max(1)).astype(np.float64)
    support = matrix.sum(1).astype(np.float64)
    order = np.lexsort((-support, -worst))  # primary key: worst confusion, then support
    return np.sort(order[:max_classes])


def plot_confusion(
    path: str | os.PathLike[str],
    matrix: np.ndarray,
    classes: Sequence[str],
    title: str = "validation confusion matrix",
    max_classes: int = MAX_CONFUSION_CLASSES,
) -> Path:
    """A confusion matrix (rows: true class, columns: predicted) with counts in the cells.

    Empty cells are left blank.

    With more than ``max_classes`` classes only the most confused ones are
    drawn (see `confusion_focus`; the title says so), so the figure
    stays small and fast whatever the number of classes.
    """
    matrix = np.asarray(matrix)
    keep = confusion_focus(matrix, max_classes)
    if len(keep) < len(classes):
        title = f"{title}: the {len(keep)} most confused of {len(classes)} classes"
        matrix = matrix[np.ix_(keep, keep)]
        classes = [str(classes[i]) for i in keep]
    k = len(classes)
    fig = _figure(1.2 + 0.6 * k, 1.0 + 0.55 * k)
    ax = fig.add_subplot(1, 1, 1)
    ax.imshow(matrix, cmap="Blues")
    for i, j in zip(*np.nonzero(matrix)):  # empty cells stay blank: text is costly to draw
        colour = "white" if matrix[i, j] > matrix.max() / 2 else "black"
        ax.text(j, i, str(int(matrix[i, j])), ha="center", va="center", color=colour, fontsize=8)
    ax.set(xticks=range(k), yticks=range(k), xlabel="predicted", ylabel="true", title=title)
    ax.set_xticklabels([_short_label(c) for c in classes], rotation=45, ha="right", fontsize=8)
    ax.set_yticklabels([_short_label(c) for c in classes], fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def _short_label(text: str, width: int = 16) -> str:
    text = str(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def plot_curves(
    path: str | os.PathLike[str],
    history: Sequence[dict[str, Any]],
    title: str = "training and validation curves",
    best_epoch: int | None = None,
) -> Path:
    """Loss and accuracy per epoch for the training and the validation rows.

    ``history`` holds one dict per epoch with keys ``epoch``, ``loss``,
    ``accuracy``, ``val_loss``, ``val_accuracy`` (``None`` for a value that
    was not finite: drawn as a gap). ``best_epoch`` draws a marker line.
    """
    epochs = np.asarray([h["epoch"] for h in history], np.float64)

    def column(key: str) -> np.ndarray:
        return np.asarray([np.nan if h.get(key) is None else h[key] for h in history], np.float64)

    fig = _figure(7.5, 5.5)
    top, bottom = fig.subplots(2, 1, sharex=True)
    for ax, key, label in ((top, "loss", "cross-entropy"), (bottom, "accuracy", "accuracy")):
        ax.plot(epochs, column(key), marker=".", color=_COLOURS[0], label="training")
        ax.plot(epochs, column(f"val_{key}"), marker=".", color=_COLOURS[1], label="validation")
        if best_epoch is not None:
            ax.axvline(best_epoch, color="black", ls="--", lw=1, label=f"best epoch ({best_epoch})")
        ax.set(ylabel=label)
        ax.grid(alpha=0.3)
    top.set(title=title)
    top.legend(loc="upper right")
    bottom.set(xlabel="epoch")
    fig.tight_layout()
    return _save(fig, path)
