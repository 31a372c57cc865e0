"""JW006: a large array read inside a jitted function from outside it (embedded as a constant).

The array is bound at module level or in a function enclosing the jitted one (a closure), by
an array maker (``jnp.arange(4096)``) or an expression of one (``jnp.arange(4096.0) / 4096``,
``np.arange(4096).reshape(64, 64)``, ``jnp.arange(N)[:, None]``).
"""

from __future__ import annotations

import ast
import math

from jaxwise.lint._core import const_int, params
from jaxwise.lint._index import Index

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef
CODE = "JW006"
SUMMARY = "large array captured by a jitted function (module level or a closure)"
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


def _number(node: ast.AST | None, consts: dict[str, int]) -> float | None:
    """``const_int``, also for a float literal (``4096.0``, ``0.01``, ``-0.5``)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _number(node.operand, consts)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.Constant) and isinstance(node.value, float):
        return node.value if math.isfinite(node.value) else None
    return const_int(node, consts)


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
    if name.endswith(".arange"):
        given = dict(zip(("start", "stop", "step"), call.args, strict=False))
        given |= {k.arg: k.value for k in call.keywords if k.arg in ("start", "stop", "step")}
        if "stop" not in given:  # arange(stop)
            given = {"stop": given["start"]} if "start" in given else {}
        start = _number(given.get("start"), consts) if "start" in given else 0
        stop = _number(given.get("stop"), consts)
        step = _number(given["step"], consts) if "step" in given else 1
        if start is None or stop is None or not step:
            return None
        return max(0, math.ceil((stop - start) / step))  # NumPy's length, float steps too
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


def array_size(ix: Index, value: ast.AST | None, consts: dict[str, int]) -> int | None:
    """Elements of the array an expression makes: a maker call, or arithmetic, indexing, a
    method (``.reshape``, ``.astype``) or ``.T`` of one."""
    for _ in range(16):  # peel `(…).reshape(…)`, `(…)[:, None]`, `(…).T`
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
            maker = ix.aliases.qualify(value.func) or ""
            if maker.startswith(_MAKERS):
                break
            value = value.func.value
        elif isinstance(value, ast.Subscript | ast.Attribute):
            value = value.value
        elif isinstance(value, ast.UnaryOp):
            value = value.operand
        else:
            break
    if isinstance(value, ast.BinOp):  # a chain `a + b + c ...`: its sides without recursion
        sides: list[ast.expr] = []
        stack: list[ast.expr] = [value]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.BinOp):
                stack += (node.right, node.left)
            else:
                sides.append(node)
        sizes = [array_size(ix, side, consts) for side in sides]
        return max((s for s in sizes if s is not None), default=None)
    if not isinstance(value, ast.Call):
        return None
    maker = ix.aliases.qualify(value.func) or ""
    if maker.startswith(_MAKERS) and maker not in _NOT_ARRAYS:
        return literal_size(value, maker, consts)
    return None


def module_arrays(ix: Index) -> dict[str, int]:
    """Module-level names bound to a literal-shaped array of ≥ THRESHOLD elements → size."""
    arrays: dict[str, int] = {}
    consts = ix.consts()
    for name, bindings in ix.bindings.items():
        for b in bindings:
            if isinstance(b.stmt, ast.For):
                continue
            size = array_size(ix, b.value, consts)
            if size is not None and size >= THRESHOLD:
                arrays[name] = max(size, arrays.get(name, 0))
    return arrays


def _closure_reads(ix: Index) -> list[tuple[ast.Name, FunctionNode, int]]:
    """Reads, inside a jitted function, of a large array bound in a function enclosing it:
    ``(Name, jitted def, size)``, the first read of each name per jitted function."""
    consts: dict[str, int] = ix.consts()
    out: list[tuple[ast.Name, FunctionNode, int]] = []
    local: dict[int, dict[str, int]] = {}  # enclosing function → its large arrays
    for a, scope in ix.assigns:
        target = a.targets[0]
        if scope is not None and isinstance(target, ast.Name):
            size = array_size(ix, a.value, consts)
            if size is not None and size >= THRESHOLD:
                local.setdefault(id(scope), {})[target.id] = size
    if not local:
        return out
    for j in {id(j.fn): j for j in ix.jitted()}.values():
        captured: dict[str, int] = {}
        for s in list(ix.scope_chain(j.fn))[1:]:
            captured = local.get(id(s), {}) | captured  # the innermost binding wins
        bound = set(params(j.fn)) | {
            n.id
            for n in ast.walk(j.fn)
            if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)
        }
        reads = sorted(
            (n for n in ast.walk(j.fn) if isinstance(n, ast.Name) and n.id in captured),
            key=lambda n: (n.lineno, n.col_offset),
        )
        seen: set[str] = set()
        for node in reads:
            if node.id not in bound | seen:
                seen.add(node.id)
                out.append((node, j.fn, captured[node.id]))
    return out


def check(ix: Index) -> None:
    """Flag the first read of each large captured array in each jitted function."""
    arrays = module_arrays(ix)
    seen: set[tuple[int, str]] = set()
    found: list[tuple[ast.Name, FunctionNode, str, int]] = [
        (node, fn, "module-level array", arrays[node.id])
        for node, fn in (ix.free_reads(set(arrays)) if arrays else ())
    ]
    found += [(node, fn, "array", size) for node, fn, size in _closure_reads(ix)]
    for node, fn, kind, size in found:
        if (id(fn), node.id) in seen:
            continue
        seen.add((id(fn), node.id))
        ix.add(
            node,
            CODE,
            f"{kind} `{node.id}` (~{size:,} elements) is read inside jitted `{fn.name}` "
            "from outside it: it is embedded in the program as a constant (bigger program, "
            "stale if reassigned, no gradient)",
            f"pass `{node.id}` as an argument of `{fn.name}`",
        )
