"""Which function bodies mention what some rule needs: the linter's cheap pre-filter."""

from __future__ import annotations

import ast
import re

from jaxwise.lint._core import Aliases

__all__ = ["HotLines"]

# Text without which a function body holds nothing any rule looks for (see ``_HotLines``).
_ALWAYS_HOT = (
    "jit",
    "pmap",
    "random",
    "key=",
    "make_train_",
    "jax.tree_map",
    "jax.tree_leaves",
    "jax.tree_flatten",
    "jax.tree_unflatten",
    "jax.tree_structure",
    "jax.tree_transpose",
    "build_tree",
    "register_keypaths",
    "PRNGKey",
    "randn",
)
# Imported under another name (`from jax import jit as J`), these make a body hot by that name.
_ALIASED = frozenset(
    {
        "jax.jit",
        "jax.pmap",
        "jax.vmap",
        "equinox.filter_jit",
        "jax.tree_map",
        "jax.tree_leaves",
        "jax.tree_flatten",
        "jax.tree_unflatten",
        "jax.numpy.randn",
        "jax.tree_structure",
        "jax.tree_transpose",
        "functools.partial",
    }
)
_GLOBAL = re.compile(r"^[ \t]*global\s", re.MULTILINE)
_SINGULAR_MARKS = ("/", "log", "sqrt", "arc", "reciprocal", "power")


class HotLines:
    """Which function bodies mention what some rule needs (``jit``, ``random``, local aliases…).

    A plain substring test (a superset of what the rules match): a body without any of these
    words cannot produce a finding unless it is jitted, which the index learns from elsewhere.
    """

    def __init__(self, text: str, tree: ast.Module) -> None:
        aliases = Aliases([n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)])
        names = aliases.names.items()
        self.words = _ALWAYS_HOT + tuple(
            n for n, full in names if full.startswith("jax.random") or full in _ALIASED
        )
        self.wheres = ("np.where", "numpy.where") + tuple(
            n for n, full in names if full == "jax.numpy.where"
        )
        self.donation = "donate_arg" in text or "make_train_" in text
        # Lines as Python numbers them: only "\n" ends a line (str.splitlines also splits at
        # form feeds and other separators).
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        self.lines = text.split("\n")

    def segment(self, node: ast.AST) -> str:
        """The source text of ``node``'s lines."""
        first, last = getattr(node, "lineno", 1), getattr(node, "end_lineno", None) or 1
        return "\n".join(self.lines[first - 1 : last])

    def any(self, node: ast.AST) -> bool:
        """Whether ``node``'s lines hold text that some rule needs."""
        seg = self.segment(node)
        for word in self.words:
            if word in seg:
                return True
        if any(w in seg for w in self.wheres) and any(m in seg for m in _SINGULAR_MARKS):
            return True
        if "global " in seg and _GLOBAL.search(seg):
            return True
        return ("vmap" in seg and "grad" in seg) or (self.donation and "array" in seg)
