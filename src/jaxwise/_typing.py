"""Names for the types of the public signatures that the type system cannot spell.

``PyTree`` is any JAX pytree: nested tuples, lists, dicts, dataclasses and NamedTuples, and
registered nodes (an Equinox module, an NNX ``State``), with arrays or Python scalars as
leaves and ``None`` as an empty subtree. A static type checker accepts anything for it, as for
``jaxtyping.PyTree`` without its leaf annotations (a recursive union such as chex's
``ArrayTree`` would refuse registered nodes and ``None``); the name says what the function
walks. Where a function returns the structure it was given, its signature says so with a type
variable instead (``def f(tree: T) -> T``).

Where a pytree has a role, its name says which: ``Params`` (a model's trainable parameters),
``Grads`` (a tree shaped like the parameters: gradients, their clipped sum, a noise draw),
``Batch`` (arrays whose leaves share the leading batch axis), ``ModelState`` (a model's
non-trainable state: BatchNorm statistics, RNG streams), and the opaque states of the parts
that plug into training, made by their ``init``: ``GradientState`` (a gradient function's),
``NoiseState`` (a noise mechanism's), ``ClipState`` (a clip policy's). Each is a pytree, so
``Any`` to a type checker like ``PyTree``: the name is for the reader.

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

__all__ = [
    "Batch",
    "ClipState",
    "GradientState",
    "Grads",
    "ModelState",
    "NoiseState",
    "Params",
    "PyTree",
    "T",
]

PyTree: TypeAlias = Any  # any pytree (see the module docstring)
Params: TypeAlias = PyTree  # a model's trainable parameters
Grads: TypeAlias = PyTree  # shaped like the parameters: gradients, a clipped sum, a noise draw
Batch: TypeAlias = PyTree  # leaves sharing the leading batch axis
ModelState: TypeAlias = PyTree  # a model's non-trainable state (None: none)
GradientState: TypeAlias = PyTree  # a gradient function's state, from its init(params)
NoiseState: TypeAlias = PyTree  # a noise mechanism's state, from its init(params)
ClipState: TypeAlias = PyTree  # a clip policy's state, from its init()
T = TypeVar("T")  # a value returned with the type it was given
