"""Noise as an Optax privatizer around the one noising step of jaxwise.

`jaxwise.privacy._mechanisms._noise.noise_step` is the noising of every DP path: ONE standard-normal
draw over all parameters as a flat vector (its length padded to a multiple of 8), turned
into this step's noise by a `NoiseMechanism` (``None``: the draw itself, DP-SGD; BandMF and
BLT correlate it with their buffers), scaled by ``σ·C`` and added to the clipped sum.
`privatizer` wraps it as an ``optax.GradientTransformation`` in jax-privacy's form
(``gaussian_privatizer``, ``matrix_factorization_privatizer``: the key and the mechanism's
state in the transformation's state), so it composes as ``optax.chain(privatizer,
optimizer)`` after any clipped sum (jaxwise's, or jax-privacy's ``clipped_grad``).
`dp_gradient_fn` and `dp_gradient` call `noise_step` with the program's step key and then
divide by the expected batch size; `add_dp_noise` and `dp_gradient_accumulated` too.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax

from jaxwise._shared._checks import check_key
from jaxwise._shared._losses import check_clip_norm
from jaxwise._typing import PyTree
from jaxwise.privacy._mechanisms._noise import (
    check_noise,
    check_noise_scale,
    flat_zeros,
    noise_step,
)
from jaxwise.privacy._mechanisms._protocols import NoiseMechanism, check_dp_events

__all__ = ["PrivatizerState", "privatizer"]


class PrivatizerState(NamedTuple):
    """The state of a `privatizer`.

    Attributes:
        key: the key of the next step's draw (a typed PRNG key).
        noise: the mechanism's state (``()`` for DP-SGD), on the flat draw's shape.
    """

    key: jax.Array
    noise: PyTree


def privatizer(
    noise: NoiseMechanism | None = None,
    *,
    noise_multiplier: float,
    clip_norm: float,
    key: jax.Array | int,
) -> optax.GradientTransformationExtraArgs:
    """The mechanism's noise added to a clipped sum, as an Optax transformation.

    ``update(summed, state)`` returns ``summed + σ·C·noise``: DP-SGD (``noise=None``) adds
    ``N(0, (σ·C)²)`` to every coordinate, as jax-privacy's ``gaussian_privatizer(stddev=σ·C)``;
    `BandMF` and `BLT` add their correlated noise, their buffers in the transformation's
    state. Each update splits the state's key and draws ONE flat standard-normal vector over
    all parameters; the state advances on every update, finite input or not. Compose it
    after a clipped *sum* and before the division by the expected batch size:
    ``optax.chain(privatizer(...), optax.scale(1 / expected_batch_size), optimizer)``. Its ε is
    the accountant's for the same ``σ``, mechanism and sampler
    ([`epsilon`][jaxwise.privacy.epsilon], [`plan_epsilon`][jaxwise.privacy.plan_epsilon]).

    Args:
        noise: a [`NoiseMechanism`][jaxwise.privacy.NoiseMechanism], or ``None`` (DP-SGD).
        noise_multiplier: ``σ >= 0``.
        clip_norm: ``C > 0``: the bound on one example's contribution to the sum.
        key: a PRNG key (or an int seed) for the noise.

    Returns:
        An ``optax.GradientTransformationExtraArgs`` whose state is a `PrivatizerState`.

    Raises:
        TypeError: a bad ``key``, ``noise`` or number type; a mechanism whose ``dp_event``
            returns no ``DpEvent``.
        ValueError: ``σ < 0``, ``C <= 0``, or ``C = inf`` with noise.

    References:
        Abadi et al., Deep Learning with Differential Privacy, 2016,
        https://arxiv.org/abs/1607.00133; jax-privacy's ``noise_addition`` privatizers.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> tx = optax.chain(privatizer(noise_multiplier=0.0, clip_norm=1.0, key=0),
        ...                  optax.scale(1 / 4))
        >>> summed = {"w": jnp.full(3, 2.0)}
        >>> out, state = tx.update(summed, tx.init(summed))
        >>> out["w"].tolist()
        [0.5, 0.5, 0.5]
    """
    check_noise(noise_multiplier)
    check_clip_norm(clip_norm)
    check_noise_scale(clip_norm, noise_multiplier)
    if noise is not None and not isinstance(noise, NoiseMechanism):
        raise TypeError(
            "`noise` must be None or a jaxwise.privacy.NoiseMechanism (init, correlate, "
            f"min_separation, dp_event), got {type(noise).__name__}"
        )
    check_dp_events(noise, None)
    if isinstance(key, int) and not isinstance(key, bool):
        key = jax.random.key(key)
    check_key(key)
    sigma = float(noise_multiplier)
    std = sigma * float(clip_norm) if sigma else 0.0
    first_key: jax.Array = key  # pyright: ignore[reportAssignmentType]  # checked: a key

    def init(params: PyTree) -> PrivatizerState:
        state = () if noise is None else noise.init(flat_zeros(params))
        return PrivatizerState(first_key, state)

    def update(
        updates: PyTree, state: Any, params: PyTree = None, **extra_args: Any
    ) -> tuple[PyTree, PrivatizerState]:
        del params, extra_args
        next_key, step_key = jax.random.split(state.key)
        noisy, noise_state, _ = noise_step(
            updates, step_key, state.noise, noise=noise, std=std, noisy=bool(sigma)
        )
        return noisy, PrivatizerState(next_key, noise_state)

    return optax.GradientTransformationExtraArgs(init, update)
