"""Tests for jaxwise.sequence against float64 Python-loop references."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from host64 import host_float64
from tolerance import rtol

from jaxwise.compilation import CompileBudget
from jaxwise.sequence import (
    bounded_while,
    discounted_returns,
    gae,
    gru_cell,
    init_gru,
    init_lstm,
    lambda_returns,
    lengths_to_mask,
    linear_recurrence,
    lstm_cell,
    masked_mean,
    masked_sum,
    odeint_rk4,
    piecewise,
    piecewise_select,
    rk4_step,
    run_bidirectional,
    run_rnn,
    segment_mean,
    segment_softmax,
)

# ---------------------------------------------------------------------------
# Masks and reductions
# ---------------------------------------------------------------------------


def test_lengths_to_mask_and_errors():
    mask = lengths_to_mask(jnp.asarray([[0, 2], [4, 1]]), 4)
    assert mask.shape == (2, 2, 4) and mask.sum(-1).tolist() == [[0, 2], [4, 1]]
    with pytest.raises(ValueError, match=">= 0"):
        lengths_to_mask(jnp.asarray([-1]), 3)
    with pytest.raises(ValueError, match="max_len=3"):
        lengths_to_mask(jnp.asarray([4]), 3)
    with pytest.raises(TypeError, match="`lengths` must have a integer dtype"):
        lengths_to_mask(jnp.asarray([1.0]), 3)
    assert jax.jit(lengths_to_mask, static_argnums=1)(jnp.asarray([2]), 3).tolist() == [
        [True, True, False]
    ]


def test_masked_mean_empty_rows_and_gradients():
    x = jnp.asarray([[1.0, 2.0, jnp.nan], [3.0, 4.0, 5.0]])
    mask = jnp.asarray([[True, True, False], [False, False, False]])
    assert masked_mean(x, mask, axis=1).tolist() == [1.5, 0.0]
    assert float(masked_sum(x, mask)) == 3.0
    g = jax.grad(lambda v: masked_mean(v, mask, axis=1).sum())(x)
    assert np.isfinite(np.asarray(g)).all() and np.asarray(g[1]).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="does not broadcast"):
        masked_mean(x, jnp.ones(4, bool))
    with pytest.raises(TypeError, match="boolean"):
        masked_sum(x, jnp.ones((2, 3)))


# ---------------------------------------------------------------------------
# Segments
# ---------------------------------------------------------------------------


def test_segment_softmax_large_scores_matches_numpy(rng):
    scores = rng.normal(200, 50, size=40).astype(np.float32)
    ids = np.sort(rng.integers(0, 6, 40))
    ids[ids == 3] = 2  # segment 3 is empty
    out = np.asarray(segment_softmax(jnp.asarray(scores), jnp.asarray(ids), 7))
    assert np.isfinite(out).all()
    for s in np.unique(ids):
        sel = ids == s
        e = np.exp(scores[sel].astype(np.float64) - scores[sel].max())
        np.testing.assert_allclose(out[sel], e / e.sum(), rtol=1e-5, atol=1e-30)
        assert out[sel].sum() == pytest.approx(1.0, rel=1e-5)
    g = jax.grad(lambda s: jnp.sum(segment_softmax(s, jnp.asarray(ids), 7) * jnp.arange(40.0)))(
        jnp.asarray(scores)
    )
    assert np.isfinite(np.asarray(g)).all()


def test_segment_mean_and_id_validation():
    out = segment_mean(
        jnp.asarray([[1.0, 2.0], [3.0, 4.0], [10.0, 0.0]]), jnp.asarray([1, 1, 3]), 4
    )
    assert out.tolist() == [[0.0, 0.0], [2.0, 3.0], [0.0, 0.0], [10.0, 0.0]]
    with pytest.raises(ValueError, match=r"in \[0, 2\), got values in \[0, 5\]"):
        segment_softmax(jnp.ones(3), jnp.asarray([0, 1, 5]), 2)
    with pytest.raises(TypeError, match="`num_segments` must be an int"):
        segment_softmax(jnp.ones(3), jnp.asarray([0, 1, 1]), None)  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(TypeError, match="static"):
        jax.jit(lambda n: segment_mean(jnp.ones(3), jnp.asarray([0, 1, 1]), n))(2)
    with pytest.raises(ValueError, match="shape"):
        segment_mean(jnp.ones(3), jnp.asarray([0, 1]), 2)


# ---------------------------------------------------------------------------
# Returns
# ---------------------------------------------------------------------------


def returns64(r, d, gamma, truncated: Any = None, next_values: Any = None) -> np.ndarray:
    nv = np.zeros(len(r)) if next_values is None else np.asarray(next_values, np.float64)
    out, future = np.zeros(len(r)), (0.0 if next_values is None else nv[-1])
    for t in reversed(range(len(r))):
        following = nv[t] if truncated is not None and truncated[t] else future
        future = r[t] + gamma * (1 - d[t]) * following
        out[t] = future
    return out


def test_discounted_returns_cut_at_done_and_scan_in_jaxpr():
    r, d = jnp.asarray([1.0, 2.0, 3.0, 4.0]), jnp.asarray([0.0, 1.0, 0.0, 1.0])
    assert discounted_returns(r, d, 0.5).tolist() == [2.0, 2.0, 5.0, 4.0]
    assert "scan" in str(jax.make_jaxpr(discounted_returns)(r, d, 0.5))


def test_discounted_returns_random_vmap_jit_and_traced_gamma(rng):
    r = rng.normal(size=(5, 30))
    d = (rng.random((5, 30)) < 0.1).astype(np.float64)
    with host_float64():
        fn = jax.jit(jax.vmap(discounted_returns, in_axes=(0, 0, None)))
        out = fn(jnp.asarray(r), jnp.asarray(d), 0.9)
        out2 = fn(jnp.asarray(r), jnp.asarray(d), 0.8)  # traced gamma: no recompile
    for i in range(5):
        np.testing.assert_allclose(np.asarray(out[i]), returns64(r[i], d[i], 0.9), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(out2[i]), returns64(r[i], d[i], 0.8), rtol=1e-12)


def test_truncation_bootstraps_instead_of_terminating(rng):
    r = rng.normal(size=20)
    d = np.zeros(20)
    d[7] = 1
    cut = np.zeros(20)
    cut[12] = 1
    values = rng.normal(size=20)
    with host_float64():
        ours = discounted_returns(
            jnp.asarray(r),
            jnp.asarray(d),
            0.95,
            truncated=jnp.asarray(cut),
            next_values=jnp.asarray(values),
        )
    np.testing.assert_allclose(np.asarray(ours), returns64(r, d, 0.95, cut, values), rtol=1e-12)
    wrong = returns64(r, np.maximum(d, cut), 0.95)  # treating the time limit as terminal
    assert not np.isclose(ours[12], wrong[12])
    with pytest.raises(ValueError, match="next_values"):
        discounted_returns(jnp.ones(3), jnp.zeros(3), 0.9, truncated=jnp.zeros(3))


def test_lambda_returns_match_loop_and_rlax_definition(rng):
    r, d, v = rng.normal(size=12), (rng.random(12) < 0.2).astype(float), rng.normal(size=12)
    for lam in (0.0, 0.7, 1.0):
        expected, future = np.zeros(12), v[-1]
        for t in reversed(range(12)):
            future = r[t] + 0.9 * (1 - d[t]) * ((1 - lam) * v[t] + lam * future)
            expected[t] = future
        with host_float64():
            ours = lambda_returns(jnp.asarray(r), jnp.asarray(d), jnp.asarray(v), 0.9, lam)
        np.testing.assert_allclose(np.asarray(ours), expected, rtol=1e-12)


def test_returns_bad_input():
    with pytest.raises(ValueError, match="`dones` must have length 4"):
        discounted_returns(jnp.ones(4), jnp.zeros(3), 0.9)
    with pytest.raises(ValueError, match="1-D"):
        discounted_returns(jnp.ones((2, 4)), jnp.zeros((2, 4)), 0.9)


# ---------------------------------------------------------------------------
# bounded_while and linear_recurrence
# ---------------------------------------------------------------------------


def newton_sqrt_parts(a):
    return (lambda x: jnp.abs(x * x - a) >= 1e-6 * a), (lambda x: 0.5 * (x + a / x))


def test_bounded_while_matches_while_loop_counts_and_gradient():
    for a in (0.5, 2.0, 16.0, 1e4):
        cond, body = newton_sqrt_parts(a)
        ref = jax.lax.while_loop(cond, body, jnp.asarray(a))
        ref_steps = jax.lax.while_loop(
            lambda c, cond=cond: cond(c[0]),
            lambda c, body=body: (body(c[0]), c[1] + 1),
            (jnp.asarray(a), 0),
        )[1]
        x, steps = bounded_while(cond, body, jnp.asarray(a), 100)
        assert float(x) == float(ref) and int(steps) == int(ref_steps)
        assert jnp.issubdtype(steps.dtype, jnp.integer)
        _, more = bounded_while(cond, body, jnp.asarray(a), 200)
        assert int(more) == int(steps)  # stops counting after convergence

    def sqrt(a):
        cond, body = newton_sqrt_parts(a)
        return bounded_while(cond, body, a, 60)[0]

    for a in (2.0, 16.0, 900.0):
        g = float(jax.grad(sqrt)(a))
        assert np.isfinite(g) and g == pytest.approx(1 / (2 * np.sqrt(a)), rel=1e-4)
    batch = jnp.asarray([0.5, 2.0, 16.0, 1e4])
    xs, counts = jax.vmap(lambda a: bounded_while(*newton_sqrt_parts(a), a, 100))(batch)
    np.testing.assert_allclose(np.asarray(xs), np.sqrt(np.asarray(batch)), rtol=1e-6)
    assert len(set(np.asarray(counts).tolist())) > 1
    with pytest.raises(ValueError, match="max_steps"):
        bounded_while(lambda c: True, lambda c: c, 0.0, 0)
    with pytest.raises(TypeError, match="cond_fun"):
        bounded_while(1, lambda c: c, 0.0, 3)  # pyright: ignore[reportArgumentType]  # bad input on purpose


def test_while_loop_is_not_reverse_differentiable_but_ours_is():
    def with_while(a):
        return jax.lax.while_loop(*newton_sqrt_parts(a), a)

    with pytest.raises(ValueError, match="Reverse-mode differentiation does not work"):
        jax.grad(with_while)(4.0)


def test_linear_recurrence_equals_sequential_scan(rng):
    a, b = rng.uniform(0.5, 1.0, size=(100, 3)), rng.normal(size=(100, 3))
    h0 = rng.normal(size=3)
    expected, h = np.zeros((100, 3)), h0.copy()
    for t in range(100):
        h = a[t] * h + b[t]
        expected[t] = h
    with host_float64():
        ours = linear_recurrence(jnp.asarray(a), jnp.asarray(b), jnp.asarray(h0))
    np.testing.assert_allclose(np.asarray(ours), expected, rtol=1e-10)
    with pytest.raises(ValueError, match="same shape"):
        linear_recurrence(jnp.ones(3), jnp.ones(4))


# ---------------------------------------------------------------------------
# GRU / LSTM
# ---------------------------------------------------------------------------


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def gru64(p, xs, h):
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    hidden = len(h)
    out = []
    for x in xs:
        gx = x @ p["w"] + p["b"]
        zr = sigmoid(gx[: 2 * hidden] + h @ p["u_zr"])
        z, r = zr[:hidden], zr[hidden:]
        cand = np.tanh(gx[2 * hidden :] + (r * h) @ p["u_h"])
        h = (1 - z) * h + z * cand
        out.append(h)
    return h, np.asarray(out)


def lstm64(p, xs, h, c):
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    n = len(h)
    out = []
    for x in xs:
        g = x @ p["w"] + h @ p["u"] + p["b"]
        i, f, gg, o = (
            sigmoid(g[:n]),
            sigmoid(g[n : 2 * n]),
            np.tanh(g[2 * n : 3 * n]),
            sigmoid(g[3 * n :]),
        )
        c = f * c + i * gg
        h = o * np.tanh(c)
        out.append(h)
    return (h, c), np.asarray(out)


def test_gru_and_lstm_match_float64_loops(rng):
    xs = rng.normal(size=(9, 4))
    with host_float64():
        gp = jax.tree.map(lambda v: v.astype(jnp.float64), init_gru(jax.random.key(0), 4, 5))
        h, out = run_rnn(gru_cell, gp, jnp.asarray(xs), jnp.zeros(5))
        h64, out64 = gru64(gp, xs, np.zeros(5))
        np.testing.assert_allclose(np.asarray(out), out64, rtol=1e-12)
        lp = jax.tree.map(lambda v: v.astype(jnp.float64), init_lstm(jax.random.key(1), 4, 5))
        (h, c), out = run_rnn(lstm_cell, lp, jnp.asarray(xs), (jnp.zeros(5), jnp.zeros(5)))
        (h64, c64), out64 = lstm64(lp, xs, np.zeros(5), np.zeros(5))
        np.testing.assert_allclose(np.asarray(out), out64, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(c), c64, rtol=1e-12)


def test_lstm_parameter_gradient_spot_checks_by_central_differences(rng):
    xs = rng.normal(size=(6, 3))
    with host_float64():
        p = jax.tree.map(lambda v: v.astype(jnp.float64), init_lstm(jax.random.key(2), 3, 4))

        def loss(p):
            _, out = run_rnn(lstm_cell, p, jnp.asarray(xs), (jnp.zeros(4), jnp.zeros(4)))
            return jnp.sum(out**2)

        grads = jax.grad(loss)(p)
        for name, index in (("w", (1, 5)), ("u", (2, 9)), ("b", (3,))):
            eps = 1e-6
            plus = jax.tree.map(lambda v: v, p)
            plus[name] = p[name].at[index].add(eps)
            minus = dict(p)
            minus[name] = p[name].at[index].add(-eps)
            numeric = (float(loss(plus)) - float(loss(minus))) / (2 * eps)
            assert float(grads[name][index]) == pytest.approx(numeric, rel=1e-6, abs=1e-9)


def test_masked_rnn_equals_running_only_real_steps(rng):
    p = init_gru(jax.random.key(0), 3, 4)
    xs = jnp.asarray(rng.normal(size=(3, 7, 3)), jnp.float32)
    lengths = jnp.asarray([7, 4, 1])
    mask = lengths_to_mask(lengths, 7)
    h, out = jax.vmap(lambda x, m: run_rnn(gru_cell, p, x, jnp.zeros(4), mask=m))(xs, mask)
    for i, n in enumerate([7, 4, 1]):
        h_real, out_real = run_rnn(gru_cell, p, xs[i, :n], jnp.zeros(4))
        np.testing.assert_allclose(np.asarray(h[i]), np.asarray(h_real), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            np.asarray(out[i, :n]), np.asarray(out_real), rtol=1e-5, atol=1e-6
        )
        assert not np.asarray(out[i, n:]).any()

    def loss(xs, checkpoint):
        _, out = jax.vmap(
            lambda x, m: run_rnn(gru_cell, p, x, jnp.zeros(4), mask=m, checkpoint=checkpoint)
        )(xs, mask)
        return jnp.sum(out**2)

    g = jax.grad(loss)(xs, False)
    assert not np.asarray(g[1, 4:]).any() and not np.asarray(g[2, 1:]).any()  # padding: exactly 0
    np.testing.assert_allclose(
        np.asarray(jax.grad(loss)(xs, True)), np.asarray(g), rtol=1e-6, atol=1e-7
    )


def _masked_lstm_loss64(p, xs, lengths):
    """NumPy float64: the LSTM run on each sequence's real steps only."""
    total = 0.0
    for x, n in zip(xs, lengths, strict=True):
        (h, c), out = lstm64(p, x[:n], np.zeros(4), np.zeros(4))
        total += np.sum(out**2) + np.sum(h * c)
    return total


@pytest.mark.parametrize("checkpoint", [True, False])
def test_masked_lstm_matches_float64_on_real_steps_values_and_gradients(rng, checkpoint):
    xs = rng.normal(size=(3, 6, 3))
    lengths = [6, 2, 0]
    with host_float64():
        p = jax.tree.map(lambda v: v.astype(jnp.float64), init_lstm(jax.random.key(3), 3, 4))
        mask = lengths_to_mask(jnp.asarray(lengths), 6)
        zero = jnp.zeros(4)

        def run(p, xs):
            return jax.vmap(
                lambda x, m: run_rnn(lstm_cell, p, x, (zero, zero), m, checkpoint=checkpoint)
            )(xs, mask)

        def loss(p, xs):
            (h, c), out = run(p, xs)
            return jnp.sum(out**2) + jnp.sum(h * c)

        (h, c), out = run(p, jnp.asarray(xs))
        for i, n in enumerate(lengths):
            (h64, c64), out64 = lstm64(p, xs[i, :n], np.zeros(4), np.zeros(4))
            np.testing.assert_allclose(np.asarray(h[i]), h64, rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(np.asarray(c[i]), c64, rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(np.asarray(out[i, :n]).reshape(n, 4), out64.reshape(n, 4))
            assert not np.asarray(out[i, n:]).any()
        assert float(loss(p, jnp.asarray(xs))) == pytest.approx(
            _masked_lstm_loss64(p, xs, lengths), rel=1e-12
        )
        gp, gx = jax.grad(loss, argnums=(0, 1))(p, jnp.asarray(xs))
        assert not np.asarray(gx[1, 2:]).any() and not np.asarray(gx[2]).any()  # padding: 0
        p64 = {k: np.asarray(v) for k, v in p.items()}
        for name, index in (("w", (2, 13)), ("u", (3, 1)), ("b", (6,))):
            eps = 1e-6
            plus, minus = dict(p64), dict(p64)
            plus[name] = p64[name].copy()
            plus[name][index] += eps
            minus[name] = p64[name].copy()
            minus[name][index] -= eps
            numeric = (
                _masked_lstm_loss64(plus, xs, lengths) - _masked_lstm_loss64(minus, xs, lengths)
            ) / (2 * eps)
            assert float(gp[name][index]) == pytest.approx(numeric, rel=1e-6, abs=1e-9)


def test_lstm_checkpointed_gradient_equals_stored_and_compiles_once(rng):
    p = init_lstm(jax.random.key(0), 3, 8)
    zero = jnp.zeros(8)

    def loss(p, xs, m, checkpoint):
        _, out = run_rnn(lstm_cell, p, xs, (zero, zero), mask=m, checkpoint=checkpoint)
        return jnp.sum(out**2)

    grad = jax.jit(jax.grad(loss), static_argnums=3)
    batches = [
        (jnp.asarray(rng.normal(size=(10, 3)), jnp.float32), jnp.arange(10) < k) for k in (3, 10)
    ]
    with CompileBudget(1, "loss") as budget:
        grads = [grad(p, xs, m, True) for xs, m in batches]
    assert budget.count == 1
    for (xs, m), g in zip(batches, grads, strict=True):
        stored = grad(p, xs, m, False)
        for name in p:
            np.testing.assert_allclose(
                np.asarray(g[name]), np.asarray(stored[name]), rtol=1e-6, atol=1e-7
            )


def test_reverse_and_bidirectional(rng):
    p = init_gru(jax.random.key(0), 2, 3)
    xs = jnp.asarray(rng.normal(size=(5, 2)), jnp.float32)
    mask = jnp.arange(5) < 3
    (hf, hb), out = run_bidirectional(gru_cell, p, p, xs, jnp.zeros(3), mask=mask)
    hb_ref, outb_ref = run_rnn(gru_cell, p, xs[:3][::-1], jnp.zeros(3))
    np.testing.assert_allclose(np.asarray(hb), np.asarray(hb_ref), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out[:3, 3:]), np.asarray(outb_ref[::-1]), rtol=1e-6)
    assert out.shape == (5, 6)


def test_rnn_runner_compiles_once(rng):
    p = init_lstm(jax.random.key(0), 3, 8)
    runner = jax.jit(
        lambda p, xs, m: run_rnn(lstm_cell, p, xs, (jnp.zeros(8), jnp.zeros(8)), mask=m)
    )
    batches = [
        (jnp.asarray(rng.normal(size=(10, 3)), jnp.float32), jnp.arange(10) < k) for k in (3, 7, 10)
    ]
    with CompileBudget(1, "<lambda>") as budget:
        for xs, m in batches:
            runner(p, xs, m)
    assert budget.count == 1


def test_rnn_bad_input():
    p = init_gru(0, 2, 3)
    with pytest.raises(ValueError, match="mask"):
        run_rnn(gru_cell, p, jnp.ones((4, 2)), jnp.zeros(3), mask=jnp.ones(3, bool))
    with pytest.raises(ValueError, match=r"\(T, D\)"):
        run_rnn(gru_cell, p, jnp.ones(4), jnp.zeros(3))
    with pytest.raises(TypeError, match="cell"):
        run_rnn("gru", p, jnp.ones((4, 2)), jnp.zeros(3))  # pyright: ignore[reportArgumentType]  # bad input on purpose


# ---------------------------------------------------------------------------
# ODEs
# ---------------------------------------------------------------------------


def oscillator(t, y, omega):
    return jnp.stack([y[1], -(omega**2) * y[0]])


def test_rk4_harmonic_oscillator_value_and_sensitivity():
    omega, T, n = 2.0, 3.0, 600
    with host_float64():

        def x_final(x0, v0):
            y, _ = odeint_rk4(oscillator, jnp.stack([x0, v0]), 0.0, T / n, n, omega)
            return y[0]

        value = float(x_final(1.0, 0.5))
        expected = np.cos(omega * T) + 0.5 * np.sin(omega * T) / omega
        assert value == pytest.approx(expected, abs=1e-4)
        dv0 = float(jax.grad(x_final, argnums=1)(1.0, 0.5))
        assert dv0 == pytest.approx(np.sin(omega * T) / omega, abs=1e-4)
        y0s = jnp.asarray([[1.0, 0.0], [0.0, 1.0], [2.0, -1.0]])
        finals, traj = jax.vmap(lambda y0: odeint_rk4(oscillator, y0, 0.0, T / n, n, omega))(y0s)
        assert traj.shape == (3, n, 2)
        np.testing.assert_allclose(np.asarray(traj[:, -1]), np.asarray(finals))
        domega = jax.grad(
            lambda w: odeint_rk4(oscillator, jnp.asarray([1.0, 0.0]), 0.0, T / n, n, w)[0][0]
        )(omega)
        assert float(domega) == pytest.approx(-T * np.sin(omega * T), rel=1e-3)


def test_rk4_pytree_state_and_errors():
    def f(t, y, args):
        return {"a": -y["a"], "b": args * jnp.ones_like(y["b"])}

    y = rk4_step(f, 0.0, {"a": jnp.ones(2), "b": jnp.zeros(1)}, 0.1, 2.0)
    np.testing.assert_allclose(np.asarray(y["a"]), np.exp(-0.1) * np.ones(2), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(y["b"]), [0.2], rtol=1e-6)
    with pytest.raises(TypeError, match="`f`"):
        odeint_rk4(None, jnp.ones(2), 0.0, 0.1, 3)  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(ValueError, match="n_steps"):
        odeint_rk4(f, jnp.ones(2), 0.0, 0.1, 0)


# ---------------------------------------------------------------------------
# piecewise
# ---------------------------------------------------------------------------


def test_piecewise_jit_and_vmap_behaviour():
    branches = [lambda x: x + 1.0, lambda x: x * 10.0, lambda x: -x]
    assert float(jax.jit(lambda i, x: piecewise(i, branches, x))(2, 3.0)) == -3.0
    out = jax.vmap(lambda i, x: piecewise(i, branches, x))(
        jnp.asarray([0, 1, 2, 7]), jnp.asarray([1.0, 1.0, 1.0, 1.0])
    )
    assert out.tolist() == [2.0, 10.0, -1.0, -1.0]
    text = str(
        jax.make_jaxpr(jax.vmap(lambda i, x: piecewise(i, branches, x)))(
            jnp.asarray([0, 1]), jnp.ones(2)
        )
    )
    assert "select_n" in text and "cond" not in text  # under vmap every branch runs
    x = jnp.asarray([-2.0, 0.5, 3.0])
    assert piecewise_select([x < 0, x < 1], [jnp.zeros(3), x], default=1.0).tolist() == [
        0.0,
        0.5,
        1.0,
    ]
    with pytest.raises(ValueError, match="conditions"):
        piecewise_select([x < 0], [x, x])


# ---------------------------------------------------------------------------
# Finite in, finite out; NaN in, NaN out (issue #16)
# ---------------------------------------------------------------------------


def test_segment_softmax_fully_masked_or_minus_inf_segment_gives_zeros():
    scores = jnp.asarray([1.0, 2.0, -jnp.inf, -jnp.inf, 3.0, 0.5])
    ids = jnp.asarray([0, 0, 1, 1, 2, 2])
    out = segment_softmax(scores, ids, 3)
    np.testing.assert_allclose(  # float32 exp and a division against float64: the table's bound
        np.asarray(out[:2]),
        np.exp([1.0, 2.0]) / np.exp([1.0, 2.0]).sum(),
        rtol=rtol("exp", "reciprocal", floor=1e-6),
    )
    assert out[2:4].tolist() == [0.0, 0.0]
    where = jnp.asarray([True, True, True, True, False, False])
    masked = segment_softmax(scores, ids, 3, where=where)
    assert masked[4:].tolist() == [0.0, 0.0] and masked[2:4].tolist() == [0.0, 0.0]
    np.testing.assert_allclose(np.asarray(masked[:2]), np.asarray(out[:2]), rtol=1e-6)
    partly = segment_softmax(
        scores, ids, 3, where=jnp.asarray([True, False, True, True, True, True])
    )
    assert partly[:2].tolist() == [1.0, 0.0]
    for w in (None, where):
        g = jax.grad(lambda s, w=w: jnp.sum(segment_softmax(s, ids, 3, where=w) * jnp.arange(6.0)))(
            scores
        )
        assert np.isfinite(np.asarray(g)).all()
    with pytest.raises(TypeError, match="`where` must be boolean"):
        segment_softmax(scores, ids, 3, where=jnp.ones(6))


def test_segment_softmax_nan_score_is_not_hidden():
    out = segment_softmax(jnp.asarray([1.0, jnp.nan, 2.0]), jnp.asarray([0, 0, 1]), 2)
    assert np.isnan(np.asarray(out[:2])).all() and float(out[2]) == 1.0


def test_masked_mean_of_70000_float16_values_counts_in_float32():
    x = jnp.full((70_000,), 1.5, jnp.float16)
    mask = jnp.ones(70_000, bool).at[-1].set(False)
    out = masked_mean(x, mask)
    assert out.dtype == jnp.float16 and float(out) == 1.5
    seg = segment_mean(x, jnp.zeros(70_000, jnp.int32), 1)
    assert seg.dtype == jnp.float16 and float(seg[0]) == 1.5


@pytest.mark.parametrize(
    ("call", "error", "argument"),
    [
        (lambda: discounted_returns(jnp.ones(3), jnp.zeros(3), float("nan")), ValueError, "gamma"),
        (lambda: discounted_returns(jnp.ones(3), jnp.zeros(3), 1.5), ValueError, "gamma"),
        (lambda: discounted_returns("abc", jnp.zeros(3), 0.9), TypeError, "rewards"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: discounted_returns(jnp.ones(0), jnp.zeros(0), 0.9), ValueError, "rewards"),
        (
            lambda: lambda_returns(jnp.ones(3), jnp.zeros(3), jnp.ones(3), 0.9, float("inf")),
            ValueError,
            "lam",
        ),
        (lambda: lambda_returns(jnp.ones(3), jnp.zeros(3), None, 0.9, 0.5), TypeError, "values"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: gae(jnp.ones(3), jnp.zeros(3), jnp.ones(3), 0.9, 0.5), ValueError, "values"),
        (
            lambda: gae(jnp.ones(3), jnp.zeros(3), jnp.ones(4), 0.9, 0.5, truncated=jnp.zeros(3)),
            ValueError,
            "next_values",
        ),
        (lambda: masked_mean(jnp.ones(3), "mask"), TypeError, "mask"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: lengths_to_mask(jnp.asarray([1]), -2), ValueError, "max_len"),
        (lambda: init_lstm(0, 0, 3), ValueError, "input_dim"),
        (lambda: init_gru("key", 2, 3), TypeError, "key"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: odeint_rk4(oscillator, jnp.ones(2), 0.0, float("nan"), 3, 1.0), ValueError, "dt"),
        (lambda: odeint_rk4(oscillator, jnp.ones(2), None, 0.1, 3, 1.0), TypeError, "t0"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (
            lambda: run_rnn(lstm_cell, init_lstm(0, 2, 3), jnp.ones((4, 2), jnp.int32), None),  # pyright: ignore[reportArgumentType]  # bad input on purpose (the carry too)
            TypeError,
            "xs",
        ),
    ],
)
def test_sequence_bad_input_names_the_argument(call, error, argument):
    with pytest.raises(error, match=f"`{argument}`"):
        call()


# ---------------------------------------------------------------------------
# λ-returns with truncation, GAE (issue #20)
# ---------------------------------------------------------------------------


def lambda_returns64(r, d, v, gamma, lam, cut: Any = None, nv: Any = None) -> np.ndarray:
    out, future = np.zeros(len(r)), v[-1]
    for t in reversed(range(len(r))):
        if cut is not None and cut[t]:
            future = r[t] + gamma * (1 - d[t]) * nv[t]
        else:
            future = r[t] + gamma * (1 - d[t]) * ((1 - lam) * v[t] + lam * future)
        out[t] = future
    return out


def gae64(r, d, v, gamma, lam, cut: Any = None, nv: Any = None) -> np.ndarray:
    out, adv = np.zeros(len(r)), 0.0
    for t in reversed(range(len(r))):
        following = nv[t] if cut is not None and cut[t] else v[t + 1]
        delta = r[t] + gamma * (1 - d[t]) * following - v[t]
        carry = 0.0 if cut is not None and cut[t] else adv
        adv = delta + gamma * lam * (1 - d[t]) * carry
        out[t] = adv
    return out


def test_truncated_lambda_returns_match_float64_loop(rng):
    r, v, nv = rng.normal(size=30), rng.normal(size=30), rng.normal(size=30)
    d, cut = np.zeros(30), np.zeros(30)
    d[5], cut[11], cut[20] = 1, 1, 1
    for lam in (0.0, 0.6, 1.0):
        with host_float64():
            ours = lambda_returns(
                jnp.asarray(r),
                jnp.asarray(d),
                jnp.asarray(v),
                0.97,
                lam,
                truncated=jnp.asarray(cut),
                next_values=jnp.asarray(nv),
            )
        np.testing.assert_allclose(
            np.asarray(ours), lambda_returns64(r, d, v, 0.97, lam, cut, nv), rtol=1e-12
        )


def test_gae_matches_rlax_and_float64_loop(rng):
    rlax = pytest.importorskip("rlax")
    r, v = rng.normal(size=40), rng.normal(size=41)
    d = (rng.random(40) < 0.1).astype(np.float64)
    with host_float64():
        ours = gae(jnp.asarray(r), jnp.asarray(d), jnp.asarray(v), 0.99, 0.95)
        peer = rlax.truncated_generalized_advantage_estimation(
            jnp.asarray(r), 0.99 * (1 - jnp.asarray(d)), 0.95, jnp.asarray(v)
        )
    np.testing.assert_allclose(np.asarray(ours), gae64(r, d, v, 0.99, 0.95), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(peer), rtol=1e-12)
    r32, d32, v32 = (jnp.asarray(a, jnp.float32) for a in (r, d, v))
    with jax.numpy_dtype_promotion("standard"):
        peer32 = rlax.truncated_generalized_advantage_estimation(r32, 0.99 * (1 - d32), 0.95, v32)
    np.testing.assert_allclose(
        np.asarray(gae(r32, d32, v32, 0.99, 0.95)), np.asarray(peer32), rtol=1e-5, atol=1e-5
    )


def test_gae_with_truncation_matches_float64_loop(rng):
    r, v, nv = rng.normal(size=25), rng.normal(size=26), rng.normal(size=25)
    d, cut = np.zeros(25), np.zeros(25)
    d[3], cut[9], cut[17] = 1, 1, 1
    with host_float64():
        ours = gae(
            jnp.asarray(r),
            jnp.asarray(d),
            jnp.asarray(v),
            0.9,
            0.8,
            truncated=jnp.asarray(cut),
            next_values=jnp.asarray(nv),
        )
    np.testing.assert_allclose(np.asarray(ours), gae64(r, d, v, 0.9, 0.8, cut, nv), rtol=1e-12)
    # GAE with λ = 1 plus the values is the discounted return bootstrapped from V(s_T)
    with host_float64():
        adv = gae(jnp.asarray(r), jnp.zeros(25), jnp.asarray(v), 0.9, 1.0)
        ret = discounted_returns(
            jnp.asarray(r),
            jnp.zeros(25),
            0.9,
            truncated=jnp.zeros(25),
            next_values=jnp.asarray(v[1:]),
        )
    np.testing.assert_allclose(np.asarray(adv) + v[:-1], np.asarray(ret), rtol=1e-10)


def test_returns_compile_once_for_new_gamma_and_lambda():
    fn = jax.jit(gae)
    args = (jnp.ones(8), jnp.zeros(8), jnp.ones(9))
    fn(*args, 0.9, 0.9)
    with CompileBudget(0) as budget:
        fn(*args, 0.8, 0.7)
    assert budget.count == 0


# ---------------------------------------------------------------------------
# RK4: time t0 + i·dt in the state's dtype, 4th-order convergence (issue #20)
# ---------------------------------------------------------------------------


def forced_oscillator(t, y, _):
    return jnp.stack([y[1], -y[0] + jnp.cos(3.0 * t)])


def test_rk4_converges_at_fourth_order_under_x64():
    horizon = 2.0
    exact = (
        9 / 8 * np.cos(horizon) - np.cos(3 * horizon) / 8
    )  # x'' + x = cos 3t, x(0) = 1, x'(0) = 0
    errors = []
    with host_float64():
        for n in (25, 50, 100, 200, 400):
            y, traj = odeint_rk4(forced_oscillator, jnp.asarray([1.0, 0.0]), 0.0, horizon / n, n)
            assert traj.dtype == jnp.float64
            errors.append(abs(float(y[0]) - exact))
    ratios = [errors[i] / errors[i + 1] for i in range(len(errors) - 1)]
    assert all(ratio >= 12 for ratio in ratios), ratios
    assert errors[-1] < 1e-10


def test_rk4_float32_time_does_not_drift_over_20000_steps():
    horizon, n = 2.0, 20_000
    y, _ = odeint_rk4(lambda t, y, _: jnp.cos(100.0 * t), jnp.zeros(()), 0.0, horizon / n, n)
    exact = np.sin(100 * horizon) / 100
    assert abs(float(y) - exact) / abs(exact) < 1e-3  # accumulating t += dt gave 2.5 %
