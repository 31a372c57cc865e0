"""Float64 NumPy algebra of lower-triangular Toeplitz strategies (BandMF, BLT).

A lower-triangular Toeplitz ``n × n`` matrix is given by its first column ``c`` (``c[0]`` on the
diagonal). Products and inverses of such matrices are again lower-triangular Toeplitz, so
everything here works on coefficient vectors: ``solve(c, a)`` is ``C⁻¹a`` (a linear
recurrence, SciPy's ``lfilter``), and the workload ``A`` of the mechanism is the prefix sum
(all ones) or the prefix sum of SGD-with-momentum (``(1 − βᵏ⁺¹)/(1 − β)``).

References:
  Choquette-Choo et al., (Amplified) Banded Matrix Factorization: A unified approach to
  private training, NeurIPS 2023, https://arxiv.org/abs/2306.08153
  McKenna, Scaling up the Banded Matrix Factorization Mechanism for Differentially Private
  ML, 2024, https://arxiv.org/abs/2405.15913 (Theorem 2: min-separation sensitivity)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxwise._extras import require

__all__ = [
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
    beta = solve(_padded(coefs, n), workload)
    return float(np.sum((n - np.arange(n)) * beta**2) / n)


def _padded(coefs: np.ndarray, n: int) -> np.ndarray:
    """``coefs`` cut or zero-padded to length ``n`` (float64)."""
    out = np.zeros(n)
    m = min(n, len(coefs))
    out[:m] = np.asarray(coefs, np.float64)[:m]
    return out


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
    grad_error = np.array([-2.0 * np.dot(g[j:], beta[: n - j]) for j in range(bands)])
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
    c = _padded(np.asarray(coefs, np.float64), steps)
    if np.any(c < 0) or np.any(np.diff(c) > 0):
        raise ValueError(
            "the min-separation sensitivity needs non-negative, non-increasing Toeplitz "
            f"coefficients, got {c[:8].tolist()}..."
        )
    k = max_participations(steps, min_sep, participations)
    column = np.zeros(steps)
    for p in range(k):
        start = p * min_sep
        column[start:] += c[: steps - start]
    return float(column @ column)
