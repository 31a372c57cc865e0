"""Confident learning (Northcutt et al., 2021): rank rows by how likely their label is wrong.

References:
  Northcutt, Jiang & Chuang, Confident Learning: Estimating Uncertainty in Dataset Labels,
  JAIR 2021, https://arxiv.org/abs/1911.00068
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np

from jaxwise._checks import check_array, check_choice, check_float, check_int
from jaxwise.label_errors._oof import OutOfFold

__all__ = ["LabelIssues", "confident_learning", "precision_recall"]

Ranking = Literal["self_confidence", "normalized_margin"]
RANKINGS = ("self_confidence", "normalized_margin")


@dataclasses.dataclass(frozen=True)
class LabelIssues:
    """Rows ranked from most to least likely mislabeled.

    Attributes:
      indices: ``(n,)`` every row, most suspicious first (candidates first).
      candidate: ``(n,)`` bool, aligned with ``indices``: in the confident joint's off-diagonal.
      p_given: ``(n,)`` probability of the given label, aligned with ``indices``.
      suggested: ``(n,)`` most probable other class, aligned with ``indices``.
      score: ``(n,)`` the ranking score (lower is more suspicious), aligned with ``indices``.
      num_candidates: number of confident-learning candidates.
      pred_probs: ``(n, k)`` the probabilities ranked, in the original row order.
      oof: the out-of-fold runs the probabilities came from (empty when given directly).
    """

    indices: np.ndarray
    candidate: np.ndarray
    p_given: np.ndarray
    suggested: np.ndarray
    score: np.ndarray
    num_candidates: int
    pred_probs: np.ndarray
    oof: tuple[OutOfFold, ...] = ()

    def top(self, k: int) -> np.ndarray:
        """The ``k`` most suspicious row indices.

        Args:
          k: how many rows (>= 0).
        """
        return self.indices[: check_int(k, "k", min_value=0)]


def confident_learning(
    pred_probs: Any, labels: Any, *, ranked_by: Ranking = "self_confidence"
) -> LabelIssues:
    """Rank rows by how likely their given label is wrong (NumPy, float64).

    Per-class thresholds ``t_j`` are the mean probability of class ``j`` over rows labeled
    ``j``; row ``i`` joins the confident joint at the most probable class ``j`` with
    ``p_ij ≥ t_j``; rows that land off the diagonal (``j ≠ given``) are the candidates.
    Candidates come first, each group ordered by the score (lower = more suspicious):
    ``self_confidence`` = ``p(given)``, ``normalized_margin`` = ``p(given) − max_{j≠given} p_j``.

    Args:
      pred_probs: ``(n, k)`` out-of-sample probabilities (rows sum to 1).
      labels: ``(n,)`` given integer labels in ``[0, k)``.
      ranked_by: ``"self_confidence"`` or ``"normalized_margin"``.

    Examples:
        >>> p = np.array([[0.9, 0.1], [0.8, 0.2], [0.1, 0.9], [0.85, 0.15]])
        >>> confident_learning(p, np.array([0, 0, 1, 1])).indices[:1].tolist()
        [3]
    """
    check_choice(ranked_by, "ranked_by", RANKINGS)
    probs = np.asarray(
        check_array(pred_probs, "pred_probs", ndim=2, dtype_kind="f", non_empty=True), np.float64
    )
    given = np.asarray(check_array(labels, "labels", ndim=1, dtype_kind="iu"))
    n, k = probs.shape
    if given.shape[0] != n:
        raise ValueError(f"`labels` has {given.shape[0]} rows but `pred_probs` has {n}")
    if given.min() < 0 or given.max() >= k:
        raise ValueError(
            f"`labels` must be in [0, {k}), got values in [{given.min()}, {given.max()}]"
        )
    if not np.all(np.isfinite(probs)):
        raise ValueError("`pred_probs` must be finite")
    if probs.min() < 0.0 or probs.max() > 1.0 + 1e-6:
        raise ValueError(
            f"`pred_probs` must be probabilities in [0, 1], got values in "
            f"[{probs.min():.3g}, {probs.max():.3g}]"
        )
    rows = np.arange(n)
    p_given = probs[rows, given]
    thresholds = np.array(
        [probs[given == j, j].mean() if np.any(given == j) else 1.0 for j in range(k)]
    )
    confident = np.where(probs >= thresholds - 1e-12, probs, -np.inf)
    joint_class = np.argmax(confident, axis=1)
    in_joint = np.isfinite(confident[rows, joint_class])
    candidate = in_joint & (joint_class != given)
    others = probs.copy()
    others[rows, given] = -np.inf
    suggested = np.argmax(others, axis=1)
    score = p_given if ranked_by == "self_confidence" else p_given - others[rows, suggested]
    order = np.lexsort((score, ~candidate))
    return LabelIssues(
        order,
        candidate[order],
        p_given[order],
        suggested[order],
        score[order],
        int(candidate.sum()),
        probs,
    )


def precision_recall(ranked: np.ndarray, truly_flipped: np.ndarray, k: int) -> tuple[float, float]:
    """Precision of the top ``k`` and recall of the top ``2k`` against the flipped rows.

    Args:
      ranked: row indices, most suspicious first.
      truly_flipped: the rows whose labels were really flipped.
      k: how many top rows count for precision (``2k`` for recall).

    Returns:
      ``(precision, recall)``.

    Examples:
        >>> precision_recall(np.array([3, 1, 2, 0]), np.array([3, 0]), 2)
        (0.5, 1.0)
    """
    flipped = set(np.asarray(truly_flipped).tolist())
    check_float(k, "k", min_value=1)
    top_k = np.asarray(ranked)[:k].tolist()
    top_2k = np.asarray(ranked)[: 2 * k].tolist()
    return (
        sum(i in flipped for i in top_k) / k,
        sum(i in flipped for i in top_2k) / max(len(flipped), 1),
    )
