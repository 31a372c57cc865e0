"""JW010: ``jax.vmap(jax.grad(f))`` with the default ``in_axes``: the parameters are mapped too."""

from __future__ import annotations

import ast

from jaxwise.lint._core import FUNCS, const_int
from jaxwise.lint._index import Index

CODE = "JW010"
SUMMARY = "vmap(grad(f)) maps the differentiated parameters (default in_axes=0)"
_GRADS = frozenset({"jax.grad", "jax.value_and_grad"})
# What shared parameters are called; a per-example argument (logits, inputs) is meant to be mapped.
_PARAM_NAMES = frozenset({"params", "parameters", "weights", "w", "variables", "model", "net"})


def _looks_like_params(name: str) -> bool:
    return name in _PARAM_NAMES or "param" in name.lower() or name.lower().startswith("weight")


def _param_name(ix: Index, fn: ast.AST, argnum: int) -> str | None:
    """The differentiated parameter's name in the definition (a local def or a lambda)."""
    if isinstance(fn, ast.Name):
        defs = ix.defs_by_name().get(fn.id, [])
        fn = defs[0] if len(defs) == 1 else fn
    if isinstance(fn, (*FUNCS, ast.Lambda)):
        positional = [*fn.args.posonlyargs, *fn.args.args]
        return positional[argnum].arg if argnum < len(positional) else None
    return None


def _argnum(grad: ast.Call) -> int | None:
    kw = next((k.value for k in grad.keywords if k.arg == "argnums"), None)
    return 0 if kw is None else const_int(kw, {})


def _maps(in_axes: ast.AST | None) -> bool:
    """Whether ``in_axes`` is the default (absent or a bare ``0``): every argument mapped.

    An explicit tuple is a deliberate choice (per-ensemble-member parameters) and is left alone.
    """
    return in_axes is None or (isinstance(in_axes, ast.Constant) and in_axes.value == 0)


def _arity(ix: Index, fn: ast.AST, outer: ast.Call | None) -> int | None:
    """Number of positional arguments the gradient function takes (definition, or the call)."""
    if isinstance(fn, ast.Lambda):
        return len(fn.args.posonlyargs) + len(fn.args.args)
    if isinstance(fn, ast.Name):
        defs = ix.defs_by_name().get(fn.id, [])
        if len(defs) == 1 and isinstance(defs[0], FUNCS):
            return len(defs[0].args.posonlyargs) + len(defs[0].args.args)
    return (
        len(outer.args)
        if outer is not None and not any(isinstance(a, ast.Starred) for a in outer.args)
        else None
    )


def check(ix: Index) -> None:
    """Flag per-example gradients whose parameter argument is batched by default in_axes."""
    outer_of = {id(c.func): c for c, _ in ix.calls.get("()", ())}
    for vmap, _ in ix.calls_named("vmap"):
        if not vmap.args or ix.aliases.qualify(vmap.func) != "jax.vmap":
            continue
        grad = vmap.args[0]
        if not (
            isinstance(grad, ast.Call) and grad.args and ix.aliases.qualify(grad.func) in _GRADS
        ):
            continue
        argnum = _argnum(grad)
        in_axes = next((k.value for k in vmap.keywords if k.arg == "in_axes"), None)
        if in_axes is None and len(vmap.args) > 1:
            in_axes = vmap.args[1]
        outer = outer_of.get(id(vmap))
        arity = _arity(ix, grad.args[0], outer)
        if argnum is None or arity is None or arity < 2 or not _maps(in_axes):
            continue
        names = [_param_name(ix, grad.args[0], argnum)]
        if outer is not None and argnum < len(outer.args):
            names.append(ast.unparse(outer.args[argnum]).split(".")[-1])
        if not any(n and _looks_like_params(n) for n in names):
            continue  # the differentiated argument is per-example data (logits…): mapping is right
        fname = (
            ast.unparse(grad.args[0]) if not isinstance(grad.args[0], ast.Lambda) else "the lambda"
        )
        ix.add(
            vmap,
            CODE,
            f"jax.vmap over {ast.unparse(grad.func)}({fname}) maps argument {argnum} (the "
            "differentiated parameters) over axis 0 too: each example gets a different "
            "slice of the parameters, or a shape error",
            "keep the parameters unbatched: jax.vmap(…, in_axes=(None, 0, …)) with None at "
            f"position {argnum}",
        )
