"""The DP-SGD epoch: `make_epoch(dp_gradient_fn(...), PoissonSampler(b))`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxwise._shared._checks import check_bool, check_int
from jaxwise._shared._losses import ChunkSize, Method
from jaxwise.privacy._clipping._dpgradient import dp_gradient_fn
from jaxwise.privacy._mechanisms._protocols import ClipPolicy
from jaxwise.train import PoissonSampler, TrainEpoch, make_epoch

__all__ = ["make_dp_train_epoch"]


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
