"""JW001: ``jax.jit`` created inside a function or loop body and called there.

A function run once per process (``main()``, called once from the module, not in a loop)
may create its jitted functions where it likes: only a jit created inside one of its loops is
flagged there. ``jax.jit(model.apply)`` re-creates its target when ``model`` is an instance of
a class (a Flax linen module's ``apply`` is a new bound method on every access); a NamedTuple
field such as Haiku's ``net.apply`` or Optax's ``opt.update`` is the same object every time.
"""

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


def _recreated(target: ast.AST, local_defs: set[str], instances: set[str]) -> bool:
    """Whether ``target`` is new each time: a lambda, a local def, a bound method, a partial."""
    if isinstance(target, ast.Lambda):
        return True
    if isinstance(target, ast.Name):
        return target.id in local_defs
    if isinstance(target, ast.Attribute):
        # `self.method` or `model.apply` (model = MLP()) is a new bound-method object on every
        # access; `module.function` or a NamedTuple's function field (`opt.update`) is the same
        # object, so JAX's cache hits.
        return isinstance(target.value, ast.Name) and (
            target.value.id in ("self", "cls") or target.value.id in instances
        )
    return isinstance(target, ast.Call)  # partial(f, …) and friends


def _is_class(func: ast.AST) -> bool:
    """``MLP(…)``, ``nn.Dense(…)``: a call of a class (by the naming convention)."""
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return bool(name) and name[0].isupper()


# Annotations of values whose `.apply`/`.update` is a NamedTuple field (the same object).
_FIELD_HOLDERS = frozenset({"Transformed", "TransformedWithState", "GradientTransformation"})


def _class_like(node: ast.AST | None) -> bool:
    """An annotation naming a class (``MLP``, ``nn.Module``), not a NamedTuple of functions."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return bool(name) and name[0].isupper() and name not in _FIELD_HOLDERS | {"Any", "Callable"}


def _returns_instance(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A factory (``def create_model(): return CNN(…)``) whose returns are all class calls
    (directly or through a local name bound to one)."""
    made = {
        a.targets[0].id
        for a in ast.walk(fn)
        if isinstance(a, ast.Assign)
        and isinstance(a.targets[0], ast.Name)
        and isinstance(a.value, ast.Call)
        and _is_class(a.value.func)
    }
    values = [r.value for r in ast.walk(fn) if isinstance(r, ast.Return) and r.value is not None]
    return bool(values) and all(
        (isinstance(v, ast.Call) and _is_class(v.func))
        or (isinstance(v, ast.Name) and v.id in made)
        for v in values
    )


def _is_instance_value(ix: Index, value: ast.AST | None, known: set[str]) -> bool:
    """``MLP(…)``, a name already known as an instance, or a call of a local factory."""
    if isinstance(value, ast.Name):
        return value.id in known
    if not isinstance(value, ast.Call):
        return False
    if _is_class(value.func):
        return True
    factory = value.func.id if isinstance(value.func, ast.Name) else None
    defs = ix.defs_by_name().get(factory, ()) if factory else ()
    return any(_returns_instance(f) for f in defs)


def _passed_instance(ix: Index, fn: ast.AST, index: int, name: str, known: set[str]) -> bool:
    """Whether a caller of ``fn`` passes an instance as its parameter ``name`` (at ``index``)."""
    if not isinstance(fn, FUNCS):
        return False
    for call, _ in ix.calls.get(fn.name, ()):
        if not isinstance(call.func, ast.Name):
            continue
        value = call.args[index] if index < len(call.args) else None
        value = next((k.value for k in call.keywords if k.arg == name), value)
        if _is_instance_value(ix, value, known):
            return True
    return False


def _instances(ix: Index, scope: Scope) -> set[str]:
    """Names bound to a class instance in ``scope``, around it, or in the module: ``model =
    MLP()``, ``model = create_model()`` (a local factory returning one), a parameter annotated
    with a class (``net: nn.Module``) or passed one by a caller (``train(MLP(), …)``)."""
    chain = list(ix.scope_chain(scope))
    ids = {id(s) for s in chain} | {id(None)}
    found: set[str] = set()
    for name, bindings in ix.bindings.items():
        if any(_is_instance_value(ix, b.value, found) for b in bindings):
            found.add(name)
    for a, s in ix.assigns:
        if isinstance(a.targets[0], ast.Name) and id(s) in ids:
            if _is_instance_value(ix, a.value, found):
                found.add(a.targets[0].id)
    for s in chain:
        if not isinstance(s, FUNCS):
            continue
        args = [*s.args.posonlyargs, *s.args.args, *s.args.kwonlyargs]
        for i, arg in enumerate(args):
            if _class_like(arg.annotation) or (
                arg.annotation is None and _passed_instance(ix, s, i, arg.arg, found)
            ):
                found.add(arg.arg)
    return found


def _field_holder_value(ix: Index, value: ast.AST | None) -> bool:
    """A value whose ``.apply`` is a NamedTuple field: ``hk.transform(f)``, ``optax.adam(…)``,
    a local factory not returning an instance, or a name bound to one of these."""
    if isinstance(value, ast.Name):
        return any(_field_holder_value(ix, b.value) for b in ix.bindings.get(value.id, ()))
    return (
        isinstance(value, ast.Call)
        and not _is_class(value.func)
        and not _is_instance_value(ix, value, set())
    )


def _untyped(ix: Index, scope: Scope) -> set[str]:
    """Unannotated parameters of the functions around ``scope`` that no visible caller shows
    to be a NamedTuple of functions: ``jax.jit(net.apply)`` in a loop on one of these is a new
    bound method on every iteration whenever ``net`` is a class instance (a Flax module)."""
    found: set[str] = set()
    for s in ix.scope_chain(scope):
        if not isinstance(s, FUNCS):
            continue
        args = [*s.args.posonlyargs, *s.args.args, *s.args.kwonlyargs]
        for i, arg in enumerate(args):
            if arg.annotation is not None or arg.arg in ("self", "cls"):
                continue
            passed = []
            for call, _ in ix.calls.get(s.name, ()):
                value = call.args[i] if i < len(call.args) else None
                passed.append(next((k.value for k in call.keywords if k.arg == arg.arg), value))
            if not any(_field_holder_value(ix, v) for v in passed):
                found.add(arg.arg)
    return found


def _in_loop(fn: ast.AST, node: ast.AST) -> bool:
    """Whether ``node`` sits inside a ``for``/``while`` loop of ``fn``'s body."""
    line = getattr(node, "lineno", 0)
    return any(
        isinstance(n, (ast.For, ast.While)) and n.lineno <= line <= (n.end_lineno or n.lineno)
        for n in ast.walk(fn)
        if n is not fn
    )


def _runs_once(ix: Index, scope: Scope) -> bool:
    """A module-level function called exactly once, by a module-level statement outside any
    loop (``main()`` under ``if __name__ == "__main__":``)."""
    if not isinstance(scope, FUNCS) or ix.outer.get(id(scope)) is not None:
        return False
    calls = ix.calls.get(scope.name, ())
    return len(calls) == 1 and calls[0][1] is None and isinstance(calls[0][0].func, ast.Name)


def _seen(ix: Index, scope: Scope, site: ast.AST) -> set[str]:
    """The names taken for class instances at ``site``: `_instances`, and in a loop the
    untyped parameters too (a jit re-created per iteration on a guess costs a note; missed,
    it costs a compile per iteration)."""
    found = _instances(ix, scope)
    loop = isinstance(scope, (ast.For, ast.AsyncFor, ast.While))
    if loop or (isinstance(scope, FUNCS) and _in_loop(scope, site)):
        found |= _untyped(ix, scope)
    return found


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
        if scope is None or not _recreated(
            call.args[0], local_defs.get(id(scope), set()), _seen(ix, scope, call)
        ):
            continue
        if id(call) in assigned:
            jitted_locals[(id(scope), assigned[id(call)])] = call
    for outer, scope in ix.calls.get("()", ()):
        inner = ix.aliases.jit_target(outer.func)
        if (
            scope is not None
            and inner is not None
            and _recreated(inner.args[0], local_defs.get(id(scope), set()), _seen(ix, scope, outer))
            and not (_runs_once(ix, scope) and not _in_loop(scope, outer))
        ):
            ix.add(
                outer,
                CODE,
                f"jax.jit of {describe(inner.args[0])} created and called inside "
                f"{_where(scope)}: a new function object every time, so it is traced and "
                "compiled on every call",
                "create the jitted function once (module level, or in __init__) and reuse it",
            )
    for (scope_id, name), site in jitted_locals.items():
        for call, scope in ix.calls.get(name, ()):
            if id(scope) != scope_id or not isinstance(call.func, ast.Name):
                continue
            if scope is not None and _runs_once(ix, scope) and not _in_loop(scope, site):
                continue  # created once per process: compiled once
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
