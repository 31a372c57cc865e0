"""Tests for jaxwise.compilation: counting, budgets, explanations, stage reports."""

import dataclasses
import functools
import logging
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise.compilation import (
    CompileBudget,
    CompileBudgetExceeded,
    CompileCounter,
    compile_budget,
    count_eqns,
    explain_recompiles,
    parse_cache_miss,
    stage_report,
)

# ---------------------------------------------------------------------------
# The trigger table: every known recompile trigger and non-trigger, with the
# exact number of compilations and the kind of explanation for the last one.
# Each case builds fresh functions so JAX's global caches cannot interfere.
# ---------------------------------------------------------------------------


def _module_level_scale(x):
    return 3.0 * x


def case_shape():
    f = jax.jit(lambda x: x * 2.0)
    a, b = jnp.ones(3), jnp.ones(4)
    return lambda: (f(a), f(b)), 2, "types", "f32[3] → f32[4]"


def case_dtype():
    f = jax.jit(lambda x: x * 2)
    a, b = jnp.ones(3, jnp.float32), jnp.ones(3, jnp.int32)
    return lambda: (f(a), f(b)), 2, "types", "f32[3] → i32[3]"


def case_weak_type():
    f = jax.jit(lambda lr: lr * 2.0)
    strong = jnp.float32(0.1)
    return lambda: (f(0.1), f(strong)), 2, "types", "weak_type=True}"


def case_static_value():
    f = jax.jit(lambda x, n: x * n, static_argnums=1)
    a = jnp.ones(3)
    return lambda: (f(a, 2), f(a, 3)), 2, "unexplained", "static argument"


def case_pytree_none_leaf():
    f = jax.jit(lambda t: t["a"] if t["b"] is None else t["a"] + t["b"])
    a = jnp.ones(3)
    return lambda: (f({"a": a, "b": None}), f({"a": a, "b": a})), 2, "pytree", "NoneType"


def case_new_closure_per_call():
    a = jnp.ones(3)

    def call():
        return jax.jit(lambda x: x + 1.0)(a)

    return lambda: (call(), call()), 2, "new_function", "re-created"


class _Model:
    def apply(self, x):
        return x + 1.0

    def run(self, x):
        return jax.jit(self.apply)(x)


def case_jit_of_bound_method():
    m, a = _Model(), jnp.ones(5)
    return lambda: (m.run(a), m.run(a)), 2, "new_function", "apply"


class _PlainConfig:  # no __eq__/__hash__: hashed by identity
    def __init__(self, k):
        self.k = k


def case_static_hashed_by_id():
    f = jax.jit(lambda x, cfg: x * cfg.k, static_argnums=1)
    a = jnp.ones(3)
    return lambda: (f(a, _PlainConfig(2.0)), f(a, _PlainConfig(2.0))), 2, "unexplained", "identity"


def case_calling_convention():
    def f(x, y=2.0):
        return x * y

    jf, a = jax.jit(f), jnp.ones(3)
    return lambda: (jf(a), jf(a, 2.0), jf(a, y=2.0)), 3, "pytree", "input pytree"


def case_values_only():
    f = jax.jit(lambda x: x * 2.0)
    a, b = jnp.ones(3), jnp.zeros(3)
    return lambda: (f(a), f(b), f(a)), 1, "new_function", "first compile"


def case_same_function_wrapped_several_times():
    a = jnp.ones(6)
    return lambda: [jax.jit(_module_level_scale)(a) for _ in range(3)], 1, "new_function", "first compile"


def case_python_floats_every_time():
    f = jax.jit(lambda x, lr: x - lr * x)
    a = jnp.ones(3)
    return lambda: [f(a, lr) for lr in (0.1, 0.2, 0.35)], 1, "new_function", "first compile"


TRIGGERS = [
    case_shape,
    case_dtype,
    case_weak_type,
    case_static_value,
    case_pytree_none_leaf,
    case_new_closure_per_call,
    case_jit_of_bound_method,
    case_static_hashed_by_id,
    case_calling_convention,
    case_values_only,
    case_same_function_wrapped_several_times,
    case_python_floats_every_time,
]


@pytest.mark.parametrize("case", TRIGGERS, ids=lambda c: c.__name__[5:])
def test_trigger_table_exact_counts(case):
    run, expected, last_kind, text = case()
    with CompileCounter() as counter:
        jax.block_until_ready(run())
    assert counter.count == expected, counter.report()
    last = counter.records[-1].explanation
    assert last is not None, counter.report()
    assert last.kind == last_kind, counter.report()
    assert text in last.summary or text in counter.records[-1].describe(), counter.report()


def test_explanations_are_captured_and_not_printed(capfd, caplog):
    # Guards the one private name we use (JAX's explanation logger).
    f = jax.jit(lambda x: x - 1.0)
    a, b = jnp.ones(2), jnp.ones(7)
    with caplog.at_level(logging.WARNING), explain_recompiles() as misses:
        f(a), f(b)
    assert [m.kind for m in misses] == ["new_function", "types"]
    assert misses[1].reasons == ("argument `x`: f32[2] → f32[7]",)
    assert misses[1].call_site and "test_compilation.py" in misses[1].call_site
    assert "TRACING CACHE MISS" not in capfd.readouterr().err
    assert not [r for r in caplog.records if "CACHE MISS" in r.getMessage()]


def test_flags_and_logger_restored_even_on_error():
    logger = logging.getLogger("jax._src.interpreters.partial_eval")
    filters_before = list(logger.filters)
    assert jax.config.jax_explain_cache_misses is False
    with pytest.raises(ZeroDivisionError):
        with CompileBudget(0), explain_recompiles():
            assert jax.config.jax_explain_cache_misses is True
            raise ZeroDivisionError("the block fails")
    assert jax.config.jax_explain_cache_misses is False
    assert logger.filters == filters_before


def test_user_flag_kept_and_messages_still_shown(caplog):
    jax.config.update("jax_explain_cache_misses", True)
    try:
        f = jax.jit(lambda x: x * 5.0)
        a = jnp.ones(4)
        with caplog.at_level(logging.WARNING), CompileCounter() as counter:
            f(a)
        assert counter.records[0].explanation.kind == "new_function"
        assert any("TRACING CACHE MISS" in r.getMessage() for r in caplog.records)
        assert jax.config.jax_explain_cache_misses is True
    finally:
        jax.config.update("jax_explain_cache_misses", False)


def test_counter_counts_eager_operations_without_name():
    x = np.ones(11, np.float32)
    with CompileCounter() as everything, CompileCounter("nothing_named_so") as named:
        jnp.asarray(x) * 7.0  # an eager multiply on a fresh shape compiles a small program
    assert everything.count >= 1
    assert named.count == 0
    assert all(r.explanation is None for r in everything.records)


def test_name_filter_by_string_and_by_function():
    def step(x):
        return x + 1.0

    def other_step(x):
        return x + 2.0

    other_step.__name__ = "step"  # same name, different definition
    a = jnp.ones(9)
    js, jo = jax.jit(step), jax.jit(other_step)
    with CompileCounter("step") as by_name, CompileCounter(step) as by_function:
        js(a), jo(a)
    assert by_name.count == 2
    assert by_function.count == 1
    assert by_function.events[0][0] == "jit(step)"
    assert by_function.events[0][1] > 0


def test_counter_cannot_be_entered_twice():
    counter = CompileCounter()
    with counter, pytest.raises(RuntimeError, match="already active"):
        with counter:
            pass


def test_budget_message_lists_every_compile_with_reason():
    f = jax.jit(lambda lr: lr * 3.0)
    strong = jnp.float32(0.5)
    with pytest.raises(CompileBudgetExceeded) as info:
        with CompileBudget(1):
            f(0.5), f(strong)
    message = str(info.value)
    assert "2 compilations, budget 1" in message
    assert "first compile" in message
    assert "weak_type=True} → f32[]{weak_type=False}" in message
    assert " ms " in message
    assert len(info.value.events) == 2 and info.value.max_compiles == 1
    assert isinstance(info.value, RuntimeError)


def test_budget_warn_mode():
    f = jax.jit(lambda x: x * 4.0)
    a, b = jnp.ones(2), jnp.ones(3)
    with pytest.warns(RuntimeWarning, match="compile budget exceeded"):
        with CompileBudget(1, on_exceed="warn"):
            f(a), f(b)


def test_budget_within_limit_is_silent():
    f = jax.jit(lambda x: x * 4.0)
    a = jnp.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with CompileBudget(1) as budget:
            f(a), f(a)
    assert budget.count == 1


def test_budget_does_not_stack_on_block_error():
    f = jax.jit(lambda x: x * 6.0)
    a, b = jnp.ones(2), jnp.ones(3)
    with pytest.raises(KeyError):
        with CompileBudget(0):
            f(a), f(b)
            raise KeyError("user error")


@pytest.mark.parametrize(
    "args, error, match",
    [
        ((-1,), ValueError, "max_compiles"),
        ((1.5,), TypeError, "max_compiles"),
        ((True,), TypeError, "max_compiles"),
        ((1, None, "explode"), ValueError, "on_exceed"),
        ((1, 3), TypeError, "name"),
        ((1, ""), ValueError, "name"),
    ],
)
def test_budget_bad_arguments(args, error, match):
    with pytest.raises(error, match=match):
        CompileBudget(*args)


def test_decorator_bad_arguments():
    with pytest.raises(ValueError, match="max_compiles"):
        compile_budget(-2)
    with pytest.raises(ValueError, match="on_exceed"):
        compile_budget(1, on_exceed="ignore")
    with pytest.raises(TypeError, match="decorates a function"):
        compile_budget(1)(42)


def test_decorator_counts_over_lifetime_and_raises_before_running():
    @compile_budget(1)
    def update(x):
        return x * 0.5

    a, b = jnp.ones(3), jnp.ones(4)
    update(a), update(a)
    assert update.budget.count == 1
    with pytest.raises(CompileBudgetExceeded, match="f32\\[3\\] → f32\\[4\\]"):
        update(b)
    assert update.budget.count == 2
    update(a)  # cached programs still run
    update.budget.reset()
    assert update.budget.count == 0


def test_decorator_refusal_leaves_donated_input_alive():
    @compile_budget(1)
    @functools.partial(jax.jit, donate_argnums=0)
    def inplace(x):
        return x + 1.0

    inplace(jnp.ones(5))
    fresh = jnp.ones(6)
    with pytest.raises(CompileBudgetExceeded):
        inplace(fresh)
    assert not fresh.is_deleted()
    np.testing.assert_array_equal(np.asarray(fresh), np.ones(6))


def test_decorator_warn_mode_and_other_functions_not_counted():
    @compile_budget(1, on_exceed="warn")
    def scale(x):
        return x * 9.0

    a, b = jnp.ones(2), jnp.ones(3)
    jax.jit(lambda x: x * 9.0)(a)  # another function: not counted
    scale(a)
    with pytest.warns(RuntimeWarning, match="budget 1"):
        scale(b)
    assert scale.budget.count == 2


def test_decorator_has_no_wrapper_overhead():
    def fn(x):
        return x

    jitted = jax.jit(fn)
    assert compile_budget(3)(jitted) is jitted


def test_stage_report_figures():
    n = 128
    a = jnp.ones((n, n))
    report = stage_report(jax.jit(lambda x, y: jnp.tanh(x @ y).sum()), a, a)
    assert report.flops >= 2 * n**3
    assert report.argument_bytes == 2 * n * n * 4
    assert report.output_bytes == 4
    assert report.trace_ms > 0 and report.lower_ms > 0 and report.compile_ms > 0
    assert report.jaxpr_eqns == 3 and report.stablehlo_lines > 3
    assert "flops" in report.table()
    spec = jax.ShapeDtypeStruct((n, n), jnp.float32)
    assert stage_report(lambda x, y: x @ y, spec, spec).jaxpr_eqns == 1
    with pytest.raises(TypeError, match="jitted"):
        stage_report(3, a)


def test_count_eqns_recurses_into_scan():
    def body(c, x):
        return c + jnp.sin(x), c

    jaxpr = jax.make_jaxpr(lambda xs: jax.lax.scan(body, 0.0, xs))(jnp.ones(4))
    inner = jaxpr.jaxpr.eqns[0].params["jaxpr"]
    assert count_eqns(jaxpr) == 1 + len(inner.eqns) and len(inner.eqns) >= 2


def test_parse_unexplained_and_context():
    text = (
        "TRACING CACHE MISS at a.py:3 (g):\n  for f defined at a.py:1\n"
        "  all previously seen cache keys differ. For the closest previous key:\n"
        "  cache miss explanation unavailable"
    )
    miss = parse_cache_miss(text)
    assert miss.kind == "unexplained" and miss.function == "f" and miss.defined_at == "a.py:1"
    ctx = parse_cache_miss(
        "TRACING CACHE MISS at a.py:3 (g):\n  for f defined at a.py:1\n"
        "  all previously seen cache keys differ. For the closest previous key:\n"
        "  Tracing context doesn't match, e.g. due to config or context manager.\n"
        "  * x64_enabled differs: now True and before False"
    )
    assert ctx.kind == "context" and ctx.reasons == ("tracing context `x64_enabled`: False → True",)


def test_pytest_marker_fails_with_explanation(pytester):
    pytester.makepyfile(
        """
        import jax, jax.numpy as jnp, pytest

        A, B = jnp.ones(3), jnp.ones(4)

        @pytest.mark.compile_budget(1)
        def test_too_many():
            f = jax.jit(lambda x: x * 2.0)
            f(A), f(B)

        @pytest.mark.compile_budget(1, name="g")
        def test_named_ok():
            def g(x):
                return x + 1.0
            jax.jit(g)(A), jax.jit(g)(A), jax.jit(lambda x: x - 1.0)(A)

        @pytest.mark.compile_budget(0)
        def test_own_failure_not_stacked():
            jax.jit(lambda x: x / 3.0)(A)
            assert False, "own failure"
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.re_match_lines([r".*CompileBudgetExceeded.*2 compilations, budget 1", r".*f32\[3\] → f32\[4\]"])
    result.stdout.fnmatch_lines(["*own failure*"])
    assert "budget 0" not in result.stdout.str()


@dataclasses.dataclass(frozen=True)
class _FrozenConfig:
    k: float


def test_value_equal_static_config_does_not_recompile():
    f = jax.jit(lambda x, cfg: x * cfg.k, static_argnums=1)
    a = jnp.ones(3)
    with CompileBudget(1):
        f(a, _FrozenConfig(2.0)), f(a, _FrozenConfig(2.0))
