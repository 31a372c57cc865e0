"""Rank rows by one label-quality score; confident learning estimates how many are wrong.

References:
  Northcutt, Jiang & Chuang, Confident Learning: Estimating Uncertainty in Dataset Labels,
  JAIR 2021, https://arxiv.org/abs/1911.00068
  Kuan & Mueller, Model-Agnostic Label Quality Scoring to Detect Real-World Label Errors,
  ICML DataPerf Workshop 2022 (the self-confidence, normalized-margin and
  confidence-weighted-entropy scores)
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
import numpy.typing as npt

from jaxwise._shared._checks import check_array, check_choice, check_int
from jaxwise.label_errors._oof import OutOfFold

__all__ = ["LabelIssues", "confident_learning", "label_quality", "precision_recall"]

Ranking = Literal["self_confidence", "normalized_margin", "confidence_weighted_entropy"]
RANKINGS = ("self_confidence", "normalized_margin", "confidence_weighted_entropy")
_TINY = 1e-10  # cleanlab's lower clip of the self-confidence and of the entropy ratio


@dataclasses.dataclass(frozen=True)
class LabelIssues:
    """Every row ranked from most to least likely mislabeled, by one score.

    Attributes:
        indices: ``(n,)`` every row, ascending ``score`` (most suspicious first; ties by row).
        score: ``(n,)`` the label-quality score of ``ranked_by`` (lower is more suspicious),
            aligned with ``indices``.
        p_given: ``(n,)`` probability of the given label, aligned with ``indices``.
        suggested: ``(n,)`` most probable other class, aligned with ``indices``.
        flagged: ``(n,)`` bool, aligned with ``indices``: confident learning counts the row
            as mislabeled (off the diagonal of the confident joint). Flagged rows are *not*
            moved ahead of the others: the ranking is the score's alone.
        num_issues: how many labels confident learning estimates to be wrong (the number of
            flagged rows): a suggested cut-off, e.g. ``issues.top(issues.num_issues)``.
        pred_probs: ``(n, k)`` the probabilities scored, in the original row order.
        ranked_by: the score's name.
        oof: the out-of-fold runs the probabilities came from (empty when given directly).
    """

    indices: np.ndarray
    score: np.ndarray
    p_given: np.ndarray
    suggested: np.ndarray
    flagged: np.ndarray
    num_issues: int
    pred_probs: np.ndarray
    ranked_by: str = "self_confidence"
    oof: tuple[OutOfFold, ...] = ()

    def top(self, k: int) -> np.ndarray:
        """The ``k`` most suspicious row indices.

        Args:
            k: how many rows (>= 0).

        Returns:
            int ``(min(k, n),)`` row indices, most suspicious first.

        Examples:
            >>> issues = confident_learning(np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([1, 1]))
            >>> issues.top(1).tolist()
            [0]
        """
        return self.indices[: check_int(k, "k", min_value=0)]


SUM_TOLERANCE = 1e-3  # |sum of a row - 1|: float32 and bfloat16 softmaxes are well within it


def _check_probs(pred_probs: npt.ArrayLike, labels: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
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
    sums = probs.sum(axis=1)
    bad = np.flatnonzero(np.abs(sums - 1.0) > SUM_TOLERANCE)
    if bad.size:
        raise ValueError(
            f"`pred_probs` rows must sum to 1 (within {SUM_TOLERANCE:g}): {bad.size} of {n} do "
            f"not, e.g. row {bad[0]} sums to {sums[bad[0]]:.6g}; pass probabilities (a softmax "
            "of the logits), not scores or logits"
        )
    return probs, given


def label_quality(
    pred_probs: npt.ArrayLike, labels: npt.ArrayLike, *, ranked_by: Ranking = "self_confidence"
) -> np.ndarray:
    """``(n,)`` label-quality score of every row (float64; lower is more suspicious).

    - ``self_confidence``: ``p(given)``.
    - ``normalized_margin``: ``(p(given) − max_{j≠given} p_j + 1) / 2``.
    - ``confidence_weighted_entropy``: ``log(1 + s) / s`` with ``s = H(p) / log(k) /
      p(given)`` (the normalised entropy over the self-confidence, both clipped at 1e-10).

    Each is cleanlab's ``get_label_quality_scores(method=...)`` with ``adjust_pred_probs``
    off.

    Args:
        pred_probs: ``(n, k)`` out-of-sample probabilities (rows sum to 1).
        labels: ``(n,)`` given integer labels in ``[0, k)``.
        ranked_by: the score.

    Returns:
        The scores, in row order.

    Raises:
        TypeError: an array of the wrong type.
        ValueError: mismatched rows, labels out of range, values that are not probabilities,
            or an unknown ``ranked_by``.

    Examples:
        >>> p = np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]])
        >>> label_quality(p, np.array([0, 2]), ranked_by="normalized_margin").round(2).tolist()
        [0.75, 0.35]
    """
    check_choice(ranked_by, "ranked_by", RANKINGS)
    probs, given = _check_probs(pred_probs, labels)
    return _scores(probs, given, ranked_by)


def _scores(probs: np.ndarray, given: np.ndarray, ranked_by: str) -> np.ndarray:
    rows = np.arange(len(given))
    p_given = probs[rows, given]
    if ranked_by == "self_confidence":
        return p_given
    if ranked_by == "normalized_margin":
        others = probs.copy()
        others[rows, given] = -np.inf
        return (p_given - others.max(axis=1) + 1.0) / 2.0
    k = probs.shape[1]
    safe = np.clip(probs, _TINY, None)
    entropy = -np.sum(probs * np.log(safe), axis=1) / np.log(k)
    ratio = entropy / np.clip(p_given, _TINY, None)
    return np.log(ratio + 1.0) / np.clip(ratio, _TINY, None)


def _confident_joint_off_diagonal(probs: np.ndarray, given: np.ndarray) -> np.ndarray:
    """``(n,)`` bool: the row lands off the diagonal of the confident joint (cleanlab's rule)."""
    k = probs.shape[1]
    thresholds = np.array(
        [probs[given == j, j].mean() if np.any(given == j) else 1.0 for j in range(k)]
    )
    confident = probs >= thresholds - 1e-6
    count = confident.sum(axis=1)
    guess = np.where(count > 1, probs.argmax(axis=1), confident.argmax(axis=1))
    return (count > 0) & (guess != given)


def confident_learning(
    pred_probs: npt.ArrayLike, labels: npt.ArrayLike, *, ranked_by: Ranking = "self_confidence"
) -> LabelIssues:
    """Rank rows by how likely their given label is wrong (NumPy, float64).

    The ranking is the score of ``ranked_by`` alone (see
    [`label_quality`][jaxwise.label_errors.label_quality]), lowest first. Confident
    learning estimates *how many* labels are wrong: per-class thresholds ``t_j`` are the
    mean probability of class ``j`` over rows labeled ``j``; a row is confidently of class
    ``j`` when ``p_ij ≥ t_j`` (the most probable such class when several are); rows
    confidently of another class than the given one are ``flagged`` and counted in
    ``num_issues`` — cleanlab's ``num_label_issues(estimation_method="off_diagonal")``.

    Args:
        pred_probs: ``(n, k)`` out-of-sample probabilities (rows sum to 1).
        labels: ``(n,)`` given integer labels in ``[0, k)``.
        ranked_by: ``"self_confidence"`` (default), ``"normalized_margin"`` or
            ``"confidence_weighted_entropy"``.

    Returns:
        [`LabelIssues`][jaxwise.label_errors.LabelIssues] over every row.

    Raises:
        TypeError: an array of the wrong type.
        ValueError: mismatched rows, labels out of range, values that are not probabilities
            (outside ``[0, 1]``, or rows that do not sum to 1 within 1e-3), or an unknown
            ``ranked_by``.

    Examples:
        >>> p = np.array([[0.9, 0.1], [0.8, 0.2], [0.1, 0.9], [0.85, 0.15]])
        >>> found = confident_learning(p, np.array([0, 0, 1, 1]))
        >>> found.indices[:1].tolist(), found.num_issues
        ([3], 1)
    """
    check_choice(ranked_by, "ranked_by", RANKINGS)
    probs, given = _check_probs(pred_probs, labels)
    rows = np.arange(len(given))
    score = _scores(probs, given, ranked_by)
    flagged = _confident_joint_off_diagonal(probs, given)
    others = probs.copy()
    others[rows, given] = -np.inf
    suggested = np.argmax(others, axis=1)
    order = np.argsort(score, kind="stable")
    return LabelIssues(
        order,
        score[order],
        probs[rows, given][order],
        suggested[order],
        flagged[order],
        int(flagged.sum()),
        probs,
        ranked_by,
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
    k = check_int(k, "k", min_value=1)
    top_k = np.asarray(ranked)[:k].tolist()
    top_2k = np.asarray(ranked)[: 2 * k].tolist()
    return (
        sum(i in flipped for i in top_k) / k,
        sum(i in flipped for i in top_2k) / max(len(flipped), 1),
    )
