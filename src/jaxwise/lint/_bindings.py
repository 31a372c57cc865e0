"""Module-level bindings: which names the module's own statements bind, to what, and where."""

from __future__ import annotations

import ast
from typing import NamedTuple

__all__ = ["Binding", "module_bindings"]


class Binding(NamedTuple):
    """A module-level binding: the statement, the bound value (or None), the if/try arm."""

    stmt: ast.stmt
    value: ast.AST | None
    arm: tuple[int, int] | None


def module_bindings(tree: ast.Module) -> dict[str, list[Binding]]:
    """Names bound by module-level statements (also inside module-level if/for/while/with/try)."""
    out: dict[str, list[Binding]] = {}

    def bind(
        target: ast.AST, stmt: ast.stmt, value: ast.AST | None, arm: tuple[int, int] | None
    ) -> None:
        if isinstance(target, ast.Name):
            out.setdefault(target.id, []).append(Binding(stmt, value, arm))
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                bind(elt, stmt, None, arm)

    def visit(body: list[ast.stmt], arm: tuple[int, int] | None) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    bind(target, stmt, stmt.value, arm)
            elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
                bind(
                    stmt.target, stmt, stmt.value if isinstance(stmt, ast.AnnAssign) else None, arm
                )
            elif isinstance(stmt, (ast.For, ast.While)):
                if isinstance(stmt, ast.For):
                    bind(stmt.target, stmt, stmt.iter, arm)
                visit(stmt.body, arm)
                visit(stmt.orelse, arm)
            elif isinstance(stmt, ast.If):
                visit(stmt.body, (id(stmt), 0))
                visit(stmt.orelse, (id(stmt), 1))
            elif isinstance(stmt, ast.Try | ast.TryStar):
                arms = [stmt.body + stmt.orelse, *[h.body for h in stmt.handlers]]
                for i, arm_body in enumerate(arms):
                    visit(arm_body, (id(stmt), i))
                visit(stmt.finalbody, arm)
            elif isinstance(stmt, ast.With):
                visit(stmt.body, arm)

    visit(tree.body, None)
    return out
