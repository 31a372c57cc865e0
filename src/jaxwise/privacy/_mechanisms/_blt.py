"""Buffered linear Toeplitz (BLT) noise: correlated noise in a few decaying buffers.

A BLT strategy ``C`` is lower-triangular Toeplitz with ``C[0] = 1`` and
``C[k] = Σ_i ω_i θ_i^{k−1}`` (``k ≥ 1``; decays ``θ_i ∈ (0, 1)``, scales ``ω_i > 0``), so
``x = C⁻¹z`` streams with one buffer per decay: ``x_t = z_t − Σ_i ω_i s_i``,
``s_i ← θ_i s_i + x_t``. Memory is ``buffers · |params|`` whatever the number of steps, where
BandMF needs ``(bands − 1) · |params|``. BLT is not banded, so it is accounted without
amplification, as jax-privacy does: one Gaussian release whose sensitivity is ``C``'s under
``min_sep``-separated participation (we scale ``C`` to sensitivity 1, so the release is a
Gaussian with the gradient's noise multiplier σ).

References:
  Dvijotham et al., Efficient and near-optimal noise generation for streaming differential
  privacy, FOCS 2024, https://arxiv.org/abs/2404.16706
  McMahan et al., Hassle-free algorithm design for differentially private matrix
  mechanisms via buffered linear Toeplitz, 2024, https://arxiv.org/abs/2408.08868
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._shared._checks import check_float, check_int
from jaxwise._shared._extras import require
from jaxwise._typing import Grads, NoiseState, Params, PyTree
from jaxwise.privacy._mechanisms import _toeplitz

if TYPE_CHECKING:  # dp-accounting is the `privacy` extra
    from dp_accounting import DpEvent

__all__ = ["BLT", "BLTStrategy", "blt_strategy"]

MIN_BUFFERS, MAX_BUFFERS = 1, 4


class BLTStrategy(NamedTuple):
    """An optimised BLT strategy (float64) and its numbers.

    Attributes:
        decays: ``(buffers,)`` float64 ``θ_i`` in (0, 1).
        scales: ``(buffers,)`` float64 ``ω_i`` > 0 (``Σ ω_i < 1``, so ``C`` is non-increasing).
        steps: the number of steps ``n``.
        min_sep: the minimum separation of an example's participations.
        sensitivity: ``C``'s sensitivity under that participation (the noise is scaled by it).
        loss: the mean squared error of ``A C⁻¹ z`` times ``sensitivity²``.
        rmse: its square root (per unit of noise, strategy scaled to sensitivity 1).
        dpsgd_rmse: DP-SGD's RMSE with the same participation, un-amplified
            (``sqrt(k · (n + 1) / 2)`` for ``k`` participations).
    """

    decays: np.ndarray
    scales: np.ndarray
    steps: int
    min_sep: int
    sensitivity: float
    loss: float
    rmse: float
    dpsgd_rmse: float


def blt_coefs(decays: np.ndarray, scales: np.ndarray, steps: int) -> np.ndarray:
    """The first column of ``C`` (float64, ``steps`` entries)."""
    k = np.arange(steps - 1, dtype=np.float64)
    tail = (scales[None, :] * decays[None, :] ** k[:, None]).sum(axis=1)
    return np.concatenate([[1.0], tail])


def _unpack(u: np.ndarray, buffers: int) -> tuple[np.ndarray, np.ndarray]:
    """Decays and scales from the unconstrained ``u`` (complex ``u`` too: complex-step)."""
    decays = 1.0 / (1.0 + np.exp(-u[:buffers]))
    weights = np.exp(u[buffers : 2 * buffers] - np.real(u[buffers : 2 * buffers]).max())
    total = 1.0 / (1.0 + np.exp(-u[-1]))
    return decays, total * weights / weights.sum()


def blt_rational(decays: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``C(z) = 1 + z Σ ω_i / (1 − θ_i z) = P(z) / Q(z)``: ``(P, Q)``, ascending powers.

    ``Q = Π (1 − θ_i z)`` and ``P = Q + z Σ_i ω_i Π_{j≠i} (1 − θ_j z)`` (``buffers + 1``
    coefficients each, ``P[0] = Q[0] = 1``), so ``C⁻¹`` is the recurrence ``Q/P`` of order
    ``buffers`` and every product with ``C`` or ``C⁻¹`` costs ``O(n · buffers)``.
    """
    buffers = decays.shape[0]
    den = np.ones(1, dtype=decays.dtype)
    for theta in decays:
        den = np.convolve(den, np.array([1.0, -theta]))
    num = np.concatenate([den, np.zeros(1, den.dtype)]).astype(np.result_type(den, scales))
    for i in range(buffers):
        others = np.ones(1, dtype=decays.dtype)
        for j in range(buffers):
            if j != i:
                others = np.convolve(others, np.array([1.0, -decays[j]]))
        num[1 : buffers + 1] = num[1 : buffers + 1] + scales[i] * others
    return num[: buffers + 1], den


def _pack(u: np.ndarray, buffers: int) -> np.ndarray:
    num, den = blt_rational(*_unpack(u, buffers))
    return np.concatenate([num[1:], den[1:]])


def _jacobian(u: np.ndarray, buffers: int) -> np.ndarray:
    """``∂(P[1:], Q[1:]) / ∂u`` by complex-step differentiation (exact to rounding)."""
    h = 1e-30
    cols = []
    for i in range(u.shape[0]):
        du = u.astype(np.complex128)
        du[i] += 1j * h
        cols.append(np.imag(_pack(du, buffers)) / h)
    return np.stack(cols, axis=1)


def _loss_and_grad(
    u: np.ndarray, buffers: int, workload: np.ndarray, min_sep: int
) -> tuple[float, float, np.ndarray]:
    """Mean error × sensitivity² of the BLT ``u`` (``O(n · buffers)``), sens² and ∂/∂u."""
    num, den = blt_rational(*_unpack(u, buffers))
    with np.errstate(over="ignore", invalid="ignore"):
        loss, sens2, d_num, d_den = _toeplitz.rational_loss_and_grad(num, den, workload, min_sep)
    grad = _jacobian(u, buffers).T @ np.concatenate([d_num[1:], d_den[1:]])
    if not (np.isfinite(loss) and np.all(np.isfinite(grad))):
        return float("inf"), sens2, np.zeros_like(u)
    return loss, sens2, grad


@functools.lru_cache(maxsize=64)
def _optimise(buffers: int, steps: int, min_sep: int, momentum: float) -> BLTStrategy:
    optimize = require("scipy.optimize", extra="privacy", feature="blt_strategy")
    workload = _toeplitz.workload_coefs(steps, momentum)
    start = np.linspace(4.0, -1.0, buffers)  # decays from 0.98 down to 0.27
    u0 = np.concatenate([start, np.zeros(buffers), [0.0]])
    _toeplitz.solve(np.ones(1), np.ones(1))  # imports SciPy before the clock starts
    with _toeplitz.StrategyProgress(f"BLT({buffers}, {steps}) strategy") as progress:

        def fun(u: np.ndarray) -> tuple[float, np.ndarray]:
            loss, _, grad = _loss_and_grad(u, buffers, workload, min_sep)
            progress(loss)
            return loss, grad

        result = optimize.minimize(
            fun,
            u0,
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": 500, "ftol": 1e-13, "gtol": 1e-12},
        )
    decays, scales = _unpack(result.x, buffers)
    loss, sens2, _ = _loss_and_grad(result.x, buffers, workload, min_sep)
    k = _toeplitz.max_participations(steps, min_sep)
    dpsgd = k * _toeplitz.mean_error(np.ones(1), workload)
    return BLTStrategy(
        decays=decays,
        scales=scales,
        steps=steps,
        min_sep=min_sep,
        sensitivity=float(np.sqrt(sens2)),
        loss=float(loss),
        rmse=float(np.sqrt(loss)),
        dpsgd_rmse=float(np.sqrt(dpsgd)),
    )


def _check(buffers: Any, steps: Any, min_sep: Any, momentum: Any) -> tuple[int, int, int, float]:
    buffers = check_int(buffers, "buffers", min_value=MIN_BUFFERS, max_value=MAX_BUFFERS)
    steps = check_int(steps, "steps", min_value=1)
    min_sep = check_int(min_sep, "min_sep", min_value=1)
    momentum = check_float(momentum, "momentum", min_value=0.0, max_value=1.0, max_inclusive=False)
    return buffers, steps, min_sep, float(momentum)


def blt_strategy(
    buffers: int, steps: int, *, min_sep: int = 1, momentum: float = 0.0
) -> BLTStrategy:
    """The BLT strategy with ``buffers`` decays minimising ``loss`` (float64, L-BFGS-B).

    The loss is BandMF's (mean squared error of ``A C⁻¹ z``) times ``C``'s squared
    sensitivity when an example joins at most every ``min_sep`` steps (``ceil(steps /
    min_sep)`` times). Cached per arguments.

    Args:
        buffers: the number of buffers, 1 to 4.
        steps: the number of steps ``n``.
        min_sep: the minimum separation of an example's participations (the groups of a
            [`CyclicPoissonSampler`][jaxwise.privacy.CyclicPoissonSampler]).
        momentum: the workload's momentum in ``[0, 1)``.

    Returns:
        A [`BLTStrategy`][jaxwise.privacy.BLTStrategy].

    Raises:
        TypeError: a non-int count.
        ValueError: ``buffers`` outside 1..4, ``steps``/``min_sep`` < 1, a bad ``momentum``.

    Examples:
        >>> s = blt_strategy(2, 50, min_sep=10)
        >>> s.decays.shape, bool(s.rmse < s.dpsgd_rmse)
        ((2,), True)
    """
    return _optimise(*_check(buffers, steps, min_sep, momentum))


@dataclasses.dataclass(frozen=True)
class BLT:
    """BLT noise, a `NoiseMechanism` for ``dp_gradient_fn(noise=...)``.

    Step ``t`` adds ``sensitivity · (C⁻¹z)_t`` for the strategy of
    [`blt_strategy`][jaxwise.privacy.blt_strategy]``(buffers, steps, min_sep=...)``; the state
    holds one buffer per decay (a pytree like the parameters with a leading
    ``(buffers,)`` axis). Privacy needs an example to join at most once every ``min_sep``
    steps and at most ``ceil(steps / min_sep)`` times: train with
    ``CyclicPoissonSampler(batch_size, groups=min_sep)`` for ``steps`` steps and account
    with ``epsilon(..., mechanism=BLT(...))``.

    Attributes:
        buffers: the number of buffers, 1 to 4.
        steps: the number of training steps.
        min_sep: the minimum separation of an example's participations.
        momentum: the workload's momentum.

    Raises:
        TypeError: a non-int count.
        ValueError: ``buffers`` outside 1..4 or a count < 1.

    Examples:
        >>> import jax.numpy as jnp
        >>> blt = BLT(buffers=2, steps=20)
        >>> state = blt.init({"w": jnp.zeros(3)})
        >>> noise, state = blt.correlate(state, {"w": jnp.ones(3)})
        >>> state["buffers"]["w"].shape
        (2, 3)
    """

    buffers: int
    steps: int
    min_sep: int = 1
    momentum: float = 0.0

    def __post_init__(self) -> None:
        _check(self.buffers, self.steps, self.min_sep, self.momentum)

    @property
    def min_separation(self) -> int:
        """``min_sep``: the sensitivity assumes an example joins at most every ``min_sep`` steps.

        Returns:
            ``min_sep``.
        """
        return self.min_sep

    @property
    def strategy(self) -> BLTStrategy:
        """The optimised strategy (cached)."""
        return blt_strategy(self.buffers, self.steps, min_sep=self.min_sep, momentum=self.momentum)

    def init(self, params: Params) -> dict[str, PyTree]:
        """Zero buffers: ``{"buffers": tree like params with a leading (buffers,) axis}``.

        Args:
            params: the parameters (a pytree of arrays).

        Returns:
            The state.
        """
        lead = self.buffers
        return {
            "buffers": jax.tree.map(lambda p: jnp.zeros((lead, *jnp.shape(p)), p.dtype), params)
        }

    def correlate(self, state: NoiseState, z: Grads) -> tuple[PyTree, PyTree]:
        """This step's noise ``sensitivity · (C⁻¹z)_t`` and the new state.

        Args:
            state: the state of `init` (or of the previous step).
            z: this step's standard-normal pytree like the parameters.

        Returns:
            ``(noise like z, new state)``.
        """
        s = self.strategy
        shape = (self.buffers,)

        def one(zi: jax.Array, buf: jax.Array) -> tuple[jax.Array, jax.Array]:
            # Σ ω_i s_i as a contraction over the buffer axis (a dot, not a reduce: XLA:CPU
            # runs a reduction over the leading axis element by element), at HIGHEST: a TPU's
            # default precision would round the buffered noise to bfloat16
            inner = jnp.tensordot(
                jnp.asarray(s.scales, buf.dtype), buf, axes=1, precision=jax.lax.Precision.HIGHEST
            )
            x = zi - inner.astype(zi.dtype)
            decays = jnp.asarray(s.decays, buf.dtype).reshape(shape + (1,) * zi.ndim)
            new = decays * buf + x[None].astype(buf.dtype)
            return x * jnp.asarray(s.sensitivity, zi.dtype), new

        pairs = jax.tree.map(one, z, state["buffers"])
        noise, buffers = jax.tree.transpose(
            jax.tree.structure(z), jax.tree.structure((0, 0)), pairs
        )
        return noise, {"buffers": buffers}

    def dp_event(
        self, release: Callable[[int], DpEvent], *, sample_rate: float, steps: int
    ) -> DpEvent:
        """One release over the whole run: the noise is scaled to sensitivity 1 under the
        participation (no amplification, as jax-privacy's ``SingleReleaseTrainingAccountant``).

        Args:
            release: ``release(k)``: the event of one release covering ``k`` participations
                (``ceil(steps / min_sep)`` here).
            sample_rate: unused (no amplification).
            steps: the noisy steps (at most ``self.steps``).

        Returns:
            ``release(ceil(steps / min_sep))``.

        Raises:
            ValueError: more ``steps`` than the strategy was built for.
        """
        del sample_rate
        if int(steps) > self.steps:
            raise ValueError(
                f"`steps` {steps} exceeds the {self.steps} steps the BLT strategy was built "
                "for: its sensitivity only covers those"
            )
        return release(-(-int(steps) // self.min_sep))
