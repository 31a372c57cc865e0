"""The probed forward pass: the per-example program re-evaluated with a probe at chosen uses.

The program of `._graph` is evaluated node by node for ONE example; a zero *probe* added to
the output of a use makes the gradient of the loss with respect to the probe that example's
output gradient ``g`` of the use, and the use's example input is its activation ``a``. Ghost
clipping (`._ghost`) probes every use; the materialising paths (`._sparse`) probe the
embedding lookups only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise.per_example._graph import EXAMPLE, Const, ExampleGraph, Node, Use, bind, read


def example_positions(program: ExampleGraph, node: Node) -> list[int]:
    """The positions of ``node``'s inputs that depend on the example."""
    return [
        i
        for i, r in enumerate(node.inputs)
        if not isinstance(r, Const) and program.dep[r] == EXAMPLE
    ]


def static_env(program: ExampleGraph, leaves: Sequence[Any]) -> dict[int, Any]:
    """Every value that does not depend on the example, as a function of the leaves."""
    env: dict[int, Any] = dict(enumerate(leaves))
    for node in program.nodes:
        if node.outputs and program.dep[node.outputs[0]] != EXAMPLE:
            for o, val in zip(node.outputs, bind(node, [read(env, r) for r in node.inputs])):
                env[o] = val
    return env


def apply_use(
    program: ExampleGraph, use: Use, env: dict[int, Any], acts: Sequence[Any]
) -> list[Any]:
    """The use's probed outputs, with its example inputs taken from ``acts``."""
    node = program.nodes[use.node]
    it = iter(acts)
    ins = [
        next(it) if i in example_positions(program, node) else read(env, r)
        for i, r in enumerate(node.inputs)
    ]
    outs = bind(node, ins)
    return [outs[p] for p in use.probes]


def forward(
    program: ExampleGraph, leaves: list[Any], example: list[Any], probes: dict[int, list[Any]]
) -> tuple[Any, dict[int, list[Any]]]:
    """Loss of ONE example with probes added at the uses in ``probes`` (by use index); also
    those uses' example inputs."""
    env: dict[int, Any] = dict(enumerate([*leaves, *example]))
    use_at = {program.uses[j].node: j for j in probes}
    acts: dict[int, list[Any]] = {}
    for k, node in enumerate(program.nodes):
        ins = [read(env, r) for r in node.inputs]
        outs = bind(node, ins)
        j = use_at.get(k)
        if j is not None:
            acts[j] = [ins[p] for p in example_positions(program, node)]
            for pos, probe in zip(program.uses[j].probes, probes[j]):
                outs[pos] = outs[pos] + probe
        for o, val in zip(node.outputs, outs):
            env[o] = val
    return read(env, program.output), acts


def probe_zeros(program: ExampleGraph, uses: Sequence[int], lead: tuple[int, ...] = ()) -> dict:
    """Zero probes ``{use: [(*lead, *output shape)]}`` for the outputs of ``uses``."""
    return {
        j: [
            jnp.zeros(
                (*lead, *program.avals[program.nodes[program.uses[j].node].outputs[p]].shape),
                program.avals[program.nodes[program.uses[j].node].outputs[p]].dtype,
            )
            for p in program.uses[j].probes
        ]
        for j in uses
    }


def output_grads(
    program: ExampleGraph, leaves: list[Any], example: list[Any]
) -> tuple[jax.Array, list[list[Any]], list[list[Any]]]:
    """One forward and one backward pass: ``(losses (B,), acts, g)`` per use."""
    b = int(np.shape(example[0])[0])
    zeros = probe_zeros(program, range(len(program.uses)), (b,))

    def total(probes: dict) -> tuple[jax.Array, tuple[jax.Array, dict]]:
        losses, acts = jax.vmap(lambda ex, pr: forward(program, leaves, ex, pr))(example, probes)
        return jnp.sum(losses), (losses, acts)

    grads, (losses, acts) = jax.grad(total, has_aux=True)(zeros)
    order = range(len(program.uses))
    return losses, [acts[j] for j in order], [grads[j] for j in order]
