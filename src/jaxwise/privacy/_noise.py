"""DP noise and the DP-SGD gradient (clip, sum, noise once, divide by the expected size)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._checks import (
    check_array,
    check_float,
    check_key,
)
from jaxwise.per_example import LossSingle, batch_size_of, check_clip_norm, clip_and_sum

__all__ = ["add_dp_noise", "dp_gradient", "dp_gradient_accumulated"]


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
