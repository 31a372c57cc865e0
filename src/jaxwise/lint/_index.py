"""One traversal of a module's AST that collects everything every rule needs.

The rules never walk the whole tree again: they read the index (calls by the
called name, function definitions and their enclosing scopes, assignments,
loops, reads of watched module-level names, imports) and the module's
top-level statements.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, NamedTuple

from jaxwise.lint._bindings import Binding, module_bindings
from jaxwise.lint._core import FUNCS, PARTIAL_NAMES, Aliases, Finding, const_int, params
from jaxwise.lint._hot import HotLines

__all__ = ["Binding", "Index", "Jitted", "Scope", "module_bindings"]

Scope = ast.AST | None  # a function, a lambda, a module-level loop, or None for the module
_EXIT = object()  # stack marker: leave the current scope
_ITEM_TARGETS = (ast.Subscript, ast.Attribute)
# Fields that never hold a node a rule needs (identifiers, flags, contexts, operators, returns).
_SKIP_FIELDS = frozenset(
    {
        "ctx",
        "name",
        "id",
        "attr",
        "arg",
        "module",
        "asname",
        "type_comment",
        "level",
        "conversion",
        "is_async",
        "kind",
        "names",
        "kwd_attrs",
        "simple",
        "op",
        "ops",
        "returns",
        "type_params",
    }
)
OLD_ATTRS = frozenset(
    {
        "tree_map",
        "tree_leaves",
        "tree_flatten",
        "tree_unflatten",
        "tree_structure",
        "tree_transpose",
        "build_tree",
        "register_keypaths",
        "PRNGKey",
        "randn",
    }
)


def _all_node_types() -> list[type]:
    out, todo = [], [ast.AST]
    while todo:
        t = todo.pop()
        out.append(t)
        todo.extend(t.__subclasses__())
    return out


_FIELDS: dict[type, tuple[str, ...]] = {
    t: tuple(f for f in getattr(t, "_fields", ()) if f not in _SKIP_FIELDS)
    for t in _all_node_types()
}
_FIELDS[type(None)] = ()


class _Kinds(dict[type, int]):
    """Node type → what the traversal does with it; anything else (a bool in
    ``MatchSingleton.value``, a future node type) is a leaf."""

    def __missing__(self, key: type) -> int:
        return 2


_KIND = _Kinds(dict.fromkeys(_all_node_types(), 0))
_KIND |= {
    ast.Name: 1,
    ast.Constant: 2,
    type(None): 2,
    ast.Nonlocal: 2,
    ast.Pass: 2,
    ast.Call: 3,
    ast.Attribute: 4,
    ast.Assign: 5,
    ast.FunctionDef: 6,
    ast.AsyncFunctionDef: 6,
    ast.Lambda: 7,
    ast.For: 8,
    ast.While: 8,
    ast.Import: 9,
    ast.ImportFrom: 9,
    ast.Global: 10,
    ast.MatchSingleton: 2,
}
_KIND.update(
    {
        t: 2
        for t in _all_node_types()
        if issubclass(t, ast.expr_context | ast.operator | ast.cmpop | ast.unaryop | ast.boolop)
    }
)


def _is_range(node: ast.AST) -> bool:
    return type(node) is ast.Call and type(node.func) is ast.Name and node.func.id == "range"


class Jitted(NamedTuple):
    """A function compiled by ``jit``: its def, the decorator or call, and the callable's name."""

    fn: ast.FunctionDef | ast.AsyncFunctionDef
    site: ast.AST
    name: str | None  # what callers call: the def's name (decorated) or the assigned name


class Index:
    """Everything the rules read, from one pass over the tree.

    Attributes:
        calls: called name (``f`` in ``f(…)`` and ``m.f(…)``; ``"()"`` for ``g(…)(…)``)
            → ``(call, scope)`` pairs.
        defs: every function definition with its enclosing scope.
        assigns: every ``name = value`` with its scope.
        item_assigns: every ``container[key] = value`` and ``obj.attr = value`` with its scope.
        watched: ``(Name node, scope)`` for every occurrence of a name bound at module level.
        bindings: module-level bindings by name (see ``module_bindings``).
    """

    def __init__(self, tree: ast.Module, path: str, text: str | None = None) -> None:
        self.tree, self.path = tree, path
        self.bindings = module_bindings(tree)
        self.findings: list[Finding] = []
        self.calls: defaultdict[str, list[tuple[ast.Call, Scope]]] = defaultdict(list)
        self.defs: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, Scope]] = []
        self.assigns: list[tuple[ast.Assign, Scope]] = []
        self.item_assigns: list[tuple[ast.Assign, Scope]] = []  # d[k] = v, obj.a = v
        self.range_loops: list[tuple[ast.For, Scope]] = []
        self.old_attrs: list[ast.Attribute] = []
        self.globals: list[tuple[ast.Global, Scope]] = []
        self.watched: list[tuple[ast.Name, Scope]] = []
        self.imports: list[ast.Import | ast.ImportFrom] = []
        self.outer: dict[int, Scope] = {}
        self._watch = frozenset(self.bindings)
        self._deferred: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        self._cache: dict[str, Any] = {}
        hot = self._hot = HotLines(text, tree) if text is not None else None
        self._traverse(list(tree.body), [None], hot)
        self.aliases = Aliases(self.imports)
        self._finish_deferred()

    def add(self, node: ast.AST, code: str, message: str, fix: str) -> None:
        """Record a finding at ``node``."""
        line, col = getattr(node, "lineno", 1), getattr(node, "col_offset", 0) + 1
        self.findings.append(Finding(self.path, line, col, code, message, fix))

    # -- the traversal -------------------------------------------------------------------
    def _traverse(self, body: list[Any], scopes: list[Scope], hot: HotLines | None) -> None:
        """Visit ``body`` in scope ``scopes[-1]``; function bodies without hot text are deferred."""
        stack: list[Any] = list(body)
        calls, watched, watch, kinds, fields = self.calls, self.watched, self._watch, _KIND, _FIELDS
        name_t, attr_t, call_t = ast.Name, ast.Attribute, ast.Call
        while stack:
            node = stack.pop()
            if node is _EXIT:
                scopes.pop()
                continue
            t = type(node)
            kind = kinds[t]
            if kind == 1:  # Name
                if node.id in watch:
                    watched.append((node, scopes[-1]))
                continue
            if kind == 2:  # leaves
                continue
            if kind == 3:  # Call
                f = node.func
                tf = type(f)
                if tf is attr_t:
                    calls[f.attr].append((node, scopes[-1]))
                elif tf is name_t or tf is call_t:
                    calls[f.id if tf is name_t else "()"].append((node, scopes[-1]))
            elif kind == 4:  # Attribute
                if node.attr in OLD_ATTRS:
                    self.old_attrs.append(node)
            elif kind == 5:  # Assign
                if len(node.targets) == 1 and type(node.targets[0]) is name_t:
                    self.assigns.append((node, scopes[-1]))
                elif len(node.targets) == 1 and type(node.targets[0]) in _ITEM_TARGETS:
                    self.item_assigns.append((node, scopes[-1]))
            elif kind == 6 or kind == 7:  # functions and lambdas
                self._enter(node, scopes, stack, hot)
                continue
            elif kind == 8:  # loops
                if t is ast.For and _is_range(node.iter):
                    self.range_loops.append((node, scopes[-1]))
                if scopes[-1] is None:  # a module-level loop is a scope of its own (JW001)
                    self._enter(node, scopes, stack, hot)
                    continue
            elif kind == 9:
                self.imports.append(node)
                continue
            elif kind == 10:
                self.globals.append((node, scopes[-1]))
                continue
            for field in fields.get(t, ()):
                value = getattr(node, field)
                if type(value) is list:
                    stack.extend(value)
                elif value is not None:
                    stack.append(value)

    def _enter(
        self, node: Any, scopes: list[Scope], stack: list[Any], hot: HotLines | None
    ) -> None:
        """Push a scope: decorators, defaults and a loop's iterable stay in the outer scope."""
        outer = scopes[-1]
        self.outer[id(node)] = outer
        if isinstance(node, (ast.For, ast.While)):
            stack.append(node.iter if isinstance(node, ast.For) else node.test)
            inner = (
                [node.target, *node.body, *node.orelse]
                if isinstance(node, ast.For)
                else [*node.body, *node.orelse]
            )
        else:
            a = node.args
            stack.extend(d for d in [*a.defaults, *a.kw_defaults] if d is not None)
            if isinstance(node, ast.Lambda):
                inner = [node.body]
            else:
                self.defs.append((node, outer))
                stack.extend(node.decorator_list)
                stack.extend(
                    x.annotation
                    for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]
                    if x.annotation is not None
                )
                if hot is not None and not hot.any(node):
                    self._deferred.append(node)  # nothing any rule looks for, unless it is jitted
                    return
                inner = list(node.body)
        stack.append(_EXIT)
        stack.extend(inner)
        scopes.append(node)

    def _finish_deferred(self) -> None:
        """Visit deferred bodies that turn out to matter: jitted, inside a jitted function, or
        calling a jitted (or donating) callable by name."""
        if not self._deferred:
            return
        names = {j.name for j in self.jitted() if j.name} | {
            self.assigned_name()[id(c)]
            for c, _ in self.jit_calls()
            if id(c) in self.assigned_name()
        }
        for factory in ("make_train_step", "make_train_epoch", "make_dp_train_epoch"):
            names.update(
                self.assigned_name()[id(c)]
                for c, _ in self.calls_named(factory)
                if id(c) in self.assigned_name()
            )
        hot = self._hot
        todo = [
            fn
            for fn in self._deferred
            if self.enclosing_jitted(fn) is not None
            or (hot is not None and any(n in hot.segment(fn) for n in names))
        ]
        if hot is not None:  # bodies passing keys to helpers that draw (JW003), transitively
            todo += self._callers_of_drawing_helpers(hot, {id(fn) for fn in todo})
        for fn in todo:
            self._traverse(list(fn.body), [*reversed(list(self.scope_chain(fn)))], None)
        self.aliases = Aliases(self.imports)  # imports inside the visited bodies count too
        self._cache.clear()

    def _callers_of_drawing_helpers(self, hot: HotLines, taken: set[int]) -> list[Any]:
        """Deferred bodies that call, by name, a function whose body draws random numbers
        (``def train(key): a = sample(key, 3); b = sample(key, 3)``): a key passed twice to
        such a helper is reused, though the caller's own text mentions no ``random``."""
        deferred = {id(fn) for fn in self._deferred}
        drawing = {
            fn.name
            for fn, _ in self.defs
            if id(fn) not in deferred and "random" in hot.segment(fn) or id(fn) in taken
        }
        found: list[Any] = []
        changed = bool(drawing)
        while changed:  # a helper of a helper: to a fixed point
            changed = False
            for fn in self._deferred:
                if id(fn) in taken:
                    continue
                text = hot.segment(fn)
                if any(f"{name}(" in text for name in drawing if name != fn.name):
                    taken.add(id(fn))
                    found.append(fn)
                    drawing.add(fn.name)
                    changed = True
        return found

    # -- derived views (computed once, on demand) ----------------------------------------
    def calls_named(self, name: str) -> list[tuple[ast.Call, Scope]]:
        """Calls of ``…name(…)``, also through a renamed import (``from jax import vmap as vm``)."""
        if "renamed" not in self._cache:
            renamed: dict[str, list[str]] = {}
            for local, full in self.aliases.names.items():
                last = full.rsplit(".", 1)[-1]
                if local != last:
                    renamed.setdefault(last, []).append(local)
            self._cache["renamed"] = renamed
        out = self.calls.get(name, [])
        for local in self._cache["renamed"].get(name, ()):
            out = out + self.calls.get(local, [])
        return out

    def consts(self) -> dict[str, int]:
        """Module-level integer constants (bound once, to an integer expression)."""
        if "consts" not in self._cache:
            consts: dict[str, int] = {}
            for name, bindings in self.bindings.items():
                if len(bindings) == 1 and isinstance(bindings[0].stmt, ast.Assign | ast.AnnAssign):
                    value = const_int(bindings[0].value, consts)
                    if value is not None:
                        consts[name] = value
            self._cache["consts"] = consts
        return self._cache["consts"]

    def scope_chain(self, scope: Scope) -> Iterator[ast.AST]:
        """``scope`` and its enclosing scopes, innermost first (the module is not included)."""
        while scope is not None:
            yield scope
            scope = self.outer.get(id(scope))

    def defs_by_name(self) -> dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]:
        """Function definitions by name (every scope)."""
        if "defs" not in self._cache:
            out: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
            for fn, _ in self.defs:
                out.setdefault(fn.name, []).append(fn)
            self._cache["defs"] = out
        return self._cache["defs"]

    def assigned_name(self) -> dict[int, str]:
        """``id(value)`` → target name, for every ``name = value``."""
        if "assigned" not in self._cache:
            self._cache["assigned"] = {
                id(a.value): a.targets[0].id
                for a, _ in self.assigns
                if isinstance(a.targets[0], ast.Name)
            }
        return self._cache["assigned"]

    def jit_calls(self) -> list[tuple[ast.Call, Scope]]:
        """``jit(target, …)`` and ``partial(jit, …)(target)`` calls with their scopes."""
        if "jit_calls" not in self._cache:
            found = []
            for key in ("jit", "pmap", "filter_jit", "filter_pmap", "()"):
                for call, scope in (
                    self.calls_named(key) if key != "()" else self.calls.get(key, ())
                ):
                    if self.aliases.jit_target(call) is not None:
                        found.append((call, scope))
            self._cache["jit_calls"] = found
        return self._cache["jit_calls"]

    def jitted(self) -> list[Jitted]:
        """Every function that is compiled: decorated with jit, or passed by name to jit."""
        if "jitted" not in self._cache:
            out: list[Jitted] = []
            for fn, _ in self.defs:
                out.extend(
                    Jitted(fn, d, fn.name)
                    for d in fn.decorator_list
                    if self.aliases.is_jit_decorator(d)
                )
            defs, assigned = self.defs_by_name(), self.assigned_name()
            for call, _ in self.jit_calls():
                target = self.unpartial(call.args[0])
                if isinstance(target, ast.Name) and target.id in defs:
                    out.append(Jitted(defs[target.id][0], call, assigned.get(id(call))))
            self._cache["jitted"] = out
        return self._cache["jitted"]

    def unpartial(self, target: ast.AST) -> ast.AST:
        """``functools.partial(f, …)`` → ``f`` (what ``jax.jit(partial(step, cfg=…))`` traces)."""
        while (
            isinstance(target, ast.Call)
            and target.args
            and self.aliases.qualify(target.func) in PARTIAL_NAMES
        ):
            target = target.args[0]
        return target

    def jitted_by_fn(self) -> dict[int, list[Jitted]]:
        """``id(function def)`` → its jit sites."""
        if "by_fn" not in self._cache:
            out: dict[int, list[Jitted]] = {}
            for j in self.jitted():
                out.setdefault(id(j.fn), []).append(j)
            self._cache["by_fn"] = out
        return self._cache["by_fn"]

    def enclosing_jitted(self, scope: Scope) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The innermost jitted function that contains ``scope`` (or is it)."""
        by_fn = self.jitted_by_fn()
        for s in self.scope_chain(scope):
            if id(s) in by_fn and isinstance(s, FUNCS):
                return s
        return None

    def locals_of(self, scope: ast.AST) -> set[str]:
        """Watched names bound in ``scope`` (parameters, stores) minus its ``global`` names."""
        if "stores" not in self._cache:
            stores: dict[int, set[str]] = {}
            for node, s in self.watched:
                if isinstance(node.ctx, ast.Store | ast.Del):
                    stores.setdefault(id(s), set()).add(node.id)
            declared: dict[int, set[str]] = {}
            for node, s in self.globals:
                declared.setdefault(id(s), set()).update(node.names)
            self._cache["stores"], self._cache["declared"] = stores, declared
        key = f"locals{id(scope)}"
        if key not in self._cache:
            stores, declared = self._cache["stores"], self._cache["declared"]
            self._cache[key] = (set(params(scope)) | stores.get(id(scope), set())) - declared.get(
                id(scope), set()
            )
        return self._cache[key]

    def free_reads(
        self, names: set[str]
    ) -> Iterator[tuple[ast.Name, ast.FunctionDef | ast.AsyncFunctionDef]]:
        """Reads of module-level ``names`` inside jitted functions: ``(Name, jitted function)``."""
        for node, scope in self.watched:
            if node.id not in names or not isinstance(node.ctx, ast.Load):
                continue
            fn = self.enclosing_jitted(scope)
            if fn is None:
                continue
            shadowed = False
            for s in self.scope_chain(scope):
                if node.id in self.locals_of(s):
                    shadowed = True
                    break
                if s is fn:
                    break
            if not shadowed:
                yield node, fn
