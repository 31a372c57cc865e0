"""One helper for flat random draws: round the length up where the compiler is faster for it.

`padded_length` is a layout (the DP noise vector's length, on every backend); `draw_length` is
the length a draw is generated at: padded where ``padded_draws`` is on
(`jaxwise._shared._backends.REWRITES`: XLA:CPU), exact elsewhere. Values never depend on it.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxwise._shared._backends import rewrite_on
from jaxwise._shared._checks import check_int, check_key, check_probability

__all__ = ["draw_length", "flat_draw", "padded_length", "poisson_batch"]

_MULTIPLE = 8


def padded_length(n: int) -> int:
    """``n`` rounded up to a multiple of 8: a length XLA:CPU's elementwise loops run fast on.

    Args:
        n: a length, >= 0.

    Returns:
        The smallest multiple of 8 that is >= ``n``.

    Examples:
        >>> padded_length(67331), padded_length(8)
        (67336, 8)
    """
    return -(-n // _MULTIPLE) * _MULTIPLE


def draw_length(n: int, backend: str | None = None) -> int:
    """The length to generate a draw of ``n`` values at: `padded_length` where it is faster.

    Args:
        n: a length, >= 0.
        backend: the platform (``"cpu"``, ``"tpu"``, ...), or ``None`` for the one traced for
            (`jaxwise._shared._backends.current_backend`).

    Returns:
        ``padded_length(n)`` where the ``padded_draws`` rewrite is on for ``backend``, else
        ``n``.

    Examples:
        >>> draw_length(67331, "cpu"), draw_length(67331, "tpu")
        (67336, 67331)
    """
    return padded_length(n) if rewrite_on("padded_draws", backend) else n


def flat_draw(
    draw: Callable[[jax.Array, tuple[int]], jax.Array],
    key: jax.Array,
    n: int,
    *,
    backend: str | None = None,
) -> jax.Array:
    """``draw(key, (m,))[:n]`` with ``m`` = `draw_length` ``(n)``: a multiple of 8 on CPU.

    JAX's default (partitionable) Threefry derives element ``i`` from the key and the counter
    ``i`` alone, so the first ``n`` values are those of ``draw(key, (n,))``, bit for bit; but
    XLA:CPU generates an odd-length draw about 2.3x slower than an even one (67,331 normals:
    32 ms vs 14 ms for 36 draws), which was most of a small model's DP-SGD step.

    Args:
        draw: ``draw(key, shape) -> array``, e.g. ``lambda k, s: jax.random.normal(k, s)``.
        key: the PRNG key.
        n: the length wanted, >= 0.
        backend: the platform whose choice applies, or ``None`` for the one traced for.

    Returns:
        ``(n,)``: the draw's first ``n`` values.

    Examples:
        >>> import jax
        >>> flat_draw(lambda k, s: jax.random.normal(k, s), jax.random.key(0), 5).shape
        (5,)
    """
    padded = draw_length(n, backend)
    out = draw(key, (padded,))
    return out if padded == n else out[:n]


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
