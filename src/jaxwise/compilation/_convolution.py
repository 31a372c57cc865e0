"""Convolutions in XLA:CPU's canonical layout, so that they stay fast inside a ``lax.scan``.

XLA:CPU runs a convolution through Eigen only when its dimension numbers are *canonical*:
input (batch, spatial..., feature), kernel (spatial..., in, out), output (batch, spatial...,
feature), i.e. NHWC/HWIO in 2-D. Its ``ConvCanonicalization`` pass rewrites the other
convolutions into transposes around a canonical one, but only in the entry computation.
Inside a ``while`` body (every ``lax.scan``, so every epoch) a non-canonical convolution is
emitted as a naive loop nest. The gradients of an NHWC convolution are such convolutions
(kernel gradient ``f01b_i01o->01bf``, input gradient ``b01f_01oi->b01f``): a 2-conv CNN epoch
ran 13x slower scanned than as a Python loop of jitted steps.

`canonical_convolutions` does the same
rewrite on the traced program, in every sub-program (scan, cond, jit, remat, ``shard_map``
bodies), so that XLA sees only canonical convolutions. It is a hook of the one jaxpr
evaluator (`jaxwise.compilation._evaluate`): each sub-program is re-traced where it is
bound, so a ``psum`` inside a ``shard_map`` body keeps its mesh axes. A transposed operand
is the same array in another memory order, so the result is the convolution's; only the
kernel that computes it changes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core as jex
from jax.lax import ConvDimensionNumbers

from jaxwise._shared._backends import rewrite_on
from jaxwise._shared._checks import check_callable
from jaxwise.compilation._evaluate import evaluate_jaxpr

__all__ = ["canonical_convolutions", "canonical_specs"]

_CONV = "conv_general_dilated"


def canonical_specs(spatial: int) -> ConvDimensionNumbers:
    """The canonical ``(lhs, rhs, out)`` specs of a convolution with ``spatial`` spatial dims.

    Args:
        spatial: the number of spatial dimensions.

    Returns:
        ``ConvDimensionNumbers`` of an NHWC input, HWIO kernel and NHWC output (in 2-D).

    Examples:
        >>> canonical_specs(2)
        ConvDimensionNumbers(lhs_spec=(0, 3, 1, 2), rhs_spec=(3, 2, 0, 1), out_spec=(0, 3, 1, 2))
    """
    inner = tuple(range(1, spatial + 1))
    return ConvDimensionNumbers(
        (0, spatial + 1, *inner), (spatial + 1, spatial, *range(spatial)), (0, spatial + 1, *inner)
    )


def _is_canonical(dn: ConvDimensionNumbers) -> bool:
    return tuple(map(tuple, dn)) == tuple(map(tuple, canonical_specs(len(dn.lhs_spec) - 2)))


def _needs_rewrite(jaxpr: Any) -> bool:
    """True when ``jaxpr`` or one of its sub-programs has a non-canonical convolution."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == _CONV and not _is_canonical(eqn.params["dimension_numbers"]):
            return True
    return any(_needs_rewrite(sub) for sub in jex.subjaxprs(jaxpr))


def _canonical_convolution(lhs: Any, rhs: Any, params: dict[str, Any]) -> jax.Array:
    """One convolution as transposes around the canonical convolution with the same params."""
    dn: ConvDimensionNumbers = params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = (tuple(s) for s in dn)
    spatial = len(lhs_spec) - 2
    lhs = jax.lax.transpose(lhs, (lhs_spec[0], *lhs_spec[2:], lhs_spec[1]))
    rhs = jax.lax.transpose(rhs, (*rhs_spec[2:], rhs_spec[1], rhs_spec[0]))
    prim = jex.primitives.conv_general_dilated_p
    out = prim.bind(lhs, rhs, **{**params, "dimension_numbers": canonical_specs(spatial)})
    # the canonical output is (batch, spatial..., feature): put each back where out_spec says
    where = [0] * len(out_spec)
    where[out_spec[0]] = 0
    where[out_spec[1]] = spatial + 1
    for i, dim in enumerate(out_spec[2:]):
        where[dim] = i + 1
    return jax.lax.transpose(out, tuple(where))


def _canonical_hook(eqn: jex.JaxprEqn, invals: list[Any]) -> list[Any] | None:
    """The evaluator's hook: a non-canonical convolution becomes a canonical one."""
    if eqn.primitive.name == _CONV and not _is_canonical(eqn.params["dimension_numbers"]):
        return [_canonical_convolution(invals[0], invals[1], eqn.params)]
    return None


def canonical_convolutions(
    fn: Callable[..., Any], *, backend: str | None = None
) -> Callable[..., Any]:
    """``fn`` with every convolution it traces in XLA:CPU's canonical layout.

    Meant for a program with a loop: on CPU the loop's convolutions then run through Eigen
    like those outside a loop. On a backend where the rewrite is off
    (``jaxwise._shared._backends.REWRITES``: GPU and TPU), and when ``fn`` has no convolution to
    rewrite, ``fn`` itself runs (traced twice on CPU: once to look).

    Args:
        fn: a function of pytrees of arrays (positional and keyword arguments), traced by
            ``jax.jit``; it may use collectives inside ``shard_map`` or a named ``vmap``.
        backend: the platform to decide for (``"cpu"``, ``"tpu"``, ...), or ``None``: the
            one the program is traced for, read at each trace.

    Returns:
        A function with ``fn``'s signature and results.

    Raises:
        TypeError: ``fn`` is not callable.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> def f(x, k):
        ...     return jax.lax.conv_general_dilated(
        ...         x, k, (1,), "SAME", dimension_numbers=("NCH", "OIH", "NCH"))
        >>> x, k = jnp.ones((2, 3, 8)), jnp.ones((4, 3, 3))
        >>> bool(jnp.allclose(canonical_convolutions(f)(x, k), f(x, k)))
        True
    """

    check_callable(fn, "fn")

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not rewrite_on("canonical_convolutions", backend):
            return fn(*args, **kwargs)
        closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args, **kwargs)
        if not _needs_rewrite(closed.jaxpr):  # nothing to change: fn itself, as traced
            return fn(*args, **kwargs)
        flat = jax.tree.leaves((args, kwargs))
        out = evaluate_jaxpr(closed, flat, _canonical_hook, descend=_needs_rewrite)
        return jax.tree.unflatten(jax.tree.structure(shape), out)

    return wrapped
