"""Why a donation failed, told apart by what the call shows.

After a watched call, a donated array whose buffer survived the call was not donated. The cause
is read from the call itself, in this order:

- ``unused``: the function does not use the argument, so ``jit`` drops it;
- ``no output``: no output has the array's shape and dtype (or fewer outputs than donated
  arrays of that type), so XLA has nothing to reuse its buffer for (JAX warns "Some donated
  buffers were not usable", unless a library, like Equinox, silences it);
- ``held``: otherwise something else holds the buffer (a live NumPy view), and JAX silently
  skipped the donation (up to JAX 0.12.0 the array stays alive; from 0.12.1 it is deleted
  while the view keeps its buffer: ``jaxwise._shared._buffers`` sees both).

A call that fails because one buffer was donated twice, or donated and also passed undonated
(XLA: "Attempt to donate the same buffer twice"), is a ``duplicate``: both paths are named.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import jax

__all__ = ["DUPLICATE_ERRORS", "duplicate", "output_avals", "why_alive"]

DUPLICATE_ERRORS = (
    "donate the same buffer twice",
    "previously donated in the same call",
)

UNUSED = (
    "the function does not use this argument, so jit drops it (keep_unused=False) and its "
    "buffer is not donated; do not donate it, or remove it"
)
NO_OUTPUT = (
    "no output has this buffer's shape and dtype ({aval}), so XLA cannot reuse it (JAX: "
    '"Some donated buffers were not usable"); return an updated value of the same shape, or '
    "do not donate this argument"
)
HELD = (
    "the buffer was still alive after the call, so XLA could not reuse it and a second copy was "
    "kept, silently: something else holds it, usually a live NumPy view (np.asarray(x) of a CPU "
    "array shares its memory); keep host copies with jaxwise.tree.host_copy(...) or np.array(x) "
    "(a copy)"
)
DUPLICATE = (
    'the same buffer is also passed as `{other}`, so XLA refuses the call ("Attempt to donate '
    'the same buffer twice"); pass a copy (jnp.array(x, copy=True)) or donate only one of them'
)


def aval_key(leaf: Any) -> tuple[tuple[int, ...], str]:
    """``(shape, dtype)`` of an array: what XLA matches a donated buffer against."""
    return tuple(getattr(leaf, "shape", ())), str(getattr(leaf, "dtype", "?"))


def output_avals(out: Any) -> Counter[tuple[tuple[int, ...], str]]:
    """How many outputs the call has of each ``(shape, dtype)``."""
    return Counter(aval_key(leaf) for leaf in jax.tree.leaves(out) if hasattr(leaf, "dtype"))


def why_alive(
    leaf: Any,
    aval: str,
    *,
    unused: bool,
    unusable: bool,
    donated: Counter[tuple[tuple[int, ...], str]],
    outputs: Counter[tuple[tuple[int, ...], str]],
) -> str:
    """The cause of a donated ``leaf`` that is still alive after the call.

    Args:
        leaf: the donated array.
        aval: its type as JAX writes it (``"float32[4,3]"``).
        unused: the function does not use it.
        unusable: JAX warned that a donated buffer of this type was not usable.
        donated: the donated arrays of the call, counted by ``(shape, dtype)``.
        outputs: the call's outputs, counted the same way.

    Returns:
        The cause and its fix, one sentence.
    """
    if unused:
        return UNUSED
    key = aval_key(leaf)
    if unusable or donated[key] > outputs[key]:
        return NO_OUTPUT.format(aval=aval)
    return HELD


def duplicate(
    donated: Sequence[tuple[str, Any]], others: Sequence[tuple[str, Any]]
) -> tuple[str, str] | None:
    """``(argument, other path)`` of a donated array passed twice, or ``None``.

    Args:
        donated: ``(path, leaf)`` of every donated array, in order.
        others: ``(path, leaf)`` of every other argument's array.

    Returns:
        The second donated path and the first path where the same array appears.
    """
    seen: dict[int, str] = {}
    for path, leaf in donated:
        if id(leaf) in seen:
            return path, seen[id(leaf)]
        seen[id(leaf)] = path
    for path, leaf in others:
        if id(leaf) in seen:
            return seen[id(leaf)], path
    return None
