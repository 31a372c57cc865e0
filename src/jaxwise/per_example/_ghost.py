"""Ghost norms and clipped sums for any per-example loss, from one forward and one backward pass.

The program of `._graph` is re-evaluated under ``vmap`` with a zero *probe* added
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

from jaxwise.per_example._graph import (
    EXAMPLE,
    Const,
    ExampleGraph,
    Node,
    Use,
    bind,
    embedding_layout,
    read,
)

# The norm contractions run at HIGHEST precision on every backend: the clip factor C/||g||
# is what bounds each example's contribution (the DP sensitivity), so a norm rounded down by a
# TPU's one-pass bfloat16 default (~0.4%) would let a clipped example exceed C. It costs up to
# six bfloat16 passes of the norm's (small) contractions on a TPU; measured there before it is
# traded away.
_PRECISION = jax.lax.Precision.HIGHEST
GHOST_KINDS = ("dense", "conv", "embedding")
FORMS = ("rank-one", "gram", "per-example")


def norm_form(t: int, k: int, n: int) -> str:
    """How a dense/conv use's per-example norm is formed from its shapes (book-keeping rule).

    A weight ``(K, N)`` applied at ``T`` positions of each example: the per-example
    gradient is ``Σ_t a_t g_tᵀ``. Its squared norm is ``‖a‖²‖g‖²`` when ``T = 1``
    (``"rank-one"``); else either from the ``(T, T)`` Gram matrices of ``a`` and ``g``
    (``"gram"``: ``O(T²(K + N))`` work and ``2T²`` floats per example) or from the
    materialised per-example gradient (``"per-example"``: ``O(T K N)`` work, ``K N`` floats,
    and its clipped sum is then the ``f``-weighted sum of those gradients). Gram when
    ``2 T² < K N``, as in mixed ghost clipping (Bu et al., 2023).

    Examples:
        >>> norm_form(1, 512, 512), norm_form(256, 512, 2048), norm_form(256, 64, 64)
        ('rank-one', 'gram', 'per-example')
    """
    if t == 1:
        return "rank-one"
    return "gram" if 2 * t * t < k * n else "per-example"


# --------------------------------------------------------------------------
# Evaluating the program
# --------------------------------------------------------------------------


def _example_positions(program: ExampleGraph, node: Node) -> list[int]:
    return [
        i
        for i, r in enumerate(node.inputs)
        if not isinstance(r, Const) and program.dep[r] == EXAMPLE
    ]


def _static(program: ExampleGraph, leaves: Sequence[Any]) -> dict[int, Any]:
    """Every value that does not depend on the example, as a function of the leaves."""
    env: dict[int, Any] = dict(enumerate(leaves))
    for node in program.nodes:
        if node.outputs and program.dep[node.outputs[0]] != EXAMPLE:
            for o, val in zip(node.outputs, bind(node, [read(env, r) for r in node.inputs])):
                env[o] = val
    return env


def _apply_use(
    program: ExampleGraph, use: Use, env: dict[int, Any], acts: Sequence[Any]
) -> list[Any]:
    """The use's probed outputs, with its example inputs taken from ``acts``."""
    node = program.nodes[use.node]
    it = iter(acts)
    ins = [
        next(it) if i in _example_positions(program, node) else read(env, r)
        for i, r in enumerate(node.inputs)
    ]
    outs = bind(node, ins)
    return [outs[p] for p in use.probes]


def _forward(
    program: ExampleGraph, leaves: list[Any], example: list[Any], probes: list[list[Any]]
) -> tuple[Any, list[list[Any]]]:
    """Loss of ONE example with probes added at every use; also each use's example inputs."""
    env: dict[int, Any] = dict(enumerate([*leaves, *example]))
    use_at = {u.node: j for j, u in enumerate(program.uses)}
    acts: list[list[Any]] = []
    for k, node in enumerate(program.nodes):
        ins = [read(env, r) for r in node.inputs]
        outs = bind(node, ins)
        j = use_at.get(k)
        if j is not None:
            acts.append([ins[p] for p in _example_positions(program, node)])
            for pos, probe in zip(program.uses[j].probes, probes[j]):
                outs[pos] = outs[pos] + probe
        for o, val in zip(node.outputs, outs):
            env[o] = val
    return read(env, program.output), acts


def output_grads(
    program: ExampleGraph, leaves: list[Any], example: list[Any]
) -> tuple[jax.Array, list[list[Any]], list[list[Any]]]:
    """One forward and one backward pass: ``(losses (B,), acts, g)`` per use."""
    b = int(np.shape(example[0])[0])
    zeros = [
        [
            jnp.zeros(
                (b, *program.avals[program.nodes[u.node].outputs[p]].shape),
                program.avals[program.nodes[u.node].outputs[p]].dtype,
            )
            for p in u.probes
        ]
        for u in program.uses
    ]

    def total(probes: list[list[Any]]) -> tuple[jax.Array, tuple[jax.Array, list[list[Any]]]]:
        losses, acts = jax.vmap(lambda ex, pr: _forward(program, leaves, ex, pr))(example, probes)
        return jnp.sum(losses), (losses, acts)

    grads, (losses, acts) = jax.grad(total, has_aux=True)(zeros)
    return losses, acts, grads


# --------------------------------------------------------------------------
# Ghost norms per use kind
# --------------------------------------------------------------------------


def _outer_sq(a: jax.Array, g: jax.Array) -> jax.Array:
    """``‖Σ_t a_t g_tᵀ‖²`` per example, ``a (B, T, K)``, ``g (B, T, N)``, by `norm_form`."""
    a, g = a.astype(jnp.float32), g.astype(jnp.float32)
    _, t, k = a.shape
    n = g.shape[2]
    form = norm_form(t, k, n)
    if form == "rank-one":
        return jnp.sum(jnp.square(a), axis=(1, 2)) * jnp.sum(jnp.square(g), axis=(1, 2))
    if form == "gram":
        aa = jnp.einsum("btk,bsk->bts", a, a, precision=_PRECISION)
        gg = jnp.einsum("btn,bsn->bts", g, g, precision=_PRECISION)
        return jnp.sum(aa * gg, axis=(1, 2))
    return jnp.sum(jnp.square(jnp.einsum("btk,btn->bkn", a, g, precision=_PRECISION)), axis=(1, 2))


def _param_side(program: ExampleGraph, node: Node) -> int:
    """The position of the node's parameter input (the one that does not depend on the example)."""
    return next(
        i
        for i, r in enumerate(node.inputs)
        if not isinstance(r, Const) and program.dep[r] != EXAMPLE
    )


def _dense_free(node: Node, param_side: int, act_ndim: int) -> tuple[tuple[int, ...], list[int]]:
    """The activation's contracted and free dimensions of a dense use (per example)."""
    (lc, rc), _ = node.params["dimension_numbers"]
    contract = tuple(rc if param_side == 0 else lc)
    return contract, [d for d in range(act_ndim) if d not in contract]


def _dense_sq(node: Node, param_side: int, a: jax.Array, g: jax.Array) -> jax.Array:
    contract, free = _dense_free(node, param_side, a.ndim - 1)
    b = a.shape[0]
    t = int(np.prod([a.shape[1 + d] for d in free], dtype=np.int64))
    a2 = jnp.transpose(a, (0, *[1 + d for d in free], *[1 + d for d in contract])).reshape(b, t, -1)
    n_free_w = g.ndim - 1 - len(free)
    if param_side == 0:  # output (w_free..., a_free...)
        g = jnp.transpose(g, (0, *range(1 + n_free_w, g.ndim), *range(1, 1 + n_free_w)))
    return _outer_sq(a2, g.reshape(b, t, -1))


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
            return jax.lax.dot_general(lhs, rhs, dn, precision=_PRECISION)

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


def _conv_sq(node: Node, rhs_shape: tuple[int, ...], x: jax.Array, g: jax.Array) -> jax.Array:
    """Per-example kernel-gradient norms² of a convolution, from its input and output gradient.

    The kernel gradient of one example is, per kernel offset, ``Σ_t x_shifted_tᵀ g_t``
    (``x_shifted``: the input window at that offset for every output position). Either
    those blocks are formed offset by offset (no unfolded copy of the input), or — when
    `norm_form` says ``"gram"`` — the unfolded patches give the Gram form.
    """
    window, g2 = _conv_windows(node, x, g)
    offsets = _conv_offsets(node, rhs_shape)
    _, rhs_spec, _ = node.params["dimension_numbers"]
    t, k, n = g2.shape[1], len(offsets) * rhs_shape[rhs_spec[1]], g2.shape[2]
    if norm_form(t, k, n) == "gram":
        return _outer_sq(jnp.concatenate([window(o) for o in offsets], axis=-1), g2)
    total = jnp.zeros((x.shape[0],), jnp.float32)
    for offset in offsets:
        block = jnp.einsum("btc,bto->bco", window(offset), g2, precision=_PRECISION)
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
    blocks = [
        jnp.einsum("btc,bto->bco", window(o), g2, precision=_PRECISION)
        for o in _conv_offsets(node, rhs_shape)
    ]
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
    gg = jnp.einsum("btd,bsd->bts", g, g, precision=_PRECISION)
    return jnp.sum(jnp.where(same, gg, 0.0), axis=(1, 2))


def _ghost_sq(program: ExampleGraph, use: Use, acts: list[Any], grads: list[Any]) -> jax.Array:
    node = program.nodes[use.node]
    side = _param_side(program, node)
    param_shape = program.avals[node.inputs[side]].shape
    if use.kind == "dense":
        return _dense_sq(node, side, acts[0], grads[0])
    if use.kind == "conv":
        return _conv_sq(node, param_shape, acts[0], grads[0])
    return _embedding_sq(node, param_shape, acts[0], grads[0])


# --------------------------------------------------------------------------
# Which ghost uses keep their per-example gradients (book-keeping)
# --------------------------------------------------------------------------


def _sizes(program: ExampleGraph, use: Use) -> tuple[int, int, int]:
    """``(T, K, N)`` of a dense or conv use: positions, inputs and outputs per parameter entry."""
    node = program.nodes[use.node]
    side = _param_side(program, node)
    out_shape = program.avals[node.outputs[0]].shape
    param_shape = program.avals[node.inputs[side]].shape
    if use.kind == "conv":
        _, rhs_spec, out_spec = node.params["dimension_numbers"]
        n = int(param_shape[rhs_spec[0]])
        t = int(np.prod(out_shape, dtype=np.int64)) // max(int(out_shape[out_spec[1]]), 1)
        return t, int(np.prod(param_shape, dtype=np.int64)) // max(n, 1), n
    act_shape = program.avals[node.inputs[1 - side]].shape
    contract, free = _dense_free(node, side, len(act_shape))
    t = int(np.prod([act_shape[d] for d in free], dtype=np.int64))
    k = int(np.prod([act_shape[d] for d in contract], dtype=np.int64))
    return t, k, int(np.prod(param_shape, dtype=np.int64)) // max(k, 1)


def keep_plan(program: ExampleGraph, batch_size: int, memory_budget: int) -> frozenset[int]:
    """The dense/conv uses whose per-example gradients are formed once and kept.

    For the clipped sum, a use either (ghost) computes its norm from activations and
    output gradients and then its share of the clipped sum with one weighted
    weight-gradient contraction (``B·T·K·N``), or (kept) forms its per-example gradients
    ``(B, K, N)`` once (``B·T·K·N``), takes the norm from them and the clipped sum as the
    ``f``-weighted sum over examples (``B·K·N``) — mixed ghost clipping with book-keeping
    (Bu et al., 2023). A use is kept when `norm_form` picks ``"per-example"`` for it
    (``2T² ≥ K·N``: its Gram matrices would be at least as large as its gradient) and its
    ``B·K·N`` float32 entries fit in what is left of ``memory_budget``; otherwise its norm
    takes its `norm_form` without keeping anything.
    """
    kept, used = [], 0
    for j, use in enumerate(program.uses):
        if use.kind not in ("dense", "conv"):
            continue
        t, k, n = _sizes(program, use)
        size = 4 * batch_size * k * n
        if norm_form(t, k, n) == "per-example" and used + size <= memory_budget:
            kept.append(j)
            used += size
    return frozenset(kept)


def leaf_forms(program: ExampleGraph) -> list[str]:
    """Per parameter leaf, how its per-example norm is formed (for the coverage rows).

    ``"rank-one"`` / ``"gram"`` / ``"per-example"`` for a dense or conv leaf (`norm_form`
    of its use), ``"gram"`` for an embedding (token-equality Gram of the output
    gradients, nothing ``(V, d)`` formed), ``"per-example"`` for elementwise and fallback
    leaves, ``""`` for unused ones.
    """
    forms = ["per-example" if k in ("elementwise", "fallback") else "" for k in program.leaf_kind]
    for use in program.uses:
        if use.kind in ("dense", "conv"):
            form = norm_form(*_sizes(program, use))
        elif use.kind == "embedding":
            form = "gram"
        else:
            continue
        for leaf in use.leaves:
            forms[leaf] = form
    return forms


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
            env = _static(program, full)
            return [_apply_use(program, program.uses[j], env, a) for j, a in zip(picked, acts_i)]

        _, vjp = jax.vjp(uses_of, [leaves[i] for i in which])
        return vjp(grads_i)[0]

    per_example = jax.vmap(one)([acts[j] for j in picked], [grads[j] for j in picked])
    return dict(zip(which, per_example))


def _sum_sq(grad: jax.Array) -> jax.Array:
    return jnp.sum(jnp.square(grad.astype(jnp.float32)).reshape(grad.shape[0], -1), axis=1)


def sq_norms(
    program: ExampleGraph,
    leaves: list[Any],
    acts: list[list[Any]],
    grads: list[list[Any]],
    keep: frozenset[int] = frozenset(),
) -> tuple[jax.Array, dict[int, jax.Array], dict[int, jax.Array]]:
    """Squared per-example gradient norms ``(B,)`` float32, the materialised leaves' gradients
    and the kept uses' per-example gradients (of their parameter input, by use index)."""
    b = int(np.shape(jax.tree.leaves(grads)[0])[0]) if jax.tree.leaves(grads) else 0
    total = jnp.zeros((b,), jnp.float32)
    env = _static(program, leaves) if keep else {}
    kept: dict[int, jax.Array] = {}
    for j, (use, a, g) in enumerate(zip(program.uses, acts, grads)):
        if j in keep:
            kept[j] = _kept_grads(program, env, use, a, g)
            total = total + _sum_sq(kept[j])
        elif use.kind in GHOST_KINDS:
            total = total + _ghost_sq(program, use, a, g)
    pe = _materialised(program, leaves, acts, grads)
    for grad in pe.values():
        total = total + _sum_sq(grad)
    return total, pe, kept


def weighted_sum(
    program: ExampleGraph,
    leaves: list[Any],
    acts: list[list[Any]],
    grads: list[list[Any]],
    pe: dict[int, jax.Array],
    kept: dict[int, jax.Array],
    factor: jax.Array,
    live: jax.Array | None,
) -> list[Any]:
    """``Σ_i f_i ∇_i`` for every leaf, from the pass's quantities (book-keeping).

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
    if not ghost:
        return out
    which = sorted({i for j in ghost for i in program.uses[j].leaves})

    def uses_of(sub: list[Any]) -> list[list[Any]]:
        full = list(leaves)
        for i, v in zip(which, sub):
            full[i] = v
        env = _static(program, full)
        return [jax.vmap(_use_fn(program, program.uses[j], env))(acts[j]) for j in ghost]

    _, vjp = jax.vjp(uses_of, [leaves[i] for i in which])
    cot = [[g * _expand(factor, g) for g in grads[j]] for j in ghost]
    for i, grad in zip(which, vjp(cot)[0]):
        out[i] = grad
    return out


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
        env = _static(program, full)
        nodes = [program.nodes[program.uses[j].node] for j in uses]
        return [read(env, node.inputs[_param_side(program, node)]) for node in nodes]

    values, vjp = jax.vjp(params_of, [leaves[i] for i in which])
    cot = [jnp.tensordot(factor, kept[j], axes=1).astype(v.dtype) for j, v in zip(uses, values)]
    return dict(zip(which, vjp(cot)[0]))


def _use_fn(
    program: ExampleGraph, use: Use, env: dict[int, Any]
) -> Callable[[list[Any]], list[Any]]:
    return lambda a: _apply_use(program, use, env, a)


def _expand(factor: jax.Array, like: jax.Array) -> jax.Array:
    return factor.astype(like.dtype).reshape(-1, *([1] * (like.ndim - 1)))
