"""JW011: a zero-copy NumPy view of a leaf that is later donated (donation silently cancelled)."""

from __future__ import annotations

import ast
from typing import NamedTuple

from jaxwise.lint._core import donated_names, params
from jaxwise.lint._index import Index

CODE = "JW011"
SUMMARY = "np.asarray view of an array that is later donated (donation silently cancelled)"
_TRAIN_FACTORIES = ("make_train_step", "make_train_epoch", "make_dp_train_epoch")


class Donor(NamedTuple):
    """A callable that donates some arguments: by position, and by keyword name."""

    positions: frozenset[int]
    names: frozenset[str]


def _donors(ix: Index) -> dict[str, Donor]:
    donors: dict[str, Donor] = {}
    for jitted in ix.jitted():
        names = params(jitted.fn)
        donated = donated_names(jitted.site, names)
        if donated and jitted.name:
            donors[jitted.name] = Donor(
                frozenset(names.index(n) for n in donated), frozenset(donated)
            )
    assigned = ix.assigned_name()
    for call, _ in ix.jit_calls():  # jax.jit(imported_fn, donate_argnums=0)
        nums = [k.value for k in call.keywords if k.arg == "donate_argnums"]
        if id(call) in assigned and assigned[id(call)] not in donors and nums:
            values = nums[0].elts if isinstance(nums[0], (ast.Tuple, ast.List)) else [nums[0]]
            positions = {
                v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, int)
            }
            donors[assigned[id(call)]] = Donor(frozenset(positions), frozenset())
    for factory in _TRAIN_FACTORIES:
        for call, _ in ix.calls_named(factory):
            off = any(
                k.arg == "donate" and isinstance(k.value, ast.Constant) and not k.value.value
                for k in call.keywords
            )
            if (
                id(call) in assigned
                and not off
                and (ix.aliases.qualify(call.func) or "").startswith("jaxwise")
            ):
                donors[assigned[id(call)]] = Donor(frozenset({0}), frozenset({"state"}))
    return donors


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _kept(ix: Index) -> set[int]:
    """``id`` of every value that outlives its statement: assigned to a name, stored into a
    container item or an attribute (``history["w"] = v``), or appended to a list."""
    kept = set(ix.assigned_name()) | {id(a.value) for a, _ in ix.item_assigns}
    for call, _ in ix.calls.get("append", ()):
        if isinstance(call.func, ast.Attribute) and len(call.args) == 1:
            kept.add(id(call.args[0]))
    return kept


def _views(ix: Index) -> list[tuple[ast.Call, ast.AST | None, str]]:
    """Views that are kept (in a variable, a container item, an attribute, a list); a temporary
    view inside an expression (``assert np.asarray(x).all()``) is gone before any later call."""
    out = []
    kept = _kept(ix)
    for key in ("asarray", "array"):
        for call, scope in ix.calls_named(key):
            if id(call) not in kept:
                continue
            name = ix.aliases.qualify(call.func)
            no_copy = any(
                k.arg == "copy" and isinstance(k.value, ast.Constant) and k.value.value is False
                for k in call.keywords
            )
            if call.args and (name == "numpy.asarray" or (name == "numpy.array" and no_copy)):
                root = _root(call.args[0])
                if root is not None:
                    out.append((call, scope, root))
    return out


def check(ix: Index) -> None:
    """Flag views whose root variable is passed, later in the same body, to a donated position."""
    donors = _donors(ix)
    if not donors:
        return
    for view, scope, root in _views(ix):
        for donor_name, donor in donors.items():
            later = [
                c
                for c, s in ix.calls.get(donor_name, ())
                if s is scope
                and (c.lineno > view.lineno or _same_loop(ix, scope, view, c))
                and isinstance(c.func, ast.Name)
                and _donates(c, donor, root)
            ]
            if later:
                ix.add(
                    view,
                    CODE,
                    f"`{ast.unparse(view)}` is a zero-copy view of `{root}`, which "
                    f"`{donor_name}` donates on line {later[0].lineno}: while the view lives "
                    "the buffer cannot be reused, so the donation is silently cancelled "
                    "(CPU; JAX does not warn)",
                    "keep a real copy: np.array(x, copy=True) or jaxwise.tree.host_copy(tree)",
                )
                break


def _same_loop(ix: Index, scope: ast.AST | None, view: ast.Call, call: ast.Call) -> bool:
    """Both inside one loop of ``scope``: the next iteration's call comes after the view."""
    if isinstance(scope, (ast.For, ast.While)):  # a module-level loop is a scope of its own
        return True
    body = ix.tree.body if scope is None else [scope]
    for node in (n for b in body for n in ast.walk(b)):
        if isinstance(node, (ast.For, ast.While)) and node is not scope:
            end = node.end_lineno or node.lineno
            if (
                node.lineno <= min(view.lineno, call.lineno)
                and max(view.lineno, call.lineno) <= end
            ):
                return True
    return False


def _donates(call: ast.Call, donor: Donor, root: str) -> bool:
    passed = [a for i, a in enumerate(call.args) if i in donor.positions]
    passed += [k.value for k in call.keywords if k.arg in donor.names]
    return any(_root(a) == root for a in passed)
