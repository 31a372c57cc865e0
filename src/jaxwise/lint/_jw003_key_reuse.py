"""JW003: one PRNG key passed to two ``jax.random`` calls without a split (functions, scripts)."""

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
    for fn in scopes.values():
        _Flow(ix).run(fn.body if isinstance(fn, FUNCS) else ix.tree.body, set())


class _Flow:
    def __init__(self, ix: Index) -> None:
        self.ix = ix

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
        for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset)):
            fn = _draw_name(self.ix, call)
            key = (
                call.args[0]
                if call.args
                else next((k.value for k in call.keywords if k.arg == "key"), None)
            )
            if fn is None or not isinstance(key, ast.Name) or key.id in fresh:
                continue
            if key.id in used:
                self.ix.add(
                    call,
                    CODE,
                    f"key `{key.id}` was already used by an earlier random call "
                    f"(jax.random.{fn} reuses it: the draws are correlated or identical)",
                    f"split first: `{key.id}, sub = jax.random.split({key.id})` and use `sub`",
                )
            used.add(key.id)


def _reassign(target: ast.AST, used: set[str]) -> None:
    for node in ast.walk(target):
        if isinstance(node, ast.Name):
            used.discard(node.id)
