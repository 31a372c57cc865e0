"""Tests for jaxwise.diagnose: captured constants and scalars, classified recompiles."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise.buckets import plan_buckets
from jaxwise.compilation import KINDS, CacheMiss, CompileCounter
from jaxwise.diagnose import captured_constants, fix_for, why_recompiled
from jaxwise.diagnose._constants import _is_user_function

WEIGHTS = jnp.asarray(np.random.default_rng(1).normal(size=(256, 256)), jnp.float32)
SCALE = 2.0
STEPS = 3


def _uses_globals(x):
    return jnp.tanh(WEIGHTS @ x) * SCALE


def test_captured_constants_finds_closure_matrix_not_argument():
    a = jnp.asarray(np.random.default_rng(0).normal(size=(300, 300)), jnp.float32)
    x = jnp.ones(300)
    for fn in (lambda v: jnp.tanh(a @ v), jax.jit(lambda v: jnp.tanh(a @ v))):
        report = captured_constants(fn, x)
        assert report.flagged and report.total_bytes == 300 * 300 * 4
        assert report.constants[0].shape == (300, 300) and report.constants[0].dtype == "float32"
        assert report.constants[0].name == "a"
        program = jax.jit(lambda v: jnp.tanh(a @ v)).lower(x).as_text()
        if "jax.const" in program:  # JAX >= 0.12.1 passes captured arrays as arguments itself
            assert report.program_chars < 300 * 300 * 4
            assert "KiB of StableHLO" not in report.verdict
        else:  # older JAX writes the 360 KB array into the program text
            assert report.program_chars > 2 * 300 * 300 * 4 > report.program_chars_without
            assert "KiB of StableHLO vs" in report.verdict
        assert "pass them as arguments" in report.verdict and "`a`" in report.verdict
        assert report.scalars == ()
    clean = captured_constants(lambda m, v: jnp.tanh(m @ v), a, x)
    assert not clean.flagged and clean.constants == () and clean.total_bytes == 0
    assert clean.verdict == "no captured arrays: every array is an argument"
    offsets = jnp.arange(3.0)
    small = captured_constants(lambda v: v * offsets, jnp.ones(3))
    assert not small.flagged and [c.name for c in small.constants] == ["offsets"]
    assert (
        small.verdict
        == "1 small captured array(s) `offsets`, 12 bytes: below the 65536-byte threshold"
    )


def test_captured_globals_named_and_stale_scalar_reported():
    report = captured_constants(jax.jit(_uses_globals), jnp.ones(256))
    assert [(c.name, c.shape) for c in report.constants] == [("WEIGHTS", (256, 256))]
    assert [(s.name, s.value, s.scope) for s in report.scalars] == [("SCALE", "2.0", "global")]
    assert report.flagged
    assert "`SCALE` (= 2.0)" in report.verdict and "stale value" in report.verdict


def test_stale_scalar_global_really_is_stale():
    # The pitfall captured_constants reports: the compiled program keeps the old value.
    global SCALE
    f = jax.jit(lambda v: v * SCALE)
    before = float(f(jnp.ones(()))[()])
    SCALE = 5.0
    try:
        assert float(f(jnp.ones(()))[()]) == before == 2.0
        assert "`SCALE` (= 5.0)" in captured_constants(f, jnp.ones(())).verdict
    finally:
        SCALE = 2.0


def test_captured_closure_scalar_and_python_loop_bound():
    factor = 3

    def f(x):
        for _ in range(STEPS):
            x = x * factor
        return x

    report = captured_constants(f, jnp.ones(2))
    assert [(s.name, s.value, s.scope) for s in report.scalars] == [
        ("STEPS", "3", "global"),
        ("factor", "3", "closure"),
    ]
    assert report.constants == () and report.flagged


LEARNING_RATE = 0.1


def _helper_reads_a_global(x):
    return x * LEARNING_RATE


def test_globals_read_by_called_user_functions_are_reported():
    def loss(x):
        return _helper_reads_a_global(x) + 1.0

    report = captured_constants(jax.jit(loss), jnp.ones(2))
    assert [(s.name, s.value, s.scope) for s in report.scalars] == [
        ("LEARNING_RATE", "0.1", "global")
    ]
    assert report.flagged
    # Library code is not followed (plan_buckets reads a NumPy scalar module constant).
    assert _is_user_function(_helper_reads_a_global) and not _is_user_function(plan_buckets)
    assert not _is_user_function(jnp.sum) and not _is_user_function(np.mean)


def test_captured_constants_bad_arguments():
    with pytest.raises(TypeError, match="`fn` must be callable"):
        captured_constants(3, jnp.ones(2))  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(ValueError, match="threshold_bytes"):
        captured_constants(lambda v: v, jnp.ones(2), threshold_bytes=-1)


# The trigger table: (fn, calls, expected (category, kind, argument, old, new) of every compile).


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


FIRST = ("first", "", "", "")


def triggers():
    a3, a4, i3 = jnp.ones(3), jnp.ones(4), jnp.ones(3, jnp.int32)
    z3 = jnp.zeros(3)
    strong = jnp.float32(0.5)
    model = _Model()
    p1, p2 = _Plain(2.0), _Plain(2.0)

    def with_default(x, y=2.0):
        return x * y

    static = functools.partial(jax.jit, static_argnums=1)
    return {
        "shape": (
            jax.jit(lambda x: x * 2.0),
            [(a3,), (a4,)],
            [FIRST, ("shape", "x", "f32[3]", "f32[4]")],
        ),
        "dtype": (
            jax.jit(lambda x: x * 2),
            [(a3,), (i3,)],
            [FIRST, ("dtype", "x", "f32[3]", "i32[3]")],
        ),
        "weak type": (
            jax.jit(lambda lr: lr * 2.0),
            [(0.5,), (strong,)],
            [
                FIRST,
                ("weak_type", "lr", "f32[]{weak_type=True}", "f32[]{weak_type=False}"),
            ],
        ),
        "static value": (
            static(lambda x, n: x * n),
            [(a3, 2), (a3, 3)],
            [FIRST, ("static", "n", "2", "3")],
        ),
        "static after shape": (
            static(lambda x, n: x * n),
            [(a3, 2), (a4, 2), (a4, 3)],
            [
                FIRST,
                ("shape", "x", "f32[3]", "f32[4]"),
                ("static", "n", "2", "3"),
            ],
        ),
        "static identity": (
            static(lambda x, c: x * c.k),
            [(a3, p1), (a3, p2)],
            [FIRST, ("static", "c", repr(p1), repr(p2))],
        ),
        "pytree (None leaf)": (
            jax.jit(lambda t: t["a"] if t["b"] is None else t["a"] + t["b"]),
            [({"a": a3, "b": None},), ({"a": a3, "b": a3},)],
            [
                FIRST,
                (
                    "structure",
                    "t['b']",
                    "PyTreeDef({'a': *, 'b': None})",
                    "PyTreeDef({'a': *, 'b': *})",
                ),
            ],
        ),
        "new closure per call": (
            lambda x: jax.jit(lambda y: y + 1.0)(x),
            [(a3,), (a3,)],
            [FIRST, ("new_function", "", "", "")],
        ),
        "jit(self.method)": (
            model.run,
            [(a4,), (a4,)],
            [FIRST, ("new_function", "", "", "")],
        ),
        "calling convention": (
            jax.jit(with_default),
            [(a3,), (a3, 2.0), {"args": (a3,), "kwargs": {"y": 2.0}}],
            [
                FIRST,
                ("structure", "y", "not passed", "passed positionally"),
                ("structure", "y", "passed positionally", "passed by keyword"),
            ],
        ),
        "values only": (jax.jit(lambda x: x * 5.0), [(a3,), (z3,)], [FIRST]),
        "same module function wrapped": (
            lambda x: jax.jit(_scale)(x),
            [(a3,), (a3,), (a3,)],
            [FIRST],
        ),
        "python floats": (
            jax.jit(lambda x, lr: x - lr * x),
            [(a3, 0.1), (a3, 0.2), (a3, 0.3)],
            [FIRST],
        ),
        "frozen dataclass static": (
            static(lambda x, c: x * c.k),
            [(a3, _Frozen(2.0)), (a3, _Frozen(2.0))],
            [FIRST],
        ),
    }


def _flat(results: list[list[CacheMiss]]) -> list[CacheMiss]:
    return [miss for misses in results for miss in misses]


@pytest.mark.parametrize("name", list(triggers()))
def test_why_recompiled_classifies_each_trigger(name):
    fn, calls, expected = triggers()[name]
    results = why_recompiled(fn, calls)
    assert len(results) == len(calls)
    misses = _flat(results)
    got = [(m.kind, m.argument, m.old, m.new) for m in misses]
    assert got == expected, [m.text for m in misses]
    for m in misses:
        assert isinstance(m, CacheMiss) and m.kind in KINDS
        assert fix_for(m)


def test_why_recompiled_reports_misses_per_call_with_detail():
    f = jax.jit(lambda x, n: x * n, static_argnums=1)
    a = jnp.ones(2)
    results = why_recompiled(f, [(a, 2), (a, 2), (a, 5)])
    assert [[m.kind for m in misses] for misses in results] == [["first"], [], ["static"]]
    assert results[2][0].summary == "static argument `n`: 2 → 5"


def test_why_recompiled_eager_operation():
    def host_loop(x):
        return x + jnp.arange(7.0)  # arange and add run eagerly, outside jit

    [misses] = why_recompiled(host_loop, [(jnp.ones(7),)])
    assert misses and {m.kind for m in misses} == {"eager"}
    assert {fix_for(m) for m in misses} == {fix_for(misses[0])}
    assert "eager" in fix_for(misses[0]) and "outside jit" in misses[0].summary


def test_why_recompiled_counts_match_a_counter():
    f = jax.jit(lambda x: x * 3.0)
    calls = [(jnp.ones(2),), (jnp.ones(3),), (jnp.ones(2),)]
    with CompileCounter(f) as counter:
        results = why_recompiled(f, calls)
    assert counter.count == len(_flat(results)) == 2
    assert [r.miss for r in counter.records] == _flat(results)


def test_fix_for_each_kind_is_distinct_and_static_identity_has_its_own():
    triggers_ = triggers()
    by_kind: dict[str, str] = {}
    for name in ("shape", "dtype", "weak type", "static value", "pytree (None leaf)"):
        fn, calls, _ = triggers_[name]
        last = _flat(why_recompiled(fn, calls))[-1]
        by_kind[last.kind] = fix_for(last)
    assert len(set(by_kind.values())) == len(by_kind) == 5
    fn, calls, _ = triggers_["static identity"]
    identity = _flat(why_recompiled(fn, calls))[-1]
    assert identity.kind == "static" and identity.note == "hashed by identity"
    assert "identity" in fix_for(identity) and fix_for(identity) != by_kind["static"]

    def fresh(x):
        return x + 1.0

    [[first]] = why_recompiled(jax.jit(fresh), [(1.0,)])
    assert first.kind == "first" and fix_for(first).startswith("nothing to fix")


def test_fix_for_bad_input():
    with pytest.raises(TypeError, match="`miss` must be a compilation.CacheMiss"):
        fix_for("shape")  # pyright: ignore[reportArgumentType]  # bad input on purpose
    miss = _flat(why_recompiled(jax.jit(lambda x: x), [(1.0,)]))[0]
    with pytest.raises(ValueError, match="`miss.kind`"):
        fix_for(dataclasses.replace(miss, kind="nonsense"))


def test_why_recompiled_bad_arguments():
    with pytest.raises(TypeError, match="`fn` must be callable"):
        why_recompiled(None, [])  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(TypeError, match="`calls`"):
        why_recompiled(jax.jit(lambda x: x), 3)  # pyright: ignore[reportArgumentType]  # bad input on purpose
