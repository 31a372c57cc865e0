"""Per-example gradients that keep embedding tables sparse: the materialising paths' lookups.

A table that the loss only reads by row lookups (an ``"embedding"`` leaf of `._graph`) has a
per-example gradient that is zero outside the rows the example reads, yet
``vmap(grad(loss))`` forms it densely: ``m × V × d`` floats per micro-batch, written, read
by the norm and read again by the weighted sum. (On a TPU v5e the 49M classifier's
8,192-row table took 14.5 of the 67 ms of its micro-batched DP gradient.) Here such a
lookup gets a zero probe on its output instead, as in ghost clipping (`._ghost`):

- the probe's per-example gradient is the looked-up rows' output gradient ``g (T, d)``;
- the table's per-example squared norm is ``Σ_{t,s} [i_t = i_s] g_t·g_s`` (repeated rows
  combine), from ``g`` rounded once to the matmul operands' format, as ghost does;
- the table's clipped sum is one scatter of ``f·g`` into the table: the lookup's
  vector-Jacobian product at the weighted output gradients.

Every other leaf takes ``vmap(grad)`` as before, in the same pass. The result equals the
dense path's up to float32 summation order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._shared._losses import clip_factor
from jaxwise.per_example import _ghost, _probes
from jaxwise.per_example._graph import ExampleGraph


def sparse_uses(program: ExampleGraph) -> list[int]:
    """The row-lookup uses whose tables the loss reads nowhere else (by use index)."""
    return [
        j
        for j, use in enumerate(program.uses)
        if use.kind == "embedding" and all(program.leaf_kind[i] == "embedding" for i in use.leaves)
    ]


def sparse_leaves(program: ExampleGraph, uses: Sequence[int]) -> list[int]:
    """The parameter leaves (by index) whose per-example gradients ``uses`` keep sparse."""
    return sorted({i for j in uses for i in program.uses[j].leaves})


def _split_grads(
    program: ExampleGraph, uses: Sequence[int], leaves: list[Any], example: list[Any]
) -> tuple[dict[int, jax.Array], dict[int, list[Any]], dict[int, list[Any]]]:
    """One ``vmap(grad)`` pass over the micro-batch: the per-example gradients ``(m, …)`` of the
    dense leaves (by leaf index), and each sparse use's example inputs and probe gradients."""
    tables = set(sparse_leaves(program, uses))
    dense = [i for i in range(len(leaves)) if i not in tables]

    def one(values: list[Any], ex: list[Any]) -> tuple[list[Any], dict, dict]:
        def loss_of(vals: list[Any], probes: dict) -> tuple[Any, dict]:
            full = list(leaves)
            for i, v in zip(dense, vals):
                full[i] = v
            return _probes.forward(program, full, ex, probes)

        zeros = _probes.probe_zeros(program, uses)
        (g_dense, g_probes), acts = jax.grad(loss_of, argnums=(0, 1), has_aux=True)(values, zeros)
        return g_dense, acts, g_probes

    per_example, acts, g = jax.vmap(one, in_axes=(None, 0))([leaves[i] for i in dense], example)
    return dict(zip(dense, per_example)), acts, g


def clip_parts(
    program: ExampleGraph,
    uses: Sequence[int],
    leaves: list[Any],
    example: list[Any],
    weights: jax.Array,
    clip_norm: float,
    bits: int | None,
    stored: Callable[[Any, int | None], Any],
) -> tuple[dict[int, jax.Array], dict, dict, jax.Array, jax.Array]:
    """One micro-batch's ``(dense per-example gradients by leaf, the sparse uses' example
    inputs, their output gradients g̃, norms (m,), clip factors (m,))``.

    The dense gradients are in their `stored` container and ``g̃`` is rounded to ``bits``
    once (bfloat16 at 8): the norms are those of exactly these values, so each released
    ``f·(g̃_dense, scatter(g̃))`` has norm at most ``C``. The factor of a weight-0 row is 0.
    """
    dense, acts, g = _split_grads(program, uses, leaves, example)
    dense = stored(dense, bits)
    if bits is not None:
        g = {
            j: [_ghost._narrow(_ghost.round_operand(x, bits), x.dtype, bits) for x in gs]
            for j, gs in g.items()
        }
    m = weights.shape[0]
    sq = jnp.zeros((m,), jnp.float32)
    for grad in dense.values():
        sq = sq + jnp.sum(jnp.square(grad.astype(jnp.float32)).reshape(m, -1), axis=1)
    for j in uses:
        sq = sq + _ghost._ghost_sq(program, program.uses[j], acts[j], g[j], "gram")
    norms = jnp.sqrt(sq)
    factor = jnp.where(weights != 0, clip_factor(norms, clip_norm) * weights, 0.0)
    return dense, acts, g, norms, jax.lax.stop_gradient(factor)


def clipped_sum_fn(
    program: ExampleGraph,
    uses: Sequence[int],
    clip_norm: float,
    bits: int | None,
    stored: Callable[[Any, int | None], Any],
) -> Callable[[Any, Any, jax.Array], tuple[Any, jax.Array]]:
    """``chunk_sum(params, batch, weights) -> (clipped sum like params, norms (m,))`` of one
    micro-batch, with the tables of ``uses`` kept sparse (`clip_parts`; `stored`: the dense
    per-example gradients' container, `jaxwise.per_example._vmap.stored`).

    Rows of weight 0 are selected out (``jnp.where``) before any product with their zero
    factor: NaN or inf in padding changes nothing.
    """

    def chunk_sum(params: Any, batch: Any, weights: jax.Array) -> tuple[Any, jax.Array]:
        leaves, treedef = jax.tree.flatten(params)
        example = jax.tree.leaves(batch)
        parts = clip_parts(program, uses, leaves, example, weights, clip_norm, bits, stored)
        dense, acts, g, norms, factor = parts
        live = weights != 0

        def rows(x: jax.Array) -> jax.Array:
            keep = live.reshape(-1, *([1] * (x.ndim - 1)))
            return jnp.where(keep, x, jnp.zeros((), x.dtype))

        out: list[Any] = list(leaves)
        for i, grad in dense.items():
            f = factor.reshape(-1, *([1] * (grad.ndim - 1)))
            summed = jnp.sum(rows(grad.astype(jnp.float32) * f), axis=0)
            out[i] = summed.astype(jnp.result_type(leaves[i]))
        g = {j: [rows(x) for x in gs] for j, gs in g.items()}
        for i, grad in _ghost.ghost_sum(program, leaves, uses, acts, g, factor, bits).items():
            out[i] = grad.astype(jnp.result_type(leaves[i]))
        return jax.tree.unflatten(treedef, out), norms

    return chunk_sum


def dense_entries(program: ExampleGraph | None, params: Any) -> int:
    """Entries of the per-example gradients the materialising paths keep (sparse tables out)."""
    leaves = jax.tree.leaves(params)
    skip = set(sparse_leaves(program, sparse_uses(program))) if program is not None else set()
    return sum(int(np.size(x)) for i, x in enumerate(leaves) if i not in skip)
