"""The keyed shuffle of every epoch: distinct 32-bit hashes whose ``argsort`` is a permutation.

Shared by `jaxwise.train.ShuffleSampler` (one permutation per epoch) and `jaxwise.label_errors`'
fold models (each model's allowed rows first, in the order of their hashes). A hash, not
``jax.random.permutation``: it costs ``O(n)`` elementwise work, keyed by the state's key and
step, so an epoch's order is a pure function of the state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["shuffle_hash"]


def _mix(x: jax.Array) -> jax.Array:
    """The "lowbias32" integer mixer: a bijection of uint32 with strong avalanche."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def shuffle_hash(key: jax.Array, step: jax.Array, n: int) -> jax.Array:
    """Distinct keyed 32-bit hashes of ``0..n-1`` (uint32 ``(n,)``); ``argsort`` is a shuffle.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> h = shuffle_hash(jax.random.key(0), jnp.int32(3), 1000)
        >>> len(set(h.tolist()))
        1000
    """
    data = jax.random.key_data(key).reshape(-1).astype(jnp.uint32)
    seed = _mix(data[0] ^ _mix(data[-1] ^ _mix(jnp.asarray(step).astype(jnp.uint32))))
    index = jnp.arange(n, dtype=jnp.uint32)
    return _mix(_mix(index + seed) ^ data[-1])
