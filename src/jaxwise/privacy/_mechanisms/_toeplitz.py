"""Float64 NumPy algebra of lower-triangular Toeplitz strategies (BandMF, BLT).

A lower-triangular Toeplitz ``n × n`` matrix is given by its first column ``c`` (``c[0]`` on the
diagonal). Products and inverses of such matrices are again lower-triangular Toeplitz, so
everything here works on coefficient vectors: ``solve(c, a)`` is ``C⁻¹a`` (a linear
recurrence, SciPy's ``lfilter``), and the workload ``A`` of the mechanism is the prefix sum
(all ones) or the prefix sum of SGD-with-momentum (``(1 − βᵏ⁺¹)/(1 − β)``).

Every function costs ``O(n · b)`` for ``b`` coefficients (a banded ``C``) or ``b`` filter
taps (a BLT's rational ``C = P/Q``, `rational_loss_and_grad`), never ``O(n²)``: the
coefficients are never padded to ``n``, and the min-separation sensitivity is one filter
run over the participation pattern. The optimisers report through `StrategyProgress` (a bar once
they take over a second; Ctrl-C is served between the evaluations, each a few short
filter runs).

References:
  Choquette-Choo et al., (Amplified) Banded Matrix Factorization: A unified approach to
  private training, NeurIPS 2023, https://arxiv.org/abs/2306.08153
  McKenna, Scaling up the Banded Matrix Factorization Mechanism for Differentially Private
  ML, 2024, https://arxiv.org/abs/2405.15913 (Theorem 2: min-separation sensitivity)
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any

import numpy as np

from jaxwise._shared._extras import require

__all__ = [
    "StrategyProgress",
    "max_participations",
    "mean_error",
    "minsep_sensitivity_squared",
    "solve",
    "workload_coefs",
]


def _signal() -> Any:
    return require("scipy.signal", extra="privacy", feature="jaxwise.privacy strategies")


def solve(coefs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """``C⁻¹ rhs`` for the lower-triangular Toeplitz ``C`` with first column ``coefs`` (float64).

    ``rhs`` may be ``(n,)`` or ``(n, d)`` (columns solved independently).
    """
    return _signal().lfilter([1.0], np.asarray(coefs, np.float64), rhs, axis=0)


def solve_transposed(coefs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """``C⁻ᵀ rhs`` (``C`` as in `solve`): the same recurrence run backwards."""
    return solve(coefs, np.asarray(rhs)[::-1])[::-1]


def workload_coefs(steps: int, momentum: float) -> np.ndarray:
    """First column of the workload: prefix sums of SGD (``momentum = 0``) or of heavy ball."""
    k = np.arange(steps, dtype=np.float64)
    if momentum == 0.0:
        return np.ones(steps)
    return (1.0 - momentum ** (k + 1.0)) / (1.0 - momentum)


def mean_error(coefs: np.ndarray, workload: np.ndarray) -> float:
    """Mean over the ``n`` steps of the squared error of ``A C⁻¹ z`` per unit of noise.

    ``A C⁻¹`` is Toeplitz with first column ``β = C⁻¹a``; the squared error of step ``i`` is
    ``Σ_{k≤i} β_k²``, so the mean is ``Σ_k (n − k) β_k² / n``.
    """
    n = workload.shape[0]
    beta = solve(np.asarray(coefs, np.float64)[:n], workload)  # O(n · len(coefs)), no padding
    return float(np.sum((n - np.arange(n)) * beta**2) / n)


def loss_and_grad(coefs: np.ndarray, workload: np.ndarray) -> tuple[float, np.ndarray]:
    """``mean_error(c) · ‖c‖²`` (scale-free) and its gradient in ``c`` (float64, exact).

    With ``β = C⁻¹a``, ``w_k = (n − k)/n`` and ``g = C⁻ᵀ(w ∘ β)``:
    ``∂E/∂c_j = −2 Σ_{k≥j} g_k β_{k−j}``.
    """
    n = workload.shape[0]
    bands = coefs.shape[0]
    beta = solve(coefs, workload)
    weights = (n - np.arange(n)) / n
    error = float(np.sum(weights * beta**2))
    g = solve_transposed(coefs, weights * beta)
    grad_error = -2.0 * _correlate(g, beta, bands)
    scale = float(np.dot(coefs, coefs))
    return error * scale, grad_error * scale + 2.0 * error * coefs


def max_participations(steps: int, min_sep: int, participations: int | None = None) -> int:
    """The most steps one example can join: ``ceil(steps / min_sep)``, capped."""
    k = -(-steps // min_sep)
    return k if participations is None else min(k, participations)


def minsep_sensitivity_squared(
    coefs: np.ndarray, steps: int, min_sep: int, participations: int | None = None
) -> float:
    """Squared L2 sensitivity of ``C`` under ``min_sep``-separated participation.

    For non-negative, non-increasing coefficients the worst case is ``k`` participations
    exactly ``min_sep`` apart from the first step (McKenna 2024, Theorem 2): the norm of the
    sum of those columns of ``C``.

    Raises:
        ValueError: a negative or increasing coefficient.
    """
    c = np.asarray(coefs, np.float64)[:steps]
    if np.any(c < 0) or np.any(np.diff(c) > 0):
        raise ValueError(
            "the min-separation sensitivity needs non-negative, non-increasing Toeplitz "
            f"coefficients, got {c[:8].tolist()}..."
        )
    column = _signal().lfilter(c, [1.0], _comb(steps, min_sep, participations))
    return float(column @ column)


def _comb(steps: int, min_sep: int, participations: int | None) -> np.ndarray:
    """The worst participation pattern: ones at ``0, min_sep, …`` (``k`` of them)."""
    comb = np.zeros(steps)
    comb[: max_participations(steps, min_sep, participations) * min_sep : min_sep] = 1.0
    return comb


def _correlate(g: np.ndarray, y: np.ndarray, taps: int) -> np.ndarray:
    """``[Σ_{t≥j} g_t y_{t−j} for j < taps]`` (``O(n · taps)``)."""
    n = g.shape[0]
    # einsum, not BLAS dot: no thread-pool start-up per product on a loaded machine
    return np.array([np.einsum("i,i->", g[j:], y[: n - j]) if j < n else 0.0 for j in range(taps)])


def rational_loss_and_grad(
    num: np.ndarray,
    den: np.ndarray,
    workload: np.ndarray,
    min_sep: int,
) -> tuple[float, float, np.ndarray, np.ndarray]:
    """Mean error × min-separation sensitivity² of ``C = P/Q`` and its gradient in ``(P, Q)``.

    ``C``'s first column is the power series of ``num(z) / den(z)`` (``num[0] = den[0] = 1``;
    a BLT with ``d`` buffers has ``d + 1`` taps each), so ``β = C⁻¹a = lfilter(Q, P, a)`` and
    the worst column sum ``s = C·comb = lfilter(P, Q, comb)`` are ``O(n · d)``, and so are
    their exact gradients (one transposed filter run each). ``C`` must be non-negative and
    non-increasing (a BLT with decays in (0, 1) and scales summing below 1 is).

    Returns:
        ``(error · sens², sens², ∂/∂num, ∂/∂den)`` (float64).
    """
    signal = _signal()
    n = workload.shape[0]
    taps_p, taps_q = num.shape[0], den.shape[0]
    weights = (n - np.arange(n)) / n
    beta = signal.lfilter(den, num, workload)
    error = float(np.sum(weights * beta**2))
    g = signal.lfilter([1.0], num, (weights * beta)[::-1])[::-1]  # P⁻ᵀ(w ∘ β)
    d_error_num = -2.0 * _correlate(g, beta, taps_p)
    d_error_den = 2.0 * _correlate(g, workload, taps_q)
    comb = _comb(n, min_sep, None)
    col = signal.lfilter(num, den, comb)
    sens2 = float(col @ col)
    h = signal.lfilter([1.0], den, col[::-1])[::-1]  # Q⁻ᵀ s
    d_sens_num = 2.0 * _correlate(h, comb, taps_p)
    d_sens_den = -2.0 * _correlate(h, col, taps_q)
    return (
        error * sens2,
        sens2,
        d_error_num * sens2 + error * d_sens_num,
        d_error_den * sens2 + error * d_sens_den,
    )


class StrategyProgress:
    """An optimiser's evaluation counter that shows a rich bar once it has run a second.

    Call it after each evaluation with the current loss; ``close()`` (or the ``with`` block)
    removes the bar. Without rich (the ``cli`` extra) it stays silent. Ctrl-C raised inside
    the optimiser propagates (the bar is closed on the way out).
    """

    def __init__(self, description: str, *, after: float = 1.0) -> None:
        self.description = description
        self.after = after
        self.start = time.perf_counter()
        self.evaluations = 0
        self._stack = ExitStack()
        self._advance: Any = None

    def __enter__(self) -> StrategyProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, loss: float) -> None:
        self.evaluations += 1
        if self._advance is None and time.perf_counter() - self.start > self.after:
            self._advance = self._open()
        if self._advance:
            self._advance(loss=float(loss))

    def _open(self) -> Any:
        from jaxwise._shared._progress import progress_bar

        try:
            return self._stack.enter_context(
                progress_bar(
                    True,
                    None,
                    self.description,
                    "evaluations, loss {loss:.6g}",
                    feature="the strategy optimiser",
                    completed=self.evaluations - 1,
                    loss=float("nan"),
                )
            )
        except ImportError:  # no rich: no bar
            return False

    def close(self) -> None:
        self._stack.close()
