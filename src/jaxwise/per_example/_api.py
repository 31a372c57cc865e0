"""Public entry points: per-example norms and clipped sums by any method, ghost coverage."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import jax
import numpy as np

from jaxwise._shared._checks import check_array, check_int
from jaxwise._shared._losses import (
    DEFAULT_MEMORY_BUDGET,
    ChunkSize,
    LossFn,
    Method,
    batch_size_of,
    check_chunk,
    check_clip_norm,
    check_loss,
    check_method,
    check_params,
    clip_factor,
    leaf_label,
    weights_of,
)
from jaxwise._typing import PyTree
from jaxwise.per_example import _ghost, _ghost_plan, _probes, _sparse
from jaxwise.per_example._cost import (
    backend_cost,
    default_budget,
    even_chunks,
    micro_batch_size,
    micro_cost,
    operand_bits,
    stored_bytes,
)
from jaxwise.per_example._graph import CoverageRow, ExampleGraph, Unsupported, coverage, trace
from jaxwise.per_example._vmap import auto_chunk_size, stored, vmap_clip_and_sum, vmap_norms

P = TypeVar("P")


@dataclasses.dataclass(frozen=True)
class ClipPlan:
    """How `clip_and_sum` (and the DP gradients) clip a batch: what was chosen and why.

    Attributes:
        method: ``"ghost"`` (book-keeping ghost clipping), ``"vmap"`` (per-example
            gradients of the whole batch) or ``"chunked"`` (per-example gradients of
            ``chunk_size`` examples at a time, accumulated in a ``lax.scan``).
        chunk_size: the micro-batch size of ``"chunked"`` (else ``None``).
        backend: the backend the costs are for (``"cpu"``, ``"gpu"``, ``"tpu"``).
        operand_bits: significand bits of the ghost norms' rounded operands (``None``:
            float32, nothing rounded; 8: bfloat16, a TPU at its default precision).
        ghost_cost: per-example extra cost of ghost clipping, FLOP units (``None``: the loss
            cannot be analysed).
        micro_cost: per-example extra cost of materialised per-example gradients.
        reason: one line saying why ``method`` was chosen.
        rows: the ghost coverage rows, each leaf's norm form on this backend, whichever
            method was chosen (empty when the loss cannot be analysed).
        sparse: for ``"vmap"``/``"chunked"``: the paths of the embedding tables whose
            per-example gradients are never formed densely (the loss only looks rows up in
            them: each example's norm and clipped sum come from its looked-up rows' output
            gradients, as in ghost clipping).
    """

    method: str
    chunk_size: int | None
    backend: str
    operand_bits: int | None
    ghost_cost: float | None
    micro_cost: float
    reason: str
    rows: tuple[CoverageRow, ...] = ()
    sparse: tuple[str, ...] = ()

    def __str__(self) -> str:
        chunk = f", micro-batches of {self.chunk_size}" if self.chunk_size else ""
        head = f"method {self.method}{chunk} on {self.backend}: {self.reason}"
        if self.sparse:
            head += f" (embedding tables kept sparse: {', '.join(self.sparse)})"
        return "\n".join([head, *(str(r) for r in self.rows)])


@dataclasses.dataclass(frozen=True)
class _Resolved:
    plan: ClipPlan
    program: ExampleGraph | None
    forms: dict[int, str]
    budget: int
    sparse: ExampleGraph | None = None  # the program whose lookups `tables` stay sparse
    tables: tuple[int, ...] = ()


def _resolve(
    loss: LossFn,
    params: Any,
    batch: Any,
    method: str,
    chunk_size: ChunkSize,
    memory_budget: int | None,
) -> _Resolved:
    """The plan for a call: the analysed program and its norm forms for ghost, else the chunk
    (and the embedding tables the materialising paths keep sparse)."""
    cost = backend_cost()
    budget = default_budget(cost, DEFAULT_MEMORY_BUDGET) if memory_budget is None else memory_budget
    n = batch_size_of(batch)
    bits = operand_bits(cost)
    program, why = None, ""
    try:
        program = trace(loss, params, batch)
    except Unsupported as err:
        if method == "ghost":
            raise ValueError(
                f"method='ghost' does not apply to this `loss`: {err}; use method='vmap'"
            ) from err
        if method == "auto":
            why = f"the loss cannot be analysed ({err})"
    tables = tuple(_sparse.sparse_uses(program)) if program is not None else ()
    sparse_names = _sparse_names(program, params, tables)
    p_count = _sparse.dense_entries(program if tables else None, params)
    micro = micro_cost(p_count, cost)
    ghost = None
    forms: dict[int, str] = {}
    rows: tuple[CoverageRow, ...] = ()
    if program is not None and method in ("ghost", "auto"):
        forms = _ghost_plan.plan_forms(program, n, budget, cost)
        rows = tuple(_rows(program, params, forms))
        pe_entries = sum(
            int(np.size(x))
            for x, kind in zip(jax.tree.leaves(params), program.leaf_kind)
            if kind in ("elementwise", "fallback")
        )
        ghost = _ghost_plan.ghost_extra_cost(program, forms, pe_entries, cost)
        if method == "auto" and micro < ghost:
            why = f"per-example gradients cost less ({micro:.3g} < {ghost:.3g} per example)"
        else:
            why = "asked for" if method == "ghost" else f"ghost costs {ghost:.3g} <= {micro:.3g}"
            plan = ClipPlan("ghost", None, cost.backend, bits, ghost, micro, why, rows)
            return _Resolved(plan, program, forms, budget)
    if method == "auto":
        held = budget if cost.micro_bytes is None else min(budget, cost.micro_bytes)
        largest = micro_batch_size(p_count, n, held, cost.max_micro, stored_bytes(cost))
        chunk_size = even_chunks(n, largest)
        method = "chunked"
    if method == "chunked" and chunk_size is None:
        chunk_size = "auto"
    if chunk_size == "auto":
        chunk_size = auto_chunk_size(loss, params, batch, memory_budget=budget)
    chunk = None if chunk_size is None or chunk_size >= n else int(chunk_size)
    name = "vmap" if chunk is None else "chunked"
    plan = ClipPlan(
        name, chunk, cost.backend, bits, ghost, micro, why or "asked for", rows, sparse_names
    )
    return _Resolved(plan, None, {}, budget, program if tables else None, tables)


def _sparse_names(program: ExampleGraph | None, params: Any, uses: tuple[int, ...]) -> tuple:
    if program is None or not uses:
        return ()
    paths = [row.path for row in coverage(program, params)]
    return tuple(paths[i] for i in _sparse.sparse_leaves(program, uses))


def _rows(program: ExampleGraph, params: Any, forms: dict[int, str]) -> list[CoverageRow]:
    return [
        dataclasses.replace(row, norm=form)
        for row, form in zip(coverage(program, params), _ghost_plan.leaf_forms(program, forms))
    ]


def _check(
    loss: Any, params: Any, batch: Any, method: Any, chunk_size: Any, memory_budget: Any
) -> int:
    check_loss(loss)
    check_chunk(chunk_size)
    check_method(method)
    if memory_budget is not None:
        check_int(memory_budget, "memory_budget", min_value=1)
    check_params(params)
    return batch_size_of(batch)


def clip_plan(
    loss: LossFn,
    params: PyTree,
    batch: PyTree,
    *,
    method: Method = "auto",
    chunk_size: ChunkSize = None,
    memory_budget: int | None = None,
) -> ClipPlan:
    """What `clip_and_sum` does for this loss, batch and backend, and why (nothing computed).

    ``method="auto"`` weighs ghost clipping (each dense/conv layer's norm in its cheaper form,
    Gram or materialised, on this backend) against per-example gradients of micro-batches
    (their size from ``memory_budget``) with a small per-backend cost table (FLOPs at the
    default matmul precision against bytes of memory traffic) and takes the cheaper.

    Args:
        loss: ``loss(params, example) -> scalar`` for ONE example.
        params: the parameters, any pytree of float arrays.
        batch: the examples (arrays or ``jax.ShapeDtypeStruct``s), a leading axis ``B``.
        method: as in `clip_and_sum`.
        chunk_size: as in `clip_and_sum`.
        memory_budget: as in `clip_and_sum`.

    Returns:
        A [`ClipPlan`][jaxwise.per_example.ClipPlan].

    Raises:
        TypeError, ValueError: as in `clip_and_sum`.

    Examples:
        >>> import jax.numpy as jnp
        >>> loss = lambda w, x: jnp.sum(jnp.tanh(x @ w))
        >>> plan = clip_plan(loss, jnp.ones((3, 2)), jnp.ones((8, 3)))
        >>> plan.method, plan.rows[0].norm
        ('ghost', 'rank-one')
    """
    _check(loss, params, batch, method, chunk_size, memory_budget)
    return _resolve(loss, params, batch, method, chunk_size, memory_budget).plan


def per_example_grad_norms(
    loss: LossFn,
    params: PyTree,
    batch: PyTree,
    *,
    method: Method = "auto",
    chunk_size: ChunkSize = None,
    memory_budget: int | None = None,
) -> jax.Array:
    """Global L2 norm of every example's gradient, shape ``(B,)``.

    Args:
        loss: ``loss(params, example) -> scalar`` for ONE example.
        params: shared parameters, any pytree of float arrays.
        batch: the examples, any pytree (tuple, dict, dataclass) whose leaves share a leading
            example axis of size ``B``; ``loss`` receives it with that axis removed.
        method: ``"auto"`` (default: ghost clipping or micro-batched per-example gradients,
            whichever the backend's cost table says is cheaper for these shapes, see
            [`clip_plan`][jaxwise.per_example.clip_plan]), ``"ghost"`` (one forward and one
            backward pass, see [`ghost_coverage`][jaxwise.per_example.ghost_coverage]),
            ``"vmap"`` (materialise per-example gradients) or ``"chunked"`` (per-example
            gradients of ``chunk_size`` examples at a time in a ``lax.scan``; default
            ``"auto"``).
        chunk_size: for the ``"vmap"``/``"chunked"`` paths: ``None`` (all at once, ``B × P``
            memory), an int (``chunk × P`` at a time), or ``"auto"`` (the largest power-of-two
            chunk whose compiled temporary memory fits ``memory_budget`` bytes, see
            [`auto_chunk_size`][jaxwise.per_example.auto_chunk_size]).
        memory_budget: bytes for per-example quantities: ``chunk_size="auto"``, the
            micro-batches ``"auto"`` may choose and the per-example gradients ghost
            book-keeping keeps; ``None`` (default): 256 MiB on a CPU, a third of the
            device's memory on an accelerator.

    Returns:
        ``(B,)`` float32 norms (the dtype of the gradients for ``"vmap"``).

    Raises:
        TypeError: ``loss`` is not callable, or a leaf of ``params``/``batch`` is not an array.
        ValueError: an unknown ``method``, a bad ``chunk_size``, or batch leaves that do not
            share their leading dimension.

    Examples:
        >>> import jax.numpy as jnp
        >>> loss = lambda w, x: jnp.sum(w * x)
        >>> x = jnp.asarray([[3.0, 4.0], [0.0, 1.0], [6.0, 8.0]])
        >>> per_example_grad_norms(loss, jnp.ones(2), x, method="chunked", chunk_size=2).tolist()
        [5.0, 1.0, 10.0]
    """
    _check(loss, params, batch, method, chunk_size, memory_budget)
    resolved = _resolve(loss, params, batch, method, chunk_size, memory_budget)
    program = resolved.program
    if program is None:
        return vmap_norms(loss, params, batch, resolved.plan.chunk_size)
    leaves, example = jax.tree.leaves(params), jax.tree.leaves(batch)
    _, acts, grads = _probes.output_grads(program, leaves, example)
    bits = resolved.plan.operand_bits
    acts, grads = _ghost.round_pass(program, acts, grads, bits)
    forms = {j: "per-example" if f == "kept" else f for j, f in resolved.forms.items()}
    sq, _, _, _ = _ghost.sq_norms(program, leaves, acts, grads, forms, bits)
    return jax.numpy.sqrt(sq)


def clip_and_sum(
    loss: LossFn,
    params: P,
    batch: PyTree,
    *,
    clip_norm: float,
    method: Method = "auto",
    chunk_size: ChunkSize = None,
    weights: jax.Array | None = None,
    memory_budget: int | None = None,
) -> tuple[P, jax.Array]:
    """Sum over examples of gradients clipped to norm ``clip_norm``, and the pre-clip norms.

    ``Σ_i w_i · g_i · min(1, C / ‖g_i‖)`` where ``w_i`` are optional
    per-example ``weights`` (e.g. a 0/1 mask of real examples in a padded
    Poisson batch). Every method gives the same result (at ``highest`` precision; at a
    precision that rounds matmul operands, the ghost path clips a bound on each example's
    released contribution, see `released_bound`); every path takes the sum from the same
    pass as the norms (no second backward pass).

    Args:
        loss: ``loss(params, example) -> scalar`` for ONE example.
        params: shared parameters, any pytree of float arrays.
        batch: the examples, any pytree whose leaves share a leading example axis ``B``.
        clip_norm: ``C > 0`` (``inf``: no clipping).
        method: as in [`per_example_grad_norms`][jaxwise.per_example.per_example_grad_norms].
        chunk_size: as in [`per_example_grad_norms`][jaxwise.per_example.per_example_grad_norms].
        weights: optional ``(B,)`` per-example weights (default ones).
        memory_budget: as in [`per_example_grad_norms`][jaxwise.per_example.per_example_grad_norms].

    Returns:
        ``(summed, norms)``: a pytree like ``params`` and ``(B,)`` pre-clip norms.

    Raises:
        TypeError: a bad ``loss``, ``params``, ``batch`` or ``clip_norm`` type.
        ValueError: ``clip_norm <= 0``, ``weights`` of the wrong shape, or as in
            [`per_example_grad_norms`][jaxwise.per_example.per_example_grad_norms].

    Examples:
        >>> import jax.numpy as jnp
        >>> loss = lambda w, x: jnp.sum(w * x)
        >>> x = jnp.asarray([[3.0, 4.0], [0.0, 0.5]])
        >>> summed, norms = clip_and_sum(loss, jnp.ones(2), x, clip_norm=1.0)
        >>> [round(v, 4) for v in summed.tolist()], norms.tolist()
        ([0.6, 1.3], [5.0, 0.5])
    """
    n = _check(loss, params, batch, method, chunk_size, memory_budget)
    check_clip_norm(clip_norm)
    w = weights_of(weights, n)
    return _clip_and_sum(loss, params, batch, clip_norm, method, chunk_size, w, memory_budget)


def masked_clip_and_sum(
    loss: LossFn,
    params: P,
    batch: PyTree,
    *,
    clip_norm: float,
    method: Method = "auto",
    chunk_size: ChunkSize = None,
    weights: jax.Array,
    memory_budget: int | None = None,
) -> tuple[P, jax.Array]:
    """`clip_and_sum` for DP: the rows of weight 0 (padding) are replaced by a live row FIRST.

    The clipped sum is `clip_and_sum`'s, bit for bit of the live rows' terms, and NaN or
    inf in a weight-0 row never reaches it; but those rows are replaced once at the input
    (``(B,)``-row selects on the batch, cheap) instead of being selected out of every
    activation and output gradient of the ghost pass (one extra read and write of each, not
    fused by XLA:CPU), so their norms are not theirs: they are returned as 0. Only for a
    caller that never releases a padding row's norm (`jaxwise.privacy`, whose metrics and
    adaptive clip weigh the norms by the mask); `clip_and_sum(weights=)` when the padding
    rows' own norms are wanted. With no live row at all the sum is 0.

    Args:
        loss: ``loss(params, example) -> scalar`` for ONE example.
        params: shared parameters, any pytree of float arrays.
        batch: the examples, leaves with a leading axis ``B``; weight-0 rows may hold anything.
        clip_norm: ``C > 0``.
        method: as in `clip_and_sum`.
        chunk_size: as in `clip_and_sum`.
        weights: ``(B,)`` per-example weights, 0 for padding (a float mask).
        memory_budget: as in `clip_and_sum`.

    Returns:
        ``(summed, norms)``: a pytree like ``params``; ``(B,)`` norms, 0 on weight-0 rows.

    Raises:
        TypeError, ValueError: as in `clip_and_sum`.

    Examples:
        >>> import jax.numpy as jnp
        >>> loss = lambda w, x: jnp.sum(w * x)
        >>> x = jnp.asarray([[3.0, 4.0], [jnp.nan, 1.0], [0.0, 0.5]])
        >>> summed, norms = masked_clip_and_sum(
        ...     loss, jnp.ones(2), x, clip_norm=1.0, weights=jnp.asarray([1.0, 0.0, 1.0])
        ... )
        >>> [round(v, 4) for v in summed.tolist()], norms.tolist()
        ([0.6, 1.3], [5.0, 0.0, 0.5])
    """
    n = _check(loss, params, batch, method, chunk_size, memory_budget)
    check_clip_norm(clip_norm)
    w = weights_of(weights, n)
    live = w != 0
    first = jax.numpy.argmax(live)

    def pick(x: Any) -> Any:
        if jax.numpy.issubdtype(jax.numpy.result_type(x), jax.dtypes.prng_key):
            return x  # a key is never NaN: nothing to replace
        keep = live.reshape(-1, *([1] * (jax.numpy.ndim(x) - 1)))
        return jax.numpy.where(keep, x, x[first])

    clean = jax.tree.map(pick, batch)
    summed, norms = _clip_and_sum(
        loss, params, clean, clip_norm, method, chunk_size, w, memory_budget, select_rows=False
    )
    any_live = jax.numpy.any(live)  # all padding: row 0 stood in, its sum is dropped
    summed = jax.tree.map(lambda g: jax.numpy.where(any_live, g, jax.numpy.zeros_like(g)), summed)
    return summed, jax.numpy.where(live, norms, 0.0)


def _clip_and_sum(
    loss: LossFn,
    params: Any,
    batch: Any,
    clip_norm: float,
    method: Method,
    chunk_size: ChunkSize,
    w: jax.Array,
    memory_budget: int | None,
    *,
    select_rows: bool = True,
) -> tuple[Any, jax.Array]:
    """The clipped sum and norms (arguments checked).

    ``select_rows`` (`clip_and_sum`): every ghost per-example quantity of a weight-0 row is
    selected out (the row may hold NaN); `masked_clip_and_sum` has replaced those rows by
    finite ones at the input and skips these selects.
    """
    resolved = _resolve(loss, params, batch, method, chunk_size, memory_budget)
    program = resolved.program
    if program is None:
        plan = resolved.plan
        chunk_sum = None
        if resolved.sparse is not None:
            chunk_sum = _sparse.clipped_sum_fn(
                resolved.sparse, resolved.tables, clip_norm, plan.operand_bits, stored
            )
        return vmap_clip_and_sum(
            loss, params, batch, clip_norm, w, plan.chunk_size, plan.operand_bits, chunk_sum
        )
    leaves, treedef = jax.tree.flatten(params)
    example = jax.tree.leaves(batch)
    _, acts, grads = _probes.output_grads(program, leaves, example)
    bits = resolved.plan.operand_bits
    acts, grads = _ghost.round_pass(program, acts, grads, bits)
    sq, slack, pe, kept = _ghost.sq_norms(program, leaves, acts, grads, resolved.forms, bits)
    norms = jax.numpy.sqrt(sq)
    live = w != 0  # weight-0 rows are selected out, never multiplied by 0 (NaN padding)
    bound = released_bound(norms, slack, bits)
    factor = jax.lax.stop_gradient(jax.numpy.where(live, clip_factor(bound, clip_norm) * w, 0.0))
    select = live if select_rows else None
    summed = _ghost.weighted_sum(program, leaves, acts, grads, pe, kept, factor, select, bits)
    return jax.tree.unflatten(treedef, summed), norms


def released_bound(norms: jax.Array, slack: jax.Array, bits: int | None) -> jax.Array:
    """A bound on the norm of each example's released contribution before its clip factor.

    ``‖ĝ‖ + 2^-bits·slack``: the norm of the rounded operands' gradient plus what rounding
    the weighted operand ``f·g̃`` can add (`_ghost.slack`); ``bits=None``: the norm. Clipping
    this bound to ``C`` keeps every released contribution's norm within ``C`` (up to float32
    accumulation).
    """
    if bits is None:
        return norms
    return norms + jax.numpy.ldexp(jax.numpy.float32(1.0), -bits) * slack


def ghost_coverage(loss: LossFn, params: PyTree, example: PyTree) -> list[CoverageRow]:
    """How each parameter leaf's per-example norm is computed by ``method="ghost"``.

    Traces ``loss`` for ONE example (nothing is computed) and returns one
    [`CoverageRow`][jaxwise.per_example.CoverageRow] per leaf, in ``jax.tree.leaves`` order:
    ``"dense"`` (``dot_general`` with a batched activation), ``"conv"``
    (``conv_general_dilated`` kernel), ``"embedding"`` (row lookup from a table),
    ``"elementwise"`` (biases, scales: small per-example gradients computed directly),
    ``"fallback"`` (exact per-example gradients of that leaf) or ``"unused"``; and, per
    leaf, how its norm is formed from the shapes on the backend in use (``row.norm``): a
    weight ``(K, N)`` used at ``T`` positions of each example takes ``"rank-one"``
    (``T = 1``: ``‖a‖²‖g‖²``), ``"gram"`` (the ``(T, T)`` Gram matrices of its activations
    and output gradients, ``2T²(K + N)`` FLOPs, nothing of the weight's size per example)
    or ``"per-example"`` (its per-example gradients are formed and kept for the clipped
    sum: ``K·N`` floats written and read twice), whichever the backend's cost table
    (FLOPs against bytes) says is cheaper; embeddings take ``"gram"`` (token equality),
    elementwise and fallback leaves ``"per-example"``. For a given batch and memory budget,
    [`clip_plan`][jaxwise.per_example.clip_plan] gives the rows of that call.

    Args:
        loss: ``loss(params, example) -> scalar`` for ONE example.
        params: the parameters, any pytree of float arrays.
        example: ONE example, any pytree of arrays WITHOUT the batch axis (what ``loss``
            receives).

    Returns:
        One ``CoverageRow`` per leaf of ``params``.

    Raises:
        TypeError: ``loss`` is not callable or ``params`` is not a pytree of float arrays.
        ValueError: ``example`` has no arrays, or the loss does not depend on the example.

    Examples:
        >>> import jax.numpy as jnp
        >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
        >>> loss = lambda p, x: jnp.sum(jnp.tanh(x @ p["w"] + p["b"]))
        >>> [(row.path, row.kind, row.norm) for row in ghost_coverage(loss, params, jnp.ones(3))]
        [('b', 'elementwise', 'per-example'), ('w', 'dense', 'rank-one')]
    """
    check_loss(loss)
    check_params(params)
    if not jax.tree.leaves(example):
        raise ValueError(
            "`example` has no arrays: pass ONE example (e.g. (x, y) or {'x': x, 'y': y}), "
            "without a batch axis"
        )
    for path, leaf in jax.tree_util.tree_flatten_with_path(example)[0]:
        check_array(leaf, leaf_label("example", path))
    batched = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((1, *jax.numpy.shape(x)), jax.numpy.result_type(x)), example
    )
    try:
        program = trace(loss, params, batched)
    except Unsupported as err:
        raise ValueError(f"method='ghost' does not apply to this `loss`: {err}") from err
    return _rows(program, params, _ghost_plan.plan_forms(program, 1, 2**62, backend_cost()))
