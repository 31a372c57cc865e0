"""``jaxwise lint``: a JAX-specific static analyzer (Python AST only: nothing is imported or run).

Rules (stable codes):

========  ====================================================================
JW001     ``jax.jit`` created inside a function or loop body and called there,
          wrapping a lambda, a closure or a bound method (a new function object
          each time: a recompile on every call)
JW002     a plain class (identity ``__hash__``) used as a static argument:
          equal configurations hash differently and recompile
JW003     the same PRNG key passed to two ``jax.random`` draws without a split
JW004     removed or deprecated JAX APIs (``jax.tree_map``, ``PRNGKey``, …)
JW005     a Python ``for`` over ``range(N ≥ 100)`` inside a jitted function
          (unrolled into the program)
JW006     a large module-level array read inside a jitted function (embedded
          as a constant: bigger programs, stale values, no gradient)
JW007     ``jnp.where(c, log(x) / sqrt(x) / a/x, …)`` without an inner where:
          NaN gradients where the unselected branch is singular
========  ====================================================================

Suppress one line with ``# noqa: JW001`` (or a bare ``# noqa``).

Example:
    >>> [f.code for f in lint_source("import jax\\nk = jax.random.PRNGKey(0)\\n")]
    ['JW004']
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

__all__ = ["RULES", "Finding", "LintError", "lint_paths", "lint_source"]

RULES = {
    "JW001": "jit created and called inside a function/loop body",
    "JW002": "plain class used as a static argument (hashed by identity)",
    "JW003": "PRNG key reused for two random draws",
    "JW004": "removed or deprecated JAX API",
    "JW005": "Python for-loop over a large range inside a jitted function",
    "JW006": "large module-level array captured by a jitted function",
    "JW007": "jnp.where hiding a singular log/sqrt/division (NaN gradients)",
}

_SEVERITY = {"JW004": "warning"}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One diagnostic: where, which rule, what is wrong and how to fix it."""

    path: str
    line: int
    col: int
    code: str
    message: str
    fix: str

    def format(self) -> str:
        """``path:line:col: CODE message (fix: …)`` — ruff/flake8 style."""
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message} (fix: {self.fix})"

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self) | {"severity": _SEVERITY.get(self.code, "error")}


@dataclasses.dataclass(frozen=True)
class LintError:
    """A file that could not be analysed (missing, not UTF-8, syntax error)."""

    path: str
    message: str

    def format(self) -> str:
        return f"{self.path}: error: {self.message}"


# --------------------------------------------------------------------------
# Names: resolve import aliases to dotted JAX names
# --------------------------------------------------------------------------


class _Aliases:
    """Maps local names to fully qualified names from the module's imports."""

    def __init__(self, nodes: list[ast.AST]) -> None:
        self.names: dict[str, str] = {}
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.names[alias.asname] = alias.name
                    else:
                        root = alias.name.split(".")[0]
                        self.names.setdefault(root, root)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    self.names[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def qualify(self, node: ast.AST) -> str | None:
        """``jnp.where`` → ``jax.numpy.where``; ``None`` if not a dotted name."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        base = self.names.get(node.id, node.id)
        return ".".join([base, *reversed(parts)])


_JIT_NAMES = {"jax.jit", "jax.pmap", "equinox.filter_jit"}
_PARTIAL_NAMES = {"functools.partial", "partial"}


def _is_jit(node: ast.AST, aliases: _Aliases) -> bool:
    """``jax.jit`` itself, or ``partial(jax.jit, …)``."""
    name = aliases.qualify(node)
    if name in _JIT_NAMES:
        return True
    if isinstance(node, ast.Call) and aliases.qualify(node.func) in _PARTIAL_NAMES and node.args:
        return aliases.qualify(node.args[0]) in _JIT_NAMES
    return False


def _jit_call_target(node: ast.AST, aliases: _Aliases) -> ast.Call | None:
    """If ``node`` is ``jit(target, …)`` (or ``partial(jit, …)(target)``), that call."""
    if isinstance(node, ast.Call) and node.args and _is_jit(node.func, aliases):
        return node
    return None


def _static_names(call_or_decorator: ast.AST, params: Sequence[str]) -> set[str]:
    """Parameter names made static by ``static_argnums``/``static_argnames`` keywords."""
    keywords: list[ast.keyword] = []
    if isinstance(call_or_decorator, ast.Call):
        keywords = list(call_or_decorator.keywords)
        func = call_or_decorator.func
        if isinstance(func, ast.Call):  # partial(jax.jit, static_argnames=…)(f)
            keywords += func.keywords
    names: set[str] = set()
    for kw in keywords:
        values = kw.value.elts if isinstance(kw.value, (ast.Tuple, ast.List)) else [kw.value]
        for v in values:
            if not isinstance(v, ast.Constant):
                continue
            if kw.arg == "static_argnames" and isinstance(v.value, str):
                names.add(v.value)
            elif kw.arg == "static_argnums" and isinstance(v.value, int) and 0 <= v.value < len(params):
                names.add(params[v.value])
    return names


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[str]:
    args = fn.args
    return [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]


# --------------------------------------------------------------------------
# The analyzer
# --------------------------------------------------------------------------

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


class _Analyzer:
    def __init__(self, tree: ast.Module, path: str) -> None:
        self.tree = tree
        self.path = path
        self.nodes = _walk_with_parents(tree)  # one pass over the AST; every rule reuses it
        self.aliases = _Aliases(self.nodes)
        self.findings: list[Finding] = []
        self.calls_by_name: dict[str, list[ast.Call]] = {}
        for node in self.nodes:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                self.calls_by_name.setdefault(node.func.id, []).append(node)
        self.jitted = self._jitted_functions()

    def add(self, node: ast.AST, code: str, message: str, fix: str) -> None:
        self.findings.append(Finding(self.path, node.lineno, node.col_offset + 1, code, message, fix))

    def run(self) -> list[Finding]:
        self.check_jit_in_bodies()
        self.check_static_classes()
        self.check_key_reuse()
        self.check_old_apis()
        self.check_large_loops()
        self.check_captured_arrays()
        self.check_where_singular()
        return sorted(set(self.findings), key=lambda f: (f.line, f.col, f.code))

    # -- which functions are jitted (decorated, or passed to jit anywhere) -----
    def _jitted_functions(self) -> dict[str, tuple[ast.AST, ast.AST]]:
        """name -> (function node, the jit decorator/call)."""
        defs: dict[str, ast.AST] = {}
        for node in self.nodes:
            if isinstance(node, _FUNCS):
                defs.setdefault(node.name, node)
        out: dict[str, tuple[ast.AST, ast.AST]] = {}
        for node in self.nodes:
            if isinstance(node, _FUNCS):
                for dec in node.decorator_list:
                    if _is_jit(dec, self.aliases) or (isinstance(dec, ast.Call) and _is_jit(dec.func, self.aliases)):
                        out[node.name] = (node, dec)
            call = _jit_call_target(node, self.aliases)
            if call is not None and isinstance(call.args[0], ast.Name) and call.args[0].id in defs:
                out.setdefault(call.args[0].id, (defs[call.args[0].id], call))
        return out

    # -- JW001 ------------------------------------------------------------------
    def check_jit_in_bodies(self) -> None:
        # Only scopes that contain a jit (call or decorator) can hold a JW001: find them via the parents.
        scopes: dict[int, ast.AST] = {}
        for node in self.nodes:
            site = isinstance(node, ast.Call) and (_is_jit(node.func, self.aliases) or _is_jit(node, self.aliases))
            site = site or (isinstance(node, _FUNCS) and any(
                _is_jit(d, self.aliases) or (isinstance(d, ast.Call) and _is_jit(d.func, self.aliases))
                for d in node.decorator_list))
            if not site:
                continue
            parent = getattr(node, "_parent", None)
            while parent is not None:
                if isinstance(parent, _FUNCS) or (isinstance(parent, (ast.For, ast.While))
                                                  and isinstance(getattr(parent, "_parent", None), ast.Module)):
                    scopes[id(parent)] = parent
                parent = getattr(parent, "_parent", None)
        for scope in scopes.values():
            where = f"`{scope.name}`" if isinstance(scope, _FUNCS) else "a loop"
            self._jit_in_scope(scope, scope.body, where)  # type: ignore[attr-defined]

    def _jit_in_scope(self, scope: ast.AST, body: list[ast.stmt], where: str) -> None:
        local_defs = {n.name for n in _walk_scope(body) if isinstance(n, _FUNCS)}
        jitted_locals: dict[str, ast.Call] = {}
        for node in _walk_scope(body):
            if isinstance(node, _FUNCS) and node is not scope:
                for dec in node.decorator_list:
                    if _is_jit(dec, self.aliases) or (isinstance(dec, ast.Call) and _is_jit(dec.func, self.aliases)):
                        jitted_locals[node.name] = node  # type: ignore[assignment]
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                call = _jit_call_target(node.value, self.aliases)
                if call is not None and self._recreated(call.args[0], local_defs):
                    jitted_locals[node.targets[0].id] = call
        for node in _walk_scope(body):
            if not isinstance(node, ast.Call):
                continue
            inner = _jit_call_target(node.func, self.aliases)
            if inner is not None and self._recreated(inner.args[0], local_defs):
                self.add(node, "JW001", f"jax.jit of {_describe(inner.args[0])} created and called inside {where}: "
                         "a new function object every time, so it is traced and compiled on every call",
                         "create the jitted function once (module level, or in __init__) and reuse it")
            elif isinstance(node.func, ast.Name) and node.func.id in jitted_locals:
                self.add(node, "JW001", f"`{node.func.id}` is jitted inside {where} and called there: it is "
                         "re-created, re-traced and re-compiled on every call",
                         "define and jit it once outside, passing what it closes over as arguments")

    @staticmethod
    def _recreated(target: ast.AST, local_defs: set[str]) -> bool:
        """Whether ``target`` is a new object each time: a lambda, a local def, a bound method, a partial."""
        if isinstance(target, ast.Lambda):
            return True
        if isinstance(target, ast.Name):
            return target.id in local_defs
        if isinstance(target, ast.Attribute):
            return isinstance(target.value, ast.Name)  # self.method / obj.method
        return isinstance(target, ast.Call)  # partial(f, …) and friends

    # -- JW002 ------------------------------------------------------------------
    def check_static_classes(self) -> None:
        plain = self._plain_classes()
        if not plain:
            return
        for name, (fn, jit_node) in self.jitted.items():
            params = _params(fn)  # type: ignore[arg-type]
            static = _static_names(jit_node, params)
            args = fn.args  # type: ignore[attr-defined]
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if arg.arg in static and isinstance(arg.annotation, ast.Name) and arg.annotation.id in plain:
                    self.add(arg, "JW002", f"static argument `{arg.arg}` of `{name}` is a `{arg.annotation.id}`, a "
                             "plain class hashed by identity: every new (even equal) instance recompiles",
                             "make it @dataclass(frozen=True) (value equality and hash) or register it with "
                             "jax.tree_util.register_static")
            for call in self.calls_by_name.get(name, []):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == name):
                    continue
                passed = list(zip(params, call.args)) + [(k.arg, k.value) for k in call.keywords if k.arg]
                for pname, value in passed:
                    if pname in static and isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
                            and value.func.id in plain:
                        self.add(value, "JW002", f"a new `{value.func.id}` (plain class, hashed by identity) is "
                                 f"passed as static argument `{pname}` of `{name}`: it recompiles every call",
                                 "make the class @dataclass(frozen=True), or create the instance once")

    def _plain_classes(self) -> set[str]:
        plain = set()
        for node in self.tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            decorators = {self.aliases.qualify(d.func if isinstance(d, ast.Call) else d) or "" for d in
                          node.decorator_list}
            if any(d.endswith(("dataclass", "register_static", "register_pytree_node_class", "register_dataclass",
                               "struct.dataclass")) for d in decorators):
                continue
            bases = {self.aliases.qualify(b) or "" for b in node.bases}
            if any(b.split(".")[-1] in ("NamedTuple", "Enum", "IntEnum", "tuple", "Module", "PyTreeNode", "str",
                                        "int", "frozenset") for b in bases):
                continue
            methods = {n.name for n in node.body if isinstance(n, _FUNCS)}
            if {"__eq__", "__hash__"} <= methods:
                continue
            plain.add(node.name)
        return plain

    # -- JW003 ------------------------------------------------------------------
    _KEY_MAKERS = {"split", "fold_in", "key", "PRNGKey", "key_data", "wrap_key_data", "clone", "key_impl"}

    def check_key_reuse(self) -> None:
        for fn in self.nodes:
            if isinstance(fn, _FUNCS):
                self._key_flow(fn.body, set())

    def _random_fn(self, call: ast.Call) -> str | None:
        name = self.aliases.qualify(call.func)
        if name and name.startswith("jax.random."):
            return name[len("jax.random."):]
        return None

    def _key_flow(self, body: list[ast.stmt], used: set[str]) -> set[str]:
        """Walk statements in order, tracking keys already consumed; returns the state after."""
        for stmt in body:
            if isinstance(stmt, (ast.If,)):
                self._key_uses(stmt.test, used)
                after_body = self._key_flow(stmt.body, set(used))
                after_else = self._key_flow(stmt.orelse, set(used))
                used = after_body | after_else
            elif isinstance(stmt, (ast.For, ast.While)):
                if isinstance(stmt, ast.For):
                    self._key_uses(stmt.iter, used)
                    self._reassign(stmt.target, used)
                first = self._key_flow(stmt.body, set(used))
                self._key_flow(stmt.body, first)  # a second iteration exposes reuse across iterations
                used = first | self._key_flow(stmt.orelse, set(used))
            elif isinstance(stmt, (ast.With, ast.Try)):
                inner = stmt.body + (stmt.finalbody if isinstance(stmt, ast.Try) else [])
                used = self._key_flow(inner, used)
            elif isinstance(stmt, _FUNCS + (ast.ClassDef,)):
                continue
            else:
                value = getattr(stmt, "value", None)
                self._key_uses(stmt if value is None else value, used)
                for target in getattr(stmt, "targets", []) or ([stmt.target] if isinstance(
                        stmt, (ast.AnnAssign, ast.AugAssign)) else []):
                    self._reassign(target, used)
        return used

    def _key_uses(self, node: ast.AST, used: set[str]) -> None:
        inner = list(ast.walk(node))
        calls = [n for n in inner if isinstance(n, ast.Call)]
        # Names bound by a comprehension (`for k in split(key, n)`) are fresh on every iteration.
        fresh = {n.id for c in inner if isinstance(c, ast.comprehension) for n in ast.walk(c.target)
                 if isinstance(n, ast.Name)}
        for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset)):
            fn = self._random_fn(call)
            key_arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "key"), None)
            if fn is None or not isinstance(key_arg, ast.Name) or key_arg.id in fresh:
                continue
            if fn in ("fold_in", "key_data", "key_impl", "clone", "wrap_key_data", "key", "PRNGKey"):
                continue
            name = key_arg.id
            if name in used:
                self.add(call, "JW003", f"key `{name}` was already used by an earlier random call "
                         f"(jax.random.{fn} reuses it: the draws are correlated or identical)",
                         f"split first: `{name}, sub = jax.random.split({name})` and use `sub`")
            used.add(name)

    @staticmethod
    def _reassign(target: ast.AST, used: set[str]) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                used.discard(node.id)

    # -- JW004 ------------------------------------------------------------------
    _OLD = {
        "jax.tree_map": ("removed", "jax.tree.map"),
        "jax.tree_leaves": ("removed", "jax.tree.leaves"),
        "jax.tree_flatten": ("removed", "jax.tree.flatten"),
        "jax.tree_unflatten": ("removed", "jax.tree.unflatten"),
        "jax.tree_structure": ("removed", "jax.tree.structure"),
        "jax.tree_transpose": ("removed", "jax.tree.transpose"),
        "jax.tree_util.build_tree": ("removed", "jax.tree.unflatten"),
        "jax.tree_util.register_keypaths": ("removed", "register the node with keys via "
                                            "jax.tree_util.register_pytree_with_keys"),
        "jax.random.PRNGKey": ("legacy", "jax.random.key (typed keys)"),
        "jax.numpy.randn": ("does not exist", "jax.random.normal(key, shape)"),
    }

    def check_old_apis(self) -> None:
        for node in self.nodes:
            if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "_parent", None), ast.Attribute):
                name = self.aliases.qualify(node)
                if name in self._OLD:
                    status, new = self._OLD[name]
                    self.add(node, "JW004", f"`{name}` is {status} in current JAX", f"use {new}")
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    name = f"{node.module}.{alias.name}"
                    if name in self._OLD:
                        status, new = self._OLD[name]
                        self.add(node, "JW004", f"`{name}` is {status} in current JAX", f"use {new}")

    # -- JW005 ------------------------------------------------------------------
    def check_large_loops(self) -> None:
        for name, (fn, _) in self.jitted.items():
            for node in ast.walk(fn):
                if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) \
                        and isinstance(node.iter.func, ast.Name) and node.iter.func.id == "range":
                    n = _range_length(node.iter)
                    if n is not None and n >= 100:
                        self.add(node, "JW005", f"Python loop of {n} iterations inside jitted `{name}` is unrolled "
                                 f"into the program ({n} copies of the body: slow compiles, big programs)",
                                 "use jax.lax.fori_loop or jax.lax.scan")

    # -- JW006 ------------------------------------------------------------------
    _ARRAY_MAKERS = ("numpy.", "jax.numpy.", "jax.random.")
    _THRESHOLD = 1000

    def check_captured_arrays(self) -> None:
        arrays: dict[str, int] = {}
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                name = self.aliases.qualify(node.value.func) or ""
                if name.startswith(self._ARRAY_MAKERS):
                    size = _literal_size(node.value, name)
                    if size is not None and size >= self._THRESHOLD:
                        for target in node.targets:
                            if isinstance(target, ast.Name):
                                arrays[target.id] = size
        if not arrays:
            return
        for name, (fn, _) in self.jitted.items():
            local = set(_params(fn)) | {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)  # type: ignore[arg-type]
                                        and isinstance(n.ctx, ast.Store)}
            reported = set()
            for node in ast.walk(fn):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in arrays \
                        and node.id not in local and node.id not in reported:
                    reported.add(node.id)
                    self.add(node, "JW006", f"module-level array `{node.id}` (~{arrays[node.id]:,} elements) is read "
                             f"inside jitted `{name}`: it is embedded in the program as a constant (bigger program, "
                             "stale if reassigned, no gradient)", f"pass `{node.id}` as an argument of `{name}`")

    # -- JW007 ------------------------------------------------------------------
    _SINGULAR = {"jax.numpy.log", "jax.numpy.sqrt", "jax.numpy.log2", "jax.numpy.log10", "jax.numpy.arccos",
                 "jax.numpy.arcsin", "jax.numpy.reciprocal", "jax.numpy.power", "jax.numpy.arctanh"}

    def check_where_singular(self) -> None:
        for node in self.nodes:
            if not (isinstance(node, ast.Call) and self.aliases.qualify(node.func) == "jax.numpy.where"
                    and len(node.args) >= 2):
                continue
            cond = ast.unparse(node.args[0])
            for branch in node.args[1:3]:
                operand = self._singular_operand(branch)
                if operand is None:
                    continue
                if isinstance(operand, ast.Call) and self.aliases.qualify(operand.func) == "jax.numpy.where":
                    continue  # the inner where supplies a safe value: the double-where idiom
                text = ast.unparse(operand)
                if re.search(rf"(?<![\w.]){re.escape(text)}(?![\w(])", cond):
                    self.add(node, "JW007", f"jnp.where({cond}, …) selects around a singular `{ast.unparse(branch)}`: "
                             f"the unselected branch still differentiates at bad `{text}`, giving NaN gradients",
                             "use jaxwise.numerics.double_where (or an inner jnp.where with a safe value)")

    def _singular_operand(self, branch: ast.AST) -> ast.AST | None:
        for node in ast.walk(branch):
            if isinstance(node, ast.Call) and self.aliases.qualify(node.func) in self._SINGULAR and node.args:
                return node.args[0]
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                return node.right
        return None


def _walk_scope(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Nodes of a body without descending into nested function or class definitions' bodies."""
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (*_FUNCS, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _describe(target: ast.AST) -> str:
    if isinstance(target, ast.Lambda):
        return "a lambda"
    if isinstance(target, ast.Attribute):
        return f"the bound method `{ast.unparse(target)}`"
    if isinstance(target, ast.Name):
        return f"the local function `{target.id}`"
    return f"`{ast.unparse(target)}`"


def _range_length(call: ast.Call) -> int | None:
    values = []
    for arg in call.args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, int):
            values.append(arg.value)
        else:
            return None
    if len(values) == 1:
        return values[0]
    if len(values) in (2, 3):
        step = values[2] if len(values) == 3 else 1
        return max(0, (values[1] - values[0] + step - 1) // step) if step > 0 else None
    return None


def _literal_size(call: ast.Call, name: str) -> int | None:
    """Element count of ``np.zeros((300, 300))``, ``jnp.arange(5000)``, ``np.eye(64)``, ``np.random.normal(size=…)``…"""
    if name.endswith((".eye", ".identity")):
        dims = [a.value for a in call.args[:2] if isinstance(a, ast.Constant) and isinstance(a.value, int)]
        return dims[0] * (dims[1] if len(dims) > 1 else dims[0]) if dims else None
    candidates: list[ast.AST] = [k.value for k in call.keywords if k.arg in ("shape", "size")]
    candidates += call.args[:1]
    for node in candidates:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List)) and all(
                isinstance(e, ast.Constant) and isinstance(e.value, int) for e in node.elts):
            size = 1
            for e in node.elts:
                size *= e.value  # type: ignore[attr-defined]
            return size
    return None


def _walk_with_parents(tree: ast.AST) -> list[ast.AST]:
    """Every node (breadth first), each child annotated with ``_parent``."""
    nodes: list[ast.AST] = [tree]
    i = 0
    while i < len(nodes):
        node = nodes[i]
        for child in ast.iter_child_nodes(node):
            child._parent = node  # type: ignore[attr-defined]
            nodes.append(child)
        i += 1
    return nodes


_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*))?", re.IGNORECASE)


def _suppressed(finding: Finding, lines: list[str]) -> bool:
    if not 1 <= finding.line <= len(lines):
        return False
    match = _NOQA.search(lines[finding.line - 1])
    if match is None:
        return False
    codes = match.group("codes")
    return codes is None or finding.code in {c.strip().upper() for c in codes.split(",")}


def lint_source(text: str, filename: str = "<string>", select: Iterable[str] | None = None,
                ignore: Iterable[str] | None = None) -> list[Finding]:
    """Analyse Python source text; return the findings (after ``# noqa`` and select/ignore).

    Raises:
      SyntaxError: the text is not valid Python.

    Example:
        >>> src = "import jax\\ndef f(x):\\n    return jax.jit(lambda y: y + 1)(x)\\n"
        >>> [f.format() for f in lint_source(src, "m.py")][0].split(" (fix")[0]
        'm.py:3:12: JW001 jax.jit of a lambda created and called inside `f`: a new function object every time, so it is traced and compiled on every call'
    """
    tree = ast.parse(text, filename=filename)
    findings = _Analyzer(tree, filename).run()
    lines = text.splitlines()
    selected = {c.upper() for c in select} if select else set(RULES)
    ignored = {c.upper() for c in ignore} if ignore else set()
    return [f for f in findings if f.code in selected and f.code not in ignored and not _suppressed(f, lines)]


def _python_files(path: Path) -> Iterator[Path]:
    if path.is_file():
        yield path
        return
    for child in sorted(path.rglob("*.py")):
        if any(part.startswith(".") or part == "__pycache__" for part in child.relative_to(path).parts[:-1]):
            continue
        yield child


def lint_paths(paths: Sequence[str | Path], select: Iterable[str] | None = None,
               ignore: Iterable[str] | None = None) -> tuple[list[Finding], list[LintError], int]:
    """Lint files and directories (recursing into ``*.py``).

    Returns:
      ``(findings, errors, files_checked)``; unreadable files and syntax
      errors are reported in ``errors`` and the other files still checked.
      A path that does not exist raises ``FileNotFoundError``.
    """
    for p in paths:
        if not Path(p).exists():
            raise FileNotFoundError(f"{p}: no such file or directory")
    findings: list[Finding] = []
    errors: list[LintError] = []
    count = 0
    for p in paths:
        for file in _python_files(Path(p)):
            count += 1
            try:
                text = file.read_bytes().decode("utf-8")
            except UnicodeDecodeError as err:
                errors.append(LintError(str(file), f"not UTF-8 ({err.reason} at byte {err.start}); skipped"))
                continue
            except OSError as err:
                errors.append(LintError(str(file), f"unreadable: {err.strerror}"))
                continue
            try:
                findings.extend(lint_source(text, str(file), select, ignore))
            except SyntaxError as err:
                errors.append(LintError(str(file), f"syntax error at line {err.lineno}: {err.msg}; skipped"))
            except RecursionError:
                errors.append(LintError(str(file), "too deeply nested to analyse; skipped"))
    return findings, errors, count
