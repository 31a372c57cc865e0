"""Banded matrix factorization (BandMF): the optimised strategy and its streaming noise.

DP-SGD adds independent noise ``z_t`` every step, so the model (a prefix sum of the noisy
gradients, ``A``) carries the error ``A z``. The matrix mechanism factors ``A = B C``, privatises
``C g`` and releases ``B (C g + z) = A g + A C⁻¹ z``: the step adds ``(C⁻¹z)_t`` instead of
``z_t``. With ``C`` lower-triangular banded Toeplitz (``bands`` coefficients, unit norm) every
example's contribution in one step touches ``bands`` rows of ``C g``, so an example that joins
at most once every ``bands`` steps (`CyclicPoissonSampler`) keeps DP-SGD's amplified
accounting at sample rate ``bands · B / n`` over ``ceil(T / bands)`` compositions
(Choquette-Choo et al. 2023), while the error of ``A C⁻¹ z`` is lower than ``A z``'s.

The step computes ``x_t = (z_t − Σ_{j≥1} c_j x_{t−j}) / c_0`` from the last ``bands − 1``
outputs, kept as buffers like the parameters (memory ``(bands − 1) · |params|``).
``bands = 1`` is DP-SGD exactly (``C = I``).

References:
  Choquette-Choo et al., (Amplified) Banded Matrix Factorization: A unified approach to
  private training, NeurIPS 2023, https://arxiv.org/abs/2306.08153
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
from jaxwise.privacy._mechanisms._protocols import poisson_event

if TYPE_CHECKING:  # dp-accounting is the `privacy` extra
    from dp_accounting import DpEvent

__all__ = ["BandMF", "BandMFStrategy", "bandmf_strategy", "column_norms"]


class BandMFStrategy(NamedTuple):
    """An optimised banded Toeplitz strategy ``C`` (float64) and its numbers.

    Attributes:
        coefs: ``(bands,)`` float64, the first column of ``C`` (unit L2 norm, non-increasing).
        steps: the number of steps ``n`` it was optimised for.
        bands: the number of bands ``b``.
        momentum: the workload's momentum (0: prefix sums of SGD).
        loss: the mean squared error of ``A C⁻¹ z`` per unit noise (``= rmse²``), the
            quantity jax-privacy's ``toeplitz.loss`` computes.
        rmse: its square root, per unit of noise and per-participation sensitivity 1.
        dpsgd_rmse: the same for DP-SGD (``C = I``).
        sensitivity: the L2 sensitivity of the streamed, column-normalised ``C̃`` when an
            example joins every ``bands`` steps (``ceil(n / bands)`` participations), without
            amplification: ``sqrt(ceil(n / bands))`` (unit columns that do not overlap).
    """

    coefs: np.ndarray
    steps: int
    bands: int
    momentum: float
    loss: float
    rmse: float
    dpsgd_rmse: float
    sensitivity: float


def _check_bands(steps: Any, bands: Any) -> tuple[int, int]:
    steps = check_int(steps, "steps", min_value=1)
    bands = check_int(bands, "bands", min_value=1)
    if bands > steps:
        raise ValueError(f"`bands` must be at most `steps` ({steps}), got {bands}")
    return steps, bands


def _initial(bands: int) -> np.ndarray:
    """The optimal infinite-horizon max-error coefficients ``binom(2k, k) / 4^k``, truncated."""
    out = np.ones(bands)
    for k in range(1, bands):
        out[k] = out[k - 1] * (2 * k - 1) / (2 * k)
    return out


def _finite_loss_and_grad(coefs: np.ndarray, workload: np.ndarray) -> tuple[float, np.ndarray]:
    """`_toeplitz.loss_and_grad`, ``(inf, 0)`` where the unstable recurrence overflows."""
    with np.errstate(over="ignore", invalid="ignore"):
        loss, grad = _toeplitz.loss_and_grad(coefs, workload)
    if not (np.isfinite(loss) and np.all(np.isfinite(grad))):
        return float("inf"), np.zeros_like(coefs)
    return loss, grad


@functools.lru_cache(maxsize=64)
def _optimise(steps: int, bands: int, momentum: float) -> BandMFStrategy:
    workload = _toeplitz.workload_coefs(steps, momentum)
    coefs = _initial(bands)
    if bands > 1:
        optimize = require("scipy.optimize", extra="privacy", feature="bandmf_strategy")
        # scale-free: c_0 is fixed at 1 and the others kept in [0, 1]; a line-search trial
        # whose recurrence C⁻¹ blows up (e.g. c_1 > c_0) is an infinite loss, not an overflow
        _toeplitz.solve(np.ones(1), np.ones(1))  # imports SciPy before the clock starts
        with _toeplitz.StrategyProgress(f"BandMF({bands}, {steps}) strategy") as progress:

            def fun(c: np.ndarray) -> tuple[float, np.ndarray]:
                loss, grad = _finite_loss_and_grad(c, workload)  # O(steps · bands)
                progress(loss)
                return loss, grad

            result = optimize.minimize(
                fun,
                coefs,
                jac=True,
                method="L-BFGS-B",
                bounds=[(1.0, 1.0)] + [(0.0, 1.0)] * (bands - 1),
                options={"maxiter": 2000, "ftol": 1e-16, "gtol": 1e-13},
            )
        coefs = np.asarray(result.x, np.float64)
    coefs = coefs / np.linalg.norm(coefs)
    loss = _toeplitz.mean_error(coefs, workload)
    # the streamed C is column-normalised (`column_norms`): every column has norm 1 and the
    # columns of participations `bands` apart do not overlap, so the worst case is the count
    sens2 = float(_toeplitz.max_participations(steps, bands))
    return BandMFStrategy(
        coefs=coefs,
        steps=steps,
        bands=bands,
        momentum=momentum,
        loss=loss,
        rmse=float(np.sqrt(loss)),
        dpsgd_rmse=float(np.sqrt(_toeplitz.mean_error(np.ones(1), workload))),
        sensitivity=float(np.sqrt(sens2)),
    )


def bandmf_strategy(steps: int, bands: int, *, momentum: float = 0.0) -> BandMFStrategy:
    """The banded Toeplitz strategy minimising the mean squared error of the model's noise.

    Optimises the ``bands`` coefficients of ``C`` in float64 with L-BFGS (SciPy) for the
    workload ``A`` of ``steps`` steps: the prefix sum (SGD) or, with ``momentum = β``, the
    prefix sum of heavy-ball momentum (first column ``(1 − βᵏ⁺¹)/(1 − β)``). The objective is
    ``mean_i ‖(A C⁻¹)_i‖² · ‖c‖²`` (scale-free; the result is scaled to ``‖c‖ = 1``, so every
    column of ``C`` has norm at most 1). Data-independent: it costs no privacy. Results are
    cached per ``(steps, bands, momentum)``.

    Args:
        steps: the number of training steps ``n`` (>= 1).
        bands: the number of bands ``b``, in ``[1, steps]``; 1 is DP-SGD (``C = I``).
        momentum: the workload's momentum β in ``[0, 1)``.

    Returns:
        A [`BandMFStrategy`][jaxwise.privacy.BandMFStrategy].

    Raises:
        TypeError: a non-int ``steps``/``bands`` or a non-float ``momentum``.
        ValueError: ``bands <= 0``, ``bands > steps`` or ``momentum`` outside ``[0, 1)``.
        ImportError: SciPy is not installed (``pip install 'jaxwise[privacy]'``).

    Examples:
        >>> s = bandmf_strategy(100, 4)
        >>> s.coefs.shape, bool(s.rmse < s.dpsgd_rmse), round(float(s.coefs @ s.coefs), 6)
        ((4,), True, 1.0)
    """
    steps, bands = _check_bands(steps, bands)
    momentum = check_float(momentum, "momentum", min_value=0.0, max_value=1.0, max_inclusive=False)
    return _optimise(steps, bands, float(momentum))


@dataclasses.dataclass(frozen=True)
class BandMF:
    """Banded matrix-factorization noise, a `NoiseMechanism` for ``dp_gradient_fn(noise=...)``.

    Step ``t`` adds ``(C̃⁻¹ z)_t`` for the column-normalised strategy ``C̃ = C D⁻¹`` of
    [`bandmf_strategy`][jaxwise.privacy.bandmf_strategy]``(steps, bands)`` (``D`` the
    column norms of the banded Toeplitz ``C``: 1 but for the last ``bands − 1`` columns, see
    `column_norms`): ``x_t = ‖c[:steps − t]‖ · (C⁻¹z)_t``, as
    jax-privacy's ``ColumnNormalizedBanded`` and Choquette-Choo et al. (2023) stream it.
    The state holds the last ``bands − 1`` values of ``C⁻¹z`` (a pytree like the parameters
    with a leading ``(bands − 1,)`` axis, in the parameters' dtypes) and the step's position
    in its block of ``steps`` steps. ``bands = 1`` returns ``z`` itself (DP-SGD, bit for
    bit). Privacy needs an example to join at most once every ``bands`` steps: train with
    ``CyclicPoissonSampler(batch_size, groups=bands)`` (or more groups) and account with
    ``epsilon(..., mechanism=BandMF(...))``. Running more than ``steps`` steps stays private:
    the strategy starts afresh every ``steps`` steps (a block-diagonal ``C̃``, every column a
    unit vector, bands never overlapping); it is only no longer optimal.

    Attributes:
        bands: the number of bands ``b`` (>= 1, <= ``steps``).
        steps: the number of steps the strategy is optimised for.
        momentum: the workload's momentum (see `bandmf_strategy`).

    Raises:
        TypeError: a non-int ``bands``/``steps``.
        ValueError: ``bands <= 0`` or ``bands > steps``.

    Examples:
        >>> import jax.numpy as jnp
        >>> mf = BandMF(bands=2, steps=10)
        >>> state = mf.init({"w": jnp.zeros(3)})
        >>> noise, state = mf.correlate(state, {"w": jnp.ones(3)})
        >>> state["buffers"]["w"].shape, bool(noise["w"][0] > 1.0)
        ((1, 3), True)
    """

    bands: int
    steps: int
    momentum: float = 0.0

    def __post_init__(self) -> None:
        _check_bands(self.steps, self.bands)
        check_float(self.momentum, "momentum", min_value=0.0, max_value=1.0, max_inclusive=False)

    @property
    def min_separation(self) -> int:
        """``bands``: the accounting assumes an example joins at most once every ``bands`` steps.

        Returns:
            ``bands``.
        """
        return self.bands

    @property
    def strategy(self) -> BandMFStrategy:
        """The optimised strategy (cached)."""
        return bandmf_strategy(self.steps, self.bands, momentum=self.momentum)

    def init(self, params: Params) -> NoiseState:
        """Zero buffers: ``{"buffers": like params, a leading (bands − 1,) axis; "index"}``.

        Args:
            params: the parameters (a pytree of arrays).

        Returns:
            The state (``()`` for ``bands = 1``).
        """
        if self.bands == 1:
            return ()
        lead = self.bands - 1
        return {
            "buffers": jax.tree.map(lambda p: jnp.zeros((lead, *jnp.shape(p)), p.dtype), params),
            "index": jnp.zeros((), jnp.int32),
        }

    def correlate(self, state: NoiseState, z: Grads) -> tuple[PyTree, PyTree]:
        """This step's noise ``‖c[:steps − t]‖ · (C⁻¹z)_t`` and the new state.

        The buffers are a ring: the step at position ``t`` of its block (``state["index"]``)
        writes ``(C⁻¹z)_t`` at slot ``t mod (bands − 1)``, so a step reads the buffers once
        and writes one slot.

        Args:
            state: the state of `init` (or of the previous step).
            z: this step's standard-normal pytree like the parameters.

        Returns:
            ``(noise like z, new state)``.
        """
        if self.bands == 1:
            return z, state
        coefs = self.strategy.coefs
        lead = self.bands - 1
        pos = state["index"]  # the step's position in its block of `steps` steps
        # slot j holds x_{t-k} with k = ((pos − j − 1) mod lead) + 1; a lag reaching before
        # the block's start (k > pos) reads nothing: past `steps` the strategy starts afresh
        k = (pos - jnp.arange(lead, dtype=jnp.int32) - 1) % lead + 1
        tail = jnp.where(k <= pos, jnp.asarray(coefs[1:], jnp.float32)[k - 1], 0.0)
        # column `pos` of the column-normalised C: its norm ‖c[:steps − pos]‖ (1 but at the end)
        norms = jnp.asarray(column_norms(coefs), jnp.float32)
        scale = norms[jnp.clip(self.steps - 1 - pos, 0, lead)]
        slot = pos % lead

        def one(zi: jax.Array, buf: jax.Array) -> tuple[jax.Array, jax.Array]:
            # at HIGHEST: a TPU's default precision would round the buffered noise to bfloat16
            inner = jnp.tensordot(
                tail.astype(buf.dtype), buf, axes=1, precision=jax.lax.Precision.HIGHEST
            )
            x = (zi - inner.astype(zi.dtype)) / jnp.asarray(coefs[0], zi.dtype)
            # x is made before the ring write reads it: were the contraction fused into the
            # write, that fusion would read the buffers it writes and could not update them
            # in place (a copy of all of them a step: 10 ms of a 49M model's TPU step)
            x = jax.lax.optimization_barrier(x)
            new = jax.lax.dynamic_update_index_in_dim(buf, x.astype(buf.dtype), slot, 0)
            return x * scale.astype(zi.dtype), new

        pairs = jax.tree.map(one, z, state["buffers"])
        outer = jax.tree.structure(z)
        noise, buffers = jax.tree.transpose(outer, jax.tree.structure((0, 0)), pairs)
        return noise, {"buffers": buffers, "index": (pos + 1) % self.steps}

    def dp_event(
        self, release: Callable[[int], DpEvent], *, sample_rate: float, steps: int
    ) -> DpEvent:
        """Amplified BandMF: ``ceil(steps / bands)`` Poisson-sampled releases (Choquette-Choo
        et al. 2023), an example joining at most once every ``bands`` steps.

        Args:
            release: ``release(k)``, one release's event (``k = 1`` here).
            sample_rate: the rate of a step's group.
            steps: the noisy steps.

        Returns:
            ``SelfComposedDpEvent(PoissonSampledDpEvent(q, release(1)), ceil(steps / bands))``.
        """
        return poisson_event(release(1), sample_rate, -(-int(steps) // self.bands))


def column_norms(coefs: np.ndarray) -> np.ndarray:
    """``‖c[:m]‖`` for ``m = 1 … bands`` (float64): the norms of ``C``'s last columns.

    The column ``j`` of the ``n × n`` banded Toeplitz ``C`` holds ``c[:min(bands, n − j)]``:
    norm 1 (``‖c‖ = 1``) but for the last ``bands − 1`` columns. Dividing those by their
    norms (Choquette-Choo et al. 2023; jax-privacy's ``ColumnNormalizedBanded``) makes every
    column a unit vector, so the step ``t`` adds ``‖c[:n − t]‖ · (C⁻¹z)_t``: less noise in
    the last ``bands − 1`` steps at the same sensitivity.

    Args:
        coefs: ``(bands,)`` the strategy's unit-norm coefficients.

    Returns:
        ``(bands,)``: entry ``m`` is ``‖c[:m + 1]‖``; the last is exactly 1.
    """
    c = np.asarray(coefs, np.float64)
    out = np.sqrt(np.cumsum(c**2))
    out[-1] = 1.0
    return out
