"""Exact bucket planning: the boundaries that minimise total padding."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxwise._shared._checks import check_int
from jaxwise.buckets._padding import _check_lengths

__all__ = ["plan_buckets"]


def plan_buckets(
    lengths: Sequence[int] | np.ndarray, max_buckets: int | np.integer
) -> tuple[int, ...]:
    """Bucket boundaries minimising total padding for observed request lengths.

    Exact dynamic programming over the sorted distinct lengths: with values
    ``v_1 < … < v_m`` seen ``c_i`` times, choose at most ``max_buckets``
    boundaries among them (``v_m`` always included) minimising
    ``Σ_i c_i (bucket(v_i) − v_i)``. The cost of padding a run of lengths to
    its largest one satisfies the quadrangle inequality, so the optimal split
    points are monotone and each DP layer is solved by divide and conquer
    (vectorised with NumPy, one pass per recursion level, integer arithmetic):
    O(K·m·log m) time and O(K·m) memory for K buckets and m distinct lengths
    (100,000 distinct lengths and 16 buckets take about a second).

    Args:
        lengths: observed request lengths (a histogram as raw samples), ints >= 0.
        max_buckets: the number of programs you are willing to compile, >= 1.

    Returns:
        Sorted tuple of at most ``max_buckets`` bucket sizes.

    Raises:
        TypeError: ``lengths`` does not hold ints, or ``max_buckets`` is not an int.
        ValueError: ``lengths`` is empty, not 1-D or negative, or ``max_buckets < 1``.

    Examples:
        >>> plan_buckets([1, 1, 2, 9, 10, 10], 2)
        (2, 10)
    """
    lengths = _check_lengths(lengths)
    max_buckets = check_int(max_buckets, "max_buckets", min_value=1)
    # Buckets are >= 1, so a 0-length request pads to at least 1: planning with lengths
    # clipped to 1 adds the same constant to every plan and keeps the optimum exact.
    values, counts = np.unique(np.maximum(lengths, 1), return_counts=True)
    m = len(values)
    k = min(max_buckets, m)
    if k == m:
        return tuple(int(v) for v in values)
    c_cum = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    cv_cum = np.concatenate([[0], np.cumsum(counts * values)]).astype(np.int64)
    # dp[j]: least padding of values[0..j] with b buckets, the last one at values[j].
    dp = values * c_cum[1:] - cv_cum[1:]
    parents = []
    for _ in range(1, k):
        dp, parent = _dp_layer(dp, values, c_cum, cv_cum)
        parents.append(parent)
    # With k <= m distinct values, k buckets are never worse than fewer; backtrack.
    result, last = [int(values[-1])], m - 1
    for parent in reversed(parents):
        last = int(parent[last])
        result.append(int(values[last]))
    return tuple(sorted(result))


_UNREACHABLE = np.int64(2**62)  # dp value of an infeasible state (exact: totals stay < 2**62)


def _dp_layer(
    prev: np.ndarray, values: np.ndarray, c_cum: np.ndarray, cv_cum: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One layer ``cur[j] = min_{p<j} prev[p] + cost(p+1, j)`` by monotone divide and conquer.

    All sub-problems of one recursion level are solved in one vectorised pass; the leftmost
    optimal ``p`` is kept, which is monotone in ``j`` under the quadrangle inequality.
    """
    m = len(values)
    cur = np.full(m, _UNREACHABLE, np.int64)
    parent = np.zeros(m, np.int64)
    lo, hi = np.array([0]), np.array([m - 1])
    opt_lo, opt_hi = np.array([0]), np.array([m - 1])
    while lo.size:
        mid = (lo + hi) // 2
        first, last = opt_lo, np.minimum(opt_hi, mid - 1)
        sizes = np.maximum(last - first + 1, 0)
        task = np.repeat(np.arange(mid.size), sizes)
        starts = np.cumsum(sizes) - sizes
        p = first[task] + (np.arange(task.size) - starts[task])
        j = mid[task]
        cand = prev[p] + values[j] * (c_cum[j + 1] - c_cum[p + 1]) - (cv_cum[j + 1] - cv_cum[p + 1])
        best_p = opt_lo.copy()
        has = sizes > 0
        if task.size:
            # Leftmost minimum per task: segments are contiguous and ordered by p.
            seg_min = np.minimum.reduceat(cand, starts[has])
            at_min = np.flatnonzero(cand == np.repeat(seg_min, sizes[has]))
            firsts = at_min[np.r_[True, task[at_min][1:] != task[at_min][:-1]]]
            best_p[has] = p[firsts]
            cur[mid[has]] = np.minimum(cand[firsts], _UNREACHABLE)
        parent[mid] = best_p
        left = mid - 1 >= lo
        right = mid + 1 <= hi
        lo, hi, opt_lo, opt_hi = (
            np.concatenate([lo[left], mid[right] + 1]),
            np.concatenate([mid[left] - 1, hi[right]]),
            np.concatenate([opt_lo[left], best_p[right]]),
            np.concatenate([best_p[left], opt_hi[right]]),
        )
    return cur, parent
