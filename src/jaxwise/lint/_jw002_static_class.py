"""JW002: a plain class (identity ``__hash__``) used as a static argument of a jitted function."""

from __future__ import annotations

import ast

from jaxwise.lint._core import params, static_names
from jaxwise.lint._index import Index

CODE = "JW002"
SUMMARY = "plain class used as a static argument (hashed by identity)"
_VALUE_DECORATORS = (
    "dataclass",
    "register_static",
    "register_pytree_node_class",
    "register_dataclass",
    "struct.dataclass",
    "dataclass_transform",
)
_VALUE_BASES = frozenset(
    {
        "NamedTuple",
        "Enum",
        "IntEnum",
        "StrEnum",
        "Flag",
        "tuple",
        "Module",
        "PyTreeNode",
        "str",
        "int",
        "float",
        "frozenset",
        "bytes",
    }
)


def plain_classes(ix: Index) -> set[str]:
    """Module-level classes that keep ``object``'s identity ``__eq__``/``__hash__``."""
    plain = set()
    for node in ix.tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        decorators = {
            ix.aliases.qualify(d.func if isinstance(d, ast.Call) else d) or ""
            for d in node.decorator_list
        }
        if any(d.endswith(_VALUE_DECORATORS) for d in decorators):
            continue
        bases = {(ix.aliases.qualify(b) or "").split(".")[-1] for b in node.bases}
        if bases & _VALUE_BASES or node.keywords:  # metaclass=… may define equality
            continue
        methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        if "__hash__" in methods or "__eq__" in methods:
            continue  # an __eq__ without __hash__ is unhashable: JAX raises a clear error itself
        if any(
            isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__hash__" for t in n.targets)
            for n in node.body
        ):
            continue
        plain.add(node.name)
    return plain


def check(ix: Index) -> None:
    """Flag plain-class static parameters (by annotation) and plain instances passed as static."""
    plain = plain_classes(ix)
    if not plain:
        return
    for jitted in ix.jitted():
        names = params(jitted.fn)
        static = static_names(jitted.site, names)
        if not static:
            continue
        label = jitted.name or jitted.fn.name
        args = jitted.fn.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if (
                arg.arg in static
                and isinstance(arg.annotation, ast.Name)
                and arg.annotation.id in plain
            ):
                ix.add(
                    arg,
                    CODE,
                    f"static argument `{arg.arg}` of `{label}` is a `{arg.annotation.id}`, "
                    "a plain class hashed by identity: every new (even equal) instance recompiles",
                    "make it @dataclass(frozen=True) (value equality and hash) or register it with "
                    "jax.tree_util.register_static",
                )
        if jitted.name is not None:
            _call_sites(ix, jitted.name, names, static, plain)


def _call_sites(ix: Index, name: str, names: list[str], static: set[str], plain: set[str]) -> None:
    for call, _ in ix.calls.get(name, ()):
        if not isinstance(call.func, ast.Name):
            continue
        passed = list(zip(names, call.args)) + [(k.arg, k.value) for k in call.keywords if k.arg]
        for pname, value in passed:
            if (
                pname in static
                and isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id in plain
            ):
                ix.add(
                    value,
                    CODE,
                    f"a new `{value.func.id}` (plain class, hashed by identity) is passed as "
                    f"static argument `{pname}` of jitted `{name}`: it recompiles on every call",
                    "make the class @dataclass(frozen=True), or create the instance once",
                )
