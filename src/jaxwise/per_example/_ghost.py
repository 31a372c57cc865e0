"""Ghost norms and clipped sums for any per-example loss, from one forward and one backward pass.

The program of `._graph` is re-evaluated under ``vmap`` (`._probes`) with a zero *probe* added
to the output of every use; the gradient of the summed loss with respect to the probes
is each example's output gradient ``g`` of that use, and the use's example input is its
activation ``a``. Then, per use kind:

- ``dense`` (``dot_general``): the per-example weight gradient is ``Σ_t a_t g_tᵀ``; its
  squared norm is ``‖a‖²‖g‖²`` without extra (time) axes, else the cheaper of the Gram
  form ``Σ_{t,s} (a_t·a_s)(g_t·g_s)`` and the materialised ``‖Aᵀ G‖²`` (per layer).
- ``conv``: the same on the unfolded patches (``conv_general_dilated_patches``).
- ``embedding`` (row-lookup ``gather``): ``Σ_{t,s} [i_t = i_s] (g_t·g_s)`` — repeated
  rows combine.
- ``elementwise`` / ``fallback``: exact per-example gradients of those leaves only, by a
  per-example vector-Jacobian product of just the using equations.

The clipped sum is book-keeping from the same quantities: one batched vector-Jacobian
product of the ghost uses at ``f·g`` (``f`` the clip factors) — the cost of a weight
gradient — plus ``Σ_i f_i ∇_i`` for the materialised leaves. No second backward pass.

References:
  Goodfellow, Efficient Per-Example Gradient Computations, 2015, arXiv:1510.01799;
  Li et al., Large Language Models Can Be Strong Differentially Private Learners
  (ghost clipping), ICLR 2022, arXiv:2110.05679; Bu et al., Differentially Private
  Optimization on Large Model at Small Cost (mixed ghost clipping), ICML 2023,
  arXiv:2210.00038.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise.per_example._ghost_plan import _dense_free, _param_side
from jaxwise.per_example._graph import (
    ExampleGraph,
    Node,
    Use,
    embedding_layout,
    read,
)
from jaxwise.per_example._probes import apply_use, example_positions, static_env

# The norm contractions run at the matmul precision in effect, on operands rounded ONCE,
# explicitly, to the format that precision gives them (`_cost.operand_bits`: bfloat16 on a TPU
# by default). A product of two such operands is exact in float32, so a one-pass norm is the
# exact norm of the rounded operands' gradient up to float32 accumulation, and the clipped sum
# uses the same rounded operands; the one rounding left (of the weighted operand ``f·g̃``) is
# bounded by `slack` and taken off the clip factor. (The fifth round ran them at HIGHEST:
# six bfloat16 passes on a TPU.)
GHOST_KINDS = ("dense", "conv", "embedding")
FORMS = ("rank-one", "gram", "per-example")


def round_operand(x: jax.Array, bits: int | None) -> jax.Array:
    """``x`` as float32, rounded to ``bits`` significand bits (round to nearest even; None: as is).

    Examples:
        >>> round_operand(jnp.asarray([1.0 + 2**-9, 3.14159]), 8).tolist()
        [1.0, 3.140625]
    """
    x = x.astype(jnp.float32)
    if bits is None:
        return x
    return jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=bits - 1)


# --------------------------------------------------------------------------
# Ghost norms per use kind
# --------------------------------------------------------------------------


def _outer_sq(a: jax.Array, g: jax.Array, form: str) -> jax.Array:
    """``‖Σ_t a_t g_tᵀ‖²`` per example, ``a (B, T, K)``, ``g (B, T, N)``, in the given form."""
    if a.shape[1] == 1 or form == "rank-one":
        a, g = a.astype(jnp.float32), g.astype(jnp.float32)
        return jnp.sum(jnp.square(a), axis=(1, 2)) * jnp.sum(jnp.square(g), axis=(1, 2))
    if form == "gram":
        aa = _dot32("btk,bsk->bts", a, a)
        gg = _dot32("btn,bsn->bts", g, g)
        return jnp.sum(aa * gg, axis=(1, 2))
    return jnp.sum(jnp.square(_dot32("btk,btn->bkn", a, g)), axis=(1, 2))


def _dot32(spec: str, x: jax.Array, y: jax.Array) -> jax.Array:
    """``einsum(spec, x, y)`` accumulated in float32, on the operands as stored (bfloat16
    operands are read as such: their products are exact in float32)."""
    if x.dtype != y.dtype:
        x, y = x.astype(jnp.float32), y.astype(jnp.float32)
    return jnp.einsum(spec, x, y, preferred_element_type=jnp.float32)


def _dense_flat(
    node: Node, param_side: int, a: jax.Array, g: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """A dense use's ``a (B, T, K)`` and ``g (B, T, N)``: per-example gradient ``Σ_t a_t g_tᵀ``."""
    contract, free = _dense_free(node, param_side, a.ndim - 1)
    b = a.shape[0]
    t = int(np.prod([a.shape[1 + d] for d in free], dtype=np.int64))
    a2 = jnp.transpose(a, (0, *[1 + d for d in free], *[1 + d for d in contract])).reshape(b, t, -1)
    n_free_w = g.ndim - 1 - len(free)
    if param_side == 0:  # output (w_free..., a_free...)
        g = jnp.transpose(g, (0, *range(1 + n_free_w, g.ndim), *range(1, 1 + n_free_w)))
    return a2, g.reshape(b, t, -1)


def _rank_one_sum(a: jax.Array, g: jax.Array) -> jax.Array:
    """``Σ_t ‖a_t‖·‖g_t‖`` per example: a bound on ``‖Σ_t a_t g_tᵀ‖`` (``(B,)`` float32)."""
    na = jnp.sqrt(jnp.sum(jnp.square(a.astype(jnp.float32)), axis=-1))
    ng = jnp.sqrt(jnp.sum(jnp.square(g.astype(jnp.float32)), axis=-1))
    return jnp.sum(na * ng, axis=1)


def _dense_grads(node: Node, param_side: int, w: Any, a: jax.Array, g: jax.Array) -> jax.Array:
    """Per-example gradients ``(B, *w.shape)`` float32 of a dense use's parameter input.

    The vector-Jacobian product of the use's ``dot_general`` for one example, mapped over the
    batch: JAX turns it into one batched contraction ``Σ_t a_t g_tᵀ``.
    """
    dn = node.params["dimension_numbers"]
    w32 = jnp.asarray(w).astype(jnp.float32)

    def one(a_i: jax.Array, g_i: jax.Array) -> jax.Array:
        def use(v: jax.Array) -> jax.Array:
            lhs, rhs = (v, a_i) if param_side == 0 else (a_i, v)
            return jax.lax.dot_general(lhs, rhs, dn)

        return jax.vjp(use, w32)[1](g_i)[0]

    return jax.vmap(one)(a.astype(jnp.float32), g.astype(jnp.float32))


def _conv_windows(
    node: Node, x: jax.Array, g: jax.Array
) -> tuple[Callable[[tuple[int, ...]], jax.Array], jax.Array]:
    """``(window, g2)``: ``window(offset)`` is the input that the kernel entry at ``offset`` sees
    at every output position, ``(B, T, C_in)``; ``g2`` the output gradient ``(B, T, C_out)``."""
    lhs_spec, _, out_spec = node.params["dimension_numbers"]
    b = x.shape[0]
    x = jnp.moveaxis(
        x, [1 + d for d in (lhs_spec[0], *lhs_spec[2:], lhs_spec[1])], range(1, x.ndim)
    )
    g = jnp.moveaxis(
        g, [1 + d for d in (out_spec[0], *out_spec[2:], out_spec[1])], range(1, g.ndim)
    )
    strides, rhs_dil = node.params["window_strides"], node.params["rhs_dilation"]
    pads = [
        (lo, hi, ld - 1)
        for (lo, hi), ld in zip(node.params["padding"], node.params["lhs_dilation"])
    ]
    xp = jax.lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0), (0, 0, 0), *pads, (0, 0, 0)])
    out_sp = g.shape[2:-1]
    t = int(np.prod(g.shape[1:-1], dtype=np.int64))

    def window(offset: tuple[int, ...]) -> jax.Array:
        start = [0, 0, *[o * r for o, r in zip(offset, rhs_dil)], 0]
        limit = [
            b,
            xp.shape[1],
            *[s + (n - 1) * st + 1 for s, n, st in zip(start[2:], out_sp, strides)],
            xp.shape[-1],
        ]
        shifted = jax.lax.slice(xp, start, limit, [1, 1, *strides, 1])
        return shifted.reshape(b, t, -1).astype(jnp.float32)

    return window, g.reshape(b, t, -1).astype(jnp.float32)


def _conv_offsets(node: Node, rhs_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every kernel offset (one per spatial kernel entry)."""
    _, rhs_spec, _ = node.params["dimension_numbers"]
    return list(np.ndindex(*[rhs_shape[d] for d in rhs_spec[2:]]))


def _conv_sq(
    node: Node, rhs_shape: tuple[int, ...], x: jax.Array, g: jax.Array, form: str
) -> jax.Array:
    """Per-example kernel-gradient norms² of a convolution, from its input and output gradient.

    The kernel gradient of one example is, per kernel offset, ``Σ_t x_shifted_tᵀ g_t``
    (``x_shifted``: the input window at that offset for every output position). Either
    those blocks are formed offset by offset (no unfolded copy of the input), or — in the
    ``"gram"`` form — the unfolded patches give the Gram form.
    """
    window, g2 = _conv_windows(node, x, g)
    offsets = _conv_offsets(node, rhs_shape)
    if form == "gram":
        return _outer_sq(jnp.concatenate([window(o) for o in offsets], axis=-1), g2, form)
    total = jnp.zeros((x.shape[0],), jnp.float32)
    for offset in offsets:
        block = jnp.einsum("btc,bto->bco", window(offset), g2)
        total = total + jnp.sum(jnp.square(block), axis=(1, 2))
    return total


def _conv_grads(node: Node, rhs_shape: tuple[int, ...], x: jax.Array, g: jax.Array) -> jax.Array:
    """Per-example kernel gradients ``(B, *rhs_shape)`` float32, one block per kernel offset.

    Each block is a batched contraction of strided windows of the input with the output
    gradient (``vmap`` of the convolution's own kernel gradient becomes a grouped
    convolution, several times slower on CPU).
    """
    window, g2 = _conv_windows(node, x, g)
    _, rhs_spec, _ = node.params["dimension_numbers"]
    blocks = [jnp.einsum("btc,bto->bco", window(o), g2) for o in _conv_offsets(node, rhs_shape)]
    b, c_in, c_out = blocks[0].shape
    spatial = [rhs_shape[d] for d in rhs_spec[2:]]
    stacked = jnp.stack(blocks, axis=1).reshape(b, *spatial, c_in, c_out)
    source = [*rhs_spec[2:], rhs_spec[1], rhs_spec[0]]  # the kernel dimension of each axis
    return jnp.transpose(stacked, (0, *[1 + source.index(d) for d in range(len(rhs_shape))]))


def _embedding_sq(
    node: Node, operand_shape: tuple[int, ...], idx: jax.Array, g: jax.Array
) -> jax.Array:
    layout = embedding_layout(node, operand_shape)
    assert layout is not None
    largest, offset_dims = layout
    b = idx.shape[0]
    keys = idx.reshape(b, -1, len(largest))
    upper = jnp.asarray(largest, keys.dtype)
    valid = jnp.all((keys >= 0) & (keys <= upper), axis=-1)
    if node.params["mode"] != jax.lax.GatherScatterMode.FILL_OR_DROP:
        valid = jnp.ones_like(valid)  # clip / promise-in-bounds: indices are clamped
    keys = jnp.clip(keys, 0, upper)
    g = jnp.moveaxis(
        g, [1 + d for d in offset_dims], list(range(g.ndim - len(offset_dims), g.ndim))
    )
    g = g.reshape(b, keys.shape[1], -1).astype(jnp.float32)
    same = (
        jnp.all(keys[:, :, None, :] == keys[:, None, :, :], axis=-1)
        & valid[:, :, None]
        & valid[:, None, :]
    )
    gg = jnp.einsum("btd,bsd->bts", g, g)
    return jnp.sum(jnp.where(same, gg, 0.0), axis=(1, 2))


def _conv_rank_one_sum(
    node: Node, rhs_shape: tuple[int, ...], x: jax.Array, g: jax.Array
) -> jax.Array:
    """`_rank_one_sum` of a convolution: ``Σ_t ‖patch_t‖·‖g_t‖`` over its output positions."""
    window, g2 = _conv_windows(node, x, g)
    patch_sq = sum(jnp.sum(jnp.square(window(o)), axis=-1) for o in _conv_offsets(node, rhs_shape))
    ng = jnp.sqrt(jnp.sum(jnp.square(g2), axis=-1))
    return jnp.sum(jnp.sqrt(jnp.asarray(patch_sq)) * ng, axis=1)


def _ghost_sq(
    program: ExampleGraph, use: Use, acts: list[Any], grads: list[Any], form: str
) -> jax.Array:
    node = program.nodes[use.node]
    side = _param_side(program, node)
    param_shape = program.avals[node.inputs[side]].shape
    if use.kind == "dense":
        return _outer_sq(*_dense_flat(node, side, acts[0], grads[0]), form)
    if use.kind == "conv":
        return _conv_sq(node, param_shape, acts[0], grads[0], form)
    return _embedding_sq(node, param_shape, acts[0], grads[0])


def slack(program: ExampleGraph, use: Use, acts: list[Any], grads: list[Any]) -> jax.Array:
    """``Σ_t ‖ã_t‖·‖g̃_t‖`` per example ``(B,)`` of a dense/conv use whose clipped sum is one
    contraction at the rounded weighted operand ``RN(f·g̃)``.

    That rounding moves each entry of ``f·g̃`` by at most ``u·|f·g̃|`` (``u = 2^-bits``), so
    the example's released contribution ``Σ_t ã_t RN(f·g̃_t)ᵀ`` is within ``u·f·slack`` of
    ``f·Σ_t ã_t g̃_tᵀ`` (the triangle inequality over rank-one terms).
    """
    node = program.nodes[use.node]
    side = _param_side(program, node)
    if use.kind == "conv":
        return _conv_rank_one_sum(node, program.avals[node.inputs[side]].shape, acts[0], grads[0])
    return _rank_one_sum(*_dense_flat(node, side, acts[0], grads[0]))


def _kept_grads(program: ExampleGraph, env: dict[int, Any], use: Use, a: Any, g: Any) -> jax.Array:
    node = program.nodes[use.node]
    side = _param_side(program, node)
    if use.kind == "conv":
        return _conv_grads(node, program.avals[node.inputs[side]].shape, a[0], g[0])
    return _dense_grads(node, side, read(env, node.inputs[side]), a[0], g[0])


# --------------------------------------------------------------------------
# Materialised leaves and the clipped sum
# --------------------------------------------------------------------------


def _materialised(
    program: ExampleGraph, leaves: list[Any], acts: list[list[Any]], grads: list[list[Any]]
) -> dict[int, jax.Array]:
    """Exact per-example gradients ``(B, *shape)`` of the elementwise/fallback leaves."""
    which = [i for i, k in enumerate(program.leaf_kind) if k in ("elementwise", "fallback")]
    if not which:
        return {}
    picked = [j for j, u in enumerate(program.uses) if u.kind in ("elementwise", "fallback")]

    def one(acts_i: list[list[Any]], grads_i: list[list[Any]]) -> list[Any]:
        def uses_of(sub: list[Any]) -> list[list[Any]]:
            full = list(leaves)
            for i, v in zip(which, sub):
                full[i] = v
            env = static_env(program, full)
            return [apply_use(program, program.uses[j], env, a) for j, a in zip(picked, acts_i)]

        _, vjp = jax.vjp(uses_of, [leaves[i] for i in which])
        return vjp(grads_i)[0]

    per_example = jax.vmap(one)([acts[j] for j in picked], [grads[j] for j in picked])
    return dict(zip(which, per_example))


def _sum_sq(grad: jax.Array) -> jax.Array:
    return jnp.sum(jnp.square(grad.astype(jnp.float32)).reshape(grad.shape[0], -1), axis=1)


def round_pass(
    program: ExampleGraph, acts: list[list[Any]], grads: list[list[Any]], bits: int | None
) -> tuple[list[list[Any]], list[list[Any]]]:
    """The ghost uses' activations and output gradients rounded to ``bits`` (`round_operand`).

    Dense and conv uses round both (their norms and clipped sums are contractions of them);
    embeddings round their output gradients (``g̃·g̃`` exact in float32, the sum a float32
    scatter of ``f·g̃``); the materialised uses keep theirs (norm and sum come from one
    per-example gradient). ``bits=None``: everything as it is.
    """
    if bits is None:
        return acts, grads
    new_acts, new_grads = list(acts), list(grads)
    for j, use in enumerate(program.uses):
        if use.kind in ("dense", "conv"):
            new_acts[j] = [_narrow(round_operand(a, bits), a.dtype, bits) for a in acts[j]]
        if use.kind in GHOST_KINDS:
            new_grads[j] = [_narrow(round_operand(g, bits), g.dtype, bits) for g in grads[j]]
    return new_acts, new_grads


def _narrow(x: jax.Array, dtype: Any, bits: int) -> jax.Array:
    """Rounded float32 values in the narrowest container that holds them: bfloat16 at 8 bits
    (same exponent range, so exact), else ``dtype``. The later passes (norms, the clipped sum)
    then read half the bytes; `as_program_dtype` restores the program's dtype where a
    re-bound equation needs it."""
    if bits == 8 and dtype == jnp.float32:
        return x.astype(jnp.bfloat16)
    return x.astype(dtype)


def as_program_dtype(values: list[Any], refs: Sequence[Any], program: ExampleGraph) -> list[Any]:
    """``values`` cast back to the dtypes the program gives ``refs`` (after `_narrow`)."""
    return [v.astype(program.avals[r].dtype) for v, r in zip(values, refs)]


def sq_norms(
    program: ExampleGraph,
    leaves: list[Any],
    acts: list[list[Any]],
    grads: list[list[Any]],
    forms: dict[int, str],
    bits: int | None = None,
) -> tuple[jax.Array, jax.Array, dict[int, jax.Array], dict[int, jax.Array]]:
    """Squared per-example gradient norms ``(B,)`` float32, the rounding slack ``(B,)``
    (``‖(slack_use)_use‖₂`` over the uses summed by a rounded contraction; zeros when
    ``bits`` is None), the materialised leaves' gradients and the kept uses' per-example
    gradients (of their parameter input, by use index). ``forms``: `plan_forms`."""
    b = int(np.shape(jax.tree.leaves(grads)[0])[0]) if jax.tree.leaves(grads) else 0
    total = jnp.zeros((b,), jnp.float32)
    slack_sq = jnp.zeros((b,), jnp.float32)
    env = static_env(program, leaves) if "kept" in forms.values() else {}
    kept: dict[int, jax.Array] = {}
    for j, (use, a, g) in enumerate(zip(program.uses, acts, grads)):
        form = forms.get(j, "gram")
        if form == "kept":
            kept[j] = _kept_grads(program, env, use, a, g)
            total = total + _sum_sq(kept[j])
        elif use.kind in GHOST_KINDS:
            total = total + _ghost_sq(program, use, a, g, form)
            if bits is not None and use.kind != "embedding":
                slack_sq = slack_sq + jnp.square(slack(program, use, a, g))
    pe = _materialised(program, leaves, acts, grads)
    for grad in pe.values():
        total = total + _sum_sq(grad)
    return total, jnp.sqrt(slack_sq), pe, kept


def weighted_sum(
    program: ExampleGraph,
    leaves: list[Any],
    acts: list[list[Any]],
    grads: list[list[Any]],
    pe: dict[int, jax.Array],
    kept: dict[int, jax.Array],
    factor: jax.Array,
    live: jax.Array | None,
    bits: int | None = None,
) -> list[Any]:
    """``Σ_i f_i ∇_i`` for every leaf, from the pass's quantities (book-keeping).

    With ``bits``, the weighted operand ``f·g̃`` of a dense/conv contraction is rounded to
    ``bits`` here, explicitly (`round_operand`), as the backend's matmul would: the program's
    operands are then exactly ``ã`` and ``RN(f·g̃)`` (see `slack`).

    Rows where ``live`` is False are selected out of every per-example quantity first
    (``jnp.where``): NaN or inf in a masked-out row never meets its zero factor. ``live=None``
    skips these selects (one extra read and write of every tensor): for a batch whose
    weight-0 rows were replaced by finite ones at the input
    (`jaxwise.per_example._api.masked_clip_and_sum`).

    Materialised leaves and kept uses sum their per-example gradients weighted by ``f``; the
    other ghost uses take one batched vector-Jacobian product at ``f·g`` (a weight gradient).
    """

    def rows(x: Any) -> Any:
        assert live is not None
        return jnp.where(_expand(live, x).astype(bool), x, jnp.zeros((), x.dtype))

    if live is not None:
        pe = {i: rows(g) for i, g in pe.items()}
        kept = {j: rows(g) for j, g in kept.items()}
        acts = [[rows(a) for a in group] for group in acts]
        grads = [[rows(g) for g in group] for group in grads]
    out: list[Any] = [jnp.zeros_like(x) for x in leaves]
    for i, grad in pe.items():
        out[i] = jnp.tensordot(factor, grad.astype(jnp.float32), axes=1).astype(leaves[i].dtype)
    for j, summed in _pull_back(program, leaves, kept, factor).items():
        out[j] = summed
    ghost = [j for j, u in enumerate(program.uses) if u.kind in GHOST_KINDS and j not in kept]
    for i, grad in ghost_sum(program, leaves, ghost, acts, grads, factor, bits).items():
        out[i] = grad
    return out


def ghost_sum(
    program: ExampleGraph,
    leaves: list[Any],
    uses: Sequence[int],
    acts: Any,
    grads: Any,
    factor: jax.Array,
    bits: int | None,
) -> dict[int, Any]:
    """``Σ_i f_i ∇_i`` of the leaves that ``uses`` (ghost uses) read, by leaf index: one batched
    vector-Jacobian product of those uses at ``RN(f·g)`` (a weight gradient; an embedding's
    is a scatter of ``f·g``, never rounded). ``acts``/``grads``: indexed by use."""
    if not uses:
        return {}
    which = sorted({i for j in uses for i in program.uses[j].leaves})

    def uses_of(sub: list[Any]) -> list[list[Any]]:
        full = list(leaves)
        for i, v in zip(which, sub):
            full[i] = v
        env = static_env(program, full)
        return [jax.vmap(_use_fn(program, program.uses[j], env))(ins[j]) for j in uses]

    ins = {
        j: as_program_dtype(acts[j], _example_refs(program, program.uses[j]), program) for j in uses
    }
    _, vjp = jax.vjp(uses_of, [leaves[i] for i in which])
    cot = [
        [
            _weighted(g, factor, None if program.uses[j].kind == "embedding" else bits, r, program)
            for g, r in zip(grads[j], _probe_refs(program, program.uses[j]))
        ]
        for j in uses
    ]
    return dict(zip(which, vjp(cot)[0]))


def _pull_back(
    program: ExampleGraph, leaves: list[Any], kept: dict[int, jax.Array], factor: jax.Array
) -> dict[int, Any]:
    """The kept uses' ``Σ_i f_i ∇_i``, carried from their parameter inputs back to the leaves.

    A kept use's parameter input is its leaf or a view of it (a reshape, transpose or cast);
    one vector-Jacobian product of those views maps the weighted sums onto the leaves.
    """
    if not kept:
        return {}
    uses = list(kept)
    which = sorted({i for j in uses for i in program.uses[j].leaves})

    def params_of(sub: list[Any]) -> list[Any]:
        full = list(leaves)
        for i, v in zip(which, sub):
            full[i] = v
        env = static_env(program, full)
        nodes = [program.nodes[program.uses[j].node] for j in uses]
        return [read(env, node.inputs[_param_side(program, node)]) for node in nodes]

    values, vjp = jax.vjp(params_of, [leaves[i] for i in which])
    cot = [jnp.tensordot(factor, kept[j], axes=1).astype(v.dtype) for j, v in zip(uses, values)]
    return dict(zip(which, vjp(cot)[0]))


def _example_refs(program: ExampleGraph, use: Use) -> list[Any]:
    node = program.nodes[use.node]
    return [node.inputs[i] for i in example_positions(program, node)]


def _probe_refs(program: ExampleGraph, use: Use) -> list[Any]:
    node = program.nodes[use.node]
    return [node.outputs[p] for p in use.probes]


def _weighted(
    g: jax.Array, factor: jax.Array, bits: int | None, ref: int, program: ExampleGraph
) -> jax.Array:
    """The cotangent ``RN(f·g̃)`` in the use output's dtype: ``f`` applied in float32 (never
    rounded to a narrow ``g̃``'s container), then rounded to ``bits`` (None: as is)."""
    g32 = g.astype(jnp.float32)
    return round_operand(g32 * _expand(factor, g32), bits).astype(program.avals[ref].dtype)


def _use_fn(
    program: ExampleGraph, use: Use, env: dict[int, Any]
) -> Callable[[list[Any]], list[Any]]:
    return lambda a: apply_use(program, use, env, a)


def _expand(factor: jax.Array, like: jax.Array) -> jax.Array:
    return factor.astype(like.dtype).reshape(-1, *([1] * (like.ndim - 1)))
