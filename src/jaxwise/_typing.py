"""Names for the types of the public signatures that the type system cannot spell.

``PyTree`` is any JAX pytree: nested tuples, lists, dicts, dataclasses and NamedTuples, and
registered nodes (an Equinox module, an NNX ``State``), with arrays or Python scalars as
leaves and ``None`` as an empty subtree. A static type checker accepts anything for it, as for
``jaxtyping.PyTree`` without its leaf annotations (a recursive union such as chex's
``ArrayTree`` would refuse registered nodes and ``None``); the name says what the function
walks. Where a function returns the structure it was given, its signature says so with a type
variable instead (``def f(tree: T) -> T``).

Examples:
    >>> from jaxwise._typing import PyTree
    >>> def leaves(tree: PyTree) -> int:
    ...     import jax
    ...     return len(jax.tree.leaves(tree))
    >>> leaves({"w": [1.0, 2.0], "b": None})
    2
"""

from __future__ import annotations

from typing import Any, TypeAlias, TypeVar

__all__ = ["PyTree", "T"]

PyTree: TypeAlias = Any  # any pytree (see the module docstring)
T = TypeVar("T")  # a value returned with the type it was given
