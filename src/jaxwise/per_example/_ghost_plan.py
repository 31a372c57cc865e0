"""Which form each ghost use's per-example norm takes, and which uses keep their gradients.

From the traced program's shapes and the backend's costs (`jaxwise.per_example._cost`): a
dense or conv use's norm is rank-one, Gram or materialised (`norm_form`); for a batch and a
memory budget, `plan_forms` decides which uses keep their per-example gradients for the
clipped sum (mixed ghost clipping with book-keeping, Bu et al., 2023), and
`ghost_extra_cost` prices the whole plan for ``method="auto"``.
"""

from __future__ import annotations

import numpy as np

from jaxwise.per_example._cost import BackendCost, backend_cost, layer_costs
from jaxwise.per_example._graph import EXAMPLE, Const, ExampleGraph, Node, Use


def norm_form(t: int, k: int, n: int, cost: BackendCost | None = None) -> str:
    """How a dense/conv use's per-example norm is formed from its shapes and the backend's costs.

    A weight ``(K, N)`` applied at ``T`` positions of each example: the per-example
    gradient is ``Σ_t a_t g_tᵀ``. Its squared norm is ``‖a‖²‖g‖²`` when ``T = 1``
    (``"rank-one"``); else either from the ``(T, T)`` Gram matrices of ``a`` and ``g``
    (``"gram"``: ``2T²(K + N)`` FLOPs and ``2T²`` floats per example) or from the
    materialised per-example gradient (``"per-example"``: kept for the clipped sum, ``KN``
    floats written and read), whichever `_cost.layer_costs` says is cheaper on the backend
    (``cost``; default the one in use) at the matmul precision in effect: FLOPs against bytes.

    Examples:
        >>> import jax
        >>> from jaxwise.per_example._cost import backend_cost
        >>> cpu, tpu = backend_cost("cpu"), backend_cost("tpu")
        >>> with jax.default_matmul_precision("default"):  # a TPU's one bfloat16 pass
        ...     norm_form(1, 512, 512), norm_form(64, 128, 128, cpu), norm_form(256, 768, 768, tpu)
        ('rank-one', 'per-example', 'gram')
    """
    if t == 1:
        return "rank-one"
    costs = layer_costs(t, k, n, cost or backend_cost())
    return "gram" if costs["gram"] < costs["per-example"] else "per-example"


def fallback_form(t: int, k: int, n: int, cost: BackendCost) -> str:
    """The norm form of a use whose per-example gradients cannot be kept (the budget is spent)."""
    if t == 1:
        return "rank-one"
    costs = layer_costs(t, k, n, cost)
    return "gram" if costs["gram"] <= costs["per-example, dropped"] else "per-example"


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


def plan_forms(
    program: ExampleGraph, batch_size: int, memory_budget: int, cost: BackendCost
) -> dict[int, str]:
    """Each dense/conv use's norm form for a batch (by use index); kept uses take ``"kept"``.

    For the clipped sum, a use either (ghost) computes its norm from activations and output
    gradients and then its share of the clipped sum with one weighted weight-gradient
    contraction (``B·T·K·N``), or (kept) forms its per-example gradients ``(B, K, N)`` once
    (``B·T·K·N``), takes the norm from them and the clipped sum as the ``f``-weighted sum
    over examples (``B·K·N``) — mixed ghost clipping with book-keeping (Bu et al., 2023).
    A use is kept when `norm_form` picks ``"per-example"`` on the backend (``cost``) and its
    ``B·K·N`` float32 entries fit in what is left of ``memory_budget``; otherwise its norm
    takes the cheaper of the Gram form and a dropped per-example gradient (`fallback_form`).
    """
    forms, used = {}, 0
    for j, use in enumerate(program.uses):
        if use.kind not in ("dense", "conv"):
            continue
        t, k, n = _sizes(program, use)
        size = 4 * batch_size * k * n
        if norm_form(t, k, n, cost) == "per-example" and used + size <= memory_budget:
            forms[j] = "kept"
            used += size
        else:
            forms[j] = fallback_form(t, k, n, cost)
    return forms


def ghost_extra_cost(
    program: ExampleGraph, forms: dict[int, str], n_leaf_entries: int, cost: BackendCost
) -> float:
    """Per-example extra cost (FLOP units, `_cost.layer_costs`) of ghost clipping the program:
    each dense/conv use in its form, the embeddings' token Gram, the materialised leaves."""
    total = 4.0 * n_leaf_entries + cost.flops_per_byte * 8.0 * n_leaf_entries
    for j, use in enumerate(program.uses):
        if use.kind in ("dense", "conv"):
            t, k, n = _sizes(program, use)
            if forms[j] != "rank-one":
                key = {"kept": "per-example", "gram": "gram"}.get(forms[j], "per-example, dropped")
                total += layer_costs(t, k, n, cost)[key]
        elif use.kind == "embedding":
            node = program.nodes[use.node]
            shape = program.avals[node.outputs[0]].shape
            d = int(shape[-1]) if shape else 1
            t = int(np.prod(shape, dtype=np.int64)) // max(d, 1)
            total += 2.0 * t * t * d + cost.flops_per_byte * 4.0 * t * t
    return total


def leaf_forms(program: ExampleGraph, forms: dict[int, str]) -> list[str]:
    """Per parameter leaf, how its per-example norm is formed (for the coverage rows).

    ``"rank-one"`` / ``"gram"`` / ``"per-example"`` for a dense or conv leaf (its use's form
    in ``forms``, `plan_forms`: kept or not, a materialised gradient is ``"per-example"``),
    ``"gram"`` for an embedding (token-equality Gram of the output gradients, nothing
    ``(V, d)`` formed), ``"per-example"`` for elementwise and fallback leaves, ``""`` for
    unused ones.
    """
    out = ["per-example" if k in ("elementwise", "fallback") else "" for k in program.leaf_kind]
    for j, use in enumerate(program.uses):
        if use.kind in ("dense", "conv"):
            form = "per-example" if forms[j] == "kept" else forms[j]
        elif use.kind == "embedding":
            form = "gram"
        else:
            continue
        for leaf in use.leaves:
            out[leaf] = form
    return out
