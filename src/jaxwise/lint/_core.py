"""Shared pieces of the linter: findings, name resolution and small AST helpers (no JAX import)."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Mapping, Sequence

__all__ = [
    "FUNCS",
    "Aliases",
    "Finding",
    "LintError",
    "const_int",
    "describe",
    "params",
    "static_names",
]

FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
JIT_NAMES = frozenset(
    {"jax.jit", "jax.pmap", "equinox.filter_jit", "equinox.filter_pmap", "flax.nnx.jit"}
)
PARTIAL_NAMES = frozenset({"functools.partial", "partial"})
SEVERITY = {"JW004": "warning"}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One diagnostic: where, which rule, what is wrong and how to fix it.

    Attributes:
        path: the file, as given.
        line: the 1-based line.
        col: the 1-based column.
        code: the rule, e.g. ``"JW003"`` (see [`RULES`][jaxwise.lint.RULES]).
        message: what is wrong.
        fix: how to fix it.
        cell: a notebook's cell (1-based; ``line`` is then the cell's line), else ``None``.
    """

    path: str
    line: int
    col: int
    code: str
    message: str
    fix: str
    cell: int | None = None  # a notebook's cell (1-based); ``line`` is then the cell's line

    def format(self) -> str:
        """``path:line:col: CODE message (fix: …)`` — ruff/flake8 style.

        In a notebook: ``nb.ipynb:cell 3:line 2:5: CODE message (fix: …)``.

        Returns:
            The one-line text.
        """
        where = f"{self.line}" if self.cell is None else f"cell {self.cell}:line {self.line}"
        return f"{self.path}:{where}:{self.col}: {self.code} {self.message} (fix: {self.fix})"

    def to_dict(self) -> dict[str, object]:
        """The finding as JSON-ready fields plus its ``severity`` (``error`` or ``warning``).

        ``cell`` is present only for a notebook's findings.

        Returns:
            ``{path, line, col, code, message, fix, severity}`` (and ``cell``).
        """
        out: dict[str, object] = dict(dataclasses.asdict(self))
        if self.cell is None:
            del out["cell"]
        out["severity"] = SEVERITY.get(self.code, "error")
        return out


@dataclasses.dataclass(frozen=True)
class LintError:
    """A path that could not be analysed (special file, too big, undecodable, unparsable).

    Attributes:
        path: the file, as given.
        message: why it was not analysed.
    """

    path: str
    message: str

    def format(self) -> str:
        """``path: error: message``.

        Returns:
            The one-line text.
        """
        return f"{self.path}: error: {self.message}"


class Aliases:
    """Maps local names to fully qualified names from a module's imports (anywhere in the file)."""

    def __init__(self, imports: Sequence[ast.Import | ast.ImportFrom]) -> None:
        self.names: dict[str, str] = {}
        for node in imports:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.names[alias.asname] = alias.name
                    else:
                        root = alias.name.split(".")[0]
                        self.names.setdefault(root, root)
            elif node.module and node.level == 0:
                for alias in node.names:
                    self.names[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def qualify(self, node: ast.AST) -> str | None:
        """``jnp.where`` → ``jax.numpy.where``; ``None`` if not a dotted name."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        base = self.names.get(node.id, node.id)
        return ".".join([base, *reversed(parts)]) if parts else base

    def is_jit(self, node: ast.AST) -> bool:
        """``jax.jit`` itself, or ``partial(jax.jit, …)``."""
        if self.qualify(node) in JIT_NAMES:
            return True
        return (
            isinstance(node, ast.Call)
            and bool(node.args)
            and self.qualify(node.func) in PARTIAL_NAMES
            and self.qualify(node.args[0]) in JIT_NAMES
        )

    def is_jit_decorator(self, node: ast.AST) -> bool:
        """``@jax.jit``, ``@jax.jit(...)`` style factories, or ``@partial(jax.jit, …)``."""
        return self.is_jit(node) or (isinstance(node, ast.Call) and self.is_jit(node.func))

    def jit_target(self, node: ast.AST) -> ast.Call | None:
        """If ``node`` is ``jit(target, …)`` (or ``partial(jit, …)(target)``), that call."""
        if isinstance(node, ast.Call) and node.args and self.is_jit(node.func):
            return node
        return None


def params(fn: ast.AST) -> list[str]:
    """Parameter names of a function or lambda, positional first."""
    if not isinstance(fn, (*FUNCS, ast.Lambda)):
        return []
    args = fn.args
    return [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]


def jit_keywords(site: ast.AST) -> list[ast.keyword]:
    """Keywords of a jit call or decorator, including those of ``partial(jax.jit, …)``."""
    if not isinstance(site, ast.Call):
        return []
    keywords = list(site.keywords)
    if isinstance(site.func, ast.Call):
        keywords += site.func.keywords
    return keywords


def _indices(kw: ast.keyword, names: Sequence[str], argnums: str, argnames: str) -> set[str]:
    values = kw.value.elts if isinstance(kw.value, (ast.Tuple, ast.List)) else [kw.value]
    out: set[str] = set()
    for v in values:
        if not isinstance(v, ast.Constant):
            continue
        if kw.arg == argnames and isinstance(v.value, str):
            out.add(v.value)
        elif kw.arg == argnums and isinstance(v.value, int) and -len(names) <= v.value < len(names):
            out.add(names[v.value])
    return out


def static_names(site: ast.AST, names: Sequence[str]) -> set[str]:
    """Parameter names made static by ``static_argnums``/``static_argnames``."""
    found: set[str] = set()
    for kw in jit_keywords(site):
        found |= _indices(kw, names, "static_argnums", "static_argnames")
    return found


def donated_names(site: ast.AST, names: Sequence[str]) -> set[str]:
    """Parameter names donated by ``donate_argnums``/``donate_argnames``."""
    found: set[str] = set()
    for kw in jit_keywords(site):
        found |= _indices(kw, names, "donate_argnums", "donate_argnames")
    return found


def const_int(node: ast.AST | None, consts: Mapping[str, int], depth: int = 0) -> int | None:
    """Value of an integer expression made of literals and known module constants, else ``None``
    (also for expressions nested deeper than 32 levels: a table, not a size)."""
    if depth > 32:
        return None
    if isinstance(node, ast.Constant):
        return (
            node.value if isinstance(node.value, int) and not isinstance(node.value, bool) else None
        )
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = const_int(node.operand, consts, depth + 1)
        return None if value is None else -value
    if isinstance(node, ast.BinOp) and isinstance(
        node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Pow)
    ):
        left = const_int(node.left, consts, depth + 1)
        right = const_int(node.right, consts, depth + 1)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.FloorDiv):
            return left // right if right else None
        return left**right if 0 <= right <= 64 and abs(left) < 2**16 else None  # no huge powers
    return None


def describe(target: ast.AST) -> str:
    """A short human name for what is being jitted."""
    if isinstance(target, ast.Lambda):
        return "a lambda"
    if isinstance(target, ast.Attribute):
        return f"the bound method `{ast.unparse(target)}`"
    if isinstance(target, ast.Name):
        return f"the local function `{target.id}`"
    return f"`{ast.unparse(target)}`"
