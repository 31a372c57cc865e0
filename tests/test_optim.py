"""Tests for jaxwise.optim: the wrappers are exactly Optax (types, states, every float64 step)."""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from host64 import host_float64
from tolerance import rtol

from jaxwise import optim
from jaxwise.compilation import CompileBudget
from jaxwise.tree import mask_by_path

# ---------------------------------------------------------------------------
# A quadratic over a pytree: loss = ½ Σ c (p − target)², grad = c (p − target)
# ---------------------------------------------------------------------------

P0 = {"w": np.array([[1.0, -2.0, 0.5], [0.3, 0.0, -1.2]]), "b": np.array([0.5, -0.25])}
TARGET = {"w": np.array([[0.2, 0.1, -0.3], [1.0, -0.5, 0.0]]), "b": np.array([-1.0, 2.0])}
CURV = {"w": np.array([[1.0, 3.0, 0.5], [2.0, 10.0, 0.2]]), "b": np.array([4.0, 0.1])}
MASK = {"w": True, "b": False}
STEPS = 6
LR = 0.1  # the largest learning rate of the cases below (the warmup-cosine peak)


def grad_np(p):
    return {k: CURV[k] * (p[k] - TARGET[k]) for k in p}


def grad_jax(p):
    return {
        k: jnp.asarray(CURV[k], p[k].dtype) * (p[k] - jnp.asarray(TARGET[k], p[k].dtype)) for k in p
    }


# --------------------------- NumPy float64 references -----------------------


def ref_run(step_fn, init_state, steps=STEPS):
    p = {k: v.copy() for k, v in P0.items()}
    state, history = init_state, []
    for t in range(steps):
        u, state = step_fn(grad_np(p), state, p, t)
        p = {k: p[k] + u[k] for k in p}
        history.append({k: v.copy() for k, v in p.items()})
    return history


def zeros():
    return {k: np.zeros_like(v) for k, v in P0.items()}


def ref_sgd(lr: Any, momentum=None, nesterov=False):
    def step(g, trace, p, t):
        if momentum is None:
            return {k: -lr * g[k] for k in g}, trace
        trace = {k: g[k] + momentum * trace[k] for k in g}
        d = {k: g[k] + momentum * trace[k] for k in g} if nesterov else trace
        return {k: -lr * d[k] for k in g}, trace

    return step, zeros()


def ref_adam(lr: Any, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, mask=None, clip=None):
    lr_fn: Callable[[int], Any] = lr if callable(lr) else (lambda t: lr)

    def step(g, state, p, t):
        m, v = state
        if clip is not None:
            norm = np.sqrt(sum((x**2).sum() for x in g.values()))
            if norm >= clip:
                g = {k: x / norm * clip for k, x in g.items()}
        m = {k: b1 * m[k] + (1 - b1) * g[k] for k in g}
        v = {k: b2 * v[k] + (1 - b2) * g[k] ** 2 for k in g}
        u = {
            k: (m[k] / (1 - b1 ** (t + 1))) / (np.sqrt(v[k] / (1 - b2 ** (t + 1))) + eps) for k in g
        }
        u = {k: u[k] + (wd * p[k] if (mask is None or mask[k]) else 0.0) for k in g}
        return {k: -lr_fn(t) * u[k] for k in g}, (m, v)

    return step, (zeros(), zeros())


def ref_lion(lr: Any, b1=0.9, b2=0.99, wd=0.0, mask=None):
    lr_fn: Callable[[int], Any] = lr if callable(lr) else (lambda t: lr)

    def step(g, m, p, t):
        d = {k: np.sign((1 - b1) * g[k] + b1 * m[k]) for k in g}
        m = {k: (1 - b2) * g[k] + b2 * m[k] for k in g}
        u = {k: d[k] + (wd * p[k] if (mask is None or mask[k]) else 0.0) for k in g}
        return {k: -lr_fn(t) * u[k] for k in g}, m

    return step, zeros()


def np_warmup_cosine(init, peak, warmup, decay, end):
    def f(t):
        if t < warmup:
            return init + (peak - init) * t / warmup
        frac = min(t - warmup, decay - warmup) / (decay - warmup)
        return end + (peak - end) * 0.5 * (1 + np.cos(np.pi * frac))

    return f


# --------------------------- the comparison table ---------------------------

WC = dict(init_value=0.0, peak_value=0.1, warmup_steps=2, decay_steps=5, end_value=0.001)

CASES = {
    "sgd": (lambda m: m.sgd(0.05), ref_sgd(0.05)),
    "momentum": (lambda m: m.sgd(0.05, momentum=0.9), ref_sgd(0.05, 0.9)),
    "nesterov": (lambda m: m.sgd(0.05, momentum=0.9, nesterov=True), ref_sgd(0.05, 0.9, True)),
    "adam": (lambda m: m.adam(0.05), ref_adam(0.05)),
    "adamw": (lambda m: m.adamw(0.05, weight_decay=0.1), ref_adam(0.05, wd=0.1)),
    "adamw masked": (
        lambda m: m.adamw(0.05, weight_decay=0.1, mask=MASK),
        ref_adam(0.05, wd=0.1, mask=MASK),
    ),
    "lion": (lambda m: m.lion(0.01, weight_decay=0.1), ref_lion(0.01, wd=0.1)),
    "lion schedule lr": (
        lambda m: m.lion(m.linear_schedule(0.02, 0.005, 4), weight_decay=0.0),
        ref_lion(lambda t: 0.02 + (0.005 - 0.02) * min(t, 4) / 4),
    ),
    "lion masked decay (mask fn)": (
        lambda m: m.lion(0.01, weight_decay=0.3, mask=lambda p: {"w": True, "b": False}),
        ref_lion(0.01, wd=0.3, mask=MASK),
    ),
    "clip + adam + warmup-cosine": (
        lambda m: m.chain(
            m.clip_by_global_norm(1.0),
            m.scale_by_adam(),
            m.scale_by_learning_rate(m.warmup_cosine_decay_schedule(**WC)),
        ),
        ref_adam(np_warmup_cosine(*WC.values()), clip=1.0),
    ),
}


def standard_promotion(fn):
    """Optax relies on implicit promotion; run peer code under JAX's standard rules."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with jax.numpy_dtype_promotion("standard"):
            return fn(*args, **kwargs)

    return wrapped


@standard_promotion
def run_optax(tx, dtype):
    return run_tx(tx, dtype)


def run_tx(tx, dtype):
    p = {k: jnp.asarray(v, dtype) for k, v in P0.items()}
    state = tx.init(p)

    @jax.jit
    def step(p, state):
        u, state = tx.update(grad_jax(p), state, p)
        return optax.apply_updates(p, u), state

    history = []
    for _ in range(STEPS):
        p, state = step(p, state)
        history.append({k: np.asarray(v, np.float64) for k, v in p.items()})
    return history


def assert_histories_close(a, b, atol, what):
    for t, (x, y) in enumerate(zip(a, b)):
        for k in x:
            np.testing.assert_allclose(
                x[k], y[k], rtol=0, atol=atol, err_msg=f"{what}: step {t}, leaf {k}"
            )


@pytest.mark.parametrize("name", CASES)
def test_every_step_matches_float64_reference_and_optax(name):
    make, (ref_step, ref_state) = CASES[name]
    reference = ref_run(ref_step, ref_state)
    with host_float64():
        ours64 = run_tx(make(optim), jnp.float64)
        optax64 = run_optax(make(optax), jnp.float64)
    # Optax evaluates a schedule of the int32 count in float32, even under x64: the learning
    # rate carries a float32 rounding (~1e-9 per step); everything else is float64-exact.
    scheduled = "schedule" in name or "cosine" in name
    assert_histories_close(
        ours64, reference, 1e-8 if scheduled else 1e-12, f"{name} vs NumPy float64"
    )
    assert_histories_close(ours64, optax64, 0.0, f"{name} vs Optax (float64): identical")
    ours32, optax32 = run_tx(make(optim), jnp.float32), run_optax(make(optax), jnp.float32)
    assert_histories_close(ours32, optax32, 0.0, f"{name} vs Optax (float32): identical")
    # Adam's bias corrections 1 - b**t are a float32 pow (exp of t·log b) on the device: its log
    # (table) moves each step by up to lr·(2 log + exp) relatively, over STEPS steps; 1e-5 on CPU.
    atol = max(1e-5, STEPS * LR * rtol("log", "log", "exp", floor=0.0))
    assert_histories_close(ours32, reference, atol, f"{name} float32 vs NumPy float64")


# ---------------------------------------------------------------------------
# Mixing with Optax, both ways
# ---------------------------------------------------------------------------


def test_mixing_with_optax_inside_both_chains():
    mixed_optax_chain = optax.chain(
        optim.scale_by_adam(), optax.add_decayed_weights(0.1), optim.scale_by_learning_rate(0.05)
    )
    mixed_our_chain = optim.chain(
        optax.scale_by_adam(), optim.add_decayed_weights(0.1), optax.scale_by_learning_rate(0.05)
    )
    reference = run_optax(optax.adamw(0.05, weight_decay=0.1), jnp.float32)
    assert_histories_close(
        run_optax(mixed_optax_chain, jnp.float32), reference, 1e-7, "optax.chain(ours…)"
    )
    assert_histories_close(
        run_optax(mixed_our_chain, jnp.float32), reference, 1e-7, "optim.chain(optax…)"
    )


@standard_promotion
def test_our_chain_forwards_extra_args_to_optax_transforms():
    tx = optim.chain(optim.scale(1.0), optax.scale_by_polyak(f_min=0.0))
    p = jnp.asarray([1.0, 2.0])
    updates, _ = tx.update(jnp.asarray([1.0, 0.0]), tx.init(p), p, value=jnp.asarray(2.0))
    assert np.isfinite(np.asarray(updates)).all()


@standard_promotion
def test_drop_in_for_optax_training_loop():
    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    for tx in (optim.adamw(1e-2), optim.lion(1e-3), optim.sgd(0.1, 0.9)):
        state = tx.init(params)
        grads = jax.tree.map(jnp.ones_like, params)
        updates, state = tx.update(grads, state, params)
        new = optax.apply_updates(params, updates)
        assert jax.tree.structure(new) == jax.tree.structure(params)


# ---------------------------------------------------------------------------
# The two classic mistakes
# ---------------------------------------------------------------------------


def test_bias_correction_first_step():
    g = jnp.asarray([0.3, -2.0, 50.0])
    b1, b2 = 0.9, 0.999
    m, v = (1 - b1) * g, (1 - b2) * g**2
    no_correction = m / (jnp.sqrt(v) + 1e-8)
    np.testing.assert_allclose(no_correction, np.sign(g) * (1 - b1) / np.sqrt(1 - b2), rtol=1e-4)
    assert float(jnp.abs(no_correction)[0]) == pytest.approx(3.162, abs=1e-3)
    tx = optim.scale_by_adam()
    ours, _ = tx.update(g, tx.init(g))
    np.testing.assert_allclose(ours, np.sign(g), rtol=1e-4)  # pyright: ignore[reportArgumentType, reportCallIssue]  # optax types updates and states as a union of trees


def test_adamw_is_decoupled_unlike_l2_plus_adam():
    lr, wd, steps = 0.01, 0.1, 50
    with host_float64():
        p0 = jnp.asarray([2.0, -3.0, 0.5, 20.0])
        # L2 + Adam: the decay goes into the gradient and is normalised away by sqrt(v̂):
        # every weight moves by ≈ lr per step whatever its size.
        l2 = optim.adam(lr)
        p, s = p0, l2.init(p0)
        first_update = None
        for _ in range(steps):
            u, s = l2.update(wd * p, s)
            first_update = u if first_update is None else first_update
            p = optim.apply_updates(p, u)
        np.testing.assert_allclose(np.asarray(first_update), -np.sign(p0) * lr, rtol=1e-6)
        moved = np.abs(np.asarray(p0 - p))
        np.testing.assert_allclose(moved, lr * steps, rtol=0.2)  # ≈ 0.5 for 0.5 and for 20.0 alike
        # AdamW with a zero task gradient shrinks geometrically by (1 − lr·wd) per step.
        aw = optim.adamw(lr, weight_decay=wd)
        p, s = p0, aw.init(p0)
        for _ in range(steps):
            u, s = aw.update(jnp.zeros(4), s, p)
            p = optim.apply_updates(p, u)
        np.testing.assert_allclose(
            np.asarray(p), np.asarray(p0) * (1 - lr * wd) ** steps, rtol=1e-12
        )


def test_lion_first_step_moves_exactly_lr():
    lr = 0.01
    tx = optim.lion(lr, weight_decay=0.0)
    p = jnp.asarray([0.5, -0.5, 2.0, -3.0])
    g = jnp.asarray([1e-8, -4.0, 3.0, -1e3])
    u, state = tx.update(g, tx.init(p), p)
    np.testing.assert_array_equal(np.asarray(u), -np.float32(lr) * np.sign(np.asarray(g)))
    assert state[0]._fields == ("count", "mu")  # pyright: ignore[reportArgumentType, reportAttributeAccessIssue, reportCallIssue, reportIndexIssue]  # optax types updates and states as a union of trees


# ---------------------------------------------------------------------------
# Masks, freezing, dtypes, counts
# ---------------------------------------------------------------------------


def test_decay_weights_only_by_path_and_freeze_is_bit_identical():
    params = {
        "dense_0": {"w": jnp.ones((2, 2)), "b": jnp.ones(2)},
        "dense_1": {"w": jnp.asarray([[-0.0, 1.0]]), "b": jnp.ones(1)},
    }
    frozen = mask_by_path(params, r"^dense_1\.")
    tx = optim.chain(
        optim.adamw(0.1, weight_decay=0.5, mask=lambda p: mask_by_path(p, r"\.w$")),
        optim.freeze(frozen),
    )
    state = tx.init(params)
    grads = jax.tree.map(jnp.zeros_like, params)
    step = jax.jit(
        lambda p, s: (lambda u_s: (optim.apply_updates(p, u_s[0]), u_s[1]))(tx.update(grads, s, p))
    )
    p = params
    for _ in range(3):
        p, state = step(p, state)
    assert float(p["dense_0"]["w"][0, 0]) < 1.0  # decayed
    np.testing.assert_array_equal(np.asarray(p["dense_0"]["b"]), np.ones(2))  # bias: no decay
    for leaf, before in zip(jax.tree.leaves(p["dense_1"]), jax.tree.leaves(params["dense_1"])):
        assert (
            np.asarray(leaf).tobytes() == np.asarray(before).tobytes()
        )  # frozen: bit-identical, -0.0 kept


def test_apply_updates_keeps_dtype_and_global_norm():
    p = {"a": jnp.ones(3, jnp.bfloat16), "b": jnp.ones(2)}
    out = optim.apply_updates(p, {"a": jnp.full(3, 0.5), "b": jnp.full(2, 0.5)})
    assert out["a"].dtype == jnp.bfloat16 and out["b"].dtype == jnp.float32
    g = {"a": jnp.asarray([3.0]), "b": jnp.asarray([[4.0]])}
    with jax.numpy_dtype_promotion("standard"):
        peer = float(optax.tree.norm(g))
    assert float(optim.global_norm(g)) == pytest.approx(5.0) == peer


def test_count_saturates():
    top = jnp.asarray(np.iinfo(np.int32).max, jnp.int32)
    assert int(optim.safe_increment(top)) == np.iinfo(np.int32).max  # pyright: ignore[reportArgumentType]  # optax types its scalars as chex.Numeric (complex included)
    assert int(optim.safe_increment(jnp.asarray(3, jnp.int32))) == 4  # pyright: ignore[reportArgumentType]  # optax types its scalars as chex.Numeric (complex included)


def test_apply_updates_names_the_structure_difference():
    params = {"dense_0": {"w": jnp.ones(2), "b": jnp.ones(2)}}
    with pytest.raises(
        ValueError, match="`params` has `dense_0.b` where `updates` has `dense_0.bias`"
    ):
        optim.apply_updates(params, {"dense_0": {"w": jnp.ones(2), "bias": jnp.ones(2)}})
    with pytest.raises(ValueError, match="`params` has `dense_1.w`, missing from `updates`"):
        optim.apply_updates({**params, "dense_1": {"w": jnp.ones(1)}}, params)
    with pytest.raises(ValueError, match="structure of `params`"):
        optim.apply_updates(params, (params,))


# ---------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------

SCHEDULES = {
    "constant": lambda m: m.constant_schedule(0.3),
    "linear": lambda m: m.linear_schedule(1.0, 0.1, 40, transition_begin=10),
    "cosine": lambda m: m.cosine_decay_schedule(0.5, 50, alpha=0.1, exponent=2.0),
    "warmup_cosine": lambda m: m.warmup_cosine_decay_schedule(0.0, 1e-2, 10, 50, end_value=1e-4),
    "piecewise": lambda m: m.piecewise_constant_schedule(1.0, {10: 0.5, 30: 0.1, 45: 2.0}),
    "join": lambda m: m.join_schedules(
        [m.constant_schedule(1.0), m.linear_schedule(1.0, 0.0, 20)], [25]
    ),
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_schedules_match_optax_pointwise(name):
    ours, peer = SCHEDULES[name](optim), standard_promotion(SCHEDULES[name](optax))
    counts = jnp.arange(0, 101, dtype=jnp.int32)  # 0 … 2 × decay_steps, boundaries included
    np.testing.assert_allclose(jax.vmap(ours)(counts), jax.vmap(peer)(counts), rtol=1e-6, atol=1e-9)
    for c in (0, 10, 25, 50, 100):
        np.testing.assert_allclose(float(ours(c)), float(peer(c)), rtol=1e-6, atol=1e-9)


def test_warmup_cosine_boundaries():
    s = optim.warmup_cosine_decay_schedule(0.0, 1.0, 100, 1000, 0.01)
    assert (
        float(s(0)) == 0.0
        and float(s(100)) == pytest.approx(1.0)
        and float(s(1000)) == pytest.approx(0.01)
    )
    assert float(s(5000)) == pytest.approx(0.01)


# ---------------------------------------------------------------------------
# Compile once; scan; donation
# ---------------------------------------------------------------------------


def test_100_step_jitted_loop_with_schedule_compiles_once():
    tx = optim.adamw(
        optim.warmup_cosine_decay_schedule(0.0, 1e-2, 10, 100, 1e-4), weight_decay=1e-3
    )
    params = {k: jnp.asarray(v, jnp.float32) for k, v in P0.items()}
    state = tx.init(params)

    @functools.partial(jax.jit, donate_argnames=("params", "state"))
    def train_step(params, state):
        updates, state = tx.update(grad_jax(params), state, params)
        return optim.apply_updates(params, updates), state

    with CompileBudget(1, train_step, exact=True):
        for _ in range(100):
            params, state = train_step(params, state)
    counts = optax.tree_utils.tree_get_all_with_path(state, "count")
    assert len(counts) == 2 and all(int(c) == 100 for _, c in counts)


def test_state_through_scan_equals_python_loop():
    tx = optim.chain(
        optim.clip_by_global_norm(1.0), optim.adam(optim.cosine_decay_schedule(0.05, 20))
    )
    p0 = {k: jnp.asarray(v, jnp.float32) for k, v in P0.items()}

    def body(carry, _):
        p, s = carry
        u, s = tx.update(grad_jax(p), s, p)
        return (optim.apply_updates(p, u), s), None

    (p_scan, s_scan), _ = jax.jit(lambda c: jax.lax.scan(body, c, length=20))((p0, tx.init(p0)))
    carry = (p0, tx.init(p0))
    step = jax.jit(lambda c: body(c, None)[0])
    for _ in range(20):
        carry = step(carry)
    for a, b in zip(jax.tree.leaves((p_scan, s_scan)), jax.tree.leaves(carry)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------
# Rosenbrock
# ---------------------------------------------------------------------------


def rosenbrock(p):
    x, y = p[0], p[1]
    return (1 - x) ** 2 + 100 * (y - x**2) ** 2


def minimise(tx, steps=3000):
    p0 = jnp.asarray([-1.5, 2.0])

    def body(carry, _):
        p, s = carry
        loss, g = jax.value_and_grad(rosenbrock)(p)
        u, s = tx.update(g, s, p)
        return (optim.apply_updates(p, u), s), loss

    (p, _), losses = jax.jit(lambda: jax.lax.scan(body, (p0, tx.init(p0)), length=steps))()
    return float(rosenbrock(p)), np.asarray(losses)


def test_rosenbrock_convergence():
    nesterov, _ = minimise(optim.sgd(1e-3, momentum=0.9, nesterov=True))
    adam_wc, _ = minimise(
        optim.adam(optim.warmup_cosine_decay_schedule(0.0, 0.05, 100, 3000, 1e-4))
    )
    plain, _ = minimise(optim.sgd(1e-3))
    momentum, _ = minimise(optim.sgd(1e-3, momentum=0.9))
    assert nesterov < 1e-3 and adam_wc < 1e-3
    assert momentum < plain and nesterov < plain


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


# Every call in this table passes bad input on purpose (hence its `pyright: ignore`s).
@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: optim.adam(-1e-3), ValueError, "learning_rate"),
        (lambda: optim.sgd(None), ValueError, "learning_rate"),  # pyright: ignore[reportArgumentType]
        (lambda: optim.adamw(1e-3, weight_decay=-0.1), ValueError, "weight_decay"),
        (lambda: optim.adam(1e-3, b1=1.0), ValueError, "b1"),
        (lambda: optim.adam(1e-3, b2=-0.1), ValueError, "b2"),
        (lambda: optim.lion(1e-3, b1=1.5), ValueError, "b1"),
        (lambda: optim.sgd(0.1, momentum=1.0), ValueError, "momentum"),
        (lambda: optim.trace(1.0), ValueError, "decay"),
        (lambda: optim.adam(True), TypeError, "learning_rate"),
        (lambda: optim.adam(np.float32(np.inf)), ValueError, "learning_rate"),
        (lambda: optim.adam(1e-3, eps=float("nan")), ValueError, "eps"),
        (lambda: optim.adam(1e-3, mu_dtype="not a dtype"), TypeError, "mu_dtype"),
        (lambda: optim.adam(1e-3, nesterov=1), TypeError, "nesterov"),  # pyright: ignore[reportArgumentType]
        (lambda: optim.adamw(1e-3, weight_decay=float("inf")), ValueError, "weight_decay"),
        (lambda: optim.lion(1e-3, b2=np.float64(1.0)), ValueError, "b2"),
        (lambda: optim.scale(float("nan")), ValueError, "step_size"),
        (lambda: optim.scale_by_learning_rate("0.1"), TypeError, "learning_rate"),  # pyright: ignore[reportArgumentType]
        (lambda: optim.scale_by_lion(mode="soft"), ValueError, "mode"),  # pyright: ignore[reportArgumentType]
        (
            lambda: optim.piecewise_constant_schedule(1.0, {10: -0.5}),
            ValueError,
            "boundaries_and_scales",
        ),
        (
            lambda: optim.join_schedules([optim.constant_schedule(1.0), 0.5], [3]),  # pyright: ignore[reportArgumentType]
            TypeError,
            "schedules",
        ),
        (
            lambda: optim.join_schedules([optim.constant_schedule(1.0)] * 3, [5, 2]),
            ValueError,
            "non-decreasing",
        ),
        (lambda: optim.constant_schedule(float("nan")), ValueError, "value"),
        (lambda: optim.clip_by_global_norm(0.0), ValueError, "max_norm"),
        (lambda: optim.clip_by_global_norm(-1.0), ValueError, "max_norm"),
        (lambda: optim.adam(float("nan")), ValueError, "learning_rate"),
        (
            lambda: optim.warmup_cosine_decay_schedule(0.0, 1.0, 200, 100),
            ValueError,
            "warmup_steps",
        ),
        (lambda: optim.cosine_decay_schedule(1.0, 0), ValueError, "decay_steps"),
        (lambda: optim.linear_schedule(1.0, 0.0, 1.5), TypeError, "transition_steps"),  # pyright: ignore[reportArgumentType]
        (lambda: optim.join_schedules([optim.constant_schedule(1.0)], [3]), ValueError, "len"),
        (lambda: optim.scale_by_schedule(0.1), TypeError, "schedule"),  # pyright: ignore[reportArgumentType]
        (lambda: optim.chain(optim.scale(1.0), 3), TypeError, "chain argument 1"),  # pyright: ignore[reportArgumentType]
        (lambda: optim.freeze(None), ValueError, "mask"),  # pyright: ignore[reportArgumentType]
    ],
)
def test_bad_hyperparameters(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_mask_mismatch_names_first_path():
    params = {"dense_0": {"w": jnp.ones(2), "b": jnp.ones(2)}, "dense_1": {"w": jnp.ones(2)}}
    bad = {"dense_0": {"w": True, "bias": False}, "dense_1": {"w": True}}
    with pytest.raises(
        ValueError, match="`mask` has `dense_0.bias` where `params` has `dense_0.b`"
    ):
        optim.adamw(1e-3, mask=bad).init(params)
    with pytest.raises(ValueError, match="`params` has `dense_1.w`, which `mask` does not cover"):
        optim.freeze({"dense_0": True}).init(params)
    with pytest.raises(TypeError, match="leaves must be bools, got str at `dense_1.w`"):
        bad_leaf = {"dense_0": True, "dense_1": "yes"}  # a str leaf on purpose
        optim.freeze(bad_leaf).init(params)  # pyright: ignore[reportArgumentType]
    optim.adamw(1e-3, mask={"dense_0": True, "dense_1": False}).init(params)  # a prefix is fine
    tx = optim.adamw(1e-3)
    with pytest.raises(ValueError, match="adamw needs `params`"):
        tx.update(params, tx.init(params))


# ---------------------------------------------------------------------------
# The wrappers ARE Optax: types, state structures, swapped states, 20 steps
# ---------------------------------------------------------------------------

PARAMS = {
    "dense_0": {"w": np.ones((3, 2), np.float32), "b": np.zeros(2, np.float32)},
    "dense_1": {"w": np.full((2, 1), 0.5, np.float32), "b": np.zeros(1, np.float32)},
}
W_ONLY = {"dense_0": {"w": True, "b": False}, "dense_1": {"w": True, "b": False}}
SCHED: dict[str, Any] = dict(
    init_value=0.0, peak_value=1e-2, warmup_steps=3, decay_steps=20, end_value=1e-4
)

# name -> (jaxwise factory, Optax factory): each pair is the same optimizer, jaxwise's masks
# given as path regexes, Optax's as bool trees.
SHARED = {
    "identity": (lambda: optim.identity(), lambda: optax.identity()),
    "scale": (lambda: optim.scale(0.5), lambda: optax.scale(0.5)),
    "scale_by_schedule": (
        lambda: optim.scale_by_schedule(optim.linear_schedule(1.0, 0.1, 10)),
        lambda: optax.scale_by_schedule(optax.linear_schedule(1.0, 0.1, 10)),
    ),
    "scale_by_learning_rate": (
        lambda: optim.scale_by_learning_rate(0.1),
        lambda: optax.scale_by_learning_rate(0.1),
    ),
    "scale_by_learning_rate (schedule)": (
        lambda: optim.scale_by_learning_rate(optim.warmup_cosine_decay_schedule(**SCHED)),
        lambda: optax.scale_by_learning_rate(optax.warmup_cosine_decay_schedule(**SCHED)),
    ),
    "trace": (lambda: optim.trace(0.9, nesterov=True), lambda: optax.trace(0.9, nesterov=True)),
    "scale_by_adam": (lambda: optim.scale_by_adam(b2=0.99), lambda: optax.scale_by_adam(b2=0.99)),
    "scale_by_lion": (lambda: optim.scale_by_lion(), lambda: optax.scale_by_lion()),
    "add_decayed_weights": (
        lambda: optim.add_decayed_weights(1e-2),
        lambda: optax.add_decayed_weights(1e-2),
    ),
    "add_decayed_weights (regex mask)": (
        lambda: optim.add_decayed_weights(1e-2, mask=r"\.w$"),
        lambda: optax.add_decayed_weights(1e-2, mask=W_ONLY),
    ),
    "clip_by_global_norm": (
        lambda: optim.clip_by_global_norm(0.1),
        lambda: optax.clip_by_global_norm(0.1),
    ),
    "freeze": (
        lambda: optim.freeze(r"^dense_1\."),
        lambda: optax.freeze({"dense_0": False, "dense_1": True}),
    ),
    "chain": (
        lambda: optim.chain(optim.clip_by_global_norm(1.0), optim.adam(1e-2)),
        lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2)),
    ),
    "sgd": (lambda: optim.sgd(0.05), lambda: optax.sgd(0.05)),
    "sgd (nesterov)": (lambda: optim.sgd(0.05, 0.9, True), lambda: optax.sgd(0.05, 0.9, True)),
    "adam": (lambda: optim.adam(1e-2), lambda: optax.adam(1e-2)),
    "adam (schedule)": (
        lambda: optim.adam(optim.warmup_cosine_decay_schedule(**SCHED)),
        lambda: optax.adam(optax.warmup_cosine_decay_schedule(**SCHED)),
    ),
    "adamw": (
        lambda: optim.adamw(1e-2, weight_decay=0.1),
        lambda: optax.adamw(1e-2, weight_decay=0.1),
    ),
    "adamw (regex mask)": (
        lambda: optim.adamw(1e-2, weight_decay=0.1, mask=r"\.w$"),
        lambda: optax.adamw(1e-2, weight_decay=0.1, mask=W_ONLY),
    ),
    "adamw (scheduled decay)": (
        lambda: optim.adamw(1e-2, weight_decay=optim.linear_schedule(0.1, 0.0, 10)),
        lambda: optax.adamw(1e-2, weight_decay=optax.linear_schedule(0.1, 0.0, 10)),
    ),
    "lion": (
        lambda: optim.lion(1e-3, weight_decay=0.1),
        lambda: optax.lion(1e-3, weight_decay=0.1),
    ),
    "lion (mask fn)": (
        lambda: optim.lion(1e-3, mask=lambda p: W_ONLY),
        lambda: optax.lion(1e-3, mask=W_ONLY),
    ),
}


def quadratic_grads(p):
    return jax.tree.map(lambda x: x - jnp.asarray(0.25, x.dtype), p)


def train(tx, params, state, steps):
    @jax.jit
    def step(p, s):
        u, s = tx.update(quadratic_grads(p), s, p)
        return optax.apply_updates(p, u), s

    with jax.numpy_dtype_promotion("standard"):  # Optax itself needs standard promotion
        for _ in range(steps):
            params, state = step(params, state)
    return params, state


def test_every_factory_returns_an_optax_transformation():
    for name, (ours, _) in SHARED.items():
        tx = ours()
        assert isinstance(tx, optax.GradientTransformation), name
        assert isinstance(tx, optax.GradientTransformationExtraArgs), name
    assert optim.GradientTransformation is optax.GradientTransformation
    assert optim.EmptyState is optax.EmptyState


@pytest.mark.parametrize("name", SHARED)
def test_state_is_optax_own_type_and_structure(name):
    ours, peer = SHARED[name]
    params = jax.tree.map(jnp.asarray, PARAMS)
    with jax.numpy_dtype_promotion("standard"):
        peer_state = peer().init(params)
    our_state = ours().init(params)
    assert jax.tree.structure(our_state) == jax.tree.structure(peer_state)
    assert [type(s) for s in jax.tree.leaves(our_state, is_leaf=lambda x: x is not our_state)] == [
        type(s) for s in jax.tree.leaves(peer_state, is_leaf=lambda x: x is not peer_state)
    ]
    for a, b in zip(jax.tree.leaves(our_state), jax.tree.leaves(peer_state)):
        assert a.shape == b.shape and a.dtype == b.dtype


@pytest.mark.parametrize("name", SHARED)
def test_20_steps_equal_optax(name):
    ours, peer = SHARED[name]
    params = jax.tree.map(jnp.asarray, PARAMS)
    p_ours, s_ours = train(ours(), params, ours().init(params), 20)
    with jax.numpy_dtype_promotion("standard"):
        p_peer, s_peer = train(peer(), params, peer().init(params), 20)
    for a, b in zip(jax.tree.leaves((p_ours, s_ours)), jax.tree.leaves((p_peer, s_peer))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6, err_msg=name)


def test_adamw_count_is_optax_and_decay_carries_no_counter():
    params = jax.tree.map(jnp.asarray, PARAMS)
    state = optim.adamw(1e-3, mask=r"\.w$").init(params)
    assert int(optax.tree_utils.tree_get(state, "count")) == 0  # one count only: no KeyError
    assert len(optax.tree_utils.tree_get_all_with_path(state, "count")) == 1


@pytest.mark.parametrize(
    "name", ["adamw (regex mask)", "lion", "sgd (nesterov)", "adam (schedule)"]
)
def test_states_swap_both_ways_mid_training(name):
    ours, peer = SHARED[name]
    params = jax.tree.map(jnp.asarray, PARAMS)
    with jax.numpy_dtype_promotion("standard"):
        p_ref, s_ref = train(peer(), params, peer().init(params), 20)
        p, s = train(ours(), params, ours().init(params), 10)
        p_a, s_a = train(peer(), p, s, 10)  # jaxwise state continued by Optax
        p, s = train(peer(), params, peer().init(params), 10)
        p_b, s_b = train(ours(), p, s, 10)  # Optax state continued by jaxwise
    for got in ((p_a, s_a), (p_b, s_b)):
        assert jax.tree.structure(got) == jax.tree.structure((p_ref, s_ref))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves((p_ref, s_ref))):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)


def test_works_under_strict_promotion_and_wraps_optax_pieces_too():
    # conftest sets jax_numpy_dtype_promotion="strict": Optax alone raises TypePromotionError;
    # jaxwise runs Optax's code under standard promotion, also Optax pieces inside optim.chain.
    params = jax.tree.map(jnp.asarray, PARAMS)
    with pytest.raises(jax.dtypes.TypePromotionError):
        tx = optax.adam(1e-3)
        tx.update(quadratic_grads(params), tx.init(params), params)
    for tx in (
        optim.chain(optax.adam(1e-3), optim.add_decayed_weights(1e-3, mask=r"\.w$")),
        optax.chain(optim.clip_by_global_norm(1.0), optim.lion(1e-4)),
        optim.chain(
            optim.scale_by_adam(),
            optim.scale_by_learning_rate(optim.cosine_decay_schedule(1e-2, 9)),
        ),
    ):
        state = tx.init(params)
        for _ in range(3):
            updates, state = tx.update(quadratic_grads(params), state, params)
            params = optim.apply_updates(params, updates)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


def test_inject_hyperparams_passes_traced_hyperparameters():
    params = jax.tree.map(jnp.asarray, PARAMS)
    tx = optax.inject_hyperparams(optim.adamw)(learning_rate=1e-2, weight_decay=0.1)
    peer = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2, weight_decay=0.1)
    p_ours, s_ours = train(tx, params, tx.init(params), 5)
    with jax.numpy_dtype_promotion("standard"):
        p_peer, _ = train(peer, params, peer.init(params), 5)
    assert float(s_ours.hyperparams["learning_rate"]) == pytest.approx(1e-2)  # pyright: ignore[reportAttributeAccessIssue]  # optax types updates and states as a union of trees
    for a, b in zip(jax.tree.leaves(p_ours), jax.tree.leaves(p_peer)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-7)


def test_numpy_scalars_are_accepted():
    params = jax.tree.map(jnp.asarray, PARAMS)
    tx = optim.adamw(
        np.float32(1e-2), b1=np.float64(0.9), weight_decay=np.float32(0.1), mu_dtype=np.float32
    )
    sched = optim.linear_schedule(np.float32(1.0), 0.0, np.int64(10), transition_begin=np.int32(2))
    ref = optax.adamw(1e-2, b1=0.9, weight_decay=0.1)
    p_ours, _ = train(tx, params, tx.init(params), 3)
    with jax.numpy_dtype_promotion("standard"):
        p_peer, _ = train(ref, params, ref.init(params), 3)
        assert float(sched(6)) == pytest.approx(float(optax.linear_schedule(1.0, 0.0, 10, 2)(6)))  # pyright: ignore[reportArgumentType]  # optax types its scalars as chex.Numeric (complex included)
    for a, b in zip(jax.tree.leaves(p_ours), jax.tree.leaves(p_peer)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_regex_masks_work_on_flax_and_equinox_style_paths():
    params = {"Dense_0": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}}
    tx = optim.add_decayed_weights(0.5, mask="kernel")
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    np.testing.assert_array_equal(np.asarray(updates["Dense_0"]["kernel"]), np.full((2, 2), 0.5))  # pyright: ignore[reportArgumentType, reportCallIssue, reportIndexIssue]  # optax types updates and states as a union of trees
    np.testing.assert_array_equal(np.asarray(updates["Dense_0"]["bias"]), np.zeros(2))  # pyright: ignore[reportArgumentType, reportCallIssue, reportIndexIssue]  # optax types updates and states as a union of trees


@pytest.mark.slow
def test_user_script_mixing_jaxwise_and_optax_type_checks_with_pyright():
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).parent.parent
    script = root / "tests" / "typing_cases" / "optax_interop.py"
    pyright = pathlib.Path(sys.executable).parent / "pyright"
    result = subprocess.run(
        # -p: the project's own configuration (its venv), whatever lies above the checkout
        [str(pyright), "-p", str(root), str(script)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and "0 errors" in result.stdout, result.stdout + result.stderr
    run = subprocess.run(
        [sys.executable, str(script)], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert "loss decreased" in run.stdout
