"""Poisson sampling (what the accountant analyses), padded to one shape; shuffled batches."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxwise._checks import (
    check_int,
    check_key,
    check_probability,
)
from jaxwise._random import flat_draw

__all__ = ["poisson_batch", "shuffled_batches"]


def poisson_batch(
    key: jax.Array, n: int, sample_rate: float, max_batch_size: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Poisson sampling inside ``jit``: ``(indices (max,), mask (max,), overflow)``.

    Each of the ``n`` examples is included independently with probability
    ``sample_rate``; the sampled indices come first, padded to ``max_batch_size``
    (so that every step has one compiled shape) with the out-of-range index ``n``,
    masked out: a gather with ``mode="fill"`` (as `jaxwise.train.make_train_epoch`
    does) reads zeros there, never a real row, so a NaN or inf in any example can
    only affect the steps that sample it.
    ``overflow`` is True when more than ``max_batch_size`` were sampled (the
    extra ones are dropped, which the accountant does not model): choose
    ``max_batch_size`` several standard deviations above ``q·n``, e.g.
    ``q·n + 12·sqrt(q·n)``.

    Args:
        key: a PRNG key.
        n: the dataset size.
        sample_rate: ``q`` in (0, 1].
        max_batch_size: the padded width.

    Returns:
        ``(indices (max_batch_size,) int32, mask (max_batch_size,) bool, overflow () bool)``.

    Raises:
        TypeError: a bad ``key`` or a non-int size.
        ValueError: ``sample_rate`` outside (0, 1], or a size < 1.

    Examples:
        >>> import jax
        >>> idx, mask, over = poisson_batch(jax.random.key(0), 1000, 0.05, 100)
        >>> idx.shape, 20 < int(mask.sum()) < 80, bool(over), bool((idx[~mask] == 1000).all())
        ((100,), True, False, True)
    """
    check_probability(sample_rate, "sample_rate", open_low=True)
    check_int(max_batch_size, "max_batch_size", min_value=1)
    check_int(n, "n", min_value=1)
    check_key(key)
    chosen = flat_draw(lambda k, shape: jax.random.bernoulli(k, sample_rate, shape), key, n)
    count = jnp.sum(chosen.astype(jnp.int32))
    (indices,) = jnp.nonzero(chosen, size=max_batch_size, fill_value=n)
    mask = jnp.arange(max_batch_size) < count
    return indices, mask, count > max_batch_size


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
