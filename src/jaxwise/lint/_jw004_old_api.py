"""JW004: removed, legacy or non-existent JAX APIs."""

from __future__ import annotations

import ast

from jaxwise.lint._index import Index

CODE = "JW004"
SUMMARY = "removed or deprecated JAX API"
_REMOVED = "was removed from JAX"
# qualified name -> (what is wrong, what to use instead)
OLD = {
    "jax.tree_map": (_REMOVED, "jax.tree.map"),
    "jax.tree_leaves": (_REMOVED, "jax.tree.leaves"),
    "jax.tree_flatten": (_REMOVED, "jax.tree.flatten"),
    "jax.tree_unflatten": (_REMOVED, "jax.tree.unflatten"),
    "jax.tree_structure": (_REMOVED, "jax.tree.structure"),
    "jax.tree_transpose": (_REMOVED, "jax.tree.transpose"),
    "jax.tree_util.build_tree": (_REMOVED, "jax.tree.unflatten"),
    "jax.tree_util.register_keypaths": (
        _REMOVED,
        "register the node with keys via jax.tree_util.register_pytree_with_keys",
    ),
    "jax.random.PRNGKey": ("is a legacy API (raw uint32 keys)", "jax.random.key (typed keys)"),
    "jax.numpy.randn": (
        "does not exist (NumPy's `randn` has no jax.numpy counterpart)",
        "jax.random.normal(key, shape)",
    ),
}


def check(ix: Index) -> None:
    """Flag uses (``jax.tree_map(…)``) and imports (``from jax import tree_map``)."""
    for node in ix.old_attrs:
        name = ix.aliases.qualify(node)
        if name in OLD:
            status, new = OLD[name]
            ix.add(node, CODE, f"`{name}` {status}", f"use {new}")
    for node in ix.imports:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                if name in OLD:
                    status, new = OLD[name]
                    ix.add(node, CODE, f"`{name}` {status}", f"use {new}")
