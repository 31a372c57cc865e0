"""Derivatives with the right mode: Jacobians, many JVPs, Hessian-vector products, CG, Newton-CG.

The cost of a Jacobian is one pass per *input* dimension in forward mode
(``jacfwd``) and one per *output* dimension in reverse mode (``jacrev``):
pick wrong and it is 100× slower. :func:`jacobian` picks from the shapes
(``jax.eval_shape``, no compilation). Second-order methods never build the
Hessian: :func:`hvp` computes ``H v`` for about the cost of two gradients,
:func:`cg_solve` solves ``H d = −g`` with those products, and
:func:`newton_cg_step` combines them.

Example:
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

__all__ = ["cg_solve", "hvp", "jacobian", "jacobian_mode", "jvp_many", "newton_cg", "newton_cg_step"]

Mode = Literal["auto", "fwd", "rev"]
_MODES = ("auto", "fwd", "rev")
_HVP_METHODS = ("fwd_rev", "rev_rev", "rev_fwd")


def _check_callable(f: Any, name: str = "f") -> None:
    if not callable(f):
        raise TypeError(f"`{name}` must be callable, got {type(f).__name__}")


def _size(tree: Any) -> int:
    return int(sum(np.prod(np.shape(leaf), dtype=np.int64) for leaf in jax.tree.leaves(tree)))


def _argnums_tuple(argnums: int | tuple[int, ...]) -> tuple[int, ...]:
    return (argnums,) if isinstance(argnums, int) else tuple(argnums)


def jacobian_mode(f: Callable[..., Any], *args: Any, argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> str:
    """``"fwd"`` if the differentiated inputs are no larger than the outputs, else ``"rev"``.

    Sizes come from ``jax.eval_shape`` (abstract evaluation: nothing is
    compiled or run).

    Example:
        >>> import jax.numpy as jnp
        >>> jacobian_mode(lambda x: jnp.tile(x, 100), jnp.ones(3)), jacobian_mode(jnp.sum, jnp.ones(300))
        ('fwd', 'rev')
    """
    _check_callable(f)
    out = jax.eval_shape(f, *args)
    if has_aux:
        out = out[0]
    n_in = sum(_size(args[i]) for i in _argnums_tuple(argnums))
    return "fwd" if n_in <= _size(out) else "rev"


def jacobian(f: Callable[..., Any], argnums: int | tuple[int, ...] = 0, mode: Mode = "auto",
             has_aux: bool = False) -> Callable[..., Any]:
    """The Jacobian of ``f`` as a function, in forward or reverse mode.

    ``mode="auto"`` chooses per call from the argument shapes (forward when
    the total input size ≤ total output size, see :func:`jacobian_mode`);
    ``"fwd"``/``"rev"`` force ``jax.jacfwd``/``jax.jacrev``. Pytree inputs
    and outputs and ``has_aux`` work as in JAX.

    Example:
        >>> import jax.numpy as jnp
        >>> a = jnp.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
        >>> jacobian(lambda x: a @ x)(jnp.ones(2)).tolist()
        [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    """
    _check_callable(f)
    if mode not in _MODES:
        raise ValueError(f"`mode` must be one of {_MODES}, got {mode!r}")
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

    Example:
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
            raise ValueError(f"each tangent must have the shape of `x` {np.shape(p)} after the batch axis, "
                             f"got {np.shape(t)[1:]}")
    y, linear = jax.linearize(f, x)
    return y, jax.vmap(linear)(tangents)


def _tree_vdot(a: Any, b: Any) -> jax.Array:
    return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def hvp(f: Callable[..., jax.Array], x: Any, v: Any, *args: Any, method: str = "fwd_rev") -> Any:
    """The Hessian-vector product ``∇²f(x) v`` without forming the Hessian.

    ``f(x, *args)`` is a scalar; ``x`` and ``v`` are pytrees of the same
    structure. Methods: ``"fwd_rev"`` (forward over reverse: ``jvp`` of the
    gradient; the usual best), ``"rev_rev"`` (``grad`` of ``<∇f, v>``),
    ``"rev_fwd"`` (``grad`` of the directional derivative). All cost a small
    constant times a gradient and memory linear in ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> f = lambda x, a: 0.5 * x @ a @ x
        >>> a = jnp.asarray([[2.0, 1.0], [1.0, 3.0]])
        >>> hvp(f, jnp.ones(2), jnp.asarray([1.0, 0.0]), a, method="rev_rev").tolist()
        [2.0, 1.0]
    """
    _check_callable(f)
    if method not in _HVP_METHODS:
        raise ValueError(f"`method` must be one of {_HVP_METHODS}, got {method!r}")
    if jax.tree.structure(x) != jax.tree.structure(v):
        raise ValueError("`v` must have the same pytree structure as `x`")
    for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(v)):
        if np.shape(a) != np.shape(b):
            raise ValueError(f"`v` leaf of shape {np.shape(b)} does not match `x` leaf of shape {np.shape(a)}")

    def fx(y: Any) -> jax.Array:
        return f(y, *args)

    if method == "fwd_rev":
        return jax.jvp(jax.grad(fx), (x,), (v,))[1]
    if method == "rev_rev":
        return jax.grad(lambda y: _tree_vdot(jax.grad(fx)(y), v))(x)
    return jax.grad(lambda y: jax.jvp(fx, (y,), (v,))[1])(x)


def _safe_div(num: jax.Array, den: jax.Array) -> jax.Array:
    """``num / den``, and 0 where ``den == 0`` (the 0/0 of a converged CG), with finite gradients."""
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

    Example:
        >>> import jax.numpy as jnp
        >>> a = jnp.asarray([[4.0, 1.0], [1.0, 3.0]])
        >>> [round(v, 5) for v in cg_solve(lambda v: a @ v, jnp.asarray([1.0, 2.0]), iters=2).tolist()]
        [0.09091, 0.63636]
    """
    _check_callable(matvec, "matvec")
    if isinstance(iters, bool) or not isinstance(iters, (int, np.integer)) or iters < 1:
        raise ValueError(f"`iters` must be an int >= 1, got {iters!r}")
    out = jax.eval_shape(matvec, b)
    if jax.tree.structure(out) != jax.tree.structure(b) or any(
        np.shape(o) != np.shape(i) for o, i in zip(jax.tree.leaves(out), jax.tree.leaves(b))
    ):
        shapes = [np.shape(leaf) for leaf in jax.tree.leaves(out)]
        raise ValueError(f"`matvec(b)` must have the shapes of `b` {[np.shape(leaf) for leaf in jax.tree.leaves(b)]}, "
                         f"got {shapes}")
    if tol is not None and not tol >= 0:
        raise ValueError(f"`tol` must be >= 0, got {tol}")
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


@functools.partial(jax.jit, static_argnames=("f", "cg_iters", "hvp_method"))
def _newton_cg_step(f: Callable[..., jax.Array], x: Any, args: tuple, damping: jax.Array, cg_iters: int,
                    hvp_method: str) -> tuple[Any, Any, Any]:
    grad = jax.grad(f)(x, *args)
    neg_grad = jax.tree.map(jnp.negative, grad)

    def matvec(v: Any) -> Any:
        hv = hvp(f, x, v, *args, method=hvp_method)
        return jax.tree.map(lambda a, b: a + damping.astype(a.dtype) * b, hv, v)

    direction = cg_solve(matvec, neg_grad, cg_iters)
    return jax.tree.map(jnp.add, x, direction), grad, direction


def newton_cg_step(f: Callable[..., jax.Array], x: Any, *args: Any, cg_iters: int = 20, damping: float = 0.0,
                   hvp_method: str = "fwd_rev") -> tuple[Any, Any, Any]:
    """One Newton step ``x + d`` with ``(H + damping·I) d = −∇f`` solved by CG on HVPs.

    Jitted (``f`` is static: pass the same function object every step and it
    compiles once); the Hessian is never formed. ``f(x, *args)`` is a scalar.

    Returns:
      ``(x_new, grad, direction)`` (``grad`` at the old ``x``).

    Example:
        >>> import jax.numpy as jnp
        >>> f = lambda x: jnp.sum((x - 3.0) ** 2)
        >>> newton_cg_step(f, jnp.zeros(2), cg_iters=2)[0].tolist()
        [3.0, 3.0]
    """
    _check_callable(f)
    if isinstance(cg_iters, bool) or not isinstance(cg_iters, int) or cg_iters < 1:
        raise ValueError(f"`cg_iters` must be an int >= 1, got {cg_iters!r}")
    if hvp_method not in _HVP_METHODS:
        raise ValueError(f"`hvp_method` must be one of {_HVP_METHODS}, got {hvp_method!r}")
    if damping < 0:
        raise ValueError(f"`damping` must be >= 0, got {damping}")
    return _newton_cg_step(f, x, tuple(args), jnp.asarray(damping, jnp.float32), cg_iters, hvp_method)


def newton_cg(f: Callable[..., jax.Array], x0: Any, *args: Any, steps: int = 20, tol: float = 1e-6,
              cg_iters: int = 20, damping: float = 0.0) -> tuple[Any, np.ndarray]:
    """Newton-CG until ``‖∇f‖ < tol`` or ``steps`` steps; returns ``(x, gradient-norm history)``.

    The history holds ``‖∇f‖`` before each step and at the returned point;
    quadratic convergence shows as the exponent doubling near the optimum.

    Example:
        >>> import jax.numpy as jnp
        >>> x, history = newton_cg(lambda x: jnp.sum(jnp.cosh(x)), jnp.asarray([1.0, -2.0]), steps=10)
        >>> [abs(round(v, 4)) for v in x.tolist()], bool(history[-1] < 1e-6)
        ([0.0, 0.0], True)
    """
    _check_callable(f)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"`steps` must be an int >= 1, got {steps!r}")
    x = x0
    history = []
    for _ in range(steps):
        x_new, grad, _ = newton_cg_step(f, x, *args, cg_iters=cg_iters, damping=damping)
        norm = float(jnp.sqrt(_tree_vdot(grad, grad)))
        history.append(norm)
        if norm < tol:
            return x, np.asarray(history)
        x = x_new
    grad = jax.grad(f)(x, *args)
    history.append(float(jnp.sqrt(_tree_vdot(grad, grad))))
    return x, np.asarray(history)
