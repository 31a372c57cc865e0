"""Tests for jaxwise.watch.Watch in-process: attribution, recompiles, donations, NaNs, transfers.

The scripts run by the command line (subprocesses) are in tests/test_watch_scripts.py.
"""

import functools
import inspect
import json
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from host64 import on_host, set_x64

from jaxwise._shared._jax import trace_state_clean
from jaxwise.compilation import CompileCounter
from jaxwise.train import TrainState, make_train_step
from jaxwise.watch import Watch, WatchReport
from jaxwise.watch._calls import unusable_avals
from jaxwise.watch._patch import ORIGINAL_JIT, Tracked, under_transformation

HERE = "tests/test_watch.py"
_DEVICE = "{0.platform}:{0.id}".format(jax.devices()[0])  # the default device, as texts name it


def _line(marker):
    """``tests/test_watch.py:LINE`` of the line holding ``# <marker>``."""
    with open(__file__) as f:
        for number, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# {marker}"):
                return f"{HERE}:{number}"
    raise AssertionError(marker)


def only(report: WatchReport, name: str):
    found = [f for f in report.functions if f.name == name]
    assert len(found) == 1, [(f.name, f.where) for f in report.functions]
    return found[0]


def double(x):
    return 2.0 * x


# ---------------------------------------------------------------------------
# The patch: jax.jit replaced for the block only, everything forwarded
# ---------------------------------------------------------------------------


def test_jax_jit_patch_still_fits():
    # What the patch relies on; fails when JAX changes it.
    params = inspect.signature(ORIGINAL_JIT).parameters
    assert list(params)[0] == "fun"
    assert {"static_argnums", "static_argnames", "donate_argnums", "donate_argnames"} <= set(params)
    with Watch():
        f = jax.jit(double)
        assert isinstance(f, Tracked) and jax.jit is not ORIGINAL_JIT
        x = jnp.ones(3)
        assert f.__wrapped__ is double and f.__name__ == "double"
        assert f.lower(x).compile()(x).tolist() == [2.0, 2.0, 2.0]
        assert f.trace(x).jaxpr is not None
        assert f.eval_shape(x).shape == (3,)
        f.clear_cache()

        class Model:
            scale = 3.0

            @jax.jit
            def apply(self, x):
                return x * 2.0

        with pytest.raises(TypeError, match="non-array argument"):
            Model().apply(x)  # bound like a method, exactly as JAX's own jitted functions
        assert not under_transformation()
        seen = []
        jax.jit(lambda v: seen.append(under_transformation()) or v)(x)
        assert seen == [True]
    assert jax.jit is ORIGINAL_JIT and not isinstance(jax.jit(double), Tracked)


def test_the_hot_paths_trace_check_is_jaxs():
    # watch._patch inlines JAX's `trace_state_clean()` (jaxwise._shared._jax): the two must agree
    seen = []

    def probe(x):
        seen.append((under_transformation(), not trace_state_clean()))
        return x

    probe(1.0)
    jax.jit(probe)(1.0)
    jax.vmap(probe)(jnp.ones(2))
    jax.vmap(probe, axis_name="i")(jnp.ones(2))
    jax.grad(probe)(1.0)
    assert seen == [(False, False)] + [(True, True)] * 4


def test_jit_restored_when_the_block_raises():
    showwarning, filters = warnings.showwarning, list(warnings.filters)
    with pytest.raises(ZeroDivisionError):
        with Watch():
            raise ZeroDivisionError
    assert jax.jit is ORIGINAL_JIT
    assert warnings.showwarning is showwarning and warnings.filters == filters


def test_one_watch_at_a_time_and_no_reuse():
    with Watch():
        with pytest.raises(RuntimeError, match="another jaxwise Watch is active"):
            Watch().__enter__()
    w = Watch()
    with w:
        pass
    with pytest.raises(RuntimeError, match="already used"):
        w.__enter__()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"nans": "yes"}, ValueError, "`nans` must be None, 'stop' or 'report'"),
        ({"warmup": 0}, ValueError, "warmup"),
        ({"transfers": 1}, TypeError, "transfers"),
        ({"fail_on": ("recompiles",)}, ValueError, "`fail_on` must be among"),
        ({"fail_on": "nan"}, TypeError, "`fail_on` must be a tuple"),
    ],
)
def test_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        Watch(**kwargs)


# ---------------------------------------------------------------------------
# Attribution: every way of jitting is seen, by name and the line that jitted it
# ---------------------------------------------------------------------------


def test_every_way_of_jitting_is_attributed():
    x = jnp.ones(3)
    with Watch() as w, CompileCounter() as counter:

        @jax.jit  # JIT: decorator
        def decorated(v):
            return v + 1.0

        static = jax.jit(lambda v, n: v * n, static_argnums=1)  # JIT: static
        partial = functools.partial(jax.jit, static_argnames="n")

        @partial  # JIT: partial
        def scaled(v, n):
            return v * n

        for n in (1, 2):
            decorated(x), static(x, n), scaled(x, n=n)
        decorated(x)
    report = w.report()
    got = {f.name: (f.where, f.calls, f.compiles) for f in report.functions}
    assert got == {
        "decorated": (_line("JIT: decorator"), 3, 1),
        "<lambda>": (_line("JIT: static"), 2, 2),
        "scaled": (_line("JIT: partial"), 2, 2),
    }
    jitted = [r for r in counter.records if not r.internal]
    assert sum(f.compiles for f in report.functions) == len(jitted) == 5


def test_flax_nnx_jit_is_attributed_with_its_static_argument():
    nnx = pytest.importorskip("flax.nnx")
    with Watch() as w:
        model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))

        @nnx.jit(static_argnames="scale")  # JIT: nnx
        def forward(model, x, scale):
            return model(x) * scale

        for scale in (1.0, 2.0, 3.0):
            forward(model, jnp.ones((4, 2)), scale=scale)  # CALL: nnx
    f = only(w.report(), "forward")
    assert (f.where, f.calls, f.compiles) == (_line("JIT: nnx"), 3, 3)
    third = f.misses[2]
    assert (third.kind, third.argument, third.old, third.new) == ("static", "scale", "2.0", "3.0")
    assert third in f.steady_state_recompiles and third.call_site == _line("CALL: nnx")


def test_equinox_filter_jit_is_attributed():
    eqx = pytest.importorskip("equinox")
    with Watch() as w:
        linear = eqx.nn.Linear(2, 3, key=jax.random.key(0))

        @eqx.filter_jit  # JIT: equinox
        def apply(model, x):
            return model(x[:2]) + x.sum()

        for _ in range(3):
            apply(linear, jnp.ones(2))
        apply(linear, jnp.ones(5))  # CALL: equinox shape
    f = only(w.report(), "apply")
    assert (f.where, f.calls, f.compiles) == (_line("JIT: equinox"), 4, 2)
    assert (f.misses[1].kind, f.misses[1].call_site) == ("shape", _line("CALL: equinox shape"))
    assert "f32[2]" in f.misses[1].old and "f32[5]" in f.misses[1].new


def test_jaxwise_train_step_is_attributed_to_the_users_line():
    tx = optax.sgd(0.1)
    with Watch() as w:
        step = make_train_step(lambda p, b: jnp.mean((b @ p["w"]) ** 2))  # JIT: step
        state = TrainState.create({"w": jnp.ones((2, 1))}, tx, 0)
        for _ in range(3):
            state, _ = step(state, jnp.ones((4, 2)))
    f = only(w.report(), "lambda_train_step")
    assert (f.where, f.calls, f.compiles) == (_line("JIT: step"), 3, 1)
    assert not w.report().donations


def test_inner_jitted_calls_while_tracing_are_not_counted():
    with Watch() as w:
        inner = jax.jit(double)
        outer = jax.jit(lambda v: inner(v) + 1.0)
        for _ in range(3):
            outer(jnp.ones(2))
        inner(jnp.ones(2))
    assert only(w.report(), "<lambda>").calls == 3
    assert only(w.report(), "double").calls == 1  # the direct call only


def test_counted_calls_stop_with_the_block_and_threads_find_their_own_call():
    import threading

    def triple(v):  # a function of this test only: nothing cached by earlier tests
        return 3.0 * v

    f = None
    with Watch() as w:
        f = jax.jit(triple)
        g = jax.jit(lambda v: v - 1.0)
        f(jnp.ones(2))
        worker = threading.Thread(target=lambda: [g(jnp.ones(n)) for n in (3, 4)])
        worker.start()
        worker.join()
        f(jnp.ones(5))
    assert f is not None
    f(jnp.ones(2)), f(jnp.ones(6))  # after the block: neither counted nor compiled here
    report = w.report()
    assert (only(report, "triple").calls, only(report, "triple").compiles) == (2, 2)
    assert (only(report, "<lambda>").calls, only(report, "<lambda>").compiles) == (2, 2)
    assert [m.argument for m in only(report, "<lambda>").misses] == ["", "v"]


def test_call_time_of_many_calls_is_a_sample_with_every_compile_counted():
    from jaxwise.watch._stats import Stats

    def halve(v):  # a function of this test only: nothing cached by earlier tests
        return v / 2.0

    with Watch() as w:
        f = jax.jit(halve)
        for n in range(200):
            f(jnp.ones(2 if n != 150 else 3))  # call 151 (not timed) compiles
    stats = next(s for s in w._stats.values() if s.name == "halve")
    assert (stats.calls, stats.timed_calls) == (200, 64 + 17)  # then calls 72, 80, ..., 200
    assert stats.untimed_compile > 0 and stats.timed_compile > 0
    assert stats.call_seconds >= stats.timed_seconds + stats.untimed_compile
    f_report = only(w.report(), "halve")
    assert f_report.call_seconds == stats.call_seconds and f_report.compiles == 2
    # the estimate: timed time, compiles of untimed calls, and the timed calls' mean without
    # their compiles for each untimed call
    s = Stats("f", None, True)
    s.calls, s.timed_calls, s.timed_seconds, s.timed_compile, s.untimed_compile = (
        100,
        10,
        3.0,
        1.0,
        0.5,
    )
    assert s.call_seconds == pytest.approx(3.0 + 0.5 + 90 * (2.0 / 10))
    s.calls = s.timed_calls = 10
    assert s.call_seconds == 3.5


def test_function_jitted_before_the_watch_reports_compiles_but_no_calls():
    before = jax.jit(double)
    with Watch() as w:
        before(jnp.ones(7)), before(jnp.ones(8))
    f = only(w.report(), "double")
    assert (f.calls, f.compiles) == (None, 2)
    assert f.where is not None and f.where.startswith(HERE)


# ---------------------------------------------------------------------------
# Recompiles: each kind, with its argument, values and call site
# ---------------------------------------------------------------------------


def test_steady_state_after_warmup_and_warmup_configurable():
    x = jnp.ones(3)
    for warmup, flagged in ((2, [False, False, True, True]), (3, [False, False, False, True])):
        with Watch(warmup=warmup) as w:
            f = jax.jit(lambda v, n: v * n, static_argnums=1)
            for n in (1, 2, 3, 4):
                f(x, n)  # CALL: steady
        function = w.report().functions[0]
        misses = function.misses
        assert [m in function.steady_state_recompiles for m in misses] == flagged
        assert [m["steady_state"] for m in function.to_json()["misses"]] == flagged
        assert {m.call_site for m in misses} == {_line("CALL: steady")}


@pytest.mark.parametrize(
    "make_args, kind, argument, old, new",
    [
        (lambda i: (jnp.ones(3 + i),), "shape", "x", "f32[3]", "f32[4]"),
        (
            lambda i: (jnp.ones(3, [jnp.float32, jnp.bfloat16][i]),),
            "dtype",
            "x",
            "f32[3]",
            "bf16[3]",
        ),
        (
            lambda i: ([1.0, jnp.float32(1.0)][i],),
            "weak_type",
            "x",
            "f32[]{weak_type=True}",
            "f32[]{weak_type=False}",
        ),
        (
            lambda i: (jnp.ones(3) if i == 0 else jax.device_put(jnp.ones(3), jax.devices()[0]),),
            "sharding",
            "x",
            f"uncommitted (on {_DEVICE})",  # cpu:0, or tpu:0 on a TPU
            f"committed (on {_DEVICE})",
        ),
    ],
    ids=["shape", "dtype", "weak_type", "committed"],
)
def test_recompile_kinds(make_args, kind, argument, old, new):
    with Watch() as w:

        @jax.jit
        def f(x):
            return x * 2

        f(*make_args(0)), f(*make_args(1))
    miss = w.report().functions[0].misses[1]
    assert (miss.kind, miss.argument, miss.old, miss.new) == (kind, argument, old, new)


def test_jit_rebuilt_in_a_loop_is_one_function_recompiling_as_new_function():
    class Model:
        def apply(self, x):
            return x + 1.0

    model = Model()
    with Watch() as w:
        for _ in range(4):
            jax.jit(model.apply)(jnp.ones(2))  # JIT: rebuilt
    f = only(w.report(), "apply")
    assert (f.where, f.calls, f.compiles) == (_line("JIT: rebuilt"), 4, 4)
    assert [m.kind for m in f.misses] == ["first", "new_function", "new_function", "new_function"]
    assert f.steady_state_recompiles == f.misses[2:]


def test_x64_flip_and_donation_change_are_named():
    x = np.ones(3, np.float32)
    try:
        with on_host(), Watch() as w:  # float64 on: only on the host
            f = jax.jit(double)
            f(x)
            set_x64(True)
            f(x)
    finally:
        set_x64(False)
    miss = w.report().functions[0].misses[1]
    assert (miss.kind, miss.argument, miss.old, miss.new) == (
        "config",
        "jax_enable_x64",
        "False",
        "True",
    )

    def triple(x):
        return 3.0 * x

    with Watch() as w:
        jax.jit(triple)(jnp.ones(3))
        jax.jit(triple, donate_argnums=0)(jnp.ones(3))
    second = [m for f in w.report().functions for m in f.misses][1]
    assert (second.kind, second.argument, second.old, second.new) == (
        "donation",
        "x",
        "not donated",
        "donated",
    )


# ---------------------------------------------------------------------------
# Donations
# ---------------------------------------------------------------------------


def test_unusable_donation_names_the_argument_path():
    # JAX's own warning still reaches the user, once per compile
    with pytest.warns(UserWarning, match="not usable") as caught, Watch() as w:

        @functools.partial(jax.jit, donate_argnums=0)
        def total(state, scale):
            return jnp.sum(state["a"]) * scale, state["b"] * scale

        for _ in range(2):
            total({"a": jnp.ones(4), "b": jnp.ones(2)}, 2.0)
    assert len(caught) == 1
    assert [(d.function, d.argument, d.count) for d in w.report().donations] == [
        ("total", "state['a']", 2)
    ]
    assert "f32" not in w.report().donations[0].cause
    assert "float32[4]" in w.report().donations[0].cause


def test_live_numpy_view_blocks_donation():
    # a NumPy view shares a jax.Array's buffer only on CPU: the state lives on the host CPU
    with on_host(), Watch() as w:
        step = jax.jit(lambda s: s + 1.0, donate_argnames="s")
        state = jnp.zeros(3)
        for _ in range(3):
            view = np.asarray(state)  # a live view pins the buffer
            state = step(state)
        del view  # pyright: ignore[reportPossiblyUnboundVariable]  # the loop above runs
        state = step(s=state)  # by keyword, nothing holds it: donated
    (finding,) = w.report().donations
    # named by the caller's variable, not the parameter `s`
    assert (finding.function, finding.argument, finding.count) == ("<lambda>", "state", 3)
    assert "NumPy view" in finding.cause


def test_donation_error_of_a_jaxwise_step_is_reported_once():
    tx = optax.sgd(0.1)
    with on_host(), Watch() as w:  # a NumPy view shares the buffer only on CPU
        step = make_train_step(lambda p, b: jnp.mean((b @ p["w"]) ** 2))
        state = TrainState.create({"w": jnp.ones((2, 1))}, tx, 0)
        state, _ = step(state, jnp.ones((4, 2)))
        view = np.asarray(state.params["w"])
        with pytest.raises(Exception, match="live NumPy view"):
            step(state, jnp.ones((4, 2)))
        del view
    (finding,) = w.report().donations
    assert (finding.function, finding.argument) == ("lambda_train_step", "state.params['w']")
    assert finding.cause.startswith("DonationError: the donated state leaf `params.w`")


def test_a_watched_jaxwise_step_lets_its_audit_vouch_and_still_sees_a_view(monkeypatch):
    # the audited step found no view can hold its state's leaves and vouches for them while
    # its program runs: the watch's check of the same leaves reads no buffer; once a view
    # exists, the audit does not vouch and both checks read the buffers
    import jaxwise.watch._watch as watch_module

    answers: list[bool] = []
    real = watch_module._buffers.donated_buffers

    def spy(leaves):
        out = real(leaves)
        answers.append(out is None)
        return out

    monkeypatch.setattr(watch_module._buffers, "donated_buffers", spy)
    tx = optax.sgd(0.1)
    with on_host(), Watch():  # a NumPy view shares the buffer only on CPU
        step = make_train_step(lambda p, b: jnp.mean((b @ p["w"]) ** 2))
        state = TrainState.create({"w": jnp.ones((2, 1))}, tx, 0)
        for _ in range(3):
            state, _ = step(state, jnp.ones((4, 2)))
        assert answers[1:] == [True, True]  # the first call is not the last result's state
        answers.clear()
        view = np.asarray(state.params["w"])
        with pytest.raises(Exception, match="live NumPy view"):
            step(state, jnp.ones((4, 2)))
        assert answers == [False]
        del view


def test_unusable_avals_parse_jax_warning():
    assert unusable_avals(
        "Some donated buffers were not usable: ShapedArray(float32[3,4]), bfloat16[].\nSee"
    ) == ["float32[3,4]", "bfloat16[]"]


# ---------------------------------------------------------------------------
# NaNs
# ---------------------------------------------------------------------------


def log_loss(w, x):
    return jnp.mean(jnp.log(x @ w))  # NAN: log


def test_nans_stop_at_the_first_nan_with_primitive_phase_and_line():
    after = []
    with Watch(nans="stop") as w:
        grad = jax.jit(jax.value_and_grad(log_loss), donate_argnums=0)
        wts = jnp.ones(2)
        for i in range(4):
            x = jnp.ones((3, 2)) * (-1.0 if i == 2 else 1.0)
            loss, g = grad(wts, x)  # CALL: nan
            after.append(i)
    assert after == [0, 1]  # stopped inside the third call
    report = w.report()
    assert report.stopped
    (nan,) = report.nans
    assert (nan.function, nan.primitive, nan.phase, nan.where, nan.call_site) == (
        "log_loss",
        "log",
        "forward",
        _line("NAN: log"),
        _line("CALL: nan"),
    )
    assert not wts.is_deleted()  # no donation while NaN checking is on  # pyright: ignore[reportPossiblyUnboundVariable]  # the loop above runs


def test_nans_report_continues_and_binds_static_arguments():
    with Watch(nans="report") as w:
        f = jax.jit(lambda x, mode: jnp.sqrt(x) if mode == "sqrt" else x, static_argnames="mode")
        outs = [f(jnp.array([v]), mode="sqrt") for v in (1.0, -1.0, -4.0)]
    assert np.isnan(outs[1]).all() and np.isnan(outs[2]).all()  # pyright: ignore[reportPossiblyUnboundVariable]  # the loop above runs
    (nan,) = w.report().nans  # reported once
    assert (nan.primitive, nan.phase) == ("sqrt", "forward")
    assert not w.report().stopped


def test_backward_nan_in_a_flax_model():
    nnx = pytest.importorskip("flax.nnx")
    with Watch(nans="stop") as w:
        model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))

        @nnx.jit
        def grads(model, x):
            return nnx.grad(lambda m: jnp.sum(jnp.sqrt(m(x) ** 2)))(model)  # NAN: sqrt

        model.kernel[...] = jnp.zeros((2, 1))
        model.bias[...] = jnp.zeros((1,))
        grads(model, jnp.ones((4, 2)))
    (nan,) = w.report().nans
    assert (nan.function, nan.phase, nan.where) == ("grads", "backward", _line("NAN: sqrt"))


def test_fail_on_nan_turns_on_nan_reporting():
    with Watch(fail_on=("nan",)) as w:
        jax.jit(jnp.log)(-jnp.ones(2))
    assert w.nans == "report" and w.report().triggered(("nan",)) == ("nan",)


# ---------------------------------------------------------------------------
# Transfers, time, JSON
# ---------------------------------------------------------------------------


def test_transfers_counted_per_call_site_static_and_device_values_excluded():
    with Watch(transfers=True) as w:
        f = jax.jit(lambda x, lr, n: x * lr * n, static_argnums=2)
        for _ in range(3):
            f(np.ones(4, np.float32), 0.5, 3)  # CALL: host
            f(jnp.ones(4), jnp.float32(0.5), 3)  # device values: nothing to transfer
    transfers = w.report().transfers
    assert transfers is not None
    sites = {t.where: t for t in transfers}
    host = sites[_line("CALL: host")]
    assert (host.function, host.calls, host.transfers, host.bytes, host.arguments) == (
        "<lambda>",
        3,
        6,
        3 * (16 + 8),
        ("x", "lr"),
    )
    assert len(sites) == 1


def test_json_is_strict_with_exactly_the_documented_keys():
    with Watch(transfers=True) as w:
        f = jax.jit(lambda x: x - 1.0)
        f(jnp.ones(2)), f(jnp.ones(3))
    document = w.report().to_json()
    json.dumps(document, allow_nan=False)
    assert set(document) == {
        "schema",
        "functions",
        "nans",
        "donations",
        "transfers",
        "seconds",
        "exit_code",
        "warmup",
        "errors",
        "notes",
    }
    assert document["schema"] == 1 and document["exit_code"] is None
    (function,) = document["functions"]
    assert set(function) == {"name", "where", "calls", "compiles", "compile_seconds", "misses"}
    assert set(function["misses"][1]) == {"kind", "argument", "old", "new", "where", "steady_state"}
    assert set(document["seconds"]) == {"total", "compiling"}
    assert document["seconds"]["total"] >= document["seconds"]["compiling"] > 0
    assert Watch().report().to_json()["transfers"] is None  # not counted unless asked


def test_text_report_lists_flagged_findings():
    with Watch() as w:
        f = jax.jit(lambda x, n: x * n, static_argnums=1)
        for n in (1, 2, 3):
            f(jnp.ones(2), n)
    text = str(w.report())
    assert "steady-state recompile of `<lambda>`" in text and "static argument `n`: 2 → 3" in text
    with Watch() as quiet:
        jax.jit(double)(jnp.ones(2))
    assert "nothing flagged" in str(quiet.report())


def test_nan_checking_leaves_jaxwise_steps_working_without_donation():
    tx = optax.sgd(0.1)
    with Watch(nans="report") as w:
        step = make_train_step(lambda p, b: jnp.mean(jnp.log(b @ p["w"])))
        state = TrainState.create({"w": jnp.ones((2, 1))}, tx, 0)
        for sign in (1.0, 1.0, -1.0):
            state, metrics = step(state, sign * jnp.ones((4, 2)))
    report = w.report()
    assert int(state.step) == 2 and int(metrics["skipped"]) == 1  # the NaN step was skipped  # pyright: ignore[reportPossiblyUnboundVariable]  # the loop above runs
    assert [(n.function, n.primitive) for n in report.nans] == [("lambda_train_step", "log")]
    assert report.donations == () and "did not donate" in report.notes[0]


def test_jaxwise_lists_watch_as_a_lazy_sub_package():
    import jaxwise

    assert "watch" in jaxwise.__all__ and jaxwise.watch.Watch is Watch
    assert all(getattr(jaxwise.watch, name).__doc__ for name in jaxwise.watch.__all__)


# ---------------------------------------------------------------------------
# The command line (parsing only: scripts run in tests/test_watch_scripts.py)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, nans, fail_on, script, args",
    [
        (["watch", "train.py"], None, (), "train.py", []),
        (["watch", "--nans", "train.py", "--nans"], "stop", (), "train.py", ["--nans"]),
        (
            ["watch", "--nans=report", "--fail-on", "nan,donation", "t.py"],
            "report",
            ("nan", "donation"),
            "t.py",
            [],
        ),
        (
            ["watch", "--json", "r.json", "--nans", "t.py", "-x", "1"],
            "stop",
            (),
            "t.py",
            ["-x", "1"],
        ),
    ],
)
def test_watch_command_line(argv, nans, fail_on, script, args):
    from jaxwise.cli import build_parser
    from jaxwise.cli._options import explicit_nans

    parsed = build_parser().parse_args(explicit_nans(argv))
    assert (parsed.nans, parsed.fail_on, parsed.script, parsed.args) == (
        nans,
        fail_on,
        script,
        args,
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["watch", "--fail-on", "recompiles", "t.py"],
            "expected conditions among recompile,nan,donation",
        ),
        (["watch", "--nans=always", "t.py"], "invalid choice: 'always'"),
        (["watch", "--warmup", "0", "t.py"], "expected a positive integer"),
    ],
)
def test_watch_command_line_errors(argv, message, capsys):
    from jaxwise.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_events_during_nested_calls_go_to_the_innermost_call_then_outward():
    # what a compile, a trace time or a donation warning does: queued on its thread, claimed
    # by the call that ends first (the innermost), the rest by the enclosing call; events
    # outside any call are handled by the report, in order
    seen = []

    def event(label):
        return lambda call, number: seen.append((label, call[0] if call else None))

    def call(label) -> Any:  # a label stands for the watched function
        return (label, None, None, True)

    with Watch() as w:
        outer = w.queued
        w._queue(event("before inner"))
        inner = w.queued
        w._queue(event("in inner"))
        w.claim(call("inner"), inner)
        w._queue(event("after inner"))
        w.claim(call("outer"), outer)
        w._queue(event("outside"))
        assert seen == [("in inner", "inner"), ("before inner", "outer"), ("after inner", "outer")]
        w.report()
    assert seen[-1] == ("outside", None)
    w.claim(call("late"), 0)  # nothing left to claim
    assert len(seen) == 4
