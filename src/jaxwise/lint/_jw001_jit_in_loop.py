"""JW001: ``jax.jit`` created inside a function or loop body and called there."""

from __future__ import annotations

import ast

from jaxwise.lint._core import FUNCS, describe
from jaxwise.lint._index import Index, Scope

CODE = "JW001"
SUMMARY = "jit created and called inside a function/loop body"


def _again(scope: ast.AST) -> str:
    if isinstance(scope, FUNCS):
        return f"every time `{scope.name}` runs"
    return "every time the lambda runs" if isinstance(scope, ast.Lambda) else "on every iteration"


def _where(scope: ast.AST) -> str:
    if isinstance(scope, FUNCS):
        return f"`{scope.name}`"
    return "a lambda" if isinstance(scope, ast.Lambda) else "a loop"


def _recreated(target: ast.AST, local_defs: set[str]) -> bool:
    """Whether ``target`` is new each time: a lambda, a local def, a bound method, a partial."""
    if isinstance(target, ast.Lambda):
        return True
    if isinstance(target, ast.Name):
        return target.id in local_defs
    if isinstance(target, ast.Attribute):
        # `self.method` is a new bound-method object on every access; `module.function` or a
        # NamedTuple's function field (`opt.update`) is the same object, so JAX's cache hits.
        return isinstance(target.value, ast.Name) and target.value.id in ("self", "cls")
    return isinstance(target, ast.Call)  # partial(f, …) and friends


def check(ix: Index) -> None:
    """Find jitted callables re-created on every execution of a body and called in it."""
    local_defs: dict[int, set[str]] = {}
    for fn, scope in ix.defs:
        local_defs.setdefault(id(scope), set()).add(fn.name)
    jitted_locals: dict[tuple[int, str], ast.AST] = {}  # (scope, name) -> the jit site
    for fn, scope in ix.defs:
        if scope is not None and any(ix.aliases.is_jit_decorator(d) for d in fn.decorator_list):
            jitted_locals[(id(scope), fn.name)] = fn
    assigned = ix.assigned_name()
    for call, scope in ix.jit_calls():
        if scope is None or not _recreated(call.args[0], local_defs.get(id(scope), set())):
            continue
        if id(call) in assigned:
            jitted_locals[(id(scope), assigned[id(call)])] = call
    for outer, scope in ix.calls.get("()", ()):
        inner = ix.aliases.jit_target(outer.func)
        if (
            scope is not None
            and inner is not None
            and _recreated(inner.args[0], local_defs.get(id(scope), set()))
        ):
            ix.add(
                outer,
                CODE,
                f"jax.jit of {describe(inner.args[0])} created and called inside "
                f"{_where(scope)}: a new function object every time, so it is traced and "
                "compiled on every call",
                "create the jitted function once (module level, or in __init__) and reuse it",
            )
    for (scope_id, name), _ in jitted_locals.items():
        for call, scope in ix.calls.get(name, ()):
            if id(scope) == scope_id and isinstance(call.func, ast.Name):
                _report_local(ix, call, name, scope)


def _report_local(ix: Index, call: ast.Call, name: str, scope: Scope) -> None:
    assert scope is not None
    ix.add(
        call,
        CODE,
        f"`{name}` is jitted inside {_where(scope)} and called there: it is re-created, "
        f"re-traced and re-compiled {_again(scope)}",
        "define and jit it once outside, passing what it closes over as arguments",
    )
