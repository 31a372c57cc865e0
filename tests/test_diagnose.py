"""Tests for jaxwise.diagnose: captured constants and the classification of every recompile trigger."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise.diagnose import FIXES, captured_constants, why_recompiled


def test_captured_constants_finds_closure_matrix_not_argument():
    a = jnp.asarray(np.random.default_rng(0).normal(size=(300, 300)), jnp.float32)
    x = jnp.ones(300)
    for fn in (lambda v: jnp.tanh(a @ v), jax.jit(lambda v: jnp.tanh(a @ v))):
        report = captured_constants(fn, x)
        assert report.flagged and report.total_bytes == 300 * 300 * 4
        assert report.constants[0].shape == (300, 300) and report.constants[0].dtype == "float32"
        assert report.program_chars > 2 * 300 * 300 * 4 > report.program_chars_without
        assert "pass them as arguments" in report.verdict
    clean = captured_constants(lambda m, v: jnp.tanh(m @ v), a, x)
    assert not clean.flagged and clean.constants == () and clean.total_bytes == 0
    assert "every array is an argument" in clean.verdict
    small = captured_constants(lambda v: v * jnp.arange(3.0), jnp.ones(3))
    assert not small.flagged
    with pytest.raises(TypeError, match="callable"):
        captured_constants(3, x)


# The trigger table of the foundation issue: (fn, calls, expected categories of every compile).


class _Plain:
    def __init__(self, k):
        self.k = k


@dataclasses.dataclass(frozen=True)
class _Frozen:
    k: float


class _Model:
    def apply(self, x):
        return x + 1.0

    def run(self, x):
        return jax.jit(self.apply)(x)


def _scale(x):
    return 3.0 * x


def triggers():
    a3, a4, i3 = jnp.ones(3), jnp.ones(4), jnp.ones(3, jnp.int32)
    strong = jnp.float32(0.5)
    model = _Model()

    def with_default(x, y=2.0):
        return x * y

    return {
        "shape": (jax.jit(lambda x: x * 2.0), [(a3,), (a4,)], ["first compile", "shape"]),
        "dtype": (jax.jit(lambda x: x * 2), [(a3,), (i3,)], ["first compile", "dtype"]),
        "weak type": (jax.jit(lambda lr: lr * 2.0), [(0.5,), (strong,)], ["first compile", "weak type"]),
        "static value": (jax.jit(lambda x, n: x * n, static_argnums=1), [(a3, 2), (a3, 3)],
                         ["first compile", "static value"]),
        "static identity": (jax.jit(lambda x, c: x * c.k, static_argnums=1), [(a3, _Plain(2.0)), (a3, _Plain(2.0))],
                            ["first compile", "static identity"]),
        "pytree (None leaf)": (jax.jit(lambda t: t["a"] if t["b"] is None else t["a"] + t["b"]),
                               [({"a": a3, "b": None},), ({"a": a3, "b": a3},)], ["first compile", "pytree structure"]),
        "new closure per call": (lambda x: jax.jit(lambda y: y + 1.0)(x), [(a3,), (a3,)],
                                 ["first compile", "new function object"]),
        "jit(self.method)": (model.run, [(a4,), (a4,)], ["first compile", "new function object"]),
        "calling convention": (jax.jit(with_default), [(a3,), (a3, 2.0), {"args": (a3,), "kwargs": {"y": 2.0}}],
                               ["first compile", "pytree structure", "pytree structure"]),
        "values only": (jax.jit(lambda x: x * 5.0), [(a3,), (jnp.zeros(3),)], ["first compile"]),
        "same module function wrapped": (lambda x: jax.jit(_scale)(x), [(a3,), (a3,), (a3,)], ["first compile"]),
        "python floats": (jax.jit(lambda x, lr: x - lr * x), [(a3, 0.1), (a3, 0.2), (a3, 0.3)], ["first compile"]),
        "frozen dataclass static": (jax.jit(lambda x, c: x * c.k, static_argnums=1),
                                    [(a3, _Frozen(2.0)), (a3, _Frozen(2.0))], ["first compile"]),
    }


@pytest.mark.parametrize("name", list(triggers()))
def test_why_recompiled_classifies_each_trigger(name):
    fn, calls, expected = triggers()[name]
    results = why_recompiled(fn, calls)
    assert [r.category for r in results] == expected, [(r.category, r.detail) for r in results]
    for r in results:
        assert r.fix == FIXES[r.category] and r.fix


def test_why_recompiled_reports_call_index_and_detail():
    f = jax.jit(lambda x, n: x * n, static_argnums=1)
    a = jnp.ones(2)
    results = why_recompiled(f, [(a, 2), (a, 2), (a, 5)])
    assert [(r.call, r.category) for r in results] == [(0, "first compile"), (2, "static value")]
    assert "2 → 5" in results[1].detail
    with pytest.raises(TypeError, match="callable"):
        why_recompiled(None, [])
