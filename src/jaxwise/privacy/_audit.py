"""Empirical privacy auditing in one training run (Steinke, Nasr & Jagielski, 2023).

A DP guarantee is a proof; a bug that drops the noise or clips the wrong quantity still
reports the theoretical ε. An audit measures instead: ``m`` canary examples are each
included in the training data independently with probability ½, the model is trained ONCE,
every canary gets a score (higher: more likely trained on, e.g. minus its loss), and an
auditor guesses "included" for the highest scores and "excluded" for the lowest, abstaining
on the rest. If training is (ε, δ)-DP, the number of correct guesses ``v`` out of ``r`` is
stochastically dominated by ``Binomial(r, e^ε / (1 + e^ε))`` up to a δ term (the paper's
Theorem 5.2 via the connection between DP and generalisation); the largest ε this
observation rejects at the chosen confidence is a *lower bound* on the run's true ε.

Reference:
  Steinke, Nasr & Jagielski, Privacy Auditing with One (1) Training Run, NeurIPS 2023,
  https://arxiv.org/abs/2305.08846 (the p-value and the bisection of its Appendix D).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from jaxwise._shared._checks import check_array, check_choice, check_int, check_probability

__all__ = ["Canaries", "audit_canaries", "empirical_epsilon"]


KINDS = ("feature", "far")


@dataclasses.dataclass(frozen=True)
class Canaries:
    """Canary examples and which of them the training data includes.

    Attributes:
        examples: ``(x, y)``: the ``m`` canary inputs and labels (NumPy arrays), in the input
            layout of ``train_data``.
        included: bool ``(m,)``: each canary is included with probability ½.
        kind: ``"feature"`` (each canary has an input feature of its own) or ``"far"``.
    """

    examples: tuple[np.ndarray, np.ndarray]
    included: np.ndarray
    kind: str = "feature"

    @property
    def m(self) -> int:
        """The number of canaries."""
        return int(self.included.shape[0])

    def pad(self, x: Any) -> np.ndarray:
        """Real inputs in the canaries' layout: ``m`` zero features appended (``"feature"``).

        A model trained on ``train_data`` sees real rows through this; its extra first-layer
        weights (one row per canary) never touch a real input.

        Args:
            x: ``(n, d)`` real inputs.

        Returns:
            ``(n, d + m)`` inputs with ``"feature"`` canaries, else ``x`` unchanged.
        """
        x = np.asarray(x)
        if self.kind != "feature":
            return x
        return np.concatenate([x, np.zeros((len(x), self.m), x.dtype)], axis=1)

    def train_data(self, data: tuple[Any, Any]) -> tuple[np.ndarray, np.ndarray]:
        """``data`` (inputs padded by [`pad`][jaxwise.privacy.Canaries.pad]) with the
        included canaries appended, last.

        Args:
            data: ``(x, y)``, the real training rows.

        Returns:
            ``(x, y)`` with the included canaries as the last rows.

        Examples:
            >>> x, y = np.zeros((4, 2), np.float32), np.arange(4) % 2
            >>> canaries = audit_canaries((x, y), 6, seed=0)
            >>> tx, ty = canaries.train_data((x, y))
            >>> tx.shape == (4 + int(canaries.included.sum()), 2 + 6)
            True
        """
        x, y = self.pad(data[0]), np.asarray(data[1])
        cx, cy = self.examples
        keep = self.included
        return (
            np.concatenate([x, cx[keep].astype(x.dtype)]),
            np.concatenate([y, cy[keep].astype(y.dtype)]),
        )


MAX_CANARY_BYTES = 4 * 2**30  # the float64 canary inputs audit_canaries may build


def audit_canaries(
    data: tuple[Any, Any],
    m: int,
    *,
    seed: int = 0,
    num_classes: int | None = None,
    kind: str = "feature",
) -> Canaries:
    """``m`` canaries for a classification dataset, each included with probability ½.

    Every canary has a random label that nothing else in the data predicts, so a model that
    fits it has memorised it; its score after training is typically minus its loss.

    - ``"feature"`` (inputs ``(n, d)``): canary ``i`` is the one-hot input ``e_{d+i}``
      (scaled to the largest input norm) of ``d + m`` features; real inputs get ``m`` zero
      features ([`Canaries.pad`][jaxwise.privacy.Canaries.pad]). A dense first layer then
      holds one weight row per canary that only that canary's gradient moves: the
      strongest input-space audit (Steinke et al.'s "Dirac" canaries, in input space), and
      the model on real inputs is unchanged.
    - ``"far"`` (any input shape): an input in a random direction, 4 to 8 times the largest
      input norm away; no change to the model, but canaries in a low-dimensional input space
      crowd each other and the audit is weaker.

    Args:
        data: ``(x, y)``: float inputs ``(n, ...)`` (``(n, d)`` for ``"feature"``) and
            integer labels ``(n,)``.
        m: the number of canaries, >= 2.
        seed: the seed of the canaries and of their inclusion.
        num_classes: the labels' range (default ``max(y) + 1``).
        kind: ``"feature"`` or ``"far"``.

    Returns:
        [`Canaries`][jaxwise.privacy.Canaries]: train on ``canaries.train_data(data)``, score
            every canary afterwards, then call
            [`empirical_epsilon`][jaxwise.privacy.empirical_epsilon].

    Raises:
        TypeError: ``data`` is not ``(x, y)`` arrays, or ``y`` is not integer.
        ValueError: ``m < 2``, ``num_classes < 2``, an unknown ``kind``, or ``"feature"``
            canaries for inputs that are not ``(n, d)``.

    Examples:
        >>> x, y = np.random.default_rng(0).normal(size=(100, 2)), np.arange(100) % 3
        >>> canaries = audit_canaries((x, y), 50, seed=1)
        >>> canaries.examples[0].shape, int(canaries.examples[1].max()) < 3, canaries.m
        ((50, 52), True, 50)
    """
    if not (isinstance(data, (tuple, list)) and len(data) == 2):
        raise TypeError(f"`data` must be (x, y) arrays, got {type(data).__name__}")
    x = np.asarray(check_array(data[0], "data[0]", dtype_kind="fiu", non_empty=True))
    y = np.asarray(check_array(data[1], "data[1]", ndim=1, dtype_kind="iu"))
    if len(y) != len(x):
        raise ValueError(f"`data` inputs and labels differ in length: {len(x)} vs {len(y)}")
    m = check_int(m, "m", min_value=2)
    check_int(seed, "seed", min_value=0)
    check_choice(kind, "kind", KINDS)
    classes = int(y.max()) + 1 if num_classes is None else num_classes
    check_int(classes, "num_classes", min_value=2)
    if kind == "feature" and x.ndim != 2:
        raise ValueError(
            f"kind='feature' needs inputs of shape (n, d), got {x.shape}; use kind='far'"
        )
    width = int(np.prod(x.shape[1:])) + (m if kind == "feature" else 0)
    if 8 * m * width > MAX_CANARY_BYTES:
        raise ValueError(
            f"`m`={m:,} canaries of {width:,} features need {8 * m * width / 2**30:,.1f} GiB "
            f"(limit {MAX_CANARY_BYTES / 2**30:.0f} GiB): pass fewer canaries (a few hundred "
            "to a few thousand suffice for an audit)"
        )
    rng = np.random.default_rng(seed)
    inputs = _canary_inputs(x, m, kind, rng)
    labels = rng.integers(0, classes, m)
    included = rng.random(m) < 0.5
    dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float32
    return Canaries((inputs.astype(dtype), labels.astype(y.dtype)), included, kind)


def _canary_inputs(x: np.ndarray, m: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    """The ``m`` canary inputs (float64) of ``kind`` for the real inputs ``x`` ``(n, ...)``:
    one-hot in ``m`` extra features (``"feature"``) or 4 to 8 times the largest input norm
    away in a random direction (``"far"``, drawn from ``rng``)."""
    flat = x.reshape(len(x), -1).astype(np.float64)
    scale = float(np.max(np.linalg.norm(flat, axis=1))) or 1.0
    if kind == "feature":
        inputs = np.zeros((m, flat.shape[1] + m))
        inputs[np.arange(m), flat.shape[1] + np.arange(m)] = scale
        return inputs
    directions = rng.normal(size=(m, flat.shape[1]))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    return (directions * scale * rng.uniform(4.0, 8.0, size=(m, 1))).reshape(m, *x.shape[1:])


def _p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """P[v or more of r guesses correct] for an (ε, δ)-DP run with m canaries (Appendix D).

    ``β = P[Binomial(r, q) >= v]`` with ``q = e^ε / (1 + e^ε)``, plus ``2 m δ`` times
    ``α = max_{1 <= i <= v} P[v - i <= Binomial(r, q) < v] / i`` (Theorem 5.2), capped at 1.
    """
    from scipy import stats  # a dependency of jax itself

    q = 1.0 / (1.0 + math.exp(-eps))
    beta = float(stats.binom.sf(v - 1, r, q))
    if delta == 0 or v == 0:
        return min(beta, 1.0)
    below = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[Bin = v-1], ..., P[Bin = 0]
    alpha = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(beta + alpha * delta * 2 * m, 1.0)


def _epsilon_bound(m: int, r: int, v: int, delta: float, confidence: float) -> float:
    """The largest ε whose p-value stays below ``1 - confidence`` (0 if even ε = 0 does not)."""
    level = 1.0 - confidence
    if r == 0 or _p_value(m, r, v, 0.0, delta) >= level:
        return 0.0
    low, high = 0.0, 1.0
    while _p_value(m, r, v, high, delta) < level:
        low, high = high, 2 * high
        if high > 1e3:  # p stays below the level: the observation rejects every finite ε
            return math.inf
    for _ in range(60):  # bisection to float64 resolution
        mid = 0.5 * (low + high)
        if _p_value(m, r, v, mid, delta) < level:
            low = mid
        else:
            high = mid
    return low


def _check_conclusive(
    m: int, k: int, delta: float, confidence: float, level: float, guesses: int | None
) -> None:
    """Refuse an audit whose best possible outcome (all ``2k`` guesses right) bounds ε by 0."""
    if _epsilon_bound(m, 2 * k, 2 * k, delta, 1.0 - level) > 0:
        return
    if guesses is not None:
        raise ValueError(
            f"`guesses`={guesses}: even {2 * k} right guesses of {2 * k} cannot bound ε above "
            f"0 at confidence {confidence}; guess on more canaries"
        )
    needed = m + 1
    while True:
        r = needed // 2 * 2
        tested = 1.0 - (1.0 - confidence) / len(_guess_counts(needed))
        if _epsilon_bound(needed, r, r, delta, tested) > 0:
            break
        needed += 1
    raise ValueError(
        f"`scores`: {m} canaries cannot give a bound on ε above 0 at confidence {confidence}, "
        f"even if every guess is right; audit with at least {needed} canaries"
    )


def _guess_counts(m: int) -> list[int]:
    """Candidate numbers of guesses per side: a geometric grid from 1 to m // 2."""
    return sorted({int(round(k)) for k in np.geomspace(1, m // 2, num=12)} - {0})


def empirical_epsilon(
    scores: Any,
    included: Any,
    *,
    delta: float,
    confidence: float = 0.95,
    guesses: int | None = None,
) -> float:
    """A lower bound on ε from one audited training run (Steinke, Nasr & Jagielski, 2023).

    The auditor guesses "included" for the ``k`` canaries with the highest scores and
    "excluded" for the ``k`` lowest (abstaining on the rest), counts its correct guesses
    ``v`` of ``r = 2k``, and returns the largest ε that an (ε, δ)-DP run would make this
    unlikely at ``confidence`` (the paper's p-value, Appendix D, in float64). Without
    ``guesses`` every ``k`` of a geometric grid up to ``m // 2`` is tried and the best bound
    kept, each tested at ``1 - (1 - confidence) / |grid|`` (Bonferroni), so the bound holds
    at ``confidence`` overall. Equal scores are ranked in a fixed random order, never by
    their position: the canaries' order carries no evidence. ``delta=0`` audits a pure-DP
    (ε, 0) claim.

    Args:
        scores: ``(m,)`` float scores, higher meaning "more likely included" (e.g. minus the
            canary's loss after training).
        included: ``(m,)`` bool: which canaries the training data included.
        delta: the δ of the guarantee under test, in [0, 1).
        confidence: the probability that the bound is not above the true ε, in (0, 1).
        guesses: a fixed ``k`` (guesses per side) instead of the search.

    Returns:
        The ε lower bound (0 when the run shows no leakage; ``inf`` when every finite ε is
            rejected, which needs δ = 0).

    Raises:
        TypeError: ``scores``/``included`` of the wrong kind.
        ValueError: shapes that differ, fewer than 2 canaries, or an argument out of range;
            too few canaries (or ``guesses``) for any outcome, even every guess right, to
            give a bound above 0 at ``confidence`` (the number needed is named).

    Examples:
        >>> included = np.arange(1000) % 2 == 0
        >>> round(empirical_epsilon(included.astype(float), included, delta=0.0), 2)  # perfect
        5.2
        >>> empirical_epsilon(np.zeros(1000), included, delta=1e-5)  # no signal
        0.0
    """
    s = np.asarray(check_array(scores, "scores", ndim=1, dtype_kind="fiu"), np.float64)
    truth = np.asarray(check_array(included, "included", ndim=1, dtype_kind="b"))
    if s.shape != truth.shape:
        raise ValueError(
            f"`scores` and `included` must have the same shape, got {s.shape} and {truth.shape}"
        )
    m = len(s)
    if m < 2:
        raise ValueError(f"`scores` needs at least 2 canaries, got {m}")
    if not np.isfinite(s).all():
        raise ValueError("`scores` must be finite")
    check_probability(delta, "delta", open_high=True)
    check_probability(confidence, "confidence", open_low=True, open_high=True)
    grid = _guess_counts(m)
    if guesses is not None:
        grid = [check_int(guesses, "guesses", min_value=1, max_value=m // 2)]
    level = (1.0 - confidence) / len(grid)
    _check_conclusive(m, max(grid), float(delta), confidence, level, guesses)
    tie_break = np.random.default_rng(0).permutation(m)  # ties: never by the canaries' order
    order = np.lexsort((tie_break, -s))
    best = 0.0
    for k in grid:
        correct = int(truth[order[:k]].sum() + (~truth[order[m - k :]]).sum())
        best = max(best, _epsilon_bound(m, 2 * k, correct, float(delta), 1.0 - level))
    return best
