"""JW007: ``jnp.where(c, f(x), …)`` around a singular ``f``, no inner where (NaN gradients)."""

from __future__ import annotations

import ast

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


_BOOLEAN = (ast.Compare, ast.BoolOp, ast.UnaryOp)


def _is_mask(value: ast.AST) -> bool:
    """``n > 0``, ``(a > 0) & (b > 0)``, ``not done``: an expression that makes a mask."""
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitAnd | ast.BitOr):
        return _is_mask(value.left) or _is_mask(value.right)
    return isinstance(value, _BOOLEAN)


def _tested(
    cond: ast.AST,
    scope: Scope,
    line: int,
    masks: dict[tuple[int, str], list[tuple[int, ast.AST]]],
) -> set[str]:
    """Texts of what the condition compares (``x`` in ``x > 0``), through masks assigned earlier
    in the same scope (``ok = n > 0; where(ok, …)``)."""
    tested = {ast.unparse(cond)}
    for node in ast.walk(cond):  # the condition of one where: small
        if isinstance(node, ast.Name):
            earlier = [v for ln, v in masks.get((id(scope), node.id), []) if ln < line]
            if earlier and _is_mask(earlier[-1]):
                tested |= _tested(earlier[-1], None, 0, {})
        elif isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                tested.add(ast.unparse(side))
                if isinstance(side, ast.Call) and len(side.args) == 1:  # jnp.abs(x) > 0
                    tested.add(ast.unparse(side.args[0]))
    return tested


def check(ix: Index) -> None:
    """Flag where calls whose condition tests the very value a branch is singular at."""
    masks: dict[tuple[int, str], list[tuple[int, ast.AST]]] = {}
    for node, scope in ix.calls_named("where"):
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
        tested = _tested(node.args[0], scope, node.lineno, masks)
        for branch, operand in operands:
            hit = next((f for f in _factors(operand) if ast.unparse(f) in tested), None)
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
