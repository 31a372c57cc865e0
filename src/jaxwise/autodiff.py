"""Derivatives with the right mode: Jacobians, many JVPs, Hessian-vector products, CG, Newton-CG.

The cost of a Jacobian is one pass per *input* dimension in forward mode
(``jacfwd``) and one per *output* dimension in reverse mode (``jacrev``):
pick wrong and it is 100× slower. :func:`jacobian` picks by cost: XLA's
cost analysis (flops and bytes) of both lowered candidate programs, computed
once per signature and cached (lowering only: nothing is compiled). Second-order
methods never build the Hessian: :func:`hvp` computes ``H v`` for about the cost
of two gradients, :func:`cg_solve` solves ``H d = −g`` with those products, and
:func:`newton_cg_step` combines them (truncated CG that stops at negative
curvature, and a backtracking line search, so it descends from any start).

Examples:
    >>> import jax.numpy as jnp
    >>> f = lambda x: jnp.sum(x ** 3)
    >>> hvp(f, jnp.asarray([1.0, 2.0]), jnp.asarray([1.0, 0.0])).tolist()
    [6.0, 0.0]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._checks import check_callable, check_choice, check_float, check_int

__all__ = [
    "cg_solve",
    "hvp",
    "jacobian",
    "jacobian_mode",
    "jvp_many",
    "newton_cg",
    "newton_cg_step",
]

Mode = Literal["auto", "fwd", "rev"]
_MODES = ("auto", "fwd", "rev")
_HVP_METHODS = ("fwd_rev", "rev_rev", "rev_fwd")


def _check_callable(f: Any, name: str = "f") -> None:
    check_callable(f, name)


def _size(tree: Any) -> int:
    return int(sum(np.prod(np.shape(leaf), dtype=np.int64) for leaf in jax.tree.leaves(tree)))


def _argnums_tuple(argnums: int | tuple[int, ...]) -> tuple[int, ...]:
    return (argnums,) if isinstance(argnums, int) else tuple(argnums)


# Reverse wins ties: at equal cost (e.g. n = m = 256 for tanh(A x)) jacrev was measured
# 1.2-1.3x faster on CPU (its rows come out in the layout of the matrix product); forward
# mode is chosen only when it is clearly cheaper.
_FWD_MARGIN = 0.9


def _abstract(tree: Any) -> Any:
    return jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct(jnp.shape(leaf), jnp.result_type(leaf)), tree
    )


def _signature(args: tuple) -> tuple:
    leaves, treedef = jax.tree.flatten(args)
    return treedef, tuple((jnp.shape(leaf), str(jnp.result_type(leaf))) for leaf in leaves)


@functools.lru_cache(maxsize=256)
def _cost_pick(
    f: Callable[..., Any],
    argnums: int | tuple[int, ...],
    has_aux: bool,
    signature: tuple,
    abstract: Any,
) -> str | None:
    """``"fwd"``/``"rev"`` from XLA's cost analysis of the two lowered programs, or None."""
    del signature  # the cache key; ``abstract`` (unhashable in general) is read only on a miss
    costs = []
    for transform in (jax.jacfwd, jax.jacrev):
        program = jax.jit(transform(f, argnums=argnums, has_aux=has_aux))
        analysis = program.lower(*abstract.args).cost_analysis()
        if isinstance(analysis, (list, tuple)):
            analysis = analysis[0] if analysis else None
        if not analysis or "flops" not in analysis:
            return None
        costs.append(float(analysis["flops"]) + float(analysis.get("bytes accessed", 0.0)))
    return "fwd" if costs[0] < _FWD_MARGIN * costs[1] else "rev"


class _Hashless:
    """Carries the abstract arguments through ``lru_cache`` without taking part in the key."""

    def __init__(self, args: tuple) -> None:
        self.args = args

    def __hash__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Hashless)


def jacobian_mode(
    f: Callable[..., Any], *args: Any, argnums: int | tuple[int, ...] = 0, has_aux: bool = False
) -> str:
    """``"fwd"`` or ``"rev"``: the Jacobian mode that is cheaper for these argument shapes.

    The two candidate programs (``jacfwd`` and ``jacrev``) are *lowered* on abstract
    arguments — nothing is compiled or run — and XLA's cost analysis (flops + bytes
    accessed) decides; forward mode must be at least 10% cheaper, since reverse mode wins
    ties on CPU (measured in ``benchmarks/bench_autodiff.py``). The pick is cached per
    function and argument signature (shapes, dtypes, structure). If the function cannot be
    lowered on its own (e.g. it closes over values traced by an outer ``jit``), the size
    rule decides: forward when the inputs are fewer than the outputs.

    Examples:
        >>> import jax.numpy as jnp
        >>> tall = jacobian_mode(lambda x: jnp.tile(x, 100), jnp.ones(3))
        >>> tall, jacobian_mode(jnp.sum, jnp.ones(300))
        ('fwd', 'rev')
    """
    _check_callable(f)
    try:
        pick = _cost_pick(
            f, argnums, bool(has_aux), (argnums, _signature(args)), _Hashless(_abstract(args))
        )
    except Exception:
        pick = None
    if pick is not None:
        return pick
    out = jax.eval_shape(f, *args)
    if has_aux:
        out = out[0]
    n_in = sum(_size(args[i]) for i in _argnums_tuple(argnums))
    return "fwd" if n_in < _size(out) else "rev"


def jacobian(
    f: Callable[..., Any],
    argnums: int | tuple[int, ...] = 0,
    mode: Mode = "auto",
    has_aux: bool = False,
) -> Callable[..., Any]:
    """The Jacobian of ``f`` as a function, in forward or reverse mode.

    ``mode="auto"`` chooses per argument signature by the cost of the two programs
    (see :func:`jacobian_mode`; cached, nothing extra is compiled);
    ``"fwd"``/``"rev"`` force ``jax.jacfwd``/``jax.jacrev``. Pytree inputs
    and outputs and ``has_aux`` work as in JAX.

    Examples:
        >>> import jax.numpy as jnp
        >>> a = jnp.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
        >>> jacobian(lambda x: a @ x)(jnp.ones(2)).tolist()
        [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    """
    _check_callable(f)
    check_choice(mode, "mode", _MODES)
    fwd = jax.jacfwd(f, argnums=argnums, has_aux=has_aux)
    rev = jax.jacrev(f, argnums=argnums, has_aux=has_aux)
    if mode == "fwd":
        return fwd
    if mode == "rev":
        return rev

    @functools.wraps(f)
    def auto(*args: Any) -> Any:
        chosen = jacobian_mode(f, *args, argnums=argnums, has_aux=has_aux)
        return fwd(*args) if chosen == "fwd" else rev(*args)

    return auto


def jvp_many(f: Callable[[Any], Any], x: Any, tangents: Any) -> tuple[Any, Any]:
    """``f(x)`` and ``J(x) t`` for a batch of tangents, linearising ``f`` once.

    Args:
      f: a function of one pytree argument.
      x: the point.
      tangents: like ``x`` with an extra leading batch axis on every leaf.

    Returns:
      ``(f(x), jvps)`` where ``jvps`` has the structure of ``f(x)`` with a
      leading batch axis.

    Examples:
        >>> import jax.numpy as jnp
        >>> y, jvps = jvp_many(lambda x: x ** 2, jnp.asarray([1.0, 3.0]), jnp.eye(2))
        >>> jvps.tolist()
        [[2.0, 0.0], [0.0, 6.0]]
    """
    _check_callable(f)
    batch = {np.shape(t)[0] if np.ndim(t) else None for t in jax.tree.leaves(tangents)}
    if len(batch) != 1 or None in batch:
        raise ValueError("`tangents` must have one shared leading batch axis on every leaf")
    for t, p in zip(jax.tree.leaves(tangents), jax.tree.leaves(x)):
        if np.shape(t)[1:] != np.shape(p):
            raise ValueError(
                f"each `tangents` leaf must have the shape of `x` {np.shape(p)} after the "
                f"batch axis, got {np.shape(t)[1:]}"
            )
    y, linear = jax.linearize(f, x)
    return y, jax.vmap(linear)(tangents)


def _tree_vdot(a: Any, b: Any) -> jax.Array:
    total: Any = sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    return jnp.asarray(total)


def hvp(f: Callable[..., jax.Array], x: Any, v: Any, *args: Any, method: str = "fwd_rev") -> Any:
    """The Hessian-vector product ``∇²f(x) v`` without forming the Hessian.

    ``f(x, *args)`` is a scalar; ``x`` and ``v`` are pytrees of the same
    structure. Methods: ``"fwd_rev"`` (forward over reverse: ``jvp`` of the
    gradient; the usual best), ``"rev_rev"`` (``grad`` of ``<∇f, v>``),
    ``"rev_fwd"`` (``grad`` of the directional derivative). All cost a small
    constant times a gradient and memory linear in ``x``.

    Examples:
        >>> import jax.numpy as jnp
        >>> f = lambda x, a: 0.5 * x @ a @ x
        >>> a = jnp.asarray([[2.0, 1.0], [1.0, 3.0]])
        >>> hvp(f, jnp.ones(2), jnp.asarray([1.0, 0.0]), a, method="rev_rev").tolist()
        [2.0, 1.0]
    """
    _check_callable(f)
    check_choice(method, "method", _HVP_METHODS)
    if jax.tree.structure(x) != jax.tree.structure(v):
        raise ValueError("`v` must have the same pytree structure as `x`")
    for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(v)):
        if np.shape(a) != np.shape(b):
            raise ValueError(
                f"`v` leaf of shape {np.shape(b)} does not match `x` leaf of shape {np.shape(a)}"
            )

    def fx(y: Any) -> jax.Array:
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


def cg_solve(matvec: Callable[[Any], Any], b: Any, iters: int, tol: float | None = None) -> Any:
    """Conjugate gradient for ``A x = b`` (``A`` symmetric positive definite, given as ``matvec``).

    A fixed number of iterations in a ``lax.fori_loop`` (jit-able, and
    reverse-differentiable since the trip count is static). With ``tol``,
    iterations stop changing ``x`` once ``‖r‖ ≤ tol · ‖b‖``. Once the
    residual is exactly 0 — ``b = 0``, an ``A = cI`` solved in one step, or
    more iterations than dimensions — the step sizes α and β would be 0/0;
    they are guarded to 0, so extra iterations idle without NaN.

    Args:
      matvec: ``v -> A v`` on pytrees like ``b``.
      b: right-hand side (a pytree).
      iters: number of iterations (≥ 1); ``n`` iterations solve an n-dim
        system exactly in exact arithmetic.
      tol: optional relative residual tolerance.

    Returns:
      ``x`` (a pytree like ``b``).

    Examples:
        >>> import jax.numpy as jnp
        >>> a = jnp.asarray([[4.0, 1.0], [1.0, 3.0]])
        >>> x = cg_solve(lambda v: a @ v, jnp.asarray([1.0, 2.0]), iters=2)
        >>> [round(v, 5) for v in x.tolist()]
        [0.09091, 0.63636]
    """
    _check_callable(matvec, "matvec")
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
    hvp_method: str,
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
    _check_callable(f)
    check_int(cg_iters, "cg_iters", min_value=1)
    check_choice(hvp_method, "hvp_method", _HVP_METHODS)
    return check_float(damping, "damping", min_value=0.0)


def newton_cg_step(
    f: Callable[..., jax.Array],
    x: Any,
    *args: Any,
    cg_iters: int = 20,
    damping: float = 0.0,
    hvp_method: str = "fwd_rev",
) -> tuple[Any, Any, Any]:
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

    Returns:
      ``(x_new, grad, direction)`` (``grad`` at the old ``x``; ``x_new = x + α·direction``).

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
    x0: Any,
    *args: Any,
    steps: int = 20,
    tol: float = 1e-6,
    cg_iters: int = 20,
    damping: float = 0.0,
) -> tuple[Any, np.ndarray]:
    """Newton-CG (see :func:`newton_cg_step`) until ``‖∇f‖ < tol`` or ``steps`` steps.

    Returns ``(x, gradient-norm history)``: ``‖∇f‖`` before each step and at the returned
    point; quadratic convergence shows as the exponent doubling near the optimum. From a
    start with negative curvature it still ends at a minimum (truncated CG + line search).
    Compiles two programs (the step and the final gradient norm), once per shape.

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
