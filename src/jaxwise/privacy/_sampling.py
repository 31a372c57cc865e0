"""Poisson sampling (what the accountant analyses), padded to one shape; shuffled batches."""

from __future__ import annotations

import jax

from jaxwise._shared._checks import check_int, check_key
from jaxwise._shared._random import poisson_batch

__all__ = ["poisson_batch", "shuffled_batches"]


def shuffled_batches(key: jax.Array, n: int, batch_size: int) -> jax.Array:
    """Fixed-size batches from one shuffle: indices ``(n // batch_size, batch_size)``, rest dropped.

    Not covered by the Poisson-sampling analysis of `epsilon`.

    Args:
        key: a PRNG key.
        n: the dataset size.
        batch_size: examples per batch, in ``[1, n]``.

    Returns:
        ``(n // batch_size, batch_size)`` int32 indices.

    Raises:
        TypeError: a bad ``key`` or a non-int size.
        ValueError: a size out of range.

    Examples:
        >>> import jax
        >>> shuffled_batches(jax.random.key(0), 10, 4).shape
        (2, 4)
    """
    check_int(n, "n", min_value=1)
    check_int(batch_size, "batch_size", min_value=1, max_value=n)
    check_key(key)
    steps = n // batch_size
    return jax.random.permutation(key, n)[: steps * batch_size].reshape(steps, batch_size)
