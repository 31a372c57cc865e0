"""PNG plots for the CLI jobs (matplotlib's Agg canvas; never touches pyplot's global state).

Every function writes its PNG atomically (a temporary file renamed into
place), so an interrupted run never leaves a half-written image over a good one.

Example:
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

__all__ = ["plot_confusion", "plot_decision_boundary", "plot_training"]

_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path


def plot_training(
    path: str | os.PathLike[str], step_losses: np.ndarray, steps_per_epoch: int, learning_rates: np.ndarray,
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
        epoch_means = losses[: n_epochs * steps_per_epoch].reshape(n_epochs, steps_per_epoch).mean(1)
        top.semilogy((np.arange(n_epochs) + 1) * steps_per_epoch, epoch_means, lw=2, color=_COLOURS[1],
                     label="epoch mean")
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
    """Predicted class regions over the plane, the points, circled ``highlight`` points, and a zoom near the origin.

    ``predict_proba`` maps ``(M, 2)`` float32 points to ``(M, C)`` probabilities.
    """
    x, y = np.asarray(x), np.asarray(y)
    lo, hi = x.min(0) - 0.15, x.max(0) + 0.15
    fig = _figure(7.0, 6.5)
    ax = fig.add_subplot(1, 1, 1)
    _regions(ax, predict_proba, lo, hi, 300)
    _points(ax, x, y, highlight, size=9)
    ax.set(xlim=(lo[0], hi[0]), ylim=(lo[1], hi[1]), title=title, xlabel="x₁", ylabel="x₂", aspect="equal")
    inset = ax.inset_axes([0.66, 0.66, 0.32, 0.32])
    r = inset_radius
    _regions(inset, predict_proba, np.array([-r, -r]), np.array([r, r]), 200)
    _points(inset, x, y, highlight, size=14)
    inset.set(xlim=(-r, r), ylim=(-r, r), xticks=[], yticks=[], aspect="equal")
    inset.set_title("near the origin", fontsize=8)
    ax.indicate_inset_zoom(inset, edgecolor="black")
    fig.tight_layout()
    return _save(fig, path)


def _regions(ax: Any, predict_proba: Callable[[np.ndarray], np.ndarray], lo: np.ndarray, hi: np.ndarray,
             n: int) -> None:
    from matplotlib.colors import ListedColormap

    gx, gy = np.meshgrid(np.linspace(lo[0], hi[0], n), np.linspace(lo[1], hi[1], n))
    grid = np.stack([gx.ravel(), gy.ravel()], axis=1).astype(np.float32)
    probs = np.asarray(predict_proba(grid))
    classes = probs.shape[1]
    cmap = ListedColormap(_COLOURS[:classes])
    ax.contourf(gx, gy, probs.argmax(1).reshape(gx.shape), levels=np.arange(classes + 1) - 0.5, cmap=cmap,
                alpha=0.25)


def _points(ax: Any, x: np.ndarray, y: np.ndarray, highlight: Sequence[int], size: float) -> None:
    for c in np.unique(y):
        sel = y == c
        ax.scatter(x[sel, 0], x[sel, 1], s=size, color=_COLOURS[int(c) % len(_COLOURS)], edgecolors="none",
                   label=f"class {int(c)}")
    if len(highlight):
        idx = np.asarray(highlight)
        ax.scatter(x[idx, 0], x[idx, 1], s=size * 14, facecolors="none", edgecolors="black", linewidths=1.4,
                   label="hardest examples")


def plot_confusion(path: str | os.PathLike[str], matrix: np.ndarray, classes: Sequence[str],
                   title: str = "validation confusion matrix") -> Path:
    """A confusion matrix (rows: true class, columns: predicted) with counts in the cells."""
    matrix = np.asarray(matrix)
    k = len(classes)
    fig = _figure(1.2 + 0.6 * k, 1.0 + 0.55 * k)
    ax = fig.add_subplot(1, 1, 1)
    ax.imshow(matrix, cmap="Blues")
    for i in range(k):
        for j in range(k):
            colour = "white" if matrix[i, j] > matrix.max() / 2 else "black"
            ax.text(j, i, str(int(matrix[i, j])), ha="center", va="center", color=colour, fontsize=8)
    ax.set(xticks=range(k), yticks=range(k), xlabel="predicted", ylabel="true", title=title)
    ax.set_xticklabels(classes, rotation=45, ha="right", fontsize=8)
    ax.set_yticklabels(classes, fontsize=8)
    fig.tight_layout()
    return _save(fig, path)
