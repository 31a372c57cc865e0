"""JW008: a Python scalar global that changes, read inside a jitted function (stale value)."""

from __future__ import annotations

import ast

from jaxwise.lint._core import FUNCS
from jaxwise.lint._index import Binding, Index

CODE = "JW008"
SUMMARY = "changing Python scalar global read inside a jitted function (stale value)"


def _is_scalar(node: ast.AST | None) -> bool:
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, (bool, int, float, complex))


def _scalar_loop(node: ast.AST | None) -> bool:
    """``for lr in (0.1, 0.01)`` / ``for n in range(3)``: the loop variable is a changing scalar."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return bool(node.elts) and all(_is_scalar(e) for e in node.elts)
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
    )


def _alternatives(bindings: list[Binding]) -> bool:
    """All bindings sit in different arms of one if/try: only one of them runs."""
    arms = [b.arm for b in bindings]
    return (
        all(a is not None for a in arms)
        and len({a[0] for a in arms if a}) == 1
        and len(set(arms)) == len(arms)
    )


def changing_scalars(ix: Index) -> dict[str, int]:
    """Module-level scalar names that are rebound after their first binding → line of the change.

    A name rebound only by module-level statements is left out when no module-level statement
    can call a jitted function before its last rebinding (``SCALE = 2.0`` under
    ``if __name__ == "__main__":`` before the first call: traced with the final value).
    """
    assigned_in_function: dict[str, int] = {}
    declared = {name for node, _ in ix.globals for name in node.names}
    for node, scope in ix.watched:
        if (
            node.id in declared
            and isinstance(node.ctx, ast.Store)
            and isinstance(scope, FUNCS)
            and node.id not in ix.locals_of(scope)
        ):  # a store that is not local: `global` here
            assigned_in_function.setdefault(node.id, node.lineno)
    out: dict[str, int] = {}
    for name, bindings in ix.bindings.items():
        loops = [b for b in bindings if isinstance(b.stmt, ast.For) and _scalar_loop(b.value)]
        scalar = loops or [b for b in bindings if _is_scalar(b.value)]
        if not scalar:
            continue
        if loops:
            out[name] = loops[0].stmt.lineno
        elif name in assigned_in_function:
            out[name] = assigned_in_function[name]
        elif (
            len(bindings) > 1
            and not _alternatives(bindings)
            and _called_before(ix, max(b.stmt.lineno for b in bindings[1:]))
        ):
            out[name] = bindings[1].stmt.lineno
    return out


def _module_level(ix: Index, scope: ast.AST | None) -> bool:
    return not any(isinstance(s, (*FUNCS, ast.Lambda)) for s in ix.scope_chain(scope))


def _called_before(ix: Index, line: int) -> bool:
    """Whether a module-level statement before ``line`` may call a jitted function: calls it,
    or calls a module function that (transitively) calls one."""
    callers = {j.name for j in ix.jitted() if j.name}
    defs = ix.defs_by_name()
    changed = True
    while changed:  # module functions calling a known caller become callers
        changed = False
        for name, fns in defs.items():
            if name in callers:
                continue
            if any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in callers
                for fn in fns
                for n in ast.walk(fn)
            ):
                callers.add(name)
                changed = True
    return any(
        call.lineno < line and _module_level(ix, scope)
        for name in callers
        for call, scope in ix.calls.get(name, ())
    )


def check(ix: Index) -> None:
    """Flag the first read of each changing scalar global in each jitted function."""
    changing = changing_scalars(ix)
    if not changing:
        return
    seen: set[tuple[int, str]] = set()
    for node, fn in ix.free_reads(set(changing)):
        if (id(fn), node.id) in seen:
            continue
        seen.add((id(fn), node.id))
        ix.add(
            node,
            CODE,
            f"global `{node.id}` is read inside jitted `{fn.name}`: its value is baked in "
            f"when `{fn.name}` is traced, so after `{node.id}` changes "
            f"(line {changing[node.id]}) the compiled function silently keeps the old value",
            f"pass `{node.id}` as an argument of `{fn.name}` "
            "(traced, or static if it changes the program)",
        )
