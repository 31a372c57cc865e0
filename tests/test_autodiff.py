"""Tests for jaxwise.autodiff against analytic float64 derivatives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from host64 import host_float64

from jaxwise.autodiff import (
    cg_solve,
    hvp,
    jacobian,
    jacobian_mode,
    jvp_many,
    newton_cg,
    newton_cg_step,
)
from jaxwise.compilation import CompileBudget


def tanh_map(a):
    return lambda x: jnp.tanh(a @ x)


def tanh_jacobian64(a, x):
    z = np.tanh(a @ x)
    return (1 - z**2)[:, None] * a


@pytest.mark.parametrize("m, n", [(40, 3), (3, 40), (7, 7)])
@pytest.mark.parametrize("mode", ["auto", "fwd", "rev"])
def test_jacobian_matches_analytic(m, n, mode, rng):
    a, x = rng.normal(size=(m, n)), rng.normal(size=n)
    with host_float64():
        jac = jacobian(tanh_map(jnp.asarray(a)), mode=mode)(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(jac), tanh_jacobian64(a, x), rtol=1e-12, atol=1e-14)


def _jaxpr_text(fn, x):
    return str(jax.make_jaxpr(fn)(x))


def test_auto_picks_forward_for_tall_and_reverse_for_wide(rng):
    tall = tanh_map(jnp.asarray(rng.normal(size=(500, 4)), jnp.float32))
    wide = tanh_map(jnp.asarray(rng.normal(size=(4, 500)), jnp.float32))
    assert jacobian_mode(tall, jnp.ones(4)) == "fwd" and jacobian_mode(wide, jnp.ones(500)) == "rev"
    fwd_text = _jaxpr_text(jacobian(tall), jnp.ones(4))
    rev_text = _jaxpr_text(jacobian(wide), jnp.ones(500))
    assert fwd_text == _jaxpr_text(jax.jacfwd(tall), jnp.ones(4))
    assert rev_text == _jaxpr_text(jax.jacrev(wide), jnp.ones(500))
    assert fwd_text != _jaxpr_text(jax.jacrev(tall), jnp.ones(4))


def test_jacobian_pytrees_and_aux():
    def f(params):
        out = {"a": params["w"] * 2.0, "b": jnp.sum(params["v"] ** 2)}
        return out, jnp.asarray(7.0)

    params = {"w": jnp.ones(3), "v": jnp.arange(2.0)}
    jac, aux = jacobian(f, has_aux=True)(params)
    assert float(aux) == 7.0
    np.testing.assert_allclose(jac["a"]["w"], 2 * np.eye(3))
    np.testing.assert_allclose(jac["b"]["v"], [0.0, 2.0])
    both = jacobian(lambda x, y: x * y, argnums=(0, 1))(jnp.ones(2), 3 * jnp.ones(2))
    np.testing.assert_allclose(both[0], 3 * np.eye(2))


def test_jacobian_under_jit():
    f = tanh_map(jnp.eye(3))
    jitted = jax.jit(jacobian(f))
    with CompileBudget(1) as budget:
        jitted(jnp.ones(3)), jitted(jnp.zeros(3))
    assert budget.count == 1  # the cost-based pick lowers both candidates but compiles neither


def logistic(x, a, lam):
    return jnp.sum(jax.nn.softplus(a @ x)) + 0.5 * lam * jnp.sum(x**2)


def logistic_grad64(x, a, lam):
    s = 1 / (1 + np.exp(-(a @ x)))
    return a.T @ s + lam * x


def logistic_hessian64(x, a, lam):
    s = 1 / (1 + np.exp(-(a @ x)))
    return a.T @ ((s * (1 - s))[:, None] * a) + lam * np.eye(len(x))


@pytest.fixture
def logistic_problem(rng):
    return rng.normal(size=(30, 6)), rng.normal(size=6) * 0.5, 0.1


def test_jvp_many_matches_analytic(logistic_problem, rng):
    a, x, lam = logistic_problem
    t = rng.normal(size=(5, 6))
    with host_float64():
        y, jvps = jvp_many(tanh_map(jnp.asarray(a)), jnp.asarray(x), jnp.asarray(t))
    np.testing.assert_allclose(np.asarray(jvps), t @ tanh_jacobian64(a, x).T, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(y), np.tanh(a @ x), rtol=1e-12)
    with pytest.raises(ValueError, match="shape of `x`"):
        jvp_many(jnp.sin, jnp.ones(3), jnp.ones((2, 4)))


@pytest.mark.parametrize("method", ["fwd_rev", "rev_rev", "rev_fwd"])
def test_hvp_methods_match_analytic_hessian(logistic_problem, rng, method):
    a, x, lam = logistic_problem
    v = rng.normal(size=6)
    with host_float64():
        out = hvp(logistic, jnp.asarray(x), jnp.asarray(v), jnp.asarray(a), lam, method=method)
    np.testing.assert_allclose(np.asarray(out), logistic_hessian64(x, a, lam) @ v, rtol=1e-10)


def test_hvp_pytrees():
    def f(p):
        return jnp.sum(p["a"] ** 2 * p["b"])

    p = {"a": jnp.asarray([1.0, 2.0]), "b": jnp.asarray([3.0, 4.0])}
    v = {"a": jnp.asarray([1.0, 0.0]), "b": jnp.asarray([0.0, 1.0])}
    for method in ("fwd_rev", "rev_rev", "rev_fwd"):
        out = hvp(f, p, v, method=method)
        # H = [[2b, 2a], [2a, 0]] blockwise-diagonal per coordinate.
        np.testing.assert_allclose(out["a"], [6.0, 4.0])
        np.testing.assert_allclose(out["b"], [2.0, 0.0])


def test_cg_exact_after_n_iterations(rng):
    m = rng.normal(size=(8, 8))
    a = m @ m.T + 8 * np.eye(8)
    b = rng.normal(size=8)
    with host_float64():
        x = cg_solve(lambda v: jnp.asarray(a) @ v, jnp.asarray(b), iters=8)
        many = cg_solve(lambda v: jnp.asarray(a) @ v, jnp.asarray(b), iters=40)
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(a, b), rtol=1e-9)
    assert np.isfinite(np.asarray(many)).all()
    np.testing.assert_allclose(np.asarray(many), np.linalg.solve(a, b), rtol=1e-9)


def test_cg_converges_in_one_step_then_idles_without_nan():
    b = jnp.asarray([1.0, -2.0, 3.0])
    x = cg_solve(lambda v: 2.0 * v, b, iters=10)
    np.testing.assert_allclose(np.asarray(x), np.asarray(b) / 2)
    zero = cg_solve(lambda v: 2.0 * v, jnp.zeros(3), iters=5)
    assert np.asarray(zero).tolist() == [0.0, 0.0, 0.0]
    g = jax.grad(lambda b: jnp.sum(cg_solve(lambda v: 2.0 * v, b, iters=6)))(b)
    np.testing.assert_allclose(np.asarray(g), 0.5 * np.ones(3), rtol=1e-6)
    assert np.isfinite(
        np.asarray(
            jax.grad(lambda b: jnp.sum(cg_solve(lambda v: 2.0 * v, b, iters=4)))(jnp.zeros(3))
        )
    ).all()


def test_cg_tolerance_and_pytrees(rng):
    a = np.diag(np.arange(1.0, 6.0))
    b = {"u": jnp.ones(2), "w": jnp.ones(3)}

    def matvec(v):
        flat = jnp.concatenate([v["u"], v["w"]])
        out = jnp.asarray(a, jnp.float32) @ flat
        return {"u": out[:2], "w": out[2:]}

    x = cg_solve(matvec, b, iters=5)
    np.testing.assert_allclose(np.concatenate([x["u"], x["w"]]), 1 / np.arange(1.0, 6.0), rtol=1e-5)
    loose = cg_solve(matvec, b, iters=5, tol=0.5)
    resid = np.linalg.norm(a @ np.concatenate([loose["u"], loose["w"]]) - 1)
    assert resid <= 0.5 * np.sqrt(5) + 1e-6


def test_newton_cg_first_direction_and_quadratic_convergence(logistic_problem):
    a, x0, lam = logistic_problem
    aj = jnp.asarray(a, jnp.float32)
    x_new, grad, direction = newton_cg_step(
        logistic, jnp.asarray(x0, jnp.float32), aj, lam, cg_iters=6
    )
    expected = np.linalg.solve(logistic_hessian64(x0, a, lam), -logistic_grad64(x0, a, lam))
    np.testing.assert_allclose(np.asarray(grad), logistic_grad64(x0, a, lam), rtol=1e-4)
    assert np.linalg.norm(np.asarray(direction) - expected) / np.linalg.norm(expected) < 1e-3
    start = jnp.asarray(x0, jnp.float32)
    with CompileBudget(0) as budget:  # the step above compiled this exact program already
        x, history = newton_cg(logistic, start, aj, lam, steps=6, tol=1e-3, cg_iters=6)
    assert budget.count == 0
    assert history[-1] < 1e-3 and len(history) <= 7
    with host_float64():
        _, h64 = newton_cg(
            logistic, jnp.asarray(x0), jnp.asarray(a), lam, steps=10, tol=1e-13, cg_iters=6
        )
    # Quadratic convergence: near the optimum ‖g_{k+1}‖ ≤ C ‖g_k‖² (the exponent doubles).
    tail = h64[-4:]
    assert all(tail[i + 1] <= 10 * tail[i] ** 2 for i in range(len(tail) - 1)), h64


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: jacobian(3), TypeError, "callable"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: jacobian(jnp.sin, mode="central"), ValueError, "mode"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: hvp(jnp.sum, jnp.ones(2), jnp.ones(2), method="gauss"), ValueError, "method"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: hvp(jnp.sum, jnp.ones(2), jnp.ones(3)), ValueError, "does not match"),
        (lambda: cg_solve(lambda v: v, jnp.ones(2), iters=0), ValueError, "iters"),
        (lambda: cg_solve(lambda v: v[:1], jnp.ones(2), iters=2), ValueError, "matvec"),
        (lambda: cg_solve("A", jnp.ones(2), iters=2), TypeError, "matvec"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: newton_cg_step(jnp.sum, jnp.ones(2), cg_iters=0), ValueError, "cg_iters"),
        (lambda: newton_cg(jnp.sum, jnp.ones(2), steps=0), ValueError, "steps"),
        (lambda: newton_cg(jnp.sum, jnp.ones(2), damping=float("nan")), ValueError, "`damping`"),
        (lambda: newton_cg_step(jnp.sum, jnp.ones(2), damping=-1.0), ValueError, "`damping`"),
        (lambda: newton_cg_step(jnp.sum, jnp.ones(2), damping="0"), TypeError, "`damping`"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: newton_cg(jnp.sum, jnp.ones(2), tol=float("inf")), ValueError, "`tol`"),
        (lambda: newton_cg_step(jnp.sum, jnp.ones(2), hvp_method="x"), ValueError, "`hvp_method`"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: cg_solve(lambda v: v, jnp.ones(2), iters=2, tol=-1.0), ValueError, "`tol`"),
        (lambda: cg_solve(lambda v: v, jnp.ones(2), iters=2.0), TypeError, "`iters`"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---------------------------------------------------------------------------
# Newton-CG with negative curvature (issue #20)
# ---------------------------------------------------------------------------


def double_well(x):
    return jnp.sum(0.25 * x**4 - 0.5 * x**2) + 0.1 * x[0] * x[1]


def test_newton_cg_from_negative_curvature_ends_at_a_minimum():
    x0 = jnp.asarray([0.1, -0.05])
    assert np.all(
        np.linalg.eigvalsh(np.asarray(jax.hessian(double_well)(x0))) < 0
    )  # a maximum's basin
    x, history = newton_cg(double_well, x0, steps=30, tol=1e-5, cg_iters=5)
    hessian = np.asarray(jax.hessian(double_well)(x), np.float64)
    assert np.all(np.linalg.eigvalsh(hessian) > 0) and history[-1] < 1e-5
    assert float(double_well(x)) < float(double_well(x0)) - 0.5
    # float64 referee: a stationary point of the NumPy gradient with a positive definite Hessian
    x64 = np.asarray(x, np.float64)
    grad64 = x64**3 - x64 + 0.1 * x64[::-1]
    assert np.max(np.abs(grad64)) < 1e-5
    # every step decreased f (descent directions + Armijo line search)
    xs = [x0]
    for _ in range(5):
        xs.append(newton_cg_step(double_well, xs[-1], cg_iters=5)[0])
    values = [float(double_well(v)) for v in xs]
    assert all(b < a for a, b in zip(values, values[1:]))


def test_negative_curvature_at_the_first_cg_iteration_takes_steepest_descent():
    x0 = jnp.asarray([0.1, -0.05])
    _, grad, direction = newton_cg_step(double_well, x0, cg_iters=5)
    np.testing.assert_allclose(np.asarray(direction), -np.asarray(grad), rtol=1e-6)


def test_newton_cg_compiles_step_and_final_norm_exactly_once(logistic_problem):
    a, x0, lam = logistic_problem
    aj, xj = jnp.asarray(a, jnp.float32), jnp.asarray(x0, jnp.float32)
    from jaxwise.autodiff._newton import _grad_norm, _newton_cg_step

    def problem(x, a, lam):  # a fresh function object: its programs are not cached yet
        return logistic(x, a, lam)

    other_start = xj + 1.0
    with CompileBudget(2) as budget:
        newton_cg(problem, xj, aj, lam, steps=3, tol=0.0, cg_iters=4)
        newton_cg(problem, other_start, aj, lam, steps=3, tol=0.0, cg_iters=4)
    assert budget.count == 2
    assert sorted(name for name, _ in budget.events) == sorted(
        [f"jit({_newton_cg_step.__name__})", f"jit({_grad_norm.__name__})"]  # pyright: ignore[reportAttributeAccessIssue]  # jit copies __name__ at run time
    )


# ---------------------------------------------------------------------------
# Jacobian mode by cost (issue #20)
# ---------------------------------------------------------------------------


def tanh_ax(a, x):
    return jnp.tanh(a @ x)


@pytest.mark.parametrize(
    ("n", "m", "expected"),
    [
        (4, 256, "fwd"),
        (16, 256, "fwd"),
        (64, 256, "fwd"),
        (256, 256, "rev"),  # a tie in cost: reverse mode is faster on CPU (benchmark sweep)
        (1024, 256, "rev"),
        (2048, 256, "rev"),
        (256, 4, "rev"),
        (256, 16, "rev"),
        (256, 64, "rev"),
        (256, 1024, "fwd"),
        (256, 2048, "fwd"),
    ],
)
def test_jacobian_pick_on_the_benchmark_sweep(n, m, expected):
    a = jax.ShapeDtypeStruct((m, n), jnp.float32)
    x = jax.ShapeDtypeStruct((n,), jnp.float32)
    with CompileBudget(0) as budget:
        assert jacobian_mode(tanh_ax, a, x, argnums=1) == expected
    assert budget.count == 0  # candidates are lowered and analysed, never compiled


def test_jacobian_mode_falls_back_to_sizes_inside_a_closure_over_tracers():
    @jax.jit
    def outer(a, x):
        inner = jacobian(lambda y: jnp.tanh(a @ y))  # closes over the traced `a`
        return inner(x)

    out = outer(jnp.eye(3), jnp.zeros(3))
    np.testing.assert_allclose(np.asarray(out), np.eye(3))
