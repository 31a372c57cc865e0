"""Tests for jaxwise.debug: locate_nan (provenance, phase, user flags), checked, assert_finite."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from host64 import on_host

from jaxwise._shared._frames import source_frames
from jaxwise.compilation import CompileBudget, CompileCounter
from jaxwise.debug import assert_finite, checked, locate_nan


def forward_log(x):
    y = x * 2.0
    return jnp.log(y)  # LINE: forward_log


def loss_with_hidden_sqrt(x):
    safe = jnp.where(x > 0, jnp.sqrt(x), 0.0)  # LINE: hidden_sqrt
    return jnp.sum(safe)


def discarded_log_then_sqrt(x, y):
    return jnp.where(x > 0, jnp.log(x), 0.0) + jnp.sqrt(y - 5.0)  # LINE: discarded_log


def guarded_cosine(a, b):
    n = jnp.linalg.norm(a) * jnp.linalg.norm(b)
    return jnp.where(n > 0, jnp.dot(a, b) / n, 0.0)  # LINE: guarded_cosine


def _line_of(marker):
    with open(__file__) as f:
        for number, text in enumerate(f, 1):
            if f"# LINE: {marker}" in text and "def " not in text and "_line_of" not in text:
                return number
    raise AssertionError(marker)


@pytest.fixture(autouse=True)
def _vmap_has_run():
    # The pitfall: after any vmap in the process, jax_debug_nans stops checking compiled functions.
    jax.vmap(lambda v: v * 2.0)(jnp.ones(3))
    yield


def test_forward_nan_after_vmap_in_compiled_function():
    jitted = jax.jit(forward_log)
    jitted(jnp.ones(3))  # compiled before
    report = locate_nan(jitted, -jnp.ones(3))
    assert report is not None
    assert report.primitive == "log" and report.kind == "nan" and report.phase == "forward"
    assert report.frame is not None
    assert report.frame.line == _line_of("forward_log")
    assert report.frame.function == "forward_log"
    assert report.frame.file == __file__
    assert "jnp.log(y)" in report.frame.source
    assert report.message == "invalid value (nan) produced by `log` in the forward pass"
    assert "forward pass" in str(report)


def test_backward_nan_points_at_forward_line():
    report = locate_nan(jax.jit(jax.grad(loss_with_hidden_sqrt)), jnp.asarray([0.0, 1.0]))
    assert report is not None
    assert report.phase == "backward" and report.primitive == "mul"
    assert report.frame is not None
    assert report.frame.line == _line_of("hidden_sqrt")
    assert "transpose" in report.name_stack


def test_no_nan_returns_none_and_flags_restored():
    before = (jax.config.jax_debug_nans, jax.config.jax_debug_infs)
    assert locate_nan(jax.grad(loss_with_hidden_sqrt), jnp.asarray([1.0, 4.0])) is None
    assert (jax.config.jax_debug_nans, jax.config.jax_debug_infs) == before


def test_flags_restored_when_function_raises():
    def broken(x):
        raise KeyError("user bug")

    with pytest.raises(KeyError):
        locate_nan(broken, jnp.ones(2))
    assert jax.config.jax_debug_nans is False and jax.config.jax_debug_infs is False


def test_inf_only_with_check_inf():
    def divide(x):
        return 1.0 / x

    assert locate_nan(divide, jnp.zeros(2)) is None
    report = locate_nan(divide, jnp.zeros(2), check_inf=True)
    assert report is not None
    assert report.frame is not None
    assert (
        report.kind == "inf"
        and report.primitive == "div"
        and report.frame.function.endswith("divide")
    )


def test_nested_jit_and_kwargs():
    inner = jax.jit(forward_log)

    @jax.jit
    def outer(x, *, scale):
        return inner(x * scale) + 1.0

    report = locate_nan(outer, jnp.ones(2), scale=-1.0)
    assert report is not None
    assert report.frame is not None
    assert report.primitive == "log" and report.frame.function == "forward_log"


def test_nan_inside_vmapped_function():
    report = locate_nan(jax.vmap(forward_log), -jnp.ones((4, 2)))
    assert report is not None
    assert report.primitive == "log" and report.phase == "forward"


def test_user_frames_from_source_info():
    # Guards the private structure we read (eqn.source_info.traceback.frames).
    jaxpr = jax.make_jaxpr(forward_log)(jnp.ones(2))
    eqn = next(e for e in jaxpr.jaxpr.eqns if e.primitive.name == "log")
    frames = source_frames(eqn.source_info)
    assert (
        frames
        and frames[-1].function == "forward_log"
        and frames[-1].line == _line_of("forward_log")
    )


def test_the_library_fallback_skips_all_of_jaxwise_not_only_its_shared_helpers():
    # _frames lives in jaxwise/_shared/: the frames it drops last are the whole package's
    import os

    import jaxwise
    from jaxwise._shared import _frames

    assert _frames._JAXWISE_DIR == os.path.dirname(os.path.abspath(jaxwise.__file__)) + os.sep


def test_locate_nan_rejects_non_callable():
    with pytest.raises(TypeError, match="callable"):
        locate_nan(3, 1.0)  # pyright: ignore[reportArgumentType]  # bad input on purpose


def test_checked_keeps_checking_on_cache_hits_after_vmap():
    f = checked(forward_log)
    good, bad = jnp.ones(3), -jnp.ones(3)
    with CompileBudget(1) as budget:
        err, out = f(good)
        assert err.get() is None
        err, out = f(bad)  # cache hit: still checked
    assert budget.count == 1
    assert "nan generated by primitive: log" in err.get()
    with pytest.raises(Exception, match="nan generated"):
        err.throw()


def test_checked_error_sets():
    div = checked(lambda x: 1 / x, errors="div")
    assert div(jnp.asarray([1, 0], jnp.int32))[0].get() is not None
    index = checked(lambda x, i: x[i], errors="index")
    assert "out-of-bounds" in index(jnp.ones(3), 5)[0].get()
    with pytest.raises(ValueError, match="`errors` must be one of"):
        checked(forward_log, errors="everything")
    with pytest.raises(TypeError, match="callable"):
        checked(None)  # pyright: ignore[reportArgumentType]  # bad input on purpose


def test_assert_finite_names_the_leaf():
    params = {
        "dense_0": {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)},
        "dense_1": {"w": jnp.asarray([1.0, jnp.inf])},
    }
    with pytest.raises(
        FloatingPointError, match=r"params: non-finite values in `dense_1.w`: 0 NaN, 1 inf of 2"
    ):
        assert_finite(params, "params")
    assert_finite({"step": jnp.asarray(3), "w": np.ones(2)})  # ints are skipped


def test_locate_nan_inside_scan_body():
    @functools.partial(jax.jit)
    def scanned(xs):
        def body(c, x):
            return c + jnp.log(x), c

        return jax.lax.scan(body, 0.0, xs)[0]

    report = locate_nan(scanned, jnp.asarray([1.0, -1.0]))
    assert report is not None
    # The walk enters scan bodies iteration by iteration.
    assert report.frame is not None
    assert report.primitive == "log" and report.frame.function.endswith("body")


@pytest.fixture
def user_debug_flags():
    """The user keeps jax_debug_nans and jax_debug_infs on; restored after the test."""
    saved = (jax.config.jax_debug_nans, jax.config.jax_debug_infs)
    jax.config.update("jax_debug_nans", True)
    jax.config.update("jax_debug_infs", True)
    yield
    jax.config.update("jax_debug_nans", saved[0])
    jax.config.update("jax_debug_infs", saved[1])


def test_user_debug_nans_on_gives_a_report_not_a_crash(user_debug_flags):
    x = -jnp.ones(3)
    report = locate_nan(forward_log, x)
    assert report is not None
    assert report.frame is not None
    assert (report.primitive, report.phase, report.frame.line) == (
        "log",
        "forward",
        _line_of("forward_log"),
    )
    assert jax.config.jax_debug_nans is True and jax.config.jax_debug_infs is True  # restored


def test_user_flags_restored_when_function_raises(user_debug_flags):
    def broken(x):
        raise KeyError("user bug")

    with pytest.raises(KeyError):
        locate_nan(broken, jnp.ones(2))
    assert jax.config.jax_debug_nans is True and jax.config.jax_debug_infs is True


def test_nan_discarded_by_where_is_not_the_culprit():
    # log(0) = -inf and log(-1) = NaN are discarded by the where; the sqrt's NaN reaches the output.
    report = locate_nan(discarded_log_then_sqrt, jnp.asarray([0.0, -1.0]), jnp.asarray([9.0, 1.0]))
    assert report is not None
    assert report.primitive == "sqrt" and report.kind == "nan" and report.phase == "forward"
    assert report.frame is not None
    assert report.frame.file == __file__ and report.frame.line == _line_of("discarded_log")
    assert report.frame.function == "discarded_log_then_sqrt"


def test_discarded_nan_alone_is_no_report():
    assert (
        locate_nan(discarded_log_then_sqrt, jnp.asarray([-1.0, 2.0]), jnp.asarray([9.0, 6.0]))
        is None
    )


def test_guarded_cosine_gradient_nan_is_created_in_the_backward_pass(user_debug_flags):
    a, b = jnp.zeros(3), jnp.ones(3)
    with jax.debug_nans(False), jax.debug_infs(False):
        assert float(guarded_cosine(a, b)) == 0.0  # the forward value is finite
    report = locate_nan(jax.grad(guarded_cosine), a, b)
    assert report is not None and report.kind == "nan"
    if jax.__version_info__ >= (0, 12, 1):
        # JAX's derivative of x / n reuses the forward quotient (0/0 = NaN, discarded by the
        # where in the forward pass, multiplied into the gradient by the backward pass)
        assert report.primitive == "div" and report.phase == "forward"
        assert "transpose" not in report.name_stack
    else:  # older JAX multiplies the cotangent by 1/n: 0 * inf in the backward pass
        assert report.primitive == "mul" and report.phase == "backward"
        assert "transpose" in report.name_stack
    assert report.frame is not None
    assert report.frame.line == _line_of("guarded_cosine") and report.frame.file == __file__


def test_guarded_cosine_with_check_inf_blames_the_forward_division():
    report = locate_nan(
        jax.jit(jax.grad(guarded_cosine)), jnp.zeros(3), jnp.ones(3), check_inf=True
    )
    assert report is not None
    assert report.primitive == "div" and report.kind == "inf" and report.phase == "forward"
    assert report.frame is not None
    assert report.frame.function == "guarded_cosine"


def test_nan_in_an_argument_is_reported_as_such():
    report = locate_nan(
        lambda p, *, scale: p["w"] * scale, {"w": np.asarray([1.0, np.nan], np.float32)}, scale=2.0
    )
    assert report is not None
    assert report.primitive == "argument" and report.frame is None
    assert report.message == "invalid value (nan) in the argument args[0]['w']"
    assert "already present in the input" in str(report)


def test_cond_branch_is_followed():
    def log_branch(v):
        return jnp.log(v)  # LINE: cond_branch

    def branchy(x):
        return jax.lax.cond(x[0] > 0, lambda v: v + 1.0, log_branch, x)

    report = locate_nan(jax.jit(branchy), jnp.asarray([-1.0, 2.0]))
    assert report is not None
    assert report.frame is not None
    assert report.primitive == "log" and report.frame.line == _line_of("cond_branch")
    assert report.frame.function.endswith("log_branch")


def test_locate_nan_does_not_recompile_the_users_program():
    jitted = jax.jit(forward_log)
    jitted(jnp.ones(3))
    with CompileCounter(forward_log) as counter:
        assert locate_nan(jitted, jnp.ones(3)) is None
    assert counter.count == 0


# ---------------------------------------------------------------------------
# Real-code forms: shard_map, checkpoint, loops, branches, custom rules, libraries
# ---------------------------------------------------------------------------


def _where(report):
    return report.primitive, report.phase, report.frame.line


def _auto_mesh():
    from jax.sharding import AxisType

    return jax.make_mesh((2,), ("d",), axis_types=(AxisType.Auto,), devices=jax.devices("cpu")[:2])


def nan_after_shard_map(x):
    from jax.sharding import PartitionSpec as P

    doubled = jax.shard_map(lambda v: v * 2.0, mesh=_auto_mesh(), in_specs=P("d"), out_specs=P("d"))
    return jnp.log(doubled(x) - 10.0)  # LINE: after_shard_map


def nan_inside_shard_map(x):
    from jax.sharding import PartitionSpec as P

    body = lambda v: jax.lax.psum(jnp.log(v - 10.0), "d")  # noqa: E731  # LINE: shard_body
    mapped = jax.shard_map(body, mesh=_auto_mesh(), in_specs=P("d"), out_specs=P())
    return mapped(x)


def _mean_of_logs(v):
    safe = jnp.where(v > 100.0, jnp.log(v - 100.0), 0.0)  # discarded NaN: never blamed
    shift = jax.lax.psum(jnp.sum(v), "d") * 0.0
    clean = jnp.sum(safe + v) + shift  # varying over "d": a scan carry
    steps = jax.lax.scan(lambda c, u: (c + jnp.sqrt(u - 3.0), c), clean, v)[0]  # LINE: sm_scan
    return jax.lax.pmean(steps, "d")


def nan_in_a_scan_inside_shard_map(x):
    from jax.sharding import PartitionSpec as P

    mapped = jax.shard_map(_mean_of_logs, mesh=_auto_mesh(), in_specs=P("d"), out_specs=P())
    return mapped(x)


def nan_inside_shard_map_backward(x):
    from jax.sharding import PartitionSpec as P

    def body(v):
        return jax.lax.pmean(jnp.sum(jnp.sqrt(v * v)), "d")  # LINE: sm_sqrt

    mapped = jax.shard_map(body, mesh=_auto_mesh(), in_specs=P("d"), out_specs=P())
    return jax.grad(mapped)(x)


def test_shard_map_does_not_crash_and_a_nan_outside_is_located():
    with on_host():  # the 2-device mesh is the CPU's, on any machine: so are the inputs
        report = locate_nan(jax.jit(nan_after_shard_map), jnp.ones(4))
    assert _where(report) == ("log", "forward", _line_of("after_shard_map"))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_nan_inside_a_shard_map_body_is_located_at_its_line(jit):
    """Issue #36: it was reported at the `shard_map` call, not at the line in the body."""
    wrap = jax.jit if jit else (lambda f: f)
    with on_host():  # the 2-device mesh is the CPU's, on any machine: so are the inputs
        report = locate_nan(wrap(nan_inside_shard_map), jnp.ones(4))
        assert _where(report) == ("log", "forward", _line_of("shard_body"))
        assert report is not None and report.frame is not None
        assert report.frame.function.endswith("<lambda>")
        # in a scan in the body, past a `where` that discards a NaN, between collectives
        report = locate_nan(wrap(nan_in_a_scan_inside_shard_map), jnp.arange(8.0))
        assert _where(report) == ("sqrt", "forward", _line_of("sm_scan"))
        # the backward pass of a shard_map (its transpose is a shard_map too)
        x = jnp.asarray([1.0, 0.0, 2.0, 3.0])
        report = locate_nan(wrap(nan_inside_shard_map_backward), x)
        assert _where(report) == ("mul", "backward", _line_of("sm_sqrt"))


def checkpointed_log(x):
    block = jax.checkpoint(lambda y: jnp.log(y - 2.0) * 3.0)  # LINE: remat_log
    return jnp.sum(block(x))


def checkpointed_norm(x):
    block = jax.checkpoint(lambda y: jnp.sqrt(y * y))  # LINE: remat_sqrt
    return jnp.sum(block(x))


def test_nan_inside_checkpoint_forward_and_backward():
    assert _where(locate_nan(checkpointed_log, jnp.ones(3))) == (
        "log",
        "forward",
        _line_of("remat_log"),
    )
    assert _where(locate_nan(jax.grad(checkpointed_norm), jnp.zeros(3))) == (
        "mul",
        "backward",
        _line_of("remat_sqrt"),
    )


def while_log(x):
    def body(carry):
        i, v = carry
        return i + 1, jnp.log(v - 1.5)  # LINE: while_body

    return jax.lax.while_loop(lambda c: c[0] < 3, body, (0, x))[1]


def fori_sqrt(x):
    return jax.lax.fori_loop(0, 5, lambda i, v: jnp.sqrt(v - 2.0), x)  # LINE: fori_body


def cond_log(x):
    return jax.lax.cond(
        jnp.sum(x) > 0,
        lambda v: jnp.log(-v),  # LINE: cond_true
        lambda v: v,
        x,
    )


def switch_arccos(x, index):
    return jax.lax.switch(index, [lambda v: v, lambda v: jnp.arccos(v * 3.0)], x)  # LINE: switch


@pytest.mark.parametrize(
    "fn, args, expected",
    [
        (while_log, (jnp.full(2, 3.0),), ("log", "while_body")),
        (fori_sqrt, (jnp.full(2, 3.0),), ("sqrt", "fori_body")),
        (cond_log, (jnp.ones(2),), ("log", "cond_true")),
        (switch_arccos, (jnp.ones(2), 1), ("acos", "switch")),
    ],
    ids=["while_loop", "fori_loop", "cond", "switch"],
)
def test_nan_inside_loop_bodies_and_branches(fn, args, expected):
    report = locate_nan(jax.jit(fn), *args)
    assert _where(report) == (expected[0], "forward", _line_of(expected[1]))


@jax.custom_vjp
def scaled_identity(x):
    return x * 2.0


def _scaled_identity_fwd(x):
    return x * 2.0, x


def _scaled_identity_bwd(x, g):
    return (g * jnp.log(x - 2.0),)  # LINE: vjp_bwd


scaled_identity.defvjp(_scaled_identity_fwd, _scaled_identity_bwd)


@jax.custom_jvp
def soft_sine(x):
    return jnp.sin(x)


@soft_sine.defjvp
def _soft_sine_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return soft_sine(x), t * jnp.sqrt(jnp.cos(x) - 2.0)  # LINE: jvp_rule


def test_nan_inside_custom_rules_points_into_the_rule():
    vjp = locate_nan(jax.grad(lambda x: jnp.sum(scaled_identity(x))), jnp.ones(3))
    assert _where(vjp) == ("log", "backward", _line_of("vjp_bwd"))
    assert vjp is not None
    assert vjp.frame is not None
    assert vjp.frame.function == "_scaled_identity_bwd"
    jvp = locate_nan(jax.jit(jax.grad(lambda x: jnp.sum(soft_sine(x)))), jnp.ones(3))
    assert _where(jvp) == ("sqrt", "forward", _line_of("jvp_rule"))


def adam_without_eps(params):
    import optax

    optimizer = optax.adam(1e-3, eps=0.0)
    state = optimizer.init(params)
    updates, _ = optimizer.update(jnp.zeros_like(params), state, params)  # LINE: optax_update
    return updates


def test_nan_inside_a_library_is_reported_at_the_users_line():
    with jax.numpy_dtype_promotion("standard"):  # Optax relies on implicit promotion
        report = locate_nan(jax.jit(adam_without_eps), jnp.ones(3))
    assert _where(report) == ("div", "forward", _line_of("optax_update"))
    assert report is not None
    assert all("optax" not in frame.file for frame in report.stack)


def norm_root(x):
    return jnp.sum(jnp.linalg.norm(x) ** 0.5)  # LINE: norm_root


def test_nan_inside_a_jax_jitted_helper_is_reported_at_the_call():
    # jnp.linalg.norm is jitted inside JAX; its derivative's equations carry no user frame
    jnp.linalg.norm(jnp.ones(5))  # traced once elsewhere first: cached frames are stale
    assert _where(locate_nan(jax.grad(norm_root), jnp.zeros(3))) == (
        "mul",
        "backward",
        _line_of("norm_root"),
    )


def long_scan(x, steps):
    def body(c, _):
        c = c + 1.0
        return c, jnp.log(10.5 - c)  # LINE: scan_body

    return jax.lax.scan(body, x, None, length=steps)[1]


def test_nan_in_a_long_scan_replays_one_step(monkeypatch):
    import jaxwise.debug._replay as replay

    evaluated = []
    original = replay.Replay.equation

    def counting(self, eqn, *args, **kwargs):
        evaluated.append(eqn.primitive.name)
        return original(self, eqn, *args, **kwargs)

    monkeypatch.setattr(replay.Replay, "equation", counting)
    counts = {}
    for steps in (50, 400):
        evaluated.clear()
        report = locate_nan(jax.jit(functools.partial(long_scan, steps=steps)), jnp.zeros(2))
        assert _where(report) == ("log", "forward", _line_of("scan_body"))
        counts[steps] = len(evaluated)
    assert counts[50] == counts[400] < 30  # one body step replayed, whatever the length


def test_nan_in_a_flax_module_is_reported_in_the_users_module():
    nnx = pytest.importorskip("flax.nnx")

    class LogHead(nnx.Module):
        def __init__(self):
            self.dense = nnx.Linear(2, 1, rngs=nnx.Rngs(0))

        def __call__(self, x):
            return jnp.log(self.dense(x))  # LINE: flax_module

    graphdef, state = nnx.split(LogHead())

    @jax.jit
    def forward(state, x):
        return nnx.merge(graphdef, state)(x)

    report = locate_nan(forward, state, -100.0 * jnp.ones((3, 2)))
    assert _where(report) == ("log", "forward", _line_of("flax_module"))
