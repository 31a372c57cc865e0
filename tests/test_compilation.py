"""Tests for jaxwise.compilation: counts, targets, budgets, explanations, stage reports."""

import dataclasses
import functools
import itertools
import logging
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from host64 import on_host, set_x64
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxwise._shared import _jax as _jaxkeys
from jaxwise.compilation import (
    KINDS,
    CompileBudget,
    CompileBudgetExceeded,
    CompileCounter,
    CompileEvent,
    compile_budget,
    count_eqns,
    explain_recompiles,
    parse_cache_miss,
    stage_report,
)
from jaxwise.compilation._hub import HUB

# ---------------------------------------------------------------------------
# The trigger table: every known recompile trigger and non-trigger, with the
# exact number of jitted compilations and the exact (kind, argument, old, new)
# of the last one. Each case builds fresh functions so JAX's caches cannot
# interfere; eager operations are excluded from the count.
# ---------------------------------------------------------------------------


def _module_level_scale(x):
    return 3.0 * x


def case_shape():
    f = jax.jit(lambda x: x * 2.0)
    a, b = jnp.ones(3), jnp.ones(4)
    return lambda: (f(a), f(b)), 2, ("shape", "x", "f32[3]", "f32[4]")


def case_dtype():
    f = jax.jit(lambda x: x * 2)
    a, b = jnp.ones(3, jnp.float32), jnp.ones(3, jnp.int32)
    return lambda: (f(a), f(b)), 2, ("dtype", "x", "f32[3]", "i32[3]")


def case_weak_type():
    f = jax.jit(lambda lr: lr * 2.0)
    strong = jnp.float32(0.1)
    return (
        lambda: (f(0.1), f(strong)),
        2,
        ("weak_type", "lr", "f32[]{weak_type=True}", "f32[]{weak_type=False}"),
    )


def case_static_value():
    f = jax.jit(lambda x, n: x * n, static_argnums=1)
    a = jnp.ones(3)
    return lambda: (f(a, 2), f(a, 3)), 2, ("static", "n", "2", "3")


def case_static_after_shape_change():
    # Issue 15: JAX's "closest key" prose blames x (f32[3] → f32[4]); the cause is n.
    f = jax.jit(lambda x, n: x * n, static_argnums=1)
    a, b = jnp.ones(3), jnp.ones(4)
    return lambda: (f(a, 2), f(b, 2), f(b, 3)), 3, ("static", "n", "2", "3")


def case_static_argname():
    f = jax.jit(lambda x, *, mode: x * (2.0 if mode == "double" else 3.0), static_argnames="mode")
    a = jnp.ones(2)
    return (
        lambda: (f(a, mode="double"), f(a, mode="triple")),
        2,
        ("static", "mode", "'double'", "'triple'"),
    )


def case_pytree_none_leaf():
    f = jax.jit(lambda t: t["a"] if t["b"] is None else t["a"] + t["b"])
    a = jnp.ones(3)
    return (
        lambda: (f({"a": a, "b": None}), f({"a": a, "b": a})),
        2,
        ("structure", "t['b']", "PyTreeDef({'a': *, 'b': None})", "PyTreeDef({'a': *, 'b': *})"),
    )


def case_nested_leaf_dtype():
    def loss(params, batch):
        return params["w"] * batch[0], batch[1]

    f = jax.jit(loss)
    p, x, i = {"w": jnp.ones(3)}, jnp.ones(3), jnp.ones(3, jnp.int32)
    return lambda: (f(p, (x, x)), f(p, (x, i))), 2, ("dtype", "batch[1]", "f32[3]", "i32[3]")


def case_new_closure_per_call():
    a = jnp.ones(3)

    def call():
        return jax.jit(lambda x: x + 1.0)(a)

    return lambda: (call(), call()), 2, ("new_function", "", "", "")


class _Model:
    def apply(self, x):
        return x + 1.0

    def run(self, x):
        return jax.jit(self.apply)(x)


def case_jit_of_bound_method():
    m, a = _Model(), jnp.ones(5)
    return lambda: (m.run(a), m.run(a)), 2, ("new_function", "", "", "")


class _PlainConfig:  # no __eq__/__hash__: hashed by identity
    def __init__(self, k):
        self.k = k


def case_static_hashed_by_id():
    f = jax.jit(lambda x, cfg: x * cfg.k, static_argnums=1)
    a = jnp.ones(3)
    c1, c2 = _PlainConfig(2.0), _PlainConfig(2.0)
    return lambda: (f(a, c1), f(a, c2)), 2, ("static", "cfg", repr(c1), repr(c2))


def case_calling_convention():
    def f(x, y=2.0):
        return x * y

    jf, a = jax.jit(f), jnp.ones(3)
    return (
        lambda: (jf(a), jf(a, 2.0), jf(a, y=2.0)),
        3,
        ("structure", "y", "passed positionally", "passed by keyword"),
    )


def case_values_only():
    f = jax.jit(lambda x: x * 2.0)
    a, b = jnp.ones(3), jnp.zeros(3)
    return lambda: (f(a), f(b), f(a)), 1, ("first", "", "", "")


def case_same_function_wrapped_several_times():
    a = jnp.ones(6)
    return lambda: [jax.jit(_module_level_scale)(a) for _ in range(3)], 1, ("first", "", "", "")


def case_python_floats_every_time():
    f = jax.jit(lambda x, lr: x - lr * x)
    a = jnp.ones(3)
    return lambda: [f(a, lr) for lr in (0.1, 0.2, 0.35)], 1, ("first", "", "", "")


TRIGGERS = [
    case_shape,
    case_dtype,
    case_weak_type,
    case_static_value,
    case_static_after_shape_change,
    case_static_argname,
    case_pytree_none_leaf,
    case_nested_leaf_dtype,
    case_new_closure_per_call,
    case_jit_of_bound_method,
    case_static_hashed_by_id,
    case_calling_convention,
    case_values_only,
    case_same_function_wrapped_several_times,
    case_python_floats_every_time,
]


@pytest.mark.parametrize("case", TRIGGERS, ids=lambda c: c.__name__[5:])
def test_trigger_table_exact_counts_and_reasons(case):
    run, expected, (kind, argument, old, new) = case()
    with CompileCounter(include_eager=False) as counter:
        jax.block_until_ready(run())
    assert counter.count == expected, counter.report()
    last = counter.records[-1].explanation
    assert last is not None, counter.report()
    assert (last.kind, last.argument, last.old, last.new) == (kind, argument, old, new), (
        counter.report()
    )
    assert last.kind in KINDS


def test_static_change_alone_names_argument_and_values():
    @functools.partial(jax.jit, static_argnums=1)
    def scale(x, factor):
        return x * factor

    a = jnp.ones(2)
    with CompileCounter(scale) as counter:
        scale(a, 2), scale(a, 3)
    assert counter.count == 2
    miss = counter.records[1].explanation
    assert miss is not None
    assert (miss.kind, miss.argument, miss.old, miss.new) == ("static", "factor", "2", "3")
    assert miss.summary == "static argument `factor`: 2 → 3"


def test_static_hashed_by_identity_has_a_hint():
    f = jax.jit(lambda x, cfg: x * cfg.k, static_argnums=1)
    a = jnp.ones(3)
    with CompileCounter(f) as counter:
        f(a, _PlainConfig(2.0)), f(a, _PlainConfig(2.0))
    assert counter.count == 2
    miss = counter.records[1].explanation
    assert miss is not None
    assert miss.note == "hashed by identity" and "frozen dataclass" in miss.summary


def _first_helper_target(x):
    return x + 1.0


def _second_helper_target(x):
    return x - 1.0


def _run_jitted(fn, x):
    return jax.jit(fn)(x)  # one helper line, different functions


def test_distinct_functions_through_one_helper_are_each_first():
    a = jnp.ones(4)
    with CompileCounter(include_eager=False) as counter:
        _run_jitted(_first_helper_target, a), _run_jitted(_second_helper_target, a)
    assert counter.count == 2
    kinds = [(r.fun_name, r.explanation and r.explanation.kind) for r in counter.records]
    assert kinds == [
        ("jit(_first_helper_target)", "first"),
        ("jit(_second_helper_target)", "first"),
    ]
    assert "re-created" not in counter.report()


def test_grad_of_a_jitted_function_is_not_a_recreated_function():
    @jax.jit
    def energy(x):
        return jnp.sum(jnp.sin(x))

    x = jnp.ones(3)
    energy(x)
    with CompileCounter(include_eager=False) as counter:
        jax.grad(energy)(x)
    kinds = [r.explanation.kind for r in counter.records if r.explanation is not None]
    assert "new_function" not in kinds, counter.report()
    assert "re-created" not in counter.report()


def test_several_differences_are_all_listed_headline_first():
    f = jax.jit(lambda x, y, n: (x * n, y), static_argnums=2)
    a, half = jnp.ones(3), jnp.ones(3, jnp.float16)
    with CompileCounter(f) as counter:
        f(a, a, 1), f(a, half, 2)
    miss = counter.records[1].explanation
    assert miss is not None
    assert [(d.kind, d.argument) for d in miss.differences] == [("static", "n"), ("dtype", "y")]
    assert (miss.kind, miss.argument) == ("static", "n")


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])
def test_sharding_change_is_kind_sharding(axis_type):
    mesh = jax.make_mesh((8,), ("data",), axis_types=(axis_type,), devices=jax.devices("cpu"))

    def double(x):
        return 2.0 * x

    f = jax.jit(double)
    x = jnp.ones(16)
    sharded = jax.device_put(x, NamedSharding(mesh, P("data")))
    with CompileCounter(f) as counter:
        f(x), f(sharded)
    assert counter.count == 2
    miss = counter.records[1].explanation
    assert miss is not None
    assert (miss.kind, miss.argument) == ("sharding", "x")
    assert "on one device" in miss.old and "data=8" in miss.new


def test_device_change_without_retrace_is_kind_sharding():
    # The trace is reused (same avals); only the executable's placement differs.
    def on_device(x):
        return 2.0 * x

    f = jax.jit(on_device)
    cpus = jax.devices("cpu")  # the texts name cpu:N on any machine
    x = jax.device_put(jnp.ones(16), cpus[0])
    with CompileCounter(f) as counter:
        f(x), f(jax.device_put(x, cpus[3])), f(jax.device_put(x, cpus[3]))
    assert counter.count == 2
    miss = counter.records[1].explanation
    assert miss is not None
    assert (miss.kind, miss.argument, miss.old, miss.new) == (
        "sharding",
        "x",
        "on cpu:0",
        "on cpu:3",
    )


def test_committing_to_the_same_device_is_kind_sharding_naming_the_argument():
    # jnp.ones is uncommitted; device_put to the same device commits it: a new executable.
    def scaled(x, s):
        return s * x

    f = jax.jit(scaled)
    device = jax.devices()[0]
    with CompileCounter(f) as counter:
        f(jnp.ones(3), 2.0), f(jax.device_put(jnp.ones(3), device), 2.0)
    assert counter.count == 2
    miss = counter.records[1].explanation
    assert miss is not None
    name = f"{device.platform}:{device.id}"  # cpu:0, or tpu:0 on a TPU
    assert (miss.kind, miss.argument, miss.old, miss.new) == (
        "sharding",
        "x",
        f"uncommitted (on {name})",
        f"committed (on {name})",
    )


def test_same_function_jitted_with_and_without_donation_is_kind_donation():
    def twice(x):
        return 2.0 * x

    with CompileCounter(twice) as counter:
        jax.jit(twice)(jnp.ones(3))
        jax.jit(twice, donate_argnums=0)(jnp.ones(3))
    assert counter.count == 2
    miss = counter.records[1].explanation
    assert miss is not None
    assert (miss.kind, miss.argument, miss.old, miss.new) == (
        "donation",
        "x",
        "not donated",
        "donated",
    )


def test_x64_flip_with_an_unchanged_python_float_is_kind_config():
    def scale(x, lr):
        return x * lr

    f = jax.jit(scale)
    x = np.ones(3, np.float32)
    try:
        with on_host(), CompileCounter(f) as counter:  # float64 on: only on the host
            f(x, 0.5)
            set_x64(True)
            f(x, 0.5)
    finally:
        set_x64(False)
    assert counter.count == 2
    miss = counter.records[1].explanation
    assert miss is not None
    assert (miss.kind, miss.argument, miss.old, miss.new) == (
        "config",
        "jax_enable_x64",
        "False",
        "True",
    )
    assert "flipped" in miss.summary and "cast inputs" not in miss.summary


def test_private_jax_hooks_still_work():
    # jaxwise reads JAX's tracing-cache keys (partial_eval.explain) and the compiling jit call
    # (pjit._pjit_call_impl_python) in one module, jaxwise._shared._jax. If JAX moves either, this
    # fails.
    f = jax.jit(lambda x, n: x * n, static_argnums=1)
    a = jnp.ones(2)
    with CompileCounter() as counter:
        f(a, 2), f(a, 3)
        jnp.asarray(np.ones(13, np.float32)) * 5.0  # an eager operation: a program inside JAX
    jitted = [r for r in counter.records if not r.internal]
    assert [r.explanation and r.explanation.kind for r in jitted] == [
        "first",
        "static",
    ]  # the prose cannot say "static"
    assert jitted[1].explanation is not None
    assert jitted[1].explanation.jax_text.startswith("TRACING CACHE MISS")
    assert any(r.internal and r.explanation is None for r in counter.records)
    assert _jaxkeys.miss_context() is None and _jaxkeys.compile_context() is None  # outside JAX


def test_every_compile_event_has_a_cache_miss():
    f = jax.jit(lambda x, n: x * n, static_argnums=1)
    a = jnp.ones(2)
    with CompileCounter() as counter:
        f(a, 2), f(a, 3)
        jnp.asarray(np.ones(19, np.float32)) * 7.0  # an eager operation: no tracing-cache miss
    jitted = [r for r in counter.records if not r.internal]
    assert [r.miss for r in jitted] == [r.explanation for r in jitted]  # the same record
    eager = [r for r in counter.records if r.internal]
    assert eager and all(r.explanation is None for r in eager)
    for r in eager:
        miss = r.miss
        assert (miss.kind, miss.argument, miss.old, miss.new) == ("eager", "", "", "")
        assert miss.kind in KINDS and "eager operation outside jit" in miss.summary
        assert miss.function and r.describe().endswith(miss.summary)


def test_a_compile_without_a_miss_is_kind_other():
    event = CompileEvent("jit(g)", 0.01, None, "g", "model.py:3")
    miss = event.miss
    assert (miss.kind, miss.function, miss.defined_at) == ("other", "g", "model.py:3")
    assert "no tracing-cache miss" in miss.summary and miss.text.startswith("jit(g): ")
    assert CompileEvent("jit(h)", 0.01, None).miss.function == "h"  # from JAX's program name


def test_a_persistent_cache_adds_no_warnings_to_the_explanations(tmp_path, caplog):
    """JAX logs the persistent cache's misses and writes at WARNING while the explain flag is
    on: only our flag raised them, so they stay hidden (as without jaxwise)."""
    from jaxwise.cli._jobs._cache import persistent_cache

    f = jax.jit(lambda x: x * 5.0 - 2.0)
    with persistent_cache(tmp_path / "cache"), caplog.at_level(logging.DEBUG):
        with explain_recompiles() as misses:
            f(jnp.ones(3)), f(jnp.ones(5))
    assert [m.kind for m in misses] == ["first", "shape"]
    assert list((tmp_path / "cache").iterdir())  # the programs went to the cache
    warnings_ = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in warnings_ if "persistent" in m.lower()], warnings_


def test_explanations_are_captured_and_not_printed(capfd, caplog):
    f = jax.jit(lambda x: x - 1.0)
    a, b = jnp.ones(2), jnp.ones(7)
    with caplog.at_level(logging.WARNING), explain_recompiles() as misses:
        f(a), f(b)
    assert [m.kind for m in misses] == ["first", "shape"]
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
        with caplog.at_level(logging.WARNING), CompileCounter(f) as counter:
            f(a)
        assert counter.count == 1
        assert counter.records[0].explanation is not None
        assert counter.records[0].explanation.kind == "first"
        assert any("TRACING CACHE MISS" in r.getMessage() for r in caplog.records)
        assert jax.config.jax_explain_cache_misses is True
    finally:
        jax.config.update("jax_explain_cache_misses", False)


def test_eager_operations_counted_only_when_asked():
    x = jnp.asarray(np.ones(11, np.float32))
    with (
        CompileCounter() as everything,
        CompileCounter(include_eager=False) as jitted_only,
        CompileCounter("nothing_named_so") as named,
    ):
        x * 7.0  # an eager multiply on a fresh shape compiles a small program
    assert everything.count == 1 and everything.records[0].fun_name == "jit(multiply)"
    assert everything.records[0].internal and everything.records[0].explanation is None
    assert jitted_only.count == 0 and named.count == 0


# ---------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------


def test_target_by_name_and_by_function():
    def step(x):
        return x + 1.0

    def other_step(x):
        return x + 2.0

    other_step.__name__ = "step"  # same name, different definition
    a = jnp.ones(9)
    js, jo = jax.jit(step), jax.jit(other_step)
    with (
        CompileCounter("step") as by_name,
        CompileCounter(step) as by_function,
        CompileCounter(js) as by_jitted,
    ):
        js(a), jo(a)
    assert by_name.count == 2
    assert by_function.count == 1 and by_jitted.count == 1
    assert by_function.events[0][0] == "jit(step)"
    assert by_function.events[0][1] > 0


class _Wrapper:
    """Any object owning a jitted program through `.jitted` (like TrainStep)."""

    def __init__(self, fn):
        self.jitted = jax.jit(fn)

    def __call__(self, *args):
        return self.jitted(*args)


def test_target_object_with_jitted_attribute():
    def finetune_step(x):
        return x * 0.5

    wrapped = _Wrapper(finetune_step)
    other = jax.jit(lambda x: x + 3.0)
    a = jnp.ones(5)
    with CompileBudget(1, wrapped, exact=True) as budget, CompileCounter(wrapped) as counter:
        wrapped(a), wrapped(a), other(a)
    assert budget.count == 1 and counter.count == 1
    assert [r.fun_name for r in counter.others] == ["jit(<lambda>)"]


def _make_step(scale):
    def step(x):  # every wrapper from this factory has the same name and definition site
        return x * scale

    return _Wrapper(step)


def test_targets_from_one_factory_count_only_their_own_program():
    a, b = _make_step(2.0), _make_step(3.0)
    x = jnp.ones(4)
    count_a, count_b, by_name = CompileCounter(a), CompileCounter(b), CompileCounter("step")
    with count_a, count_b, by_name:
        a(x), b(x), b(jnp.ones(5))
    assert (count_a.count, count_b.count, by_name.count) == (1, 2, 3)


def test_target_decorated_function():
    @compile_budget(2)
    def halve(x):
        return x * 0.5

    with CompileCounter(halve) as counter, CompileCounter(halve.jitted) as via_attribute:
        halve(jnp.ones(2)), halve(jnp.ones(3)), halve(jnp.ones(3))
    assert counter.count == 2 and via_attribute.count == 2
    assert halve.jitted.lower(jnp.ones(2)).as_text() == halve.lower(jnp.ones(2)).as_text()


def test_target_that_counts_nothing_warns_naming_what_compiled():
    f = jax.jit(lambda x: x * 4.0)
    with pytest.warns(
        RuntimeWarning, match=r"`normalise_rows` counted 0 compilations .*jit\(<lambda>\)"
    ):
        with CompileBudget(0, "normalise_rows") as budget:
            f(jnp.ones(2))
    assert budget.count == 0


def test_target_that_counts_nothing_in_an_empty_block_is_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with CompileBudget(0, "never_compiled") as budget:
            pass
    assert budget.count == 0


@pytest.mark.parametrize(
    "target, error, match",
    [(3, TypeError, "target"), ("", ValueError, "target"), (object(), TypeError, "target")],
)
def test_bad_targets(target, error, match):
    with pytest.raises(error, match=match):
        CompileCounter(target)


def test_target_is_the_one_keyword_name_alias_is_gone():
    assert CompileBudget(1, target="f").target_name == "f"
    assert CompileCounter(target="f").target_name == "f"
    with pytest.raises(TypeError, match="name"):
        CompileCounter(name="g")  # pyright: ignore[reportCallIssue]  # removed alias on purpose
    with pytest.raises(TypeError, match="name"):
        CompileBudget(1, name="g")  # pyright: ignore[reportCallIssue]  # removed alias on purpose


def test_counter_cannot_be_entered_twice():
    counter = CompileCounter()
    with counter, pytest.raises(RuntimeError, match="already active"):
        with counter:
            pass


# ---------------------------------------------------------------------------
# Budgets
# ---------------------------------------------------------------------------


def test_budget_message_lists_every_compile_with_reason():
    f = jax.jit(lambda lr: lr * 3.0)
    strong = jnp.float32(0.5)
    with pytest.raises(CompileBudgetExceeded) as info:
        with CompileBudget(1, f):
            f(0.5), f(strong)
    message = str(info.value)
    assert "2 compilations, budget 1" in message
    assert "first compile" in message
    assert "argument `lr`: f32[]{weak_type=True} → f32[]{weak_type=False}" in message
    assert " ms " in message
    assert len(info.value.events) == 2 and info.value.max_compiles == 1
    assert isinstance(info.value, RuntimeError)


def test_budget_exact_raises_on_fewer():
    f = jax.jit(lambda x: x * 8.0)
    a = jnp.ones(2)
    with pytest.raises(
        CompileBudgetExceeded, match="compile count wrong for .*: 1 compilations, exactly 2"
    ):
        with CompileBudget(2, f, exact=True):
            f(a), f(a)
    with CompileBudget(1, f, exact=True) as budget:
        f(jnp.ones(3))
    assert budget.count == 1


def test_budget_warn_mode():
    f = jax.jit(lambda x: x * 4.0)
    a, b = jnp.ones(2), jnp.ones(3)
    with pytest.warns(RuntimeWarning, match="compile budget exceeded"):
        with CompileBudget(1, f, on_exceed="warn") as budget:
            f(a), f(b)
    assert budget.count == 2


def test_budget_within_limit_is_silent():
    f = jax.jit(lambda x: x * 4.0)
    a = jnp.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with CompileBudget(1, exact=True) as budget:
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
        ((1, 3), TypeError, "target"),
        ((1, ""), ValueError, "target"),
    ],
)
def test_budget_bad_arguments(args, error, match):
    with pytest.raises(error, match=match):
        CompileBudget(*args)


def test_budget_accepts_numpy_int():
    assert CompileBudget(np.int64(2)).max_compiles == 2


def test_decorator_bad_arguments():
    with pytest.raises(ValueError, match="max_compiles"):
        compile_budget(-2)
    with pytest.raises(ValueError, match="on_exceed"):
        compile_budget(1, on_exceed="ignore")  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(TypeError, match="decorates a function"):
        compile_budget(1)(42)  # pyright: ignore[reportArgumentType]  # bad input on purpose


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
    assert inplace.budget.count == 2


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


def test_decorator_has_no_wrapper_overhead_and_is_freed():
    def fn(x):
        return x

    jitted = jax.jit(fn)
    assert compile_budget(3)(jitted) is jitted
    budget = jitted.budget  # pyright: ignore[reportAttributeAccessIssue]  # compile_budget attaches .budget at run time
    assert budget in HUB._sinks
    del jitted
    assert budget not in HUB._sinks  # freed by reference counting: no cycle keeps it alive


# ---------------------------------------------------------------------------
# Stage reports and the prose fallback
# ---------------------------------------------------------------------------


def test_stage_report_figures_and_table(monkeypatch):
    from types import SimpleNamespace

    from jaxwise.compilation import _stage

    clock = itertools.count(10.0, 0.25)  # a fake clock: every stage takes 250 ms
    monkeypatch.setattr(_stage, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    n = 128
    a = jnp.ones((n, n))
    f = jax.jit(lambda x, y: jnp.tanh(x @ y).sum())
    with CompileCounter(f) as counter:
        report = stage_report(f, a, a)
    assert counter.count == 1
    assert report.flops is not None
    assert report.flops >= 2 * n**3
    assert report.argument_bytes == 2 * n * n * 4
    # device allocation sizes: a CPU's are exact, an accelerator pads to its tiles (a TPU: 512)
    if jax.default_backend() == "cpu":
        assert report.output_bytes == 4
    else:
        assert report.output_bytes is not None and report.output_bytes >= 4
    assert (report.trace_ms, report.lower_ms, report.compile_ms) == (250.0, 250.0, 250.0)
    assert report.jaxpr_eqns == 3 and report.stablehlo_lines > 3
    text = str(report)
    lines = text.splitlines()
    assert lines[0].split() == ["stage", "/", "figure", "value", "unit"]
    assert set(lines[1]) == {"-"}
    assert any(
        line.startswith("arguments") and f"{2 * n * n * 4:,}" in line and line.endswith("bytes")
        for line in lines
    )
    assert any(line.startswith("compile") and line.endswith("ms") for line in lines)
    value_end = len(lines[0]) - len("  unit")
    assert all(
        line[value_end - 1] != " " and line[value_end : value_end + 2] in ("", "  ")
        for line in lines[2:]
    )
    spec = jax.ShapeDtypeStruct((n, n), jnp.float32)
    assert stage_report(lambda x, y: x @ y, spec, spec).jaxpr_eqns == 1
    assert stage_report(_Wrapper(lambda x: x * 2.0), spec).jaxpr_eqns == 1
    with pytest.raises(TypeError, match="jitted"):
        stage_report(3, a)  # pyright: ignore[reportArgumentType]  # bad input on purpose


def test_count_eqns_recurses_into_scan():
    def body(c, x):
        return c + jnp.sin(x), c

    jaxpr = jax.make_jaxpr(lambda xs: jax.lax.scan(body, 0.0, xs))(jnp.ones(4))
    inner = jaxpr.jaxpr.eqns[0].params["jaxpr"]
    assert count_eqns(jaxpr) == 1 + len(inner.eqns) and len(inner.eqns) >= 2


def test_parse_prose_fallback():
    shape = parse_cache_miss(
        "TRACING CACHE MISS at a.py:3 (g):\n  for f defined at a.py:1\n"
        "  all previously seen cache keys differ. For the closest previous key:\n"
        "  different input types:\n  * at x, now f32[4] and before f32[3]"
    )
    assert (shape.kind, shape.argument, shape.old, shape.new, shape.function) == (
        "shape",
        "x",
        "f32[3]",
        "f32[4]",
        "f",
    )
    ctx = parse_cache_miss(
        "TRACING CACHE MISS at a.py:3 (g):\n  for f defined at a.py:1\n"
        "  all previously seen cache keys differ. For the closest previous key:\n"
        "  Tracing context doesn't match, e.g. due to config or context manager.\n"
        "  * x64_enabled differs: now True and before False"
    )
    assert (ctx.kind, ctx.argument, ctx.old, ctx.new) == ("config", "x64_enabled", "False", "True")
    assert ctx.reasons[0].startswith("JAX config `x64_enabled` flipped: False → True")
    unexplained = parse_cache_miss(
        "TRACING CACHE MISS at a.py:3 (g):\n  for f defined at a.py:1\n"
        "  all previously seen cache keys differ. For the closest previous key:\n"
        "  cache miss explanation unavailable"
    )
    assert unexplained.kind == "other" and unexplained.defined_at == "a.py:1"
    first = parse_cache_miss(
        "TRACING CACHE MISS at a.py:3 (g):\n  never seen function:\n    f id=1 defined at a.py:1"
    )
    assert (first.kind, first.function) == ("first", "f")


# ---------------------------------------------------------------------------
# The pytest marker
# ---------------------------------------------------------------------------


def test_pytest_marker_counts_jitted_programs_only(pytester, inner_pytest_args):
    pytester.makepyfile(
        """
        import jax, jax.numpy as jnp, numpy as np, pytest

        A, B = jnp.ones(3), jnp.ones(4)

        @pytest.mark.compile_budget(1)
        def test_too_many():
            f = jax.jit(lambda x: x * 2.0)
            f(A), f(B)

        @pytest.mark.compile_budget(1, target="g", exact=True)
        def test_named_ok():
            def g(x):
                return x + 1.0
            jax.jit(g)(A), jax.jit(g)(A), jax.jit(lambda x: x - 1.0)(A)

        @pytest.mark.compile_budget(1, exact=True)
        def test_eager_ops_not_counted():
            x = jnp.asarray(np.ones(17, np.float32)) * 3.0   # eager: compiles only on first use
            jax.jit(lambda v: v + 1.0)(x)

        @pytest.mark.compile_budget(0)
        def test_own_failure_not_stacked():
            jax.jit(lambda x: x / 3.0)(A)
            assert False, "own failure"
        """
    )
    result = pytester.runpytest(*inner_pytest_args)  # jaxwise's plugin, installed or not
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.re_match_lines(
        [r".*CompileBudgetExceeded.*2 compilations, budget 1", r".*f32\[3\] → f32\[4\]"]
    )
    result.stdout.fnmatch_lines(["*own failure*"])
    assert "budget 0" not in result.stdout.str()
    alone = pytester.runpytest(*inner_pytest_args, "-k", "eager_ops_not_counted")
    alone.assert_outcomes(passed=1)


@dataclasses.dataclass(frozen=True)
class _FrozenConfig:
    k: float


def test_value_equal_static_config_does_not_recompile():
    f = jax.jit(lambda x, cfg: x * cfg.k, static_argnums=1)
    a = jnp.ones(3)
    with CompileBudget(1, f, exact=True):
        f(a, _FrozenConfig(2.0)), f(a, _FrozenConfig(2.0))
