"""JW003: one PRNG key passed to two ``jax.random`` calls without a split (functions, scripts).

Keys are followed by name (``key``) or attribute path (``self.key``); a draw inside a list
comprehension or generator reuses its key on every iteration unless the key is bound by the
comprehension; a module-level helper that draws from one of its parameters (``def
sample(key, n): return jax.random.normal(key, (n,))``) consumes the key passed there.
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


def _consumers(ix: Index) -> dict[str, tuple[int, str]]:
    """Module-level helpers that draw from a parameter: name → (position, parameter)."""
    out: dict[str, tuple[int, str]] = {}
    for name in DRAWS:
        for call, scope in ix.calls_named(name):
            key = _draw_key(ix, call)
            fn = scope
            while fn is not None and not isinstance(fn, FUNCS):
                fn = ix.outer.get(id(fn))
            if not isinstance(key, ast.Name) or fn is None or ix.outer.get(id(fn)) is not None:
                continue
            names = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
            if key.id in names:
                out.setdefault(fn.name, (names.index(key.id), key.id))
    return out


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
    for name in consumers:  # bodies calling a helper that draws consume keys too
        for _, scope in ix.calls.get(name, ()):
            fn = scope
            while fn is not None and not isinstance(fn, FUNCS):
                fn = ix.outer.get(id(fn))
            scopes.setdefault(id(fn), fn)
    for fn in scopes.values():
        _Flow(ix, consumers).run(fn.body if isinstance(fn, FUNCS) else ix.tree.body, set())


class _Flow:
    def __init__(self, ix: Index, consumers: dict[str, tuple[int, str]]) -> None:
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
        fn = _draw_name(self.ix, call)
        if fn is not None:
            return f"jax.random.{fn}", _draw_key(self.ix, call)
        name = call.func.id if isinstance(call.func, ast.Name) else None
        if name in self.consumers:
            position, param = self.consumers[name]
            key = call.args[position] if len(call.args) > position else None
            key = next((k.value for k in call.keywords if k.arg == param), key)
            return f"`{name}` (which draws from its `{param}`)", key
        return "", None

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
