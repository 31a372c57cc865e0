"""JW003: one PRNG key passed to two ``jax.random`` calls without a split (functions, scripts).

Keys are followed by name (``key``) or attribute path (``self.key``); a draw inside a list
comprehension or generator reuses its key on every iteration unless the key is bound by the
comprehension; a helper that draws from one of its parameters (``def sample(key, n): return
jax.random.normal(key, (n,))``; module-level, nested or a method, the key positional or
keyword-only, directly or through another such helper) consumes the key passed there, as does
an Equinox layer built with ``key=``.
"""

from __future__ import annotations

import ast

from jaxwise.lint._core import FUNCS
from jaxwise.lint._index import Index

CODE = "JW003"
SUMMARY = "PRNG key reused for two random draws"
# Calls that consume a key's randomness (jax.random's samplers, and split).
DRAWS = frozenset(
    {
        "split",
        "normal",
        "uniform",
        "bernoulli",
        "categorical",
        "randint",
        "permutation",
        "choice",
        "truncated_normal",
        "gumbel",
        "logistic",
        "laplace",
        "exponential",
        "gamma",
        "loggamma",
        "beta",
        "dirichlet",
        "poisson",
        "cauchy",
        "multivariate_normal",
        "rademacher",
        "maxwell",
        "orthogonal",
        "pareto",
        "t",
        "weibull_min",
        "double_sided_maxwell",
        "ball",
        "binomial",
        "chisquare",
        "f",
        "generalized_normal",
        "geometric",
        "lognormal",
        "rayleigh",
        "triangular",
        "wald",
        "bits",
        "multinomial",
        "shuffle",
    }
)


def _draw_name(ix: Index, call: ast.Call) -> str | None:
    name = ix.aliases.qualify(call.func)
    if name and name.startswith("jax.random.") and name[11:] in DRAWS:
        return name[11:]
    return None


def _key_text(node: ast.AST | None) -> str | None:
    """``key`` or ``self.key``: a key followed by name, else ``None``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and _key_text(node.value) is not None:
        return f"{_key_text(node.value)}.{node.attr}"
    return None


Consumer = tuple[int | None, str]  # (position among the call's arguments, parameter name)


def _own_calls(fn: ast.AST) -> list[ast.Call]:
    """Calls in ``fn``'s body, not in the functions defined inside it."""
    out, todo = [], list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        if isinstance(node, (*FUNCS, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Call):
            out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], list[str]]:
    """Positional parameters as callers pass them (``self``/``cls`` dropped) and keyword-only."""
    positional = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
    if positional and positional[0] in ("self", "cls"):
        positional = positional[1:]
    return positional, [a.arg for a in fn.args.kwonlyargs]


def _consumers(ix: Index) -> dict[str, Consumer]:
    """Helpers (module-level, nested, methods) that consume a parameter: they draw from it, pass
    it to an Equinox layer's ``key=``, or pass it on to another such helper (``def init(key):
    return sample(key, 3)``) → name → (position, parameter)."""
    out: dict[str, Consumer] = {}
    if not any(_draw_name(ix, c) for n in DRAWS for c, _ in ix.calls_named(n)) and not any(
        (ix.aliases.qualify(c.func) or "").startswith("equinox.nn.")
        for n in ix.calls
        if n[:1].isupper()
        for c, _ in ix.calls[n]
    ):
        return out  # nothing draws: no helper can consume a key
    bodies = [(fn, _own_calls(fn)) for fn, _ in ix.defs]
    changed = True
    while changed:  # a fixed point: helpers of helpers
        changed = False
        for fn, calls in bodies:
            if fn.name in out:
                continue
            positional, keyword = _signature(fn)
            for call in calls:
                _, key = _consumed_key(ix, out, call)
                if isinstance(key, ast.Name) and key.id in positional + keyword:
                    where = positional.index(key.id) if key.id in positional else None
                    out[fn.name] = (where, key.id)
                    changed = True
                    break
    return out


def _consumed_key(
    ix: Index, consumers: dict[str, Consumer], call: ast.Call
) -> tuple[str, ast.AST | None]:
    """``(what consumes it, the key expression)`` for a draw, an Equinox layer built with
    ``key=``, or a call of a consuming helper (by name or as a method)."""
    fn = _draw_name(ix, call)
    if fn is not None:
        return f"jax.random.{fn}", _draw_key(ix, call)
    qualified = ix.aliases.qualify(call.func) or ""
    if qualified.startswith("equinox.nn."):
        key = next((k.value for k in call.keywords if k.arg == "key"), None)
        return (f"`{qualified}` (which initialises from its `key`)", key) if key else ("", None)
    func = call.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    if name in consumers:
        position, param = consumers[name]
        key = call.args[position] if position is not None and len(call.args) > position else None
        key = next((k.value for k in call.keywords if k.arg == param), key)
        return f"`{name}` (which draws from its `{param}`)", key
    return "", None


def _draw_key(ix: Index, call: ast.Call) -> ast.AST | None:
    if _draw_name(ix, call) is None:
        return None
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg == "key"), None)


def check(ix: Index) -> None:
    """Follow keys statement by statement in every body that draws random numbers."""
    scopes: dict[int, ast.AST | None] = {}
    for name in DRAWS:
        for call, scope in ix.calls_named(name):
            if _draw_name(ix, call) is None:
                continue
            fn = scope
            while fn is not None and not isinstance(fn, FUNCS):  # lambdas and top-level loops
                fn = ix.outer.get(id(fn))
            scopes.setdefault(id(fn), fn)
    consumers = _consumers(ix)
    layers = [n for n in ix.calls if n[:1].isupper()]  # eqx.nn.Linear(…, key=key)
    for name in [*consumers, *layers]:  # bodies calling a helper that draws consume keys too
        for call, scope in ix.calls.get(name, ()):
            if name not in consumers and not _consumed_key(ix, consumers, call)[0]:
                continue
            fn = scope
            while fn is not None and not isinstance(fn, FUNCS):
                fn = ix.outer.get(id(fn))
            scopes.setdefault(id(fn), fn)
    for fn in scopes.values():
        _Flow(ix, consumers).run(fn.body if isinstance(fn, FUNCS) else ix.tree.body, set())


class _Flow:
    def __init__(self, ix: Index, consumers: dict[str, Consumer]) -> None:
        self.ix = ix
        self.consumers = consumers

    def run(self, body: list[ast.stmt], used: set[str], repeat: bool = True) -> set[str]:
        """Walk statements in order, tracking keys already consumed; returns the state after.

        A loop body is walked a second time (``repeat``) to expose reuse across iterations;
        loops inside that second walk are walked once, so the work stays polynomial in the
        nesting depth (not ``2**depth``).
        """
        for stmt in body:
            if isinstance(stmt, ast.If):
                self.uses(stmt.test, used)
                used = self.run(stmt.body, set(used), repeat) | self.run(
                    stmt.orelse, set(used), repeat
                )
            elif isinstance(stmt, (ast.For, ast.While)):
                if isinstance(stmt, ast.For):
                    self.uses(stmt.iter, used)
                    _reassign(stmt.target, used)
                first = self.run(stmt.body, set(used), repeat)
                if repeat:  # a second iteration exposes reuse across iterations
                    self.run(stmt.body, first, repeat=False)
                used = first | self.run(stmt.orelse, set(used), repeat)
            elif isinstance(stmt, (ast.With, ast.Try)):
                inner = stmt.body + (stmt.finalbody if isinstance(stmt, ast.Try) else [])
                used = self.run(inner, used, repeat)
            elif isinstance(stmt, (*FUNCS, ast.ClassDef)):
                continue
            else:
                value = getattr(stmt, "value", None)
                self.uses(stmt if value is None else value, used)
                targets = getattr(stmt, "targets", None) or (
                    [stmt.target] if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) else []
                )
                for target in targets:
                    _reassign(target, used)
        return used

    def _consumed(self, call: ast.Call) -> tuple[str, ast.AST | None]:
        """``(what consumes it, the key expression)`` for a draw or a drawing helper."""
        return _consumed_key(self.ix, self.consumers, call)

    def uses(self, node: ast.AST, used: set[str]) -> None:
        inner = list(ast.walk(node))  # one statement's expression: small
        calls = [n for n in inner if isinstance(n, ast.Call)]
        # Names bound by a comprehension (`for k in split(key, n)`) are fresh on every iteration.
        fresh = {
            n.id
            for c in inner
            if isinstance(c, ast.comprehension)
            for n in ast.walk(c.target)
            if isinstance(n, ast.Name)
        }
        repeated = {  # calls evaluated once per iteration of a comprehension
            id(n)
            for c in inner
            if isinstance(c, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp))
            for part in ([c.key, c.value] if isinstance(c, ast.DictComp) else [c.elt])
            for n in ast.walk(part)
        }
        for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset)):
            what, key_node = self._consumed(call)
            key = _key_text(key_node)
            if not what or key is None or key.split(".")[0] in fresh:
                continue
            if key in used:
                self._report(call, key, f"{what} reuses it: the draws are correlated or identical")
            elif id(call) in repeated:
                self._report(
                    call, key, f"{what} draws from it on every iteration of the comprehension"
                )
            used.add(key)

    def _report(self, call: ast.Call, key: str, why: str) -> None:
        self.ix.add(
            call,
            CODE,
            f"key `{key}` was already used by an earlier random call ({why})"
            if "reuses" in why
            else f"key `{key}` is reused: {why}, so every draw is the same",
            f"split first: `{key}, sub = jax.random.split({key})` and use `sub` (in a "
            f"comprehension: `for k in jax.random.split({key}, n)`)",
        )


def _reassign(target: ast.AST, used: set[str]) -> None:
    for node in ast.walk(target):
        text = _key_text(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        if text is not None:
            used.discard(text)
            used.difference_update({k for k in used if k.startswith(text + ".")})
