"""Second order without the Hessian: Hessian-vector products, CG, and Newton-CG steps."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._shared._checks import check_callable, check_choice, check_float, check_int

X = TypeVar("X")
B = TypeVar("B")

__all__ = ["cg_solve", "hvp", "newton_cg", "newton_cg_step"]

_HVP_METHODS = ("fwd_rev", "rev_rev", "rev_fwd")
HvpMethod = Literal["fwd_rev", "rev_rev", "rev_fwd"]


def _tree_vdot(a: Any, b: Any) -> jax.Array:
    total: Any = sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    return jnp.asarray(total)


def hvp(f: Callable[..., jax.Array], x: X, v: X, *args: Any, method: HvpMethod = "fwd_rev") -> X:
    """The Hessian-vector product ``∇²f(x) v`` without forming the Hessian.

    ``f(x, *args)`` is a scalar; ``x`` and ``v`` are pytrees of the same
    structure. Methods: ``"fwd_rev"`` (forward over reverse: ``jvp`` of the
    gradient; the usual best), ``"rev_rev"`` (``grad`` of ``<∇f, v>``),
    ``"rev_fwd"`` (``grad`` of the directional derivative). All cost a small
    constant times a gradient and memory linear in ``x``.

    Args:
        f: ``f(x, *args) -> scalar``.
        x: the point (a pytree of float arrays).
        v: the direction, ``x``'s structure and shapes.
        *args: further arguments of ``f`` (not differentiated).
        method: ``"fwd_rev"``, ``"rev_rev"`` or ``"rev_fwd"``.

    Returns:
        ``∇²f(x) v``: ``x``'s structure, shapes and dtypes.

    Raises:
        TypeError: ``f`` is not callable.
        ValueError: an unknown ``method``, or ``v`` differs from ``x`` in structure or shape.

    Examples:
        >>> import jax.numpy as jnp
        >>> f = lambda x, a: 0.5 * x @ a @ x
        >>> a = jnp.asarray([[2.0, 1.0], [1.0, 3.0]])
        >>> hvp(f, jnp.ones(2), jnp.asarray([1.0, 0.0]), a, method="rev_rev").tolist()
        [2.0, 1.0]
    """
    check_callable(f, "f")
    check_choice(method, "method", _HVP_METHODS)
    if jax.tree.structure(x) != jax.tree.structure(v):
        raise ValueError("`v` must have the same pytree structure as `x`")
    for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(v)):
        if np.shape(a) != np.shape(b):
            raise ValueError(
                f"`v` leaf of shape {np.shape(b)} does not match `x` leaf of shape {np.shape(a)}"
            )

    def fx(y: X) -> jax.Array:
        return f(y, *args)

    if method == "fwd_rev":
        return jax.jvp(jax.grad(fx), (x,), (v,))[1]
    if method == "rev_rev":
        return jax.grad(lambda y: _tree_vdot(jax.grad(fx)(y), v))(x)
    return jax.grad(lambda y: jax.jvp(fx, (y,), (v,))[1])(x)


def _safe_div(num: jax.Array, den: jax.Array) -> jax.Array:
    """``num / den``, and 0 where ``den == 0`` (the 0/0 of a converged CG), finite gradients."""
    ok = den != 0
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def cg_solve(matvec: Callable[[B], B], b: B, iters: int, tol: float | None = None) -> B:
    """Conjugate gradient for ``A x = b`` (``A`` symmetric positive definite, given as ``matvec``).

    A fixed number of iterations in a ``lax.fori_loop`` (jit-able, and
    reverse-differentiable since the trip count is static). With ``tol``,
    iterations stop changing ``x`` once ``‖r‖ ≤ tol · ‖b‖``. Once the
    residual is exactly 0 — ``b = 0``, an ``A = cI`` solved in one step, or
    more iterations than dimensions — the step sizes α and β would be 0/0;
    they are guarded to 0, so extra iterations idle without NaN.

    Args:
        matvec: ``v -> A v`` on pytrees like ``b``.
        b: right-hand side (a pytree of float arrays).
        iters: number of iterations (≥ 1); ``n`` iterations solve an n-dim
            system exactly in exact arithmetic.
        tol: optional relative residual tolerance, >= 0.

    Returns:
        ``x`` (a pytree like ``b``).

    Raises:
        TypeError: ``matvec`` is not callable, or ``iters``/``tol`` have the wrong type.
        ValueError: ``matvec`` does not return ``b``'s shapes, ``iters < 1`` or ``tol < 0``.

    Examples:
        >>> import jax.numpy as jnp
        >>> a = jnp.asarray([[4.0, 1.0], [1.0, 3.0]])
        >>> x = cg_solve(lambda v: a @ v, jnp.asarray([1.0, 2.0]), iters=2)
        >>> [round(v, 5) for v in x.tolist()]
        [0.09091, 0.63636]
    """
    check_callable(matvec, "matvec")
    iters = check_int(iters, "iters", min_value=1)
    out = jax.eval_shape(matvec, b)
    if jax.tree.structure(out) != jax.tree.structure(b) or any(
        np.shape(o) != np.shape(i) for o, i in zip(jax.tree.leaves(out), jax.tree.leaves(b))
    ):
        shapes = [np.shape(leaf) for leaf in jax.tree.leaves(out)]
        raise ValueError(
            "`matvec` must return arrays of the shapes of `b` "
            f"{[np.shape(leaf) for leaf in jax.tree.leaves(b)]}, "
            f"got {shapes} from matvec(b)"
        )
    if tol is not None:
        tol = check_float(tol, "tol", min_value=0.0)
    threshold = (tol * tol) * _tree_vdot(b, b) if tol is not None else -1.0

    def axpy(a: jax.Array, x: Any, y: Any) -> Any:
        return jax.tree.map(lambda xi, yi: a.astype(xi.dtype) * xi + yi, x, y)

    x0 = jax.tree.map(jnp.zeros_like, b)
    rr0 = _tree_vdot(b, b)

    def body(_: Any, carry: tuple) -> tuple:
        x, r, p, rr = carry
        active = rr > threshold
        ap = matvec(p)
        alpha = jnp.where(active, _safe_div(rr, _tree_vdot(p, ap)), 0.0)
        x = axpy(alpha, p, x)
        r = axpy(-alpha, ap, r)
        rr_new = _tree_vdot(r, r)
        beta = _safe_div(rr_new, rr)
        p = axpy(beta, p, r)
        return x, r, p, jnp.where(active, rr_new, rr)

    x, *_ = jax.lax.fori_loop(0, int(iters), body, (x0, b, b, rr0))
    return x


def _truncated_cg(matvec: Callable[[Any], Any], b: Any, iters: int) -> Any:
    """CG for ``A d = b`` that stops at negative curvature (Steihaug; Nocedal & Wright, Alg. 7.1).

    If a search direction ``p`` has ``pᵀ A p ≤ 0`` the iteration stops and returns the
    current iterate — or ``b`` itself (steepest descent, since ``b = −∇f``) if that happens
    at the first iteration. Every returned direction is therefore a descent direction.
    """
    x0 = jax.tree.map(jnp.zeros_like, b)

    def axpy(a: jax.Array, x: Any, y: Any) -> Any:
        return jax.tree.map(lambda xi, yi: a.astype(xi.dtype) * xi + yi, x, y)

    def body(i: Any, carry: tuple) -> tuple:
        x, r, p, rr, stopped = carry
        ap = matvec(p)
        curvature = _tree_vdot(p, ap)
        negative = curvature <= 0
        alpha = jnp.where(stopped | negative, 0.0, _safe_div(rr, curvature))
        x = axpy(alpha, p, x)
        # negative curvature at the very first iteration: take the steepest-descent step b
        first = negative & ~stopped & (i == 0)
        x = jax.tree.map(lambda xi, bi: jnp.where(first, bi, xi), x, b)
        r = axpy(-alpha, ap, r)
        rr_new = _tree_vdot(r, r)
        p = axpy(_safe_div(rr_new, rr), p, r)
        return x, r, p, jnp.where(stopped | negative, rr, rr_new), stopped | negative

    x, *_ = jax.lax.fori_loop(0, iters, body, (x0, b, b, _tree_vdot(b, b), jnp.asarray(False)))
    return x


def _armijo(
    f: Callable[..., jax.Array],
    x: Any,
    args: tuple,
    value: jax.Array,
    grad: Any,
    direction: Any,
    max_halvings: int = 30,
) -> jax.Array:
    """The largest ``α ∈ {1, ½, ¼, …}`` with ``f(x + α d) ≤ f(x) + 10⁻⁴ α ∇fᵀd`` (0 if none)."""
    slope = _tree_vdot(grad, direction)

    def value_at(alpha: jax.Array) -> jax.Array:
        return f(jax.tree.map(lambda xi, di: xi + alpha.astype(xi.dtype) * di, x, direction), *args)

    def cond(state: tuple) -> jax.Array:
        alpha, k = state
        trial = value_at(alpha)
        ok = trial <= value + 1e-4 * alpha * slope
        return ~ok & (k < max_halvings)

    alpha, k = jax.lax.while_loop(
        cond,
        lambda s: (s[0] * 0.5, s[1] + 1),
        (jnp.asarray(1.0, jnp.result_type(value)), jnp.asarray(0)),
    )
    return jnp.where(k < max_halvings, alpha, 0.0)


@functools.partial(jax.jit, static_argnames=("f", "cg_iters", "hvp_method"))
def _newton_cg_step(
    f: Callable[..., jax.Array],
    x: Any,
    args: tuple,
    damping: jax.Array,
    cg_iters: int,
    hvp_method: HvpMethod,
) -> tuple[Any, Any, Any, jax.Array]:
    value, grad = jax.value_and_grad(f)(x, *args)
    neg_grad = jax.tree.map(jnp.negative, grad)

    def matvec(v: Any) -> Any:
        hv = hvp(f, x, v, *args, method=hvp_method)
        return jax.tree.map(lambda a, b: a + damping.astype(a.dtype) * b, hv, v)

    direction = _truncated_cg(matvec, neg_grad, cg_iters)
    alpha = _armijo(f, x, args, value, grad, direction)
    x_new = jax.tree.map(lambda xi, di: xi + alpha.astype(xi.dtype) * di, x, direction)
    return x_new, grad, direction, jnp.sqrt(_tree_vdot(grad, grad))


@functools.partial(jax.jit, static_argnames=("f",))
def _grad_norm(f: Callable[..., jax.Array], x: Any, args: tuple) -> jax.Array:
    grad = jax.grad(f)(x, *args)
    return jnp.sqrt(_tree_vdot(grad, grad))


def _check_newton_args(f: Any, cg_iters: Any, damping: Any, hvp_method: Any) -> float:
    check_callable(f, "f")
    check_int(cg_iters, "cg_iters", min_value=1)
    check_choice(hvp_method, "hvp_method", _HVP_METHODS)
    return check_float(damping, "damping", min_value=0.0)


def newton_cg_step(
    f: Callable[..., jax.Array],
    x: X,
    *args: Any,
    cg_iters: int = 20,
    damping: float = 0.0,
    hvp_method: HvpMethod = "fwd_rev",
) -> tuple[X, X, X]:
    """One Newton-CG step: ``(H + damping·I) d = −∇f`` by truncated CG, then a line search.

    The Hessian is never formed (CG on Hessian-vector products). Negative curvature is
    handled the Steihaug way: CG stops at the first search direction ``p`` with
    ``pᵀ H p ≤ 0`` and returns its current iterate (steepest descent ``−∇f`` if that happens
    at once), so ``d`` is always a descent direction — plain Newton would walk *up* to a
    maximum or saddle from a start with negative curvature. A backtracking (Armijo) line
    search then takes ``x + α d`` with the largest ``α ∈ {1, ½, …}`` that decreases ``f``
    enough (``α = 1``, the pure Newton step, near a minimum: quadratic convergence is kept).

    Jitted (``f`` is static: pass the same function object every step and it compiles
    once). ``f(x, *args)`` is a scalar.

    Args:
        f: ``f(x, *args) -> scalar``, twice differentiable (static: the same object each
            step).
        x: the current point (a pytree of float arrays).
        *args: further arguments of ``f`` (not differentiated).
        cg_iters: the CG iterations per step, >= 1.
        damping: added to the Hessian's diagonal, >= 0.
        hvp_method: how Hessian-vector products are taken, as in
            [`hvp`][jaxwise.autodiff.hvp].

    Returns:
        ``(x_new, grad, direction)``, each ``x``'s structure (``grad`` at the old ``x``;
            ``x_new = x + α·direction``).

    Raises:
        TypeError: ``f`` is not callable, or an option has the wrong type.
        ValueError: ``cg_iters < 1``, ``damping < 0``, or an unknown ``hvp_method``.

    References:
        Nocedal & Wright, *Numerical Optimization* (2nd ed.), Algorithm 7.1 (line-search
        Newton-CG); Steihaug, "The conjugate gradient method and trust regions in large scale
        optimization", SIAM J. Numer. Anal. 1983.

    Examples:
        >>> import jax.numpy as jnp
        >>> f = lambda x: jnp.sum((x - 3.0) ** 2)
        >>> newton_cg_step(f, jnp.zeros(2), cg_iters=2)[0].tolist()
        [3.0, 3.0]
    """
    damping = _check_newton_args(f, cg_iters, damping, hvp_method)
    x_new, grad, direction, _ = _newton_cg_step(
        f, x, tuple(args), jnp.asarray(damping, jnp.float32), int(cg_iters), hvp_method
    )
    return x_new, grad, direction


def newton_cg(
    f: Callable[..., jax.Array],
    x0: X,
    *args: Any,
    steps: int = 20,
    tol: float = 1e-6,
    cg_iters: int = 20,
    damping: float = 0.0,
) -> tuple[X, np.ndarray]:
    """Newton-CG (see `newton_cg_step`) until ``‖∇f‖ < tol``.

    At most ``steps`` steps. Quadratic convergence shows in the history as the exponent
    doubling near the optimum. From a start with negative curvature it still ends at a
    minimum (truncated CG + line search). Compiles two programs (the step and the final
    gradient norm), once per shape.

    Args:
        f: ``f(x, *args) -> scalar``, twice differentiable.
        x0: the starting point (a pytree of float arrays).
        *args: further arguments of ``f`` (not differentiated).
        steps: the most Newton steps, >= 1.
        tol: stop once the gradient norm is below it, >= 0.
        cg_iters: the CG iterations per step, >= 1.
        damping: added to the Hessian's diagonal, >= 0.

    Returns:
        ``(x, history)``: the last point (``x0``'s structure) and a float64 NumPy array of
            ``‖∇f‖`` before each step and at the returned point.

    Raises:
        TypeError: ``f`` is not callable, or an option has the wrong type.
        ValueError: an option is out of range.

    Examples:
        >>> import jax.numpy as jnp
        >>> f = lambda x: jnp.sum(jnp.cosh(x))
        >>> x, history = newton_cg(f, jnp.asarray([1.0, -2.0]), steps=10)
        >>> [abs(round(v, 4)) for v in x.tolist()], bool(history[-1] < 1e-6)
        ([0.0, 0.0], True)
    """
    damping = _check_newton_args(f, cg_iters, damping, "fwd_rev")
    steps = check_int(steps, "steps", min_value=1)
    tol = check_float(tol, "tol", min_value=0.0)
    x, args = x0, tuple(args)
    damping_array = jnp.asarray(damping, jnp.float32)
    history = []
    for _ in range(steps):
        x_new, _, _, norm = _newton_cg_step(f, x, args, damping_array, int(cg_iters), "fwd_rev")
        history.append(float(norm))
        if history[-1] < tol:
            return x, np.asarray(history)
        x = x_new
    history.append(float(_grad_norm(f, x, args)))
    return x, np.asarray(history)
