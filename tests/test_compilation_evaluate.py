"""Tests for jaxwise.compilation.evaluate_jaxpr: the one jaxpr evaluator and its hook.

A hook that swaps ``sin`` for ``cos`` must reach every kind of sub-program (jit, scan,
cond, while, checkpoint, custom_jvp, custom_vjp, shard_map with a collective, a named vmap)
and give the same values as the program written with ``cos``; without a hook the evaluator
is ``jax.core.eval_jaxpr``. The ``shard_map`` parameter names it reads are checked here, so a
JAX upgrade that renames them fails this file.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from host64 import mesh_devices
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxwise.compilation import (
    CompileBudget,
    canonical_convolutions,
    evaluate_equation,
    evaluate_jaxpr,
)
from jaxwise.compilation._evaluate import _SHARD_MAP_PARAMS


def _cos_for_sin(eqn, invals):
    return [jnp.cos(invals[0])] if eqn.primitive.name == "sin" else None


def _program(trig):
    """``trig`` (sin or cos) inside every kind of sub-program."""
    mesh = Mesh(np.asarray(mesh_devices(4)), ("data",))

    @jax.custom_jvp
    def smooth(x):
        return trig(x) * 2.0

    smooth.defjvp(lambda p, t: (smooth(p[0]), 2.0 * t[0]))

    @jax.custom_vjp
    def rough(x):
        return trig(x) + 1.0

    rough.defvjp(lambda x: (rough(x), None), lambda _, g: (g,))

    def f(x):
        a = jax.jit(trig)(x)
        b = jax.lax.scan(lambda c, v: (c + trig(v), c), jnp.zeros(()), x)[0]
        c = jax.lax.cond(b > 0, lambda: trig(x), lambda: -trig(x))
        d = jax.lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] + trig(s[1])), (0, x))
        e = jax.checkpoint(trig)(x) + smooth(x) + rough(x)
        body = lambda v: jax.lax.psum(trig(v), "data")  # noqa: E731
        g = jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P())(x)
        h = jax.vmap(lambda v: jax.lax.pmean(trig(v), "i"), axis_name="i")(x)
        return a + c + d[1] + e + h + jnp.sum(g) + b

    return f


def test_a_hook_reaches_every_kind_of_sub_program():
    x = jnp.linspace(0.1, 1.0, 8)
    program = jax.make_jaxpr(_program(jnp.sin))(x)
    got = evaluate_jaxpr(program, [x], _cos_for_sin)
    want = _program(jnp.cos)(x)
    np.testing.assert_allclose(got[0], want, rtol=1e-6)
    # also traced: inside jit, and inside its own re-traced sub-programs
    traced = jax.jit(lambda v: evaluate_jaxpr(program, [v], _cos_for_sin)[0])(x)
    np.testing.assert_allclose(traced, want, rtol=1e-6)


def test_without_a_hook_it_is_eval_jaxpr():
    x = jnp.linspace(0.1, 1.0, 8)
    program = jax.make_jaxpr(_program(jnp.sin))(x)
    np.testing.assert_array_equal(evaluate_jaxpr(program, [x])[0], _program(jnp.sin)(x))
    eqn = program.eqns[0]
    assert len(evaluate_equation(eqn, [x])) == len(eqn.outvars)


def test_declined_sub_programs_are_bound_unchanged():
    def f(x):
        return jnp.sin(x) + jax.jit(jnp.sin)(x)

    x = jnp.ones(3)
    program = jax.make_jaxpr(f)(x)
    (got,) = evaluate_jaxpr(program, [x], _cos_for_sin, descend=lambda _: False)
    np.testing.assert_allclose(got, jnp.cos(x) + jnp.sin(x), rtol=1e-6)


def test_the_hook_runs_inside_the_shard_map_axis_environment():
    """A hook may use the body's collectives itself (it runs inside the mesh axes)."""
    mesh = Mesh(np.asarray(mesh_devices(4)), ("data",))

    def f(x):
        return jax.shard_map(jnp.sin, mesh=mesh, in_specs=P("data"), out_specs=P("data"))(x)

    def summed(eqn, invals):
        return [jax.lax.psum(jnp.sin(invals[0]), "data")] if eqn.primitive.name == "sin" else None

    x = jnp.arange(8.0)
    program = jax.make_jaxpr(f)(x)
    (got,) = evaluate_jaxpr(program, [x], summed)
    want = np.tile(np.sin(np.arange(8.0)).reshape(4, 2).sum(0), 4)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_evaluated_program_under_jit_compiles_once():
    x = jnp.linspace(0.1, 1.0, 8)
    program = jax.make_jaxpr(_program(jnp.sin))(x)
    run = jax.jit(lambda v: evaluate_jaxpr(program, [v], _cos_for_sin)[0])
    with CompileBudget(1, run, exact=True):
        for scale in (1.0, 2.0, 3.0):
            run(scale * x)


def test_the_shard_map_parameters_it_reads_exist():
    mesh = Mesh(np.asarray(mesh_devices(2)), ("data",))
    sm = jax.shard_map(jnp.sin, mesh=mesh, in_specs=P("data"), out_specs=P("data"))
    (eqn,) = jax.make_jaxpr(sm)(jnp.ones(4)).eqns
    assert eqn.primitive.name == "shard_map"
    assert _SHARD_MAP_PARAMS <= eqn.params.keys()
    assert "newly_manual_axes" in eqn.params


def test_wrong_arguments_are_named():
    program = jax.make_jaxpr(lambda a, b: a + b)(1.0, 2.0)
    with pytest.raises(ValueError, match="`args` must hold 2 values, got 1"):
        evaluate_jaxpr(program, [1.0])
    with pytest.raises(ValueError, match="`consts` must hold 0 values, got 1"):
        evaluate_jaxpr(program, [1.0, 2.0], consts=[3.0])
    with pytest.raises(TypeError, match="`jaxpr` must be a jaxpr"):
        evaluate_jaxpr(lambda a, b: a + b, [1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`hook` must be callable"):
        evaluate_jaxpr(program, [1.0, 2.0], hook=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`descend` must be callable"):
        evaluate_jaxpr(program, [1.0, 2.0], _cos_for_sin, descend="all")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`hook` returned 2 outputs for `add`, which has 1"):
        evaluate_jaxpr(program, [1.0, 2.0], lambda eqn, invals: [1.0, 2.0])
    with pytest.raises(TypeError, match="`fn` must be callable"):
        canonical_convolutions(None)  # type: ignore[arg-type]
