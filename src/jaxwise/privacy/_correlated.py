"""The noising step of a DP gradient with a noise mechanism (DP-SGD, BandMF, BLT).

`add_correlated_noise` is `add_dp_noise` with the standard normal ``z`` (drawn exactly as
there: one flat ``jax.random.normal`` sliced per leaf) passed through a mechanism's
``correlate`` before it is scaled by ``σ·C`` and added: the piece ``dp_gradient_fn(...,
noise=...)`` runs each step. ``noise=None`` and ``BandMF(bands=1)`` are DP-SGD bit for bit.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise.privacy._bandmf import BandMF
from jaxwise.privacy._blt import BLT

__all__ = ["add_correlated_noise"]


def _standard_normal(summed: Any, key: jax.Array) -> Any:
    """``z`` like ``summed``: one normal draw of the total size, sliced per leaf."""
    leaves, treedef = jax.tree.flatten(summed)
    sizes = [int(np.size(x)) for x in leaves]
    dtypes = {jnp.dtype(x.dtype) for x in leaves}
    dtype = dtypes.pop() if len(dtypes) == 1 else jnp.dtype(jnp.float32)
    flat = jax.random.normal(key, (sum(sizes),), dtype)
    offsets = np.cumsum([0, *sizes])
    parts = [flat[a:b].reshape(x.shape) for x, a, b in zip(leaves, offsets[:-1], offsets[1:])]
    return jax.tree.unflatten(treedef, parts)


def add_correlated_noise(
    summed: Any,
    key: jax.Array,
    state: Any,
    *,
    noise: BandMF | BLT | None,
    clip_norm: float | jax.Array,
    noise_multiplier: float,
    batch_size: float,
) -> tuple[Any, Any]:
    """``((summed + σ·C·noise) / batch_size, new mechanism state)``.

    Args:
        summed: the sum of clipped per-example gradients (a pytree of float arrays).
        key: this step's noise key.
        state: the mechanism's state (``()`` for ``noise=None``).
        noise: ``None`` (independent Gaussian) or a mechanism.
        clip_norm: ``C`` (a float, or a traced scalar from an adaptive clip policy).
        noise_multiplier: σ.
        batch_size: the divisor (the expected batch size).

    Returns:
        ``(noisy gradient like summed, new state)``.
    """
    leaves, treedef = jax.tree.flatten(summed)
    if not noise_multiplier or not leaves:
        scaled = [x / jnp.asarray(batch_size, x.dtype) for x in leaves]
        return jax.tree.unflatten(treedef, scaled), state
    z = _standard_normal(summed, key)
    if noise is not None:
        z, state = noise.correlate(state, z)
    if isinstance(clip_norm, (int, float)):
        std: Any = float(noise_multiplier) * float(clip_norm)
    else:
        std = jnp.asarray(noise_multiplier, jnp.float32) * clip_norm
    noisy = [
        (x + (std * e.astype(x.dtype)).astype(x.dtype)) / jnp.asarray(batch_size, x.dtype)
        for x, e in zip(leaves, jax.tree.leaves(z))
    ]
    return jax.tree.unflatten(treedef, noisy), state
