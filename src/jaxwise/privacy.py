"""DP-SGD with an honest (ε, δ) from Google's ``dp-accounting``.

DP-SGD (Abadi et al., 2016) clips every example's gradient to norm ``C``,
sums, adds Gaussian noise ``N(0, σ²C²)`` once per (logical) batch and
divides by the batch size. The privacy guarantee comes from an accountant;
we never hand-roll one: :func:`epsilon` composes dp-accounting's
``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` over the steps with its RDP
(default) or PLD accountant.

**What the guarantee covers.** The accountant analyses *Poisson sampling*:
each example joins each batch independently with probability ``q``.
:func:`poisson_batch` implements exactly that, inside ``jit``, padded to a
fixed maximum size with a mask (one compiled shape). Fixed-size batches from
a shuffle (:func:`shuffled_batches`) are what most code uses, but the
Poisson analysis does not formally cover them; use them knowingly.

**Normalisation.** We divide the noisy sum by the *expected* batch size
``q·N`` under Poisson sampling — a data-independent constant, so the result
is post-processing of the privatised sum. Dividing by the *actual* size
would reveal how many examples were sampled (whether a given person is in
the batch), which the analysis does not account for. With fixed-size
batches the two are the same. Gradient accumulation over micro-batches adds
the clipped sums first and the noise **once** per logical batch
(:func:`dp_gradient_accumulated`), never per micro-batch.

References:
  Abadi et al., Deep Learning with Differential Privacy, CCS 2016,
  https://arxiv.org/abs/1607.00133

Example (MNIST-sized: 60,000 examples, batches of 256, 60 epochs):
    >>> round(epsilon(noise_multiplier=1.1, sample_rate=256 / 60000, steps=14062, delta=1e-5), 2)
    2.6
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxwise._checks import (
    check_array,
    check_callable,
    check_choice,
    check_float,
    check_int,
    check_key,
    check_probability,
)
from jaxwise.per_example import LossSingle, batch_size_of, check_clip_norm, clip_and_sum
from jaxwise.train import Gradients, ShuffleSampler, TrainEpoch, make_train_epoch

__all__ = [
    "add_dp_noise",
    "dp_gradient",
    "dp_gradient_accumulated",
    "epsilon",
    "make_dp_train_epoch",
    "PoissonSampler",
    "noise_multiplier_for",
    "poisson_batch",
    "shuffled_batches",
]


def _check_noise(noise_multiplier: Any) -> None:
    check_float(noise_multiplier, "noise_multiplier", min_value=0.0)


def _check_noise_scale(clip_norm: Any, noise_multiplier: Any) -> None:
    """Noise std ``σ·C`` must be finite: ``C = inf`` (no clipping) only without noise."""
    if float(noise_multiplier) > 0 and float(clip_norm) == float("inf"):
        raise ValueError(
            "`clip_norm` must be finite when `noise_multiplier` > 0 (the noise std is "
            "noise_multiplier * clip_norm)"
        )


def add_dp_noise(
    summed: Any, key: jax.Array, clip_norm: float, noise_multiplier: float, batch_size: Any
) -> Any:
    """``(summed + N(0, σ²C²)) / batch_size``: ONE normal draw over all parameters.

    The noise for every leaf comes from a single ``jax.random.normal`` of the
    total parameter count, sliced per leaf (no per-leaf key splitting, one
    random-bits kernel); entries are independent across and within leaves.

    Args:
      summed: the sum of clipped per-example gradients (a pytree of float arrays).
      key: a PRNG key.
      clip_norm: ``C``; noise_multiplier: ``σ``.
      batch_size: the denominator (the *expected* batch size under Poisson
        sampling, see the module notes).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> add_dp_noise({"w": jnp.ones(3)}, jax.random.key(0), 1.0, 0.0, 2)["w"].tolist()
        [0.5, 0.5, 0.5]
    """
    check_clip_norm(clip_norm)
    _check_noise(noise_multiplier)
    _check_noise_scale(clip_norm, noise_multiplier)
    check_key(key)
    check_float(batch_size, "batch_size", min_value=0.0, min_inclusive=False, allow_traced=True)
    for leaf in jax.tree.leaves(summed):
        check_array(leaf, "summed")
    leaves, treedef = jax.tree.flatten(summed)
    std = (
        float(noise_multiplier) * float(clip_norm) if noise_multiplier else 0.0
    )  # σ = 0: none, even with C = inf
    if not std or not leaves:
        return jax.tree.unflatten(treedef, [x / jnp.asarray(batch_size, x.dtype) for x in leaves])
    sizes = [int(np.size(x)) for x in leaves]
    dtypes = {jnp.dtype(x.dtype) for x in leaves}
    dtype = dtypes.pop() if len(dtypes) == 1 else jnp.dtype(jnp.float32)
    noise = jax.random.normal(key, (sum(sizes),), dtype)
    offsets = np.cumsum([0, *sizes])
    noisy = [
        (x + std * noise[a:b].reshape(x.shape).astype(x.dtype)) / jnp.asarray(batch_size, x.dtype)
        for x, a, b in zip(leaves, offsets[:-1], offsets[1:])
    ]
    return jax.tree.unflatten(treedef, noisy)


def dp_gradient(
    loss_single: LossSingle,
    params: Any,
    batch: tuple[Any, ...],
    key: jax.Array,
    clip_norm: float,
    noise_multiplier: float,
    chunk_size: int | str | None = None,
    method: str = "auto",
    mask: jax.Array | None = None,
    expected_batch_size: float | None = None,
) -> tuple[Any, jax.Array]:
    """The DP-SGD gradient of one batch: ``(noisy mean gradient, per-example norms)``.

    Args:
      loss_single: ``loss_single(params, *example) -> scalar``.
      params: the parameters.
      batch: a tuple of arrays with a leading example axis.
      key: PRNG key for the noise.
      clip_norm: ``C``; noise_multiplier: ``σ``.
      chunk_size, method: as in :func:`jaxwise.per_example.clip_and_sum`.
      mask: optional bool ``(B,)``: real examples of a padded Poisson batch.
      expected_batch_size: the denominator; default ``B`` (fixed-size
        batches). Pass ``q·N`` with Poisson batches.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> loss = lambda w, x: jnp.sum(w * x)
        >>> g, norms = dp_gradient(loss, jnp.ones(2), (jnp.asarray([[3.0, 4.0], [0.0, 1.0]]),),
        ...                        jax.random.key(0), clip_norm=1.0, noise_multiplier=0.0)
        >>> [round(v, 4) for v in g.tolist()], norms.tolist()
        ([0.3, 0.9], [5.0, 1.0])
    """
    if not isinstance(batch, tuple):
        raise TypeError(
            f"`batch` must be a tuple of arrays (e.g. (x, y)), got {type(batch).__name__}"
        )
    n = batch_size_of(batch)
    weights = None if mask is None else jnp.asarray(mask).astype(jnp.float32)
    summed, norms = clip_and_sum(
        loss_single,
        params,
        *batch,
        clip_norm=clip_norm,
        chunk_size=chunk_size,
        method=method,
        weights=weights,
    )
    denominator = n if expected_batch_size is None else expected_batch_size
    return add_dp_noise(summed, key, clip_norm, noise_multiplier, denominator), norms


def dp_gradient_accumulated(
    loss_single: LossSingle,
    params: Any,
    microbatches: tuple[Any, ...],
    key: jax.Array,
    clip_norm: float,
    noise_multiplier: float,
    expected_batch_size: float,
    mask: jax.Array | None = None,
    chunk_size: int | None = None,
    method: str = "auto",
) -> tuple[Any, jax.Array]:
    """DP-SGD over a logical batch split into micro-batches: noise added ONCE.

    ``microbatches`` has shape ``(M, m, …)`` per array (M micro-batches of m
    examples); ``mask`` ``(M, m)`` marks real examples. The clipped sums of
    all micro-batches are accumulated in a ``lax.scan``, then one noise draw
    is added and the total divided by ``expected_batch_size``. Adding noise
    per micro-batch (a common bug) would multiply the noise variance by M.

    Returns:
      ``(noisy mean gradient, norms (M, m))``.
    """
    if not isinstance(microbatches, tuple):
        raise TypeError(
            f"`microbatches` must be a tuple of arrays, got {type(microbatches).__name__}"
        )
    m = batch_size_of(microbatches, "microbatches")
    inner = jax.tree.leaves(microbatches)[0].shape[1]
    weights = (
        jnp.ones((m, inner), jnp.float32) if mask is None else jnp.asarray(mask).astype(jnp.float32)
    )
    if weights.shape != (m, inner):
        raise ValueError(f"`mask` must have shape ({m}, {inner}), got {weights.shape}")
    zero = jax.tree.map(jnp.zeros_like, params)

    def accumulate(total: Any, xs: tuple) -> tuple[Any, jax.Array]:
        micro, w = xs
        summed, norms = clip_and_sum(
            loss_single,
            params,
            *micro,
            clip_norm=clip_norm,
            chunk_size=chunk_size,
            method=method,
            weights=w,
        )
        return jax.tree.map(jnp.add, total, summed), norms

    total, norms = jax.lax.scan(accumulate, zero, (microbatches, weights))
    return add_dp_noise(total, key, clip_norm, noise_multiplier, expected_batch_size), norms


# --------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------


def poisson_batch(
    key: jax.Array, n: int, sample_rate: float, max_batch_size: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Poisson sampling inside ``jit``: ``(indices (max,), mask (max,), overflow)``.

    Each of the ``n`` examples is included independently with probability
    ``sample_rate``; the sampled indices are padded (with index 0, masked
    out) to ``max_batch_size`` so that every step has one compiled shape.
    ``overflow`` is True when more than ``max_batch_size`` were sampled (the
    extra ones are dropped, which the accountant does not model): choose
    ``max_batch_size`` several standard deviations above ``q·n``, e.g.
    ``q·n + 6·sqrt(q·n)``.

    Examples:
        >>> import jax
        >>> idx, mask, over = poisson_batch(jax.random.key(0), 1000, 0.05, 100)
        >>> idx.shape, 20 < int(mask.sum()) < 80, bool(over)
        ((100,), True, False)
    """
    check_probability(sample_rate, "sample_rate", open_low=True)
    check_int(max_batch_size, "max_batch_size", min_value=1)
    check_int(n, "n", min_value=1)
    check_key(key)
    chosen = jax.random.bernoulli(key, sample_rate, (n,))
    count = jnp.sum(chosen.astype(jnp.int32))
    (indices,) = jnp.nonzero(chosen, size=max_batch_size, fill_value=0)
    mask = jnp.arange(max_batch_size) < count
    return indices, mask, count > max_batch_size


def shuffled_batches(key: jax.Array, n: int, batch_size: int) -> jax.Array:
    """Fixed-size batches from one shuffle: indices ``(n // batch_size, batch_size)``, rest dropped.

    Not covered by the Poisson-sampling analysis of :func:`epsilon`.
    """
    check_int(n, "n", min_value=1)
    check_int(batch_size, "batch_size", min_value=1, max_value=n)
    check_key(key)
    steps = n // batch_size
    return jax.random.permutation(key, n)[: steps * batch_size].reshape(steps, batch_size)


# --------------------------------------------------------------------------
# Accounting (dp-accounting)
# --------------------------------------------------------------------------


def _check_accounting(sample_rate: float, steps: int, delta: float) -> None:
    check_probability(sample_rate, "sample_rate", open_low=True)
    check_int(steps, "steps", min_value=1)
    check_probability(delta, "delta", open_low=True, open_high=True)


def _accountant(kind: str) -> Any:
    import dp_accounting

    if kind == "rdp":
        return dp_accounting.rdp.RdpAccountant()
    if kind == "pld":
        return dp_accounting.pld.PLDAccountant()
    raise ValueError(f"`accountant` must be 'rdp' or 'pld', got {kind!r}")


def _event(noise_multiplier: float, sample_rate: float, steps: int) -> Any:
    import dp_accounting

    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            sample_rate, dp_accounting.GaussianDpEvent(noise_multiplier)
        ),
        int(steps),
    )


def epsilon(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str = "rdp"
) -> float:
    """ε of DP-SGD with Poisson sampling, from dp-accounting (RDP by default, ``"pld"`` optional).

    Args:
      noise_multiplier: σ (noise std / clip norm); 0 gives ε = inf.
      sample_rate: q = expected batch size / dataset size, in (0, 1].
      steps: number of noisy gradient steps.
      delta: δ in (0, 1), typically < 1 / dataset size.
      accountant: ``"rdp"`` or ``"pld"``.

    Examples:
        >>> epsilon(1.0, 0.01, 100, 1e-5) < epsilon(1.0, 0.01, 1000, 1e-5)
        True
    """
    _check_noise(noise_multiplier)
    _check_accounting(sample_rate, steps, delta)
    acc = _accountant(accountant)
    if noise_multiplier == 0:
        return float("inf")
    with _quiet_absl():  # dp-accounting logs orders it excludes; the result already says all
        acc.compose(_event(noise_multiplier, sample_rate, steps))
        return float(acc.get_epsilon(delta))


@contextlib.contextmanager
def _quiet_absl() -> Iterator[None]:
    """Hide absl's WARNING lines (dp-accounting's "failed to converge … excluding this order")."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def noise_multiplier_for(
    target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "rdp"
) -> float:
    """The smallest σ whose ε (Poisson-sampled Gaussian, ``steps`` steps) is ``<= target_epsilon``.

    Uses ``dp_accounting.calibrate_dp_mechanism`` (bisection). Raises
    ``ValueError`` if the target is unreachable with σ ≤ 1e4.

    Examples:
        >>> s = noise_multiplier_for(3.0, 1e-5, 256 / 60000, 10000)
        >>> round(epsilon(s, 256 / 60000, 10000, 1e-5), 2) <= 3.0
        True
    """
    import dp_accounting

    check_float(target_epsilon, "target_epsilon", min_value=0.0, min_inclusive=False)
    _check_accounting(sample_rate, steps, delta)
    _accountant(accountant)
    upper = 1e4
    if epsilon(upper, sample_rate, steps, delta, accountant) > target_epsilon:
        raise ValueError(
            f"`target_epsilon` {target_epsilon} is unreachable: even "
            f"noise_multiplier={upper:g} gives more "
            f"(sample_rate={sample_rate}, steps={steps}, delta={delta})"
        )
    return float(
        dp_accounting.calibrate_dp_mechanism(
            lambda: _accountant(accountant),
            lambda sigma: _event(sigma, sample_rate, steps),
            target_epsilon,
            delta,
            bracket_interval=dp_accounting.ExplicitBracketInterval(1e-3, upper),
            tol=1e-4,
        )
    )


# --------------------------------------------------------------------------
# A jitted DP-SGD epoch: a configuration of jaxwise.train.make_train_epoch
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DPConfig:
    """DP-SGD settings of :func:`make_dp_train_epoch`."""

    clip_norm: float
    noise_multiplier: float
    sampling: str
    batch_size: int
    chunk_size: int | None
    method: str


@dataclasses.dataclass(frozen=True)
class PoissonSampler:
    """Poisson sampling for :func:`jaxwise.train.make_train_epoch`: rate ``q = batch_size / n``.

    Each step draws its own batch with :func:`poisson_batch`, padded to a fixed width (the
    expected size plus six standard deviations, rounded up to a multiple of ``multiple``, e.g.
    the devices of a mesh) with a mask; ``round(n / batch_size)`` steps per epoch.

    Examples:
        >>> PoissonSampler(64).width(60000), PoissonSampler(64).steps(60000)
        (113, 938)
    """

    batch_size: int
    multiple: int = 1

    def __post_init__(self) -> None:
        check_int(self.batch_size, "batch_size", min_value=1)
        check_int(self.multiple, "multiple", min_value=1)

    def check(self, n: int) -> None:
        if self.batch_size > n:
            raise ValueError(
                f"`batch_size` {self.batch_size} is larger than the dataset ({n} examples)"
            )

    def steps(self, n: int) -> int:
        return max(1, int(round(n / self.batch_size)))

    def width(self, n: int) -> int:
        expected = self.batch_size
        cap = int(min(n, np.ceil(expected + 6 * np.sqrt(expected) + 1)))
        return -(-cap // self.multiple) * self.multiple

    def plan(self, key: jax.Array, step: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
        del step
        key, plan_key = jax.random.split(key)
        return jax.random.split(plan_key, self.steps(n)), key

    def draw(self, x: jax.Array, n: int) -> tuple[jax.Array, jax.Array, dict[str, Any]]:
        idx, mask, overflow = poisson_batch(x, n, self.batch_size / n, self.width(n))  # x: a key
        return idx, mask, {"overflow": overflow}


@dataclasses.dataclass(frozen=True)
class _DPShuffleSampler(ShuffleSampler):
    """Fixed-size batches from a ``jax.random.permutation``; ``overflow = False`` always."""

    def plan(self, key: jax.Array, step: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
        del step
        key, plan_key = jax.random.split(key)
        order = jax.random.permutation(plan_key, n)[: self.steps(n) * self.batch_size]
        return order.reshape(self.steps(n), self.batch_size), key

    def draw(self, x: jax.Array, n: int) -> tuple[jax.Array, None, dict[str, Any]]:
        del n
        return x, None, {"overflow": jnp.zeros((), bool)}


def _dp_gradient_fn(loss_single: LossSingle, config: DPConfig) -> Callable[..., Gradients]:
    """The plug-in gradient of a DP-SGD epoch: clipped, summed, noised once per batch."""

    def gradient(params: Any, model_state: Any, batch: Any, key: jax.Array, mask: Any) -> Gradients:
        if not isinstance(batch, tuple):
            raise TypeError(
                "`data` of a DP-SGD epoch must be a tuple of arrays (e.g. (x, y)), got "
                f"{type(batch).__name__}"
            )
        grads, norms = dp_gradient(
            loss_single,
            params,
            batch,
            key,
            config.clip_norm,
            config.noise_multiplier,
            chunk_size=config.chunk_size,
            method=config.method,
            mask=mask,
            expected_batch_size=float(config.batch_size),
        )
        real = jnp.ones(norms.shape, jnp.float32) if mask is None else mask.astype(jnp.float32)
        count = jnp.maximum(real.sum(), 1.0)
        metrics = {
            "grad_norm_mean": jnp.sum(norms * real) / count,
            "clipped_fraction": jnp.sum((norms > config.clip_norm).astype(jnp.float32) * real)
            / count,
            "batch_size": jnp.sum(real).astype(jnp.int32),
        }
        return Gradients(grads, None, model_state, None, metrics)

    return gradient


def make_dp_train_epoch(
    loss_single: LossSingle,
    optimizer: Any,
    batch_size: int,
    *,
    clip_norm: float,
    noise_multiplier: float,
    sampling: str = "poisson",
    chunk_size: int | None = None,
    method: str = "auto",
    mesh: Mesh | None = None,
    skip_nonfinite: bool = True,
    donate: bool = True,
) -> TrainEpoch:
    """A jitted DP-SGD epoch ``epoch(state, data) -> (state, metrics)`` over one ``lax.scan``.

    A configuration of :func:`jaxwise.train.make_train_epoch` (the one training loop): the
    DP gradient (:func:`dp_gradient`) and the sampler plug into it, so DP epochs get the NaN
    guard (a non-finite noisy gradient or update is skipped), the per-call donation audit and
    ``mesh`` (data parallelism; the padded batch width is rounded up to the devices).

    ``state`` is a :class:`jaxwise.train.TrainState`; ``data`` a tuple of arrays with a
    leading example axis. ``sampling="poisson"`` (what :func:`epsilon` analyses): each step
    samples with rate ``q = batch_size / N``, padded to a fixed maximum with a mask, ``round(1
    / q)`` steps per epoch; ``"shuffle"``: ``N // batch_size`` fixed-size batches. The noisy
    gradient goes through any jaxwise/Optax optimizer. Metrics per step: ``"grad_norm"`` (of
    the noisy gradient), ``"skipped"``, ``"grad_norm_mean"`` (pre-clip, real examples),
    ``"clipped_fraction"``, ``"batch_size"`` (actual) and ``"overflow"``.
    ``method`` picks the per-example clipping (:func:`dp_gradient`): ``"auto"`` (default)
    uses ghost clipping wherever the traced loss allows it, ``"vmap"``/``"chunked"``
    materialise per-example gradients.

    The returned :class:`jaxwise.train.TrainEpoch` has ``.steps_per_epoch(n)`` and
    ``.sample_rate(n)`` for the accountant, ``.config`` (a :class:`DPConfig`) and ``.jitted``
    (compiled under ``<loss_single's name>_train_epoch``).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from jaxwise import optim
        >>> from jaxwise.train import TrainState
        >>> def sq(w, x, y): return (jnp.dot(w, x) - y) ** 2
        >>> x = jax.random.normal(jax.random.key(0), (64, 3)); y = x @ jnp.asarray([1.0, -1.0, 0.5])
        >>> tx = optim.sgd(0.1)
        >>> epoch = make_dp_train_epoch(sq, tx, 16, clip_norm=10.0, noise_multiplier=0.5)
        >>> state, metrics = epoch(TrainState.create(jnp.zeros(3), tx, 0), (x, y))
        >>> epoch.steps_per_epoch(64), sorted(metrics)[:3], int(state.step)
        (4, ['batch_size', 'clipped_fraction', 'grad_norm'], 4)
    """
    check_callable(loss_single, "loss_single")
    check_clip_norm(clip_norm)
    _check_noise(noise_multiplier)
    _check_noise_scale(clip_norm, noise_multiplier)
    sampling = check_choice(sampling, "sampling", ("poisson", "shuffle"))
    batch_size = check_int(batch_size, "batch_size", min_value=1)
    config = DPConfig(
        float(clip_norm), float(noise_multiplier), sampling, batch_size, chunk_size, method
    )
    multiple = 1 if mesh is None else int(mesh.shape.get("data", 1))
    sampler: PoissonSampler | ShuffleSampler = _DPShuffleSampler(batch_size)
    if sampling == "poisson":
        sampler = PoissonSampler(batch_size, multiple)
    epoch = make_train_epoch(
        loss_single,
        optimizer,
        batch_size,
        gradient=_dp_gradient_fn(loss_single, config),
        sampler=sampler,
        mesh=mesh,
        skip_nonfinite=skip_nonfinite,
        donate=donate,
    )
    epoch.config = config
    return epoch
