"""The materialising paths: per-example gradients by ``vmap``, whole-batch or in chunks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._shared._checks import check_int
from jaxwise._shared._losses import (
    DEFAULT_MEMORY_BUDGET,
    LossFn,
    batch_size_of,
    check_loss,
    check_params,
    clip_factor,
)
from jaxwise._typing import PyTree
from jaxwise.optim import global_norm
from jaxwise.per_example._ghost import round_operand

P = TypeVar("P")

_MAPPED = (None, 0)  # params shared, the batch mapped over its leading axis


def per_example_grads(loss: LossFn, params: P, batch: PyTree) -> P:
    """Gradients of every example: a pytree like ``params`` with a leading batch axis.

    ``vmap(grad(loss), in_axes=(None, 0))``: the parameters are shared, only the batch is
    mapped (never the default ``in_axes=0``, which would map the parameters too). Memory
    ``B × P``; see [`per_example_grad_norms`][jaxwise.per_example.per_example_grad_norms]
    and [`clip_and_sum`][jaxwise.per_example.clip_and_sum] for cheaper paths.

    Args:
        loss: ``loss(params, example) -> scalar`` for ONE example.
        params: shared parameters, any pytree of float arrays.
        batch: the examples, any pytree (tuple, dict, dataclass) whose leaves share a leading
            example axis of size ``B``; ``loss`` receives it with that axis removed.

    Returns:
        A pytree like ``params`` whose leaves have a leading axis ``B``.

    Raises:
        TypeError: ``loss`` is not callable, or a leaf of ``params`` or ``batch`` is not an array.
        ValueError: the leaves of ``batch`` do not share their leading dimension.

    Examples:
        >>> import jax.numpy as jnp
        >>> x = jnp.asarray([[1.0, 2.0], [3.0, 4.0]])
        >>> g = per_example_grads(lambda w, x: jnp.sum(w * x), jnp.ones(2), x)
        >>> g.tolist()
        [[1.0, 2.0], [3.0, 4.0]]
    """
    check_loss(loss)
    check_params(params)
    batch_size_of(batch)
    return jax.vmap(jax.grad(loss), in_axes=_MAPPED)(params, batch)


def _norm_single(loss: LossFn) -> Callable[[Any, Any], jax.Array]:
    def norm(params: Any, example: Any) -> jax.Array:
        return global_norm(jax.grad(loss)(params, example))

    return norm


def stored(grads: Any, bits: int | None) -> Any:
    """Per-example gradients in the narrowest container that holds their values at ``bits``.

    At 8 significand bits (a TPU's default matmul precision) every float32 leaf becomes
    bfloat16: the ``m × P`` kept gradients move half the bytes, and the norm and the clipped
    sum both read the same stored values, so each released contribution ``f·g̃`` still has norm
    ``≤ C`` (the norm is of ``g̃`` itself). Any other ``bits`` (``None``: exact; 11: TF32)
    keeps them as they are.

    The values are rounded with ``lax.reduce_precision`` before the cast: XLA may compute a
    reader of ``g.astype(bfloat16).astype(float32)`` from the unrounded ``g`` (excess precision,
    on by default), and the TPU lane caught the norms 2e-4 off the stored values that way; a
    ``reduce_precision`` is never removed, so every reader sees the stored values.

    Examples:
        >>> stored(jnp.ones(2), 8).dtype, stored(jnp.ones(2), None).dtype
        (dtype(bfloat16), dtype('float32'))
    """
    if bits != 8:
        return grads

    def keep(g: jax.Array) -> jax.Array:
        if g.dtype != jnp.float32:
            return g
        return round_operand(g, 8).astype(jnp.bfloat16)

    return jax.tree.map(keep, grads)


def clip_factors(
    loss: LossFn,
    params: Any,
    batch: Any,
    weights: jax.Array,
    clip_norm: float,
    bits: int | None = None,
) -> tuple[Any, jax.Array, jax.Array]:
    """``(per-example gradients (m, …), norms (m,), clip factors (m,))`` of one micro-batch.

    The gradients are kept in their `stored` container (bfloat16 at ``bits=8``); the norms
    are taken from those stored values (accumulated in float32), so each example's released
    contribution ``f_i·g̃_i`` has norm at most ``C`` whatever precision formed ``g̃_i``. The
    factor of a weight-0 row is 0.
    """
    grads = stored(jax.vmap(jax.grad(loss), in_axes=_MAPPED)(params, batch), bits)
    sq = sum(
        jnp.sum(jnp.square(g.astype(jnp.float32)).reshape(g.shape[0], -1), axis=1)
        for g in jax.tree.leaves(grads)
    )
    norms = jnp.sqrt(jnp.asarray(sq))
    factor = jnp.where(weights != 0, clip_factor(norms, clip_norm) * weights, 0.0)
    return grads, norms, factor


def _clipped_sum_chunk(
    loss: LossFn,
    params: Any,
    batch: Any,
    weights: jax.Array,
    clip_norm: float,
    bits: int | None,
) -> tuple[Any, jax.Array]:
    """Clipped sum of one micro-batch: its per-example gradients, kept; their norms; their
    ``f``-weighted sum (`clip_factors`). One backward pass (``vmap`` of ``grad``), no second
    weighted one.

    The ``m × P`` per-example gradients are read by the norm (a reduction XLA may fuse into
    their producer) and by the weighted sum. Rows of weight 0 are selected out
    (``jnp.where``), never multiplied by 0: NaN or inf in padding changes nothing.
    """
    grads, norms, factor = clip_factors(loss, params, batch, weights, clip_norm, bits)
    live = weights != 0

    def weighted(g: jax.Array) -> jax.Array:
        f = factor.reshape(-1, *([1] * (g.ndim - 1)))
        keep = live.reshape(f.shape)
        return jnp.sum(jnp.where(keep, g.astype(jnp.float32) * f, 0.0), axis=0)

    summed = jax.tree.map(weighted, grads)
    return jax.tree.map(lambda s, p: s.astype(jnp.result_type(p)), summed, params), norms


def _chunked(batch: Any, chunk: int) -> tuple[Any, jax.Array, int]:
    """Batch as ``(n_chunks, chunk, …)`` (padded with example 0), and the real-example mask."""
    n = batch_size_of(batch)
    n_chunks = -(-n // chunk)
    pad = n_chunks * chunk - n

    def reshape(x: jax.Array) -> jax.Array:
        if pad:
            x = jnp.concatenate([x, jnp.broadcast_to(x[:1], (pad, *x.shape[1:]))], axis=0)
        return x.reshape(n_chunks, chunk, *x.shape[1:])

    mask = (jnp.arange(n_chunks * chunk) < n).reshape(n_chunks, chunk)
    return jax.tree.map(reshape, batch), mask, n


def vmap_norms(loss: LossFn, params: Any, batch: Any, chunk_size: int | None) -> jax.Array:
    """Per-example norms by ``vmap``, all at once or ``chunk_size`` at a time in a ``lax.scan``."""
    n = batch_size_of(batch)
    norm = _norm_single(loss)
    if chunk_size is None or chunk_size >= n:
        return jax.vmap(norm, in_axes=_MAPPED)(params, batch)
    chunks, _, n = _chunked(batch, chunk_size)

    def one_chunk(_: None, chunk: Any) -> tuple[None, jax.Array]:
        return None, jax.vmap(norm, in_axes=_MAPPED)(params, chunk)

    _, norms = jax.lax.scan(one_chunk, None, chunks)
    return norms.reshape(-1)[:n]


def vmap_clip_and_sum(
    loss: LossFn,
    params: Any,
    batch: Any,
    clip_norm: float,
    w: jax.Array,
    chunk_size: int | None,
    bits: int | None = None,
    chunk_sum: Callable[[Any, Any, jax.Array], tuple[Any, jax.Array]] | None = None,
) -> tuple[Any, jax.Array]:
    """Clipped sum from per-example gradients, all at once or ``chunk_size`` at a time
    (micro-batches accumulated in a ``lax.scan`` carry); one backward pass per example.
    ``bits``: the matmul operands' significand bits (`stored`). ``chunk_sum(params, batch,
    weights) -> (sum, norms)`` replaces the dense per-chunk sum (`._sparse.clipped_sum_fn`:
    embedding tables kept sparse)."""
    n = batch_size_of(batch)

    def dense_sum(p: Any, b: Any, cw: jax.Array) -> tuple[Any, jax.Array]:
        return _clipped_sum_chunk(loss, p, b, cw, clip_norm, bits)

    one = chunk_sum or dense_sum
    if chunk_size is None or chunk_size >= n:
        return one(params, batch, w)
    chunks, mask, n = _chunked(batch, chunk_size)
    padded = jnp.concatenate([w, jnp.zeros((mask.size - n,), w.dtype)]).reshape(mask.shape)
    chunk_weights = jnp.where(mask, padded, 0.0)
    zero = jax.tree.map(jnp.zeros_like, params)

    def one_chunk(total: Any, xs: tuple) -> tuple[Any, jax.Array]:
        chunk, cw = xs
        summed, norms = one(params, chunk, cw)
        return jax.tree.map(jnp.add, total, summed), norms

    total, norms = jax.lax.scan(one_chunk, zero, (chunks, chunk_weights))
    return total, norms.reshape(-1)[:n]


def auto_chunk_size(
    loss: LossFn, params: PyTree, batch: PyTree, *, memory_budget: int = DEFAULT_MEMORY_BUDGET
) -> int:
    """The largest power-of-two chunk whose compiled temporary memory fits ``memory_budget`` bytes.

    Compiles the chunked norm computation for candidate chunk sizes
    (``jit(...).lower(...).compile().memory_analysis().temp_size_in_bytes``,
    binary search, a few compilations) — do it once per model and batch
    shape, not per step.

    Args:
        loss: ``loss(params, example) -> scalar`` for ONE example.
        params: shared parameters, any pytree of float arrays.
        batch: the examples, any pytree whose leaves share a leading example axis ``B``
            (arrays or ``jax.ShapeDtypeStruct``s: only shapes and dtypes are used).
        memory_budget: bytes of compiled temporary memory allowed.

    Returns:
        A chunk size between 1 and ``B``: a power of two, or ``B`` when everything fits.

    Raises:
        TypeError: ``loss`` is not callable or ``memory_budget`` is not an int.
        ValueError: ``memory_budget`` < 1, or the batch leaves do not share ``B``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> loss = lambda w, x: jnp.sum(jnp.tanh(x @ w))
        >>> w, x = jnp.ones((256, 256)), jnp.ones((64, 256))
        >>> auto_chunk_size(loss, w, x, memory_budget=2**30)  # everything fits
        64

        The answer is the backend's compiler's: XLA:TPU fuses this small program into no
        temporary memory at all (any budget fits 64), XLA:CPU keeps the per-example gradients:

        >>> with jax.default_device(jax.devices("cpu")[0]):  # nothing fits: one at a time
        ...     auto_chunk_size(loss, w, x, memory_budget=1)
        1
    """
    check_loss(loss)
    check_params(params)
    n = batch_size_of(batch)
    check_int(memory_budget, "memory_budget", min_value=1)
    spec = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), (params, batch)
    )

    def temp_bytes(chunk: int) -> int:
        fn = jax.jit(lambda p, b: vmap_norms(loss, p, b, chunk))
        analysis = fn.lower(*spec).compile().memory_analysis()
        return int(getattr(analysis, "temp_size_in_bytes", 0))

    candidates = [1 << k for k in range(int(np.log2(n)) + 1)]
    if candidates[-1] != n:
        candidates.append(n)
    lo, hi = 0, len(candidates) - 1  # invariant: candidates[lo] fits or lo == 0
    if temp_bytes(candidates[hi]) <= memory_budget:
        return candidates[hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if temp_bytes(candidates[mid]) <= memory_budget:
            lo = mid
        else:
            hi = mid
    return candidates[lo]
