"""JW006: a large module-level array read inside a jitted function (embedded as a constant)."""

from __future__ import annotations

import ast

from jaxwise.lint._core import const_int
from jaxwise.lint._index import Index

CODE = "JW006"
SUMMARY = "large module-level array captured by a jitted function"
THRESHOLD = 1000
_MAKERS = ("numpy.", "jax.numpy.", "jax.random.")
_NOT_ARRAYS = frozenset(
    {
        "jax.random.key",
        "jax.random.PRNGKey",
        "jax.numpy.dtype",
        "numpy.dtype",
        "numpy.random.default_rng",
        "numpy.random.seed",
        "numpy.random.RandomState",
    }
)


def _shape_size(node: ast.AST, consts: dict[str, int]) -> int | None:
    if isinstance(node, (ast.Tuple, ast.List)):
        size = 1
        for elt in node.elts:
            dim = const_int(elt, consts)
            if dim is None:
                return None
            size *= dim
        return size
    return const_int(node, consts)


def literal_size(call: ast.Call, name: str, consts: dict[str, int]) -> int | None:
    """Element count of ``np.zeros((300, 300))``, ``jnp.arange(N)``, ``normal(k, (9, 9))``,
    ``jnp.linspace(0, 1, N)``, ``jnp.arange(start, stop, step)``."""
    if name.endswith((".linspace", ".logspace", ".geomspace")):
        num = call.args[2] if len(call.args) > 2 else None
        num = next((k.value for k in call.keywords if k.arg == "num"), num)
        return 50 if num is None else const_int(num, consts)  # NumPy's default num
    if name.endswith(".arange") and len(call.args) >= 2:
        start, stop = (const_int(a, consts) for a in call.args[:2])
        step = const_int(call.args[2], consts) if len(call.args) > 2 else 1
        if start is None or stop is None or not step:
            return None
        return max(0, -((start - stop) // step))
    if name.endswith((".eye", ".identity")):
        dims = [const_int(a, consts) for a in call.args[:2]]
        dims = [d for d in dims if d is not None]
        return dims[0] * (dims[1] if len(dims) > 1 else dims[0]) if dims else None
    candidates: list[ast.AST] = [k.value for k in call.keywords if k.arg in ("shape", "size")]
    if name.startswith("jax.random."):
        candidates += call.args[1:2]  # (key, shape, …)
    elif not name.startswith("numpy.random."):
        candidates += call.args[:1]
    for node in candidates:
        size = _shape_size(node, consts)
        if size is not None:
            return size
    return None


def module_arrays(ix: Index) -> dict[str, int]:
    """Module-level names bound to a literal-shaped array of ≥ THRESHOLD elements → size."""
    arrays: dict[str, int] = {}
    consts = ix.consts()
    for name, bindings in ix.bindings.items():
        for b in bindings:
            if not isinstance(b.value, ast.Call) or isinstance(b.stmt, ast.For):
                continue
            maker = ix.aliases.qualify(b.value.func) or ""
            if maker.startswith(_MAKERS) and maker not in _NOT_ARRAYS:
                size = literal_size(b.value, maker, consts)
                if size is not None and size >= THRESHOLD:
                    arrays[name] = max(size, arrays.get(name, 0))
    return arrays


def check(ix: Index) -> None:
    """Flag the first read of each large module array in each jitted function."""
    arrays = module_arrays(ix)
    if not arrays:
        return
    seen: set[tuple[int, str]] = set()
    for node, fn in ix.free_reads(set(arrays)):
        if (id(fn), node.id) in seen:
            continue
        seen.add((id(fn), node.id))
        ix.add(
            node,
            CODE,
            f"module-level array `{node.id}` (~{arrays[node.id]:,} elements) is read inside "
            f"jitted `{fn.name}`: it is embedded in the program as a constant (bigger "
            "program, stale if reassigned, no gradient)",
            f"pass `{node.id}` as an argument of `{fn.name}`",
        )
