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

from jaxwise.autodiff._jacobian import jacobian, jacobian_mode, jvp_many
from jaxwise.autodiff._newton import cg_solve, hvp, newton_cg, newton_cg_step

__all__ = [
    "cg_solve",
    "hvp",
    "jacobian",
    "jacobian_mode",
    "jvp_many",
    "newton_cg",
    "newton_cg_step",
]
