"""A corpus of real-code diagnostics cases with their exact expected answers.

Three tables of cases, each checked by tests/test_watch_corpus.py and scored by
benchmarks/bench_diagnostics_corpus.py:

- ``RECOMPILES``: a function, a sequence of calls, and the (kind, argument, old, new) of the
  last compile, as seen by ``jaxwise.watch.Watch``;
- ``NANS``: a function and arguments, and (primitive, phase, line marker) of
  ``jaxwise.debug.locate_nan``'s report;
- ``DONATIONS``: a block of training code and the donation findings of a ``Watch`` around it.

Lines are named by ``# AT: name`` markers in this file. Lint precision and recall are scored
on tests/lint_cases/ (every file states its expected findings).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import host64
import jax
import jax.numpy as jnp
import numpy as np

HERE = Path(__file__)


def at(marker: str) -> int:
    """The line of this file holding ``# AT: marker``."""
    for number, text in enumerate(HERE.read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# AT: {marker}"):
            return number
    raise KeyError(marker)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[], Any]
    expected: Any
    known_limit: str = ""  # a known wrong answer: why (the test marks it xfail)
    cpu_only: str = ""  # the expected answer holds only on a CPU: why (skipped elsewhere)


# The donation cases whose finding needs a NumPy view of a jax.Array's own buffer.
NUMPY_VIEW = "a NumPy view shares a jax.Array's buffer only on CPU (elsewhere np.asarray copies)"


# ---------------------------------------------------------------------------
# Recompile explanations
# ---------------------------------------------------------------------------


def _last_miss(build: Callable[[], Callable[[], Any]]) -> tuple[str, str, str, str]:
    """Run ``build()`` (which jits) and its returned ``calls()`` under a Watch; the last miss."""
    from jaxwise.watch import Watch

    with Watch() as watch:
        calls = build()
        calls()
    functions = watch.report().functions
    most = max(f.compiles for f in functions)
    last = [f for f in functions if f.compiles == most][-1].misses[-1]  # the one recompiling
    return last.kind, last.argument, last.old, last.new


def _host(build: Callable[[], Callable[[], None]]) -> Callable[[], Callable[[], None]]:
    """``build`` and its calls with the CPU device the default: the expected texts name cpu:N.

    The arrays are made and the calls run on the host whatever the default backend (on a
    TPU machine the default device is tpu:0; its 8 CPU devices are there too).
    """

    def hosted() -> Callable[[], None]:
        cpu = jax.devices("cpu")[0]
        with jax.default_device(cpu):
            calls = build()

        def run() -> None:
            with jax.default_device(cpu):
                calls()

        return run

    return hosted


def _calls(fn: Callable[..., Any], *arg_lists: tuple) -> Callable[[], None]:
    def run() -> None:
        for args in arg_lists:
            jax.block_until_ready(fn(*args))

    return run


class _Plain:
    def __init__(self, k: int) -> None:
        self.k = k


@dataclasses.dataclass(frozen=True)
class _Frozen:
    k: int


def _scale(x, n):
    return x * n


def _rec_static_int():
    f = jax.jit(_scale, static_argnums=1)
    return _calls(f, (jnp.ones(3), 2), (jnp.ones(3), 3))


def _rec_static_str():
    f = jax.jit(lambda x, mode: x * 2 if mode == "a" else x, static_argnames="mode")
    return lambda: [f(jnp.ones(3), mode="a"), f(jnp.ones(3), mode="b")]


def _rec_static_type():
    f = jax.jit(_scale, static_argnums=1)
    return _calls(f, (jnp.ones(3), 1), (jnp.ones(3), 1.0))


def _rec_static_identity():
    f = jax.jit(lambda x, cfg: x * cfg.k, static_argnums=1)
    return _calls(f, (jnp.ones(3), _Plain(2)), (jnp.ones(3), _Plain(2)))


def _rec_shape():
    f = jax.jit(lambda x: x * 2.0 + 0.875)
    return _calls(f, (jnp.ones(3),), (jnp.ones(4),))


def _rec_dtype():
    f = jax.jit(lambda x: x * 3)
    return _calls(f, (jnp.ones(3),), (jnp.ones(3, jnp.bfloat16),))


def _rec_weak():
    f = jax.jit(lambda x, lr: x * lr)
    return _calls(f, (jnp.ones(3), 0.1), (jnp.ones(3), jnp.float32(0.1)))


def _rec_weak_in_tree():
    f = jax.jit(lambda x, hp: x * hp["lr"])
    return _calls(f, (jnp.ones(3), {"lr": 0.1}), (jnp.ones(3), {"lr": jnp.float32(0.1)}))


def _rec_batch_in_tuple():
    f = jax.jit(lambda w, batch: (batch[0] @ w - batch[1]).sum())
    w = jnp.ones((2, 1))
    return _calls(
        f, (w, (jnp.ones((8, 2)), jnp.ones((8, 1)))), (w, (jnp.ones((5, 2)), jnp.ones((5, 1))))
    )


def _rec_dict_keys():
    f = jax.jit(lambda p: sum(jax.tree.leaves(p)))
    return _calls(f, ({"a": jnp.ones(2)},), ({"a": jnp.ones(2), "b": jnp.ones(2)},))


def _rec_none_leaf():
    f = jax.jit(lambda x, mask: x if mask is None else x * mask)
    return _calls(f, (jnp.ones(3), None), (jnp.ones(3), jnp.ones(3)))


def _rec_keyword():
    f = jax.jit(_scale)
    return lambda: [f(jnp.ones(3), 2.0), f(jnp.ones(3), n=2.0)]


def _rec_tuple_length():
    f = jax.jit(lambda xs: sum(xs))
    return _calls(f, ((jnp.ones(2), jnp.ones(2)),), ((jnp.ones(2), jnp.ones(2), jnp.ones(2)),))


def _rec_static_then_shape():
    f = jax.jit(_scale, static_argnums=1)
    return _calls(f, (jnp.ones(3), 2), (jnp.ones(4), 2), (jnp.ones(4), 3))


def _rec_lambda_in_loop():
    def run() -> None:
        for _ in range(2):
            jax.jit(lambda x: x + 1.0)(jnp.ones(3))

    return run


def _rec_bound_method():
    class Model:
        def apply(self, x):
            return x + 1.0

    model = Model()

    def run() -> None:
        for _ in range(2):
            jax.jit(model.apply)(jnp.ones(3))

    return run


def _rec_committed():
    f = jax.jit(lambda x: x * 2.0 + 0.125)  # a program compiled nowhere else (JAX shares them)
    return _calls(f, (jnp.ones(3),), (jax.device_put(jnp.ones(3), jax.devices("cpu")[0]),))


def _rec_device():
    f = jax.jit(lambda x: x * 2.0 + 0.375)
    return _calls(
        f,
        (jax.device_put(jnp.ones(3), jax.devices("cpu")[0]),),
        (jax.device_put(jnp.ones(3), jax.devices("cpu")[1]),),
    )


def _rec_mesh():
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices("cpu")[:2])
    f = jax.jit(lambda x: x * 2.0 + 0.625)
    sharded = jax.device_put(jnp.ones(4), NamedSharding(mesh, P("data")))
    return _calls(f, (jnp.ones(4),), (sharded,))


def _rec_donation():
    def twice(x):
        return 2.0 * x

    def run() -> None:
        jax.jit(twice)(jnp.ones(3))
        jax.jit(twice, donate_argnums=0)(jnp.ones(3))

    return run


def _rec_x64():
    f = jax.jit(_scale)

    def run() -> None:
        try:
            f(np.ones(3, np.float32), 0.5)
            host64.set_x64(True)
            f(np.ones(3, np.float32), 0.5)
        finally:
            host64.set_x64(False)

    return run


def _rec_vmap_batch():
    f = jax.jit(jax.vmap(lambda x: x.sum()))
    return _calls(f, (jnp.ones((8, 3)),), (jnp.ones((6, 3)),))


def _rec_nnx_static():
    from flax import nnx

    model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))

    @nnx.jit(static_argnames="scale")
    def forward(model, x, scale):
        return model(x) * scale

    return lambda: [forward(model, jnp.ones((2, 2)), scale=s) for s in (1.0, 2.0)]


def _rec_nnx_shape():
    from flax import nnx

    model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    forward = nnx.jit(lambda model, x: model(x))
    return lambda: [forward(model, jnp.ones((n, 2))) for n in (4, 3)]


def _rec_equinox_shape():
    import equinox as eqx

    f = eqx.filter_jit(lambda x: x * 2)
    return lambda: [f(jnp.ones(n)) for n in (3, 5)]


def _rec_train_step_batch():
    from jaxwise import optim
    from jaxwise.train import TrainState, make_train_step

    tx = optim.sgd(0.1)
    step = make_train_step(lambda p, b: jnp.mean((b @ p["w"]) ** 2))
    box = [TrainState.create({"w": jnp.ones((2, 1))}, tx, 0)]

    def run() -> None:
        for n in (8, 5):
            box[0], _ = step(box[0], jnp.ones((n, 2)))

    return run


def _rec_frozen_config():
    f = jax.jit(lambda x, cfg: x * cfg.k, static_argnums=1)
    return _calls(f, (jnp.ones(3), _Frozen(2)), (jnp.ones(3), _Frozen(3)))


RECOMPILES = [
    Case("static int", lambda: _last_miss(_rec_static_int), ("static", "n", "2", "3")),
    Case(
        "static str by keyword",
        lambda: _last_miss(_rec_static_str),
        ("static", "mode", "'a'", "'b'"),
    ),
    Case("static 1 vs 1.0", lambda: _last_miss(_rec_static_type), ("static", "n", "1", "1.0")),
    Case(
        "static hashed by identity",
        lambda: _last_miss(_rec_static_identity)[:2],
        ("static", "cfg"),
    ),
    Case(
        "static frozen dataclass",
        lambda: _last_miss(_rec_frozen_config),
        ("static", "cfg", "_Frozen(k=2)", "_Frozen(k=3)"),
    ),
    Case("shape", lambda: _last_miss(_rec_shape), ("shape", "x", "f32[3]", "f32[4]")),
    Case("dtype", lambda: _last_miss(_rec_dtype), ("dtype", "x", "f32[3]", "bf16[3]")),
    Case(
        "weak type",
        lambda: _last_miss(_rec_weak),
        ("weak_type", "lr", "f32[]{weak_type=True}", "f32[]{weak_type=False}"),
    ),
    Case(
        "weak type in a dict",
        lambda: _last_miss(_rec_weak_in_tree)[:2],
        ("weak_type", "hp['lr']"),
    ),
    Case(
        "batch shape in a tuple",
        lambda: _last_miss(_rec_batch_in_tuple),
        ("shape", "batch[0]", "f32[8,2]", "f32[5,2]"),
    ),
    Case("dict keys", lambda: _last_miss(_rec_dict_keys)[:2], ("structure", "p['b']")),
    Case("None vs array", lambda: _last_miss(_rec_none_leaf)[:2], ("structure", "mask")),
    Case(
        "positional vs keyword",
        lambda: _last_miss(_rec_keyword),
        ("structure", "n", "passed positionally", "passed by keyword"),
    ),
    Case("tuple length", lambda: _last_miss(_rec_tuple_length)[:2], ("structure", "xs[2]")),
    Case(
        "static after shape", lambda: _last_miss(_rec_static_then_shape), ("static", "n", "2", "3")
    ),
    Case("jit of a lambda in a loop", lambda: _last_miss(_rec_lambda_in_loop)[0], "new_function"),
    Case(
        "jit of a bound method in a loop", lambda: _last_miss(_rec_bound_method)[0], "new_function"
    ),
    Case(
        "committed to the same device",
        lambda: _last_miss(_host(_rec_committed)),
        ("sharding", "x", "uncommitted (on cpu:0)", "committed (on cpu:0)"),
    ),
    Case(
        "another device",
        lambda: _last_miss(_host(_rec_device)),
        ("sharding", "x", "on cpu:0", "on cpu:1"),
    ),
    Case("mesh sharding", lambda: _last_miss(_host(_rec_mesh))[:2], ("sharding", "x")),
    Case(
        "with and without donation",
        lambda: _last_miss(_rec_donation),
        ("donation", "x", "not donated", "donated"),
    ),
    Case(
        "x64 flip",
        lambda: _last_miss(_host(_rec_x64)),
        ("config", "jax_enable_x64", "False", "True"),
    ),
    Case(
        "vmapped batch size",
        lambda: _last_miss(_rec_vmap_batch),
        ("shape", "x", "f32[8,3]", "f32[6,3]"),
    ),
    Case(
        "nnx.jit static argument",
        lambda: _last_miss(_rec_nnx_static),
        ("static", "scale", "1.0", "2.0"),
    ),
    Case("nnx.jit batch shape", lambda: _last_miss(_rec_nnx_shape)[0], "shape"),
    Case("equinox filter_jit shape", lambda: _last_miss(_rec_equinox_shape)[0], "shape"),
    Case(
        "jaxwise train step batch",
        lambda: _last_miss(_rec_train_step_batch),
        ("shape", "batch", "f32[8,2]", "f32[5,2]"),
    ),
]


# ---------------------------------------------------------------------------
# NaN location
# ---------------------------------------------------------------------------


def _locate(fn: Callable[..., Any], *args: Any) -> tuple[str, str, int | None]:
    from jaxwise.debug import locate_nan

    report = locate_nan(fn, *args)
    if report is None:
        return ("none", "", None)
    return report.primitive, report.phase, report.frame.line if report.frame else None


def nan_log(x):
    return jnp.log(x)  # AT: log


def nan_sqrt_abs(x):
    return jnp.sum(jnp.sqrt(x * x))  # AT: sqrt_abs


def nan_where_discarded(x, y):
    return jnp.where(x > 0, jnp.log(x), 0.0) + jnp.sqrt(y - 5.0)  # AT: where_discarded


def nan_double_where(x):
    return jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))  # AT: double_where


def nan_zero_over_zero(x):
    return x / jnp.sum(x)  # AT: zero_over_zero


def nan_zero_times_inf(x):
    big = 1.0 / x
    return big * 0.0  # AT: zero_times_inf


def nan_arccos(x):
    return jnp.arccos(x * 2.0)  # AT: arccos


def nan_scan(x):
    def body(c, _):
        c = c + 1.0
        return c, jnp.log(20.5 - c)  # AT: scan

    return jax.lax.scan(body, x, None, length=200)[1]


def nan_fori(x):
    return jax.lax.fori_loop(0, 10, lambda i, v: jnp.sqrt(v - 0.5), x)  # AT: fori


def nan_while(x):
    def body(c):
        return c[0] + 1, jnp.log(c[1] - 1.0)  # AT: while

    return jax.lax.while_loop(lambda c: c[0] < 5, body, (0, x))[1]


def nan_cond(x):
    return jax.lax.cond(x[0] > 0, lambda v: jnp.log(-v), lambda v: v, x)  # AT: cond


def nan_switch(x):
    return jax.lax.switch(2, [lambda v: v, lambda v: -v, lambda v: jnp.sqrt(-v)], x)  # AT: switch


def nan_remat(x):
    return jnp.sum(jax.checkpoint(lambda v: jnp.log(v - 3.0))(x))  # AT: remat


def nan_remat_grad(x):
    return jnp.sum(jax.checkpoint(lambda v: jnp.sqrt(v * v))(x))  # AT: remat_grad


@jax.custom_vjp
def _clip_grad(x):
    return x


def _clip_fwd(x):
    return x, x


def _clip_bwd(x, g):
    return (g * jnp.sqrt(x - 2.0),)  # AT: custom_vjp


_clip_grad.defvjp(_clip_fwd, _clip_bwd)


@jax.custom_jvp
def _soft(x):
    return jnp.tanh(x)


@_soft.defjvp
def _soft_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _soft(x), t * jnp.log(jnp.cos(x) - 2.0)  # AT: custom_jvp


_inner_jitted = jax.jit(lambda v: jnp.log(v - 5.0))  # AT: nested_jit


def nan_nested(x):
    return _inner_jitted(x) + 1.0


def nan_optax(p):
    import optax

    opt = optax.adam(1e-3, eps=0.0)
    updates, _ = opt.update(jnp.zeros_like(p), opt.init(p), p)  # AT: optax
    return updates


def nan_norm_grad(x):
    return jnp.linalg.norm(x)  # AT: norm_grad


def nan_log_softmax(x):
    return jax.nn.log_softmax(x)  # AT: log_softmax


def _nnx_case():
    from flax import nnx

    class Head(nnx.Module):
        def __init__(self):
            self.dense = nnx.Linear(2, 1, rngs=nnx.Rngs(0))

        def __call__(self, x):
            return jnp.log(self.dense(x))  # AT: nnx_module

    graphdef, state = nnx.split(Head())
    fn = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    return _locate(fn, state, -100.0 * jnp.ones((3, 2)))


def _equinox_case():
    import equinox as eqx

    class Scale(eqx.Module):
        w: jax.Array

        def __call__(self, x):
            return jnp.sqrt(self.w * x)  # AT: equinox_module

    return _locate(eqx.filter_jit(lambda m, x: m(x)), Scale(jnp.ones(3)), -jnp.ones(3))


def _shard_case(inside: bool):
    from jax.sharding import AxisType
    from jax.sharding import PartitionSpec as P

    cpus = jax.devices("cpu")  # a 2-device mesh on any machine, its input on the host
    mesh = jax.make_mesh((2,), ("d",), axis_types=(AxisType.Auto,), devices=cpus[:2])
    with jax.default_device(cpus[0]):
        if inside:
            body = jax.shard_map(
                lambda v: jnp.log(v - 9.0),  # AT: shard_body
                mesh=mesh,
                in_specs=P("d"),
                out_specs=P("d"),
            )
            return _locate(lambda x: body(x), jnp.ones(4))  # AT: shard_inside
        doubled = jax.shard_map(lambda v: v * 2.0, mesh=mesh, in_specs=P("d"), out_specs=P("d"))
        outside = jax.jit(lambda x: jnp.log(doubled(x) - 9.0))  # AT: shard_outside
        return _locate(outside, jnp.ones(4))


def _optax_case():
    with jax.numpy_dtype_promotion("standard"):
        return _locate(jax.jit(nan_optax), jnp.ones(3))


NANS = [
    Case(
        "forward log",
        lambda: _locate(jax.jit(nan_log), -jnp.ones(2)),
        ("log", "forward", at("log")),
    ),
    Case(
        "backward sqrt(x*x) at 0",
        lambda: _locate(jax.grad(nan_sqrt_abs), jnp.zeros(2)),
        ("mul", "backward", at("sqrt_abs")),
    ),
    Case(
        "NaN discarded by where, another kept",
        lambda: _locate(nan_where_discarded, jnp.asarray([0.0, -1.0]), jnp.asarray([9.0, 1.0])),
        ("sqrt", "forward", at("where_discarded")),
    ),
    Case(
        "the double-where pitfall",
        lambda: _locate(jax.jit(jax.grad(nan_double_where)), jnp.zeros(2)),
        ("mul", "backward", at("double_where")),
    ),
    Case(
        "0/0",
        lambda: _locate(nan_zero_over_zero, jnp.zeros(2)),
        ("div", "forward", at("zero_over_zero")),
    ),
    Case(
        "0·inf",
        lambda: _locate(nan_zero_times_inf, jnp.zeros(2)),
        ("mul", "forward", at("zero_times_inf")),
    ),
    Case(
        "arccos out of domain",
        lambda: _locate(nan_arccos, jnp.ones(2)),
        ("acos", "forward", at("arccos")),
    ),
    Case(
        "vmap", lambda: _locate(jax.vmap(nan_log), -jnp.ones((3, 2))), ("log", "forward", at("log"))
    ),
    Case(
        "scan of 200 steps",
        lambda: _locate(jax.jit(nan_scan), jnp.zeros(2)),
        ("log", "forward", at("scan")),
    ),
    Case(
        "fori_loop body",
        lambda: _locate(jax.jit(nan_fori), jnp.ones(2)),
        ("sqrt", "forward", at("fori")),
    ),
    Case(
        "while_loop body",
        lambda: _locate(jax.jit(nan_while), jnp.full(2, 3.0)),
        ("log", "forward", at("while")),
    ),
    Case(
        "cond branch",
        lambda: _locate(jax.jit(nan_cond), jnp.ones(2)),
        ("log", "forward", at("cond")),
    ),
    Case(
        "switch branch",
        lambda: _locate(jax.jit(nan_switch), jnp.ones(2)),
        ("sqrt", "forward", at("switch")),
    ),
    Case(
        "checkpoint forward",
        lambda: _locate(nan_remat, jnp.ones(2)),
        ("log", "forward", at("remat")),
    ),
    Case(
        "checkpoint backward",
        lambda: _locate(jax.grad(nan_remat_grad), jnp.zeros(2)),
        ("mul", "backward", at("remat_grad")),
    ),
    Case(
        "custom_vjp backward rule",
        lambda: _locate(jax.grad(lambda x: jnp.sum(_clip_grad(x))), jnp.ones(2)),
        ("sqrt", "backward", at("custom_vjp")),
    ),
    Case(
        "custom_jvp rule",
        lambda: _locate(jax.grad(lambda x: jnp.sum(_soft(x))), jnp.ones(2)),
        ("log", "forward", at("custom_jvp")),
    ),
    Case(
        "nested jit",
        lambda: _locate(jax.jit(nan_nested), jnp.ones(2)),
        ("log", "forward", at("nested_jit")),
    ),
    Case("Optax adam(eps=0)", _optax_case, ("div", "forward", at("optax"))),
    Case(
        "norm's gradient at 0",
        lambda: _locate(jax.grad(nan_norm_grad), jnp.zeros(3)),
        ("mul", "backward", at("norm_grad")),  # sqrt's derivative 0.5/0 = inf, times 2x = 0
    ),
    Case(
        "log_softmax of -inf",
        lambda: _locate(nan_log_softmax, jnp.full(3, -jnp.inf)),
        ("sub", "forward", at("log_softmax")),
    ),
    Case("Flax NNX module", _nnx_case, ("log", "forward", at("nnx_module"))),
    Case("Equinox module", _equinox_case, ("sqrt", "forward", at("equinox_module"))),
    Case(
        "NaN outside a shard_map",
        lambda: _shard_case(False),
        ("log", "forward", at("shard_outside")),
    ),
    Case(
        "NaN inside a shard_map",
        lambda: _shard_case(True),
        ("log", "forward", at("shard_body")),
    ),
    Case(
        "argument already NaN",
        lambda: _locate(nan_log, jnp.asarray([jnp.nan, 1.0])),
        ("argument", "forward", None),
    ),
    Case("no NaN", lambda: _locate(nan_log, jnp.ones(2)), ("none", "", None)),
]


# ---------------------------------------------------------------------------
# Donation
# ---------------------------------------------------------------------------


def _watched(block: Callable[[], Any]) -> list[tuple[str, str, str]]:
    """Donation findings of a Watch around ``block``: (function, argument, cause keyword)."""
    import warnings

    from jaxwise.watch import Watch

    with warnings.catch_warnings(record=True):  # JAX's own donation warning: not scored
        with Watch() as watch:
            try:
                block()
            except Exception as err:  # a jaxwise step's DonationError: recorded by the watch
                if type(err).__name__ != "DonationError":
                    raise
    keywords = ("DonationError", "NumPy view", "shape and dtype", "not use")
    out = []
    for d in watch.report().donations:
        key = next((k for k in keywords if k in d.cause), "other")
        out.append((d.function, d.argument, key))
    return out


def _update(params, grads):
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def _don_view_kept():
    update = jax.jit(_update, donate_argnums=0)
    params, kept = {"w": jnp.ones(3)}, []
    for _ in range(2):
        kept.append(np.asarray(params["w"]))
        params = update(params, {"w": jnp.ones(3)})


def _don_temporary_view():
    update = jax.jit(_update, donate_argnums=0)
    params = {"w": jnp.ones(3)}
    for _ in range(2):
        assert np.asarray(params["w"]).all()
        params = update(params, {"w": jnp.ones(3)})


def _don_host_copy():
    update = jax.jit(_update, donate_argnums=0)
    params, kept = {"w": jnp.ones(3)}, []
    for _ in range(2):
        kept.append(np.array(params["w"]))
        params = update(params, {"w": jnp.ones(3)})


def _don_unusable():
    total = jax.jit(lambda state: (jnp.sum(state["a"]), state["b"] * 2.0), donate_argnums=0)
    total({"a": jnp.ones(4), "b": jnp.ones(2)})


def _don_by_keyword():
    step = jax.jit(lambda s: s + 1.0, donate_argnames="s")
    weights = jnp.zeros(3)
    view = np.asarray(weights)
    weights = step(s=weights)
    del view


def _don_identity():
    jax.jit(lambda x: x, donate_argnums=0)(jnp.ones(3))


def _don_numpy_input():
    jax.jit(lambda x: x * 2.0, donate_argnums=0)(np.ones(3, np.float32))


def _don_nnx_view():
    from flax import nnx

    model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))

    @nnx.jit(donate_argnums=0)
    def shrink(model):
        model.kernel[...] = model.kernel[...] * 0.5

    kept = np.asarray(model.kernel[...])
    shrink(model)
    del kept


def _jaxwise_step():
    from jaxwise import optim
    from jaxwise.train import TrainState, make_train_step

    tx = optim.sgd(0.1)
    step = make_train_step(lambda p, b: jnp.mean((b @ p["w"]) ** 2))
    return tx, step, TrainState.create({"w": jnp.ones((2, 1))}, tx, 0)


def _don_step_view():
    _, step, state = _jaxwise_step()
    state, _ = step(state, jnp.ones((4, 2)))
    view = np.asarray(state.params["w"])
    step(state, jnp.ones((4, 2)))
    del view


def _don_step_deleted():
    _, step, state = _jaxwise_step()
    step(state, jnp.ones((4, 2)))
    step(state, jnp.ones((4, 2)))  # the old, donated state again


def _don_step_shared():
    _, step, state = _jaxwise_step()
    state = dataclasses.replace(state, model_state={"a": state.params["w"]})
    step(state, jnp.ones((4, 2)))


def _don_step_in_users_jit():
    _, step, state = _jaxwise_step()
    outer = jax.jit(lambda s, b: step(s, b), donate_argnums=0)
    for _ in range(2):
        state, _ = outer(state, jnp.ones((4, 2)))


def _don_step_disable_jit():
    _, step, state = _jaxwise_step()
    with jax.disable_jit():
        step(state, jnp.ones((4, 2)))


def _don_partial_unusable():
    f = jax.jit(lambda p: {"w": p["w"] * 2.0}, donate_argnums=0)
    f({"w": jnp.ones(3), "extra": jnp.ones(5)})


DONATIONS = [
    Case(
        "NumPy view kept in a list",
        lambda: _watched(_don_view_kept),
        [("_update", "params['w']", "NumPy view")],
        cpu_only=NUMPY_VIEW,
    ),
    Case("temporary view", lambda: _watched(_don_temporary_view), []),
    Case("real host copy", lambda: _watched(_don_host_copy), []),
    Case(
        "no output of that shape",
        lambda: _watched(_don_unusable),
        [("<lambda>", "state['a']", "shape and dtype")],
    ),
    Case(
        "donated by keyword, view kept",
        lambda: _watched(_don_by_keyword),
        [("<lambda>", "weights", "NumPy view")],
        cpu_only=NUMPY_VIEW,
    ),
    Case("identity function", lambda: _watched(_don_identity), []),
    Case("NumPy input", lambda: _watched(_don_numpy_input), []),
    Case(
        "nnx.jit, view of a kernel",
        lambda: _watched(_don_nnx_view),
        [("shrink", "model.kernel", "NumPy view")],
        cpu_only=NUMPY_VIEW,
    ),
    Case(
        "jaxwise step, live view",
        lambda: _watched(_don_step_view),
        [("lambda_train_step", "state.params['w']", "DonationError")],
        cpu_only=NUMPY_VIEW,
    ),
    Case(
        "jaxwise step, old state reused",
        lambda: _watched(_don_step_deleted),
        [("lambda_train_step", "state.step", "DonationError")],
    ),
    Case(
        "jaxwise step, one buffer at two paths",
        lambda: _watched(_don_step_shared),
        [("lambda_train_step", "state.model_state['a']", "DonationError")],
    ),
    Case(
        "jaxwise step inside the user's donating jit", lambda: _watched(_don_step_in_users_jit), []
    ),
    Case("jaxwise step under disable_jit", lambda: _watched(_don_step_disable_jit), []),
    Case(
        "one leaf of a tree unusable",
        lambda: _watched(_don_partial_unusable),
        [("<lambda>", "p['extra']", "not use")],
    ),
]

ALL = {"recompile explanations": RECOMPILES, "NaN location": NANS, "donation": DONATIONS}
