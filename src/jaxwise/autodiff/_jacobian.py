"""Jacobians in the cheaper mode (XLA's cost analysis of both programs) and many JVPs at once."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._shared._checks import check_callable, check_choice

X = TypeVar("X")
Y = TypeVar("Y")

__all__ = ["jacobian", "jacobian_mode", "jvp_many"]

Mode = Literal["auto", "fwd", "rev"]
Pick = Literal["fwd", "rev"]
_MODES = ("auto", "fwd", "rev")


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
) -> Pick | None:
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
) -> Pick:
    """``"fwd"`` or ``"rev"``: the Jacobian mode that is cheaper for these argument shapes.

    The two candidate programs (``jacfwd`` and ``jacrev``) are *lowered* on abstract
    arguments — nothing is compiled or run — and XLA's cost analysis (flops + bytes
    accessed) decides; forward mode must be at least 10% cheaper, since reverse mode wins
    ties on CPU (measured in ``benchmarks/bench_autodiff.py``). The pick is cached per
    function and argument signature (shapes, dtypes, structure). If the function cannot be
    lowered on its own (e.g. it closes over values traced by an outer ``jit``), the size
    rule decides: forward when the inputs are fewer than the outputs.

    Args:
        f: the function whose Jacobian is wanted.
        *args: its arguments (arrays or pytrees; only shapes and dtypes are read).
        argnums: the argument(s) to differentiate with respect to.
        has_aux: ``f`` returns ``(output, aux)``.

    Returns:
        ``"fwd"`` or ``"rev"``.

    Raises:
        TypeError: ``f`` is not callable.

    Examples:
        >>> import jax.numpy as jnp
        >>> tall = jacobian_mode(lambda x: jnp.tile(x, 100), jnp.ones(3))
        >>> tall, jacobian_mode(jnp.sum, jnp.ones(300))
        ('fwd', 'rev')
    """
    check_callable(f, "f")
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
    (see [`jacobian_mode`][jaxwise.autodiff.jacobian_mode]; cached, nothing extra is
    compiled); ``"fwd"``/``"rev"`` force ``jax.jacfwd``/``jax.jacrev``. Pytree inputs
    and outputs and ``has_aux`` work as in JAX.

    Args:
        f: the function to differentiate.
        argnums: the argument(s) to differentiate with respect to.
        mode: ``"auto"``, ``"fwd"`` or ``"rev"``.
        has_aux: ``f`` returns ``(output, aux)``; the Jacobian function then returns
            ``(jacobian, aux)``.

    Returns:
        A function of ``f``'s arguments returning the Jacobian: for an output of shape
            ``(m…)`` and an input of shape ``(n…)``, an array of shape ``(m…, n…)`` (pytrees of
            those for pytree inputs and outputs, as ``jax.jacrev``).

    Raises:
        TypeError: ``f`` is not callable.
        ValueError: ``mode`` is not one of the three.

    Examples:
        >>> import jax.numpy as jnp
        >>> a = jnp.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
        >>> jacobian(lambda x: a @ x)(jnp.ones(2)).tolist()
        [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    """
    check_callable(f, "f")
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


def jvp_many(f: Callable[[X], Y], x: X, tangents: X) -> tuple[Y, Y]:
    """``f(x)`` and ``J(x) t`` for a batch of tangents, linearising ``f`` once.

    Args:
        f: a function of one pytree argument.
        x: the point.
        tangents: like ``x`` with an extra leading batch axis on every leaf.

    Returns:
        ``(f(x), jvps)`` where ``jvps`` has the structure of ``f(x)`` with a
            leading batch axis.

    Raises:
        TypeError: ``f`` is not callable.
        ValueError: the tangents do not share one leading batch axis, or a leaf's shape after
            it is not ``x``'s.

    Examples:
        >>> import jax.numpy as jnp
        >>> y, jvps = jvp_many(lambda x: x ** 2, jnp.asarray([1.0, 3.0]), jnp.eye(2))
        >>> jvps.tolist()
        [[2.0, 0.0], [0.0, 6.0]]
    """
    check_callable(f, "f")
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
