"""JW007: ``jnp.where(c, f(x), …)`` around a singular ``f``, no inner where (NaN gradients)."""

from __future__ import annotations

import ast
import re

from jaxwise.lint._index import Index, Scope

CODE = "JW007"
SUMMARY = "jnp.where hiding a singular log/sqrt/division (NaN gradients)"
_SINGULAR = frozenset(
    {
        "log",
        "sqrt",
        "log2",
        "log10",
        "arccos",
        "arcsin",
        "reciprocal",
        "power",
        "arctanh",
        "rsqrt",
        "log1p",
    }
)
_GUARDS = frozenset(
    {
        "where",
        "maximum",
        "minimum",
        "clip",
        "fmax",
        "fmin",
        "double_where",
        "safe_sqrt",
        "safe_log",
        "safe_div",
        "safe_norm",
        "stop_gradient",
    }
)


def _guarded(operand: ast.AST) -> bool:
    """The operand already passes through a guard (inner where, maximum, clip, …)."""
    if isinstance(operand, ast.Call):
        f = operand.func
        return (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")) in _GUARDS
    return False


def _factors(node: ast.AST) -> list[ast.AST]:
    """``a * (b * c)`` → ``[a * (b * c), a, b * c, b, c]``: each factor can be the zero."""
    out = [] if isinstance(node, ast.Constant) else [node]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        out += _factors(node.left) + _factors(node.right)
    return out


def _operands(ix: Index, branch: ast.AST) -> list[ast.AST]:
    """Singular operands in a branch: arguments of log/sqrt/… and denominators."""
    out: list[ast.AST] = []
    for node in ast.walk(branch):  # one where branch: small
        if isinstance(node, ast.Call) and node.args:
            name = ix.aliases.qualify(node.func) or ""
            if name.startswith("jax.numpy.") and name[10:] in _SINGULAR:
                out.append(node.args[0])
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            out.append(node.right)
    return [o for o in out if not _guarded(o)]


def _mask_text(
    ix: Index,
    cond: ast.AST,
    scope: Scope,
    line: int,
    masks: dict[tuple[int, str], list[tuple[int, ast.AST]]],
) -> str:
    """The condition's text, plus what its names were assigned earlier (``ok = n > 0``)."""
    parts = [ast.unparse(cond)]
    names = (
        [cond]
        if isinstance(cond, ast.Name)
        else [n for n in ast.walk(cond) if isinstance(n, ast.Name)]
    )
    for name in names:
        assert isinstance(name, ast.Name)
        earlier = [v for ln, v in masks.get((id(scope), name.id), []) if ln < line]
        if earlier:
            parts.append(ast.unparse(earlier[-1]))
    return " ; ".join(parts)


def check(ix: Index) -> None:
    """Flag where calls whose condition tests the very value a branch is singular at."""
    masks: dict[tuple[int, str], list[tuple[int, ast.AST]]] = {}
    for node, scope in ix.calls.get("where", ()):
        if len(node.args) < 2 or ix.aliases.qualify(node.func) != "jax.numpy.where":
            continue
        operands = [(b, o) for b in node.args[1:3] for o in _operands(ix, b)]
        if not operands:
            continue
        if not masks:
            for assign, s in ix.assigns:
                target = assign.targets[0]
                assert isinstance(target, ast.Name)
                masks.setdefault((id(s), target.id), []).append((assign.lineno, assign.value))
        cond = _mask_text(ix, node.args[0], scope, node.lineno, masks)
        for branch, operand in operands:
            hit = next(
                (
                    f
                    for f in _factors(operand)
                    if re.search(rf"(?<![\w.]){re.escape(ast.unparse(f))}(?![\w(])", cond)
                ),
                None,
            )
            if hit is not None:
                ix.add(
                    node,
                    CODE,
                    f"jnp.where({ast.unparse(node.args[0])}, …) selects around a singular "
                    f"`{ast.unparse(branch)}`: the unselected branch still differentiates at bad "
                    f"`{ast.unparse(hit)}`, giving NaN gradients",
                    "use jaxwise.numerics.double_where (or an inner jnp.where with a safe value)",
                )
                break
