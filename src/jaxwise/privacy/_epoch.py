"""Poisson sampling and the DP-SGD epoch: `make_epoch(dp_gradient_fn(...), PoissonSampler(b))`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxwise._checks import check_bool, check_int
from jaxwise._losses import ChunkSize, Method
from jaxwise.buckets import plan_buckets
from jaxwise.privacy._dpgradient import dp_gradient_fn
from jaxwise.privacy._mechanism import ClipPolicy
from jaxwise.privacy._sampling import poisson_batch
from jaxwise.train import TrainEpoch, make_epoch

__all__ = ["PoissonSampler", "make_dp_train_epoch"]


@dataclasses.dataclass(frozen=True)
class PoissonSampler:
    """Poisson sampling, a `jaxwise.train.Sampler`: rate ``q = batch_size / n``.

    Each step draws its own batch with `poisson_batch`: ``X ~ Binomial(n, q)`` real
    examples, padded with a mask to at most ``width(n)`` rows (the expected size plus twelve
    standard deviations, rounded up to a multiple of ``multiple``, e.g. the devices of a
    mesh); ``round(n / batch_size)`` steps per epoch.

    Padded rows cost a real row's work, so a step does not run at ``width(n)``: it runs at
    the smallest of ``widths(n)`` that holds its ``X`` examples, ``buckets`` padded widths
    chosen by [`plan_buckets`][jaxwise.buckets.plan_buckets] from the binomial distribution
    of ``X`` (the expected padding is minimised exactly; the largest width is ``width(n)``,
    almost never used, so its size costs compile time and memory, not run time). With 5
    buckets a step at ``batch_size = 64`` costs about 1.07 expected batches. The accounting
    is unchanged: every example is still included with probability ``q``; only a step with
    more than ``width(n)`` examples is truncated, with probability
    ``overflow_probability(n)`` (about 1e-25 at ``batch_size = 64``), see the privacy guide.

    Attributes:
        batch_size: the expected batch size, >= 1.
        multiple: the padded width is a multiple of it, >= 1.
        buckets: how many padded widths the steps run at (1 to 16).

    Raises:
        TypeError: a field is not an int.
        ValueError: a field is < 1.

    Examples:
        >>> PoissonSampler(64).width(60000), PoissonSampler(64).steps(60000)
        (161, 938)
        >>> PoissonSampler(64).widths(60000)
        (60, 67, 74, 86, 161)
        >>> f"{PoissonSampler(64).overflow_probability(60000):.1e}"
        '7.9e-25'
    """

    batch_size: int
    multiple: int = 1
    buckets: int = 5

    def __post_init__(self) -> None:
        check_int(self.batch_size, "batch_size", min_value=1)
        check_int(self.multiple, "multiple", min_value=1)
        check_int(self.buckets, "buckets", min_value=1, max_value=16)

    @property
    def poisson_sampled(self) -> bool:
        """``True``: every example joins each step's batch independently (the amplification by
        sampling that `epoch_epsilon` accounts for holds).

        Returns:
            ``True``.
        """
        return True

    @property
    def min_separation(self) -> int:
        """1: an example may join two consecutive steps (what the DP-SGD accountant assumes).

        Returns:
            1.
        """
        return 1

    def check(self, n: int) -> None:
        """``ValueError`` if the batch size exceeds the ``n`` examples.

        Args:
            n: the dataset size.

        Raises:
            ValueError: ``batch_size > n``.
        """
        if self.batch_size > n:
            raise ValueError(
                f"`batch_size` {self.batch_size} is larger than the dataset ({n} examples)"
            )

    def sample_rate(self, n: int) -> float:
        """``q = batch_size / n``: each example's probability of joining a batch.

        Args:
            n: the dataset size.

        Returns:
            The sampling rate.
        """
        return self.batch_size / n

    def steps(self, n: int) -> int:
        """Steps per epoch, ``round(n / batch_size)``.

        Args:
            n: the dataset size.

        Returns:
            The steps per epoch, >= 1.
        """
        return max(1, int(round(n / self.batch_size)))

    def width(self, n: int) -> int:
        """The largest padded batch width: expected size + 12 standard deviations, rounded up.

        Args:
            n: the dataset size.

        Returns:
            The width, at most ``n`` before rounding up to ``multiple``.
        """
        expected = self.batch_size
        cap = int(min(n, np.ceil(expected + 12 * np.sqrt(expected) + 1)))
        return self._round(cap)

    def _round(self, width: int) -> int:
        return -(-width // self.multiple) * self.multiple

    def widths(self, n: int) -> tuple[int, ...]:
        """The padded widths of the steps: ``buckets`` of them, the last one ``width(n)``.

        Args:
            n: the dataset size.

        Returns:
            The widths, increasing.
        """
        cap = self.width(n)
        pmf = _binomial_pmf(n, self.batch_size / n, min(cap, n))
        cdf = np.cumsum(pmf) / pmf.sum()
        quantiles = np.searchsorted(cdf, (np.arange(_QUANTILES) + 0.5) / _QUANTILES)
        planned = plan_buckets([*quantiles.tolist(), cap], self.buckets)
        return tuple(sorted({min(self._round(w), cap) for w in planned}))

    def overflow_probability(self, n: int) -> float:
        """``P(X > width(n))`` for ``X ~ Binomial(n, q)``: a step's chance of truncation.

        Args:
            n: the dataset size.

        Returns:
            The probability (0.0 when ``width(n) >= n``).
        """
        cap = self.width(n)
        if cap >= n:
            return 0.0
        # beyond 40 standard deviations above the mean the terms are below 1e-300
        upper = min(n, cap + 40 * int(np.sqrt(self.batch_size)) + 40)
        return float(_binomial_pmf(n, self.batch_size / n, upper)[cap + 1 :].sum())

    def plan(self, key: jax.Array, step: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
        """One sampling key per step of the epoch, and the state's next key.

        Args:
            key: the state's key.
            step: the state's step counter (unused).
            n: the dataset size.

        Returns:
            ``(keys, next_key)``: one sampling key per step, and the state's next key.
        """
        del step
        key, plan_key = jax.random.split(key)
        return jax.random.split(plan_key, self.steps(n)), key

    def draw(self, x: jax.Array, n: int) -> tuple[jax.Array, jax.Array, dict[str, Any]]:
        """One step's Poisson batch: ``(indices, mask, {"overflow": ...})``.

        Args:
            x: the step's sampling key.
            n: the dataset size.

        Returns:
            ``(indices (width,), mask (width,), {"overflow": bool scalar})``.
        """
        idx, mask, overflow = poisson_batch(x, n, self.batch_size / n, self.width(n))  # x: a key
        return idx, mask, {"overflow": overflow}


_QUANTILES = 2000  # the binomial distribution as a sample of equally likely quantiles


def _binomial_pmf(n: int, q: float, upper: int) -> np.ndarray:
    """``P(X = k)`` for ``k = 0..upper``, ``X ~ Binomial(n, q)``, in float64 (log-gamma form)."""
    k = np.arange(upper + 1, dtype=np.float64)
    if q >= 1.0:
        return (k == n).astype(np.float64)
    lgamma = np.vectorize(math.lgamma, otypes=[np.float64])
    log_choose = math.lgamma(n + 1.0) - lgamma(k + 1.0) - lgamma(n - k + 1.0)
    return np.exp(log_choose + k * np.log(q) + (n - k) * np.log1p(-q))


def make_dp_train_epoch(
    loss: Callable[..., Any],
    batch_size: int,
    *,
    clip_norm: float | ClipPolicy,
    noise_multiplier: float,
    method: Method = "auto",
    chunk_size: ChunkSize = None,
    model_state: bool = False,
    freeze_model_state: bool = False,
) -> TrainEpoch:
    """A jitted DP-SGD epoch: ``make_epoch(dp_gradient_fn(loss, ...), PoissonSampler(batch_size))``.

    The DP gradient ([`dp_gradient_fn`][jaxwise.privacy.dp_gradient_fn]) and Poisson sampling
    ([`PoissonSampler`][jaxwise.privacy.PoissonSampler]) composed by
    [`make_epoch`][jaxwise.train.make_epoch] (the one training loop), so DP epochs get the NaN
    guard (a non-finite noisy gradient or update is skipped), the per-call donation audit and
    the state's optimizer; compose them yourself for a mesh, a sampler or a noise mechanism.

    ``state`` is a [`TrainState`][jaxwise.train.TrainState]; ``data`` any pytree (tuple,
    dict, dataclass) whose leaves share a leading example axis. Metrics per step:
    ``"grad_norm"`` (of the noisy gradient), ``"skipped"``, ``"grad_norm_mean"`` (pre-clip,
    real examples), ``"clipped_fraction"``, ``"batch_size"`` (actual), ``"overflow"`` and
    ``"width"``.

    With ``model_state=True`` the loss is ``loss(params, model_state, example) -> (loss,
    new_model_state)`` and the state's ``model_state`` is carried from step to step: RNG
    streams and counters advance every step (every example's dropout mask differs, see
    [`dp_gradient`][jaxwise.privacy.dp_gradient]); state computed from the examples
    (BatchNorm's running statistics) is refused with a ``ValueError`` naming it on the first
    call (``freeze_model_state=True`` runs BatchNorm of adapted models in inference mode
    from the given statistics instead).

    Args:
        loss: ``loss(params, example) -> scalar`` for ONE example (``data``'s structure, the
            leading axis removed); with ``model_state=True``, ``loss(params, model_state,
            example) -> (scalar, new_model_state)``.
        batch_size: the expected batch size ``q·N`` of Poisson sampling.
        clip_norm: ``C`` (or a [`ClipPolicy`][jaxwise.privacy.ClipPolicy]).
        noise_multiplier: ``σ``: the noise std is ``σ·C``.
        method: the per-example clipping: ``"auto"`` (default) uses ghost clipping wherever
            the traced loss allows it, ``"vmap"``/``"chunked"`` materialise per-example
            gradients (see [`clip_and_sum`][jaxwise.per_example.clip_and_sum]).
        chunk_size: as in [`clip_and_sum`][jaxwise.per_example.clip_and_sum].
        model_state: the loss takes and returns the model state (``TrainState.model_state``).
        freeze_model_state: run BatchNorm layers of adapted models in inference mode.

    Returns:
        A [`TrainEpoch`][jaxwise.train.TrainEpoch]; the accountant reads
            ``epoch.sampler.sample_rate(n)``, ``epoch.steps_per_epoch(n)`` and
            ``epoch.gradient.noise_multiplier``.

    Raises:
        TypeError: ``loss`` is not callable, or a bad option type.
        ValueError: a bad ``clip_norm``, ``noise_multiplier``, ``method``, ``chunk_size`` or
            ``batch_size``; on the first call, model state (or a layer) that mixes examples.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from jaxwise import optim
        >>> from jaxwise.train import TrainState
        >>> def sq(w, example): return (jnp.dot(w, example["x"]) - example["y"]) ** 2
        >>> x = jax.random.normal(jax.random.key(0), (64, 3)); y = x @ jnp.asarray([1.0, -1.0, 0.5])
        >>> epoch = make_dp_train_epoch(sq, 16, clip_norm=10.0, noise_multiplier=0.5)
        >>> state = TrainState.create(jnp.zeros(3), optim.sgd(0.1), 0)
        >>> state, metrics = epoch(state, {"x": x, "y": y})
        >>> epoch.steps_per_epoch(64), sorted(metrics)[:3], int(state.step)
        (4, ['batch_size', 'clipped_fraction', 'grad_norm'], 4)
    """
    check_bool(model_state, "model_state")
    gradient = dp_gradient_fn(
        loss,
        clip_norm=clip_norm,
        noise_multiplier=noise_multiplier,
        method=method,
        chunk_size=chunk_size,
        takes_model_state=model_state,
        freeze_model_state=freeze_model_state,
    )
    return make_epoch(gradient, PoissonSampler(check_int(batch_size, "batch_size", min_value=1)))
