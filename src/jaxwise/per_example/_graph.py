"""The per-example program as a flat graph, and how each parameter leaf is used in it.

``loss(params, example)`` is traced ONCE for one example to a jaxpr, calls to
``jit``/``closed_call`` are inlined, and every value is classified as *constant*, *param*
(computed from the parameters alone) or *example* (depends on the example). An equation
where a param value meets an example value is a **use**: the per-example gradient of a
parameter leaf is the sum over its uses of the vector-Jacobian product of that equation
with respect to its param input, at the gradient of the equation's output. Uses of known
structure get a ghost norm (``"dense"``, ``"conv"``, ``"embedding"``); the rest are
materialised per example for the leaves they touch (``"elementwise"``, ``"fallback"``).

The graph is built by the one jaxpr evaluator (`jaxwise.compilation.evaluate_jaxpr`) with a
hook whose values are the graph's refs; jaxprs are read through ``jax.extend.core`` only;
`bind` is the one place that re-applies a node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np

from jaxwise._errors import JaxwiseError
from jaxwise._shared._jax import program_parts
from jaxwise.compilation import evaluate_jaxpr
from jaxwise.tree import path_names

CONST, PARAM, EXAMPLE = 0, 1, 2
KINDS = ("dense", "conv", "embedding", "elementwise", "fallback", "unused")

# Equations that only reorder or re-type their single input (norm-preserving views).
_VIEWS = frozenset(
    {
        "convert_element_type",
        "transpose",
        "reshape",
        "squeeze",
        "expand_dims",
        "copy",
        "copy_p",
        "reduce_precision",
    }
)
_INLINE = frozenset({"jit", "pjit", "closed_call", "core_call", "checkpoint", "remat", "remat2"})
_ELEMENTWISE = frozenset(
    {
        "add",
        "add_any",
        "sub",
        "mul",
        "div",
        "max",
        "min",
        "select_n",
        "pow",
        "clamp",
        "rem",
        "atan2",
    }
)


class Unsupported(JaxwiseError):
    """The program cannot be analysed (the caller falls back to ``vmap``)."""


@dataclasses.dataclass(frozen=True)
class Const:
    """A literal or closed-over constant input of a node."""

    value: Any


Ref = "int | Const"


@dataclasses.dataclass(frozen=True)
class Node:
    """One primitive application of the flattened per-example program."""

    prim: Any
    params: dict[str, Any]
    inputs: tuple[Any, ...]  # value ids (int) or Const
    outputs: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Use:
    """A node where param values meet example values.

    Attributes:
        node: index into ``ExampleGraph.nodes``.
        kind: ``"dense"``, ``"conv"``, ``"embedding"`` (ghost norms) or ``"elementwise"`` /
            ``"fallback"`` (materialised per example).
        leaves: indices of the parameter leaves its param inputs depend on.
        probes: output positions with a float dtype (their gradients are the ``g``).
    """

    node: int
    kind: str
    leaves: frozenset[int]
    probes: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class ExampleGraph:
    """The flattened per-example program with its dependence classes and uses."""

    nodes: tuple[Node, ...]
    avals: tuple[Any, ...]
    n_leaves: int
    n_inputs: int
    output: Any
    dep: tuple[int, ...]
    uses: tuple[Use, ...]
    leaf_kind: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class CoverageRow:
    """How one parameter leaf's per-example gradient norm is computed.

    Attributes:
        path: dotted path of the leaf in ``params`` (``"dense_0.w"``).
        kind: ``"dense"`` / ``"conv"`` / ``"embedding"`` (ghost norm from activations and
            output gradients, nothing per-example materialised), ``"elementwise"`` (small
            per-example gradients computed directly: biases, scales), ``"fallback"`` (exact
            per-example gradients for this leaf), ``"unused"`` (the loss does not depend on it).
        shape: the leaf's shape.
        norm: how the norm is formed from the shapes (``"rank-one"``, ``"gram"`` or
            ``"per-example"``, see [`ghost_coverage`][jaxwise.per_example.ghost_coverage]);
            ``""`` for an unused leaf.
    """

    path: str
    kind: str
    shape: tuple[int, ...]
    norm: str = ""

    def __str__(self) -> str:
        return f"{self.path:<32} {self.kind:<11} {self.norm:<11} {self.shape}"


def bind(node: Node, inputs: Sequence[Any]) -> list[Any]:
    """Apply ``node``'s primitive to ``inputs`` (a list of outputs)."""
    out = node.prim.bind(*inputs, **node.prim.get_bind_params(node.params))
    return list(out) if node.prim.multiple_results else [out]


def read(env: dict[int, Any], ref: Any) -> Any:
    return ref.value if isinstance(ref, Const) else env[ref]


# --------------------------------------------------------------------------
# Tracing and flattening
# --------------------------------------------------------------------------


def trace(loss: Callable[[Any, Any], Any], params: Any, batch: Any) -> ExampleGraph:
    """Trace ``loss`` for one example (each leaf's shape without its leading axis) and analyse it.

    The example inputs of the program are ``jax.tree.leaves(batch)``, in that order.
    """
    leaves, treedef = jax.tree.flatten(params)
    ex_leaves, ex_def = jax.tree.flatten(batch)
    spec = [jax.ShapeDtypeStruct(np.shape(x)[1:], x.dtype) for x in ex_leaves]
    pspec = [jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in leaves]

    def single(p: list[Any], ex: list[Any]) -> Any:
        return loss(jax.tree.unflatten(treedef, p), jax.tree.unflatten(ex_def, ex))

    closed = jax.make_jaxpr(single)(pspec, spec)
    out_aval: Any = closed.out_avals[0] if len(closed.out_avals) == 1 else None
    if out_aval is None or out_aval.shape != () or not jnp.issubdtype(out_aval.dtype, jnp.floating):
        raise TypeError(
            f"`loss` must return a float scalar for one example, got {closed.out_avals}"
        )
    nodes: list[Node] = []
    avals: list[Any] = []

    def new(aval: Any) -> int:
        avals.append(aval)
        return len(avals) - 1

    inputs = [new(v.aval) for v in closed.jaxpr.invars]
    (output,) = _walk(closed.jaxpr, closed.consts, inputs, nodes, new)
    return _analyse(nodes, avals, len(leaves), len(inputs), output)


def _walk(
    jaxpr: Any,
    consts: Sequence[Any],
    in_refs: Sequence[Any],
    nodes: list[Node],
    new: Callable[[Any], int],
) -> list[Any]:
    """Flatten ``jaxpr``: the one jaxpr evaluator, its values the refs of the graph.

    The hook adds a `Node` per equation (calls are inlined) and returns fresh value ids as
    the equation's outputs, so nothing is computed.
    """

    def add(eqn: jex.JaxprEqn, invals: list[Any]) -> list[Any]:
        ins = [Const(v) if isinstance(a, jex.Literal) else v for a, v in zip(eqn.invars, invals)]
        inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        if eqn.primitive.name in _INLINE and inner is not None:
            body, consts = program_parts(inner)
            return _walk(body, consts, ins, nodes, new)
        outs = [new(v.aval) for v in eqn.outvars]
        nodes.append(Node(eqn.primitive, dict(eqn.params), tuple(ins), tuple(outs)))
        return outs

    outs = evaluate_jaxpr(jaxpr, in_refs, add, consts=[Const(c) for c in consts])
    return [Const(o) if isinstance(a, jex.Literal) else o for a, o in zip(jaxpr.outvars, outs)]


# --------------------------------------------------------------------------
# Dependence analysis and use classification
# --------------------------------------------------------------------------


# node, the leaves it touches, its ghost kind (or None), its probed outputs
RawUse = tuple[int, frozenset[int], "str | None", tuple[int, ...]]


def _analyse(
    nodes: list[Node], avals: list[Any], n_leaves: int, n_inputs: int, output: Any
) -> ExampleGraph:
    dep = [PARAM if i < n_leaves else EXAMPLE for i in range(n_inputs)]
    dep += [CONST] * (len(avals) - n_inputs)
    leaves_of: dict[int, frozenset[int]] = {i: frozenset({i}) for i in range(n_leaves)}
    view_of: dict[int, int] = {i: i for i in range(n_leaves)}  # value -> leaf it is a pure view of
    raw_uses: list[RawUse] = []
    for k, node in enumerate(nodes):
        deps = [CONST if isinstance(r, Const) else dep[r] for r in node.inputs]
        value_ins = [r for r in node.inputs if not isinstance(r, Const) and dep[r] == PARAM]
        touched = frozenset().union(*(leaves_of[r] for r in value_ins))
        out_dep = EXAMPLE if EXAMPLE in deps else max(deps, default=CONST)
        if EXAMPLE in deps and PARAM in deps:
            probes = tuple(
                j for j, o in enumerate(node.outputs) if jnp.issubdtype(avals[o].dtype, jnp.inexact)
            )
            if probes:  # an integer-valued use passes no gradient
                raw_uses.append((k, touched, _ghost_kind(node, deps, view_of, avals), probes))
        for o in node.outputs:
            dep[o] = out_dep
            if out_dep == PARAM:
                leaves_of[o] = touched
                if node.prim.name in _VIEWS and len(value_ins) == 1 and value_ins[0] in view_of:
                    view_of[o] = view_of[value_ins[0]]
    if isinstance(output, Const) or dep[output] != EXAMPLE:
        raise Unsupported("the loss does not depend on the example")
    leaf_kind = _leaf_kinds(nodes, n_leaves, raw_uses)
    uses = []
    for k, touched, ghost, probes in raw_uses:
        kinds = {leaf_kind[i] for i in touched}
        if ghost is not None and kinds == {ghost}:
            kind = ghost
        else:
            kind = "elementwise" if kinds == {"elementwise"} else "fallback"
        uses.append(Use(k, kind, touched, probes))
    return ExampleGraph(
        tuple(nodes),
        tuple(avals),
        n_leaves,
        n_inputs,
        output,
        tuple(dep),
        tuple(uses),
        tuple(leaf_kind),
    )


def _leaf_kinds(nodes: list[Node], n_leaves: int, raw_uses: list[RawUse]) -> list[str]:
    """A ghost kind for a leaf with exactly one ghost-able use, else elementwise/fallback/unused."""
    per_leaf: list[list[RawUse]] = [[] for _ in range(n_leaves)]
    for use in raw_uses:
        for leaf in use[1]:
            per_leaf[leaf].append(use)
    kinds = []
    for uses_i in per_leaf:
        if not uses_i:
            kinds.append("unused")
        elif len(uses_i) == 1 and uses_i[0][2] is not None:
            kinds.append(str(uses_i[0][2]))
        elif all(nodes[use[0]].prim.name in _ELEMENTWISE for use in uses_i):
            kinds.append("elementwise")
        else:
            kinds.append("fallback")
    return kinds


def _ghost_kind(
    node: Node, deps: list[int], view_of: dict[int, int], avals: list[Any]
) -> str | None:
    """``"dense"``/``"conv"``/``"embedding"`` if the node has a ghost norm, else None."""
    name = node.prim.name
    params = [i for i, d in enumerate(deps) if d == PARAM]
    if len(params) != 1 or node.inputs[params[0]] not in view_of or len(node.inputs) != 2:
        return None
    side = params[0]
    if deps[1 - side] != EXAMPLE:
        return None
    if name == "dot_general":
        (_, _), (lb, rb) = node.params["dimension_numbers"]
        return "dense" if not lb and not rb else None
    if name == "conv_general_dilated" and side == 1:
        ok = node.params["feature_group_count"] == 1 and node.params["batch_group_count"] == 1
        return "conv" if ok else None
    if name == "gather" and side == 0:
        shape = avals[node.inputs[0]].shape
        return "embedding" if embedding_layout(node, shape) is not None else None
    return None


def embedding_layout(
    node: Node, operand_shape: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """For a row-lookup gather: ``(largest start index per component, offset_dims)``, else None.

    A row lookup takes whole slices (along each indexed operand dimension either size 1 or
    the full dimension; full along the others), so two lookups touch the same gradient
    entries iff their (clamped) indices are equal.
    """
    dn = node.params["dimension_numbers"]
    sizes = tuple(node.params["slice_sizes"])
    if getattr(dn, "operand_batching_dims", ()) or getattr(dn, "start_indices_batching_dims", ()):
        return None
    index_map = tuple(dn.start_index_map)
    if any(sizes[d] not in (1, operand_shape[d]) for d in index_map):
        return None
    if any(sizes[d] != operand_shape[d] for d in range(len(sizes)) if d not in index_map):
        return None
    return tuple(operand_shape[d] - sizes[d] for d in index_map), tuple(dn.offset_dims)


def coverage(program: ExampleGraph, params: Any) -> list[CoverageRow]:
    """One `CoverageRow` per parameter leaf, in ``jax.tree.leaves`` order."""
    names = path_names(params)
    shapes = [tuple(np.shape(x)) for x in jax.tree.leaves(params)]
    return [CoverageRow(n or "<root>", k, s) for n, k, s in zip(names, program.leaf_kind, shapes)]
