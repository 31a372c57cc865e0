"""The user's own arguments of a watched call, when a library stands between the user and JIT.

Equinox's ``filter_jit`` jits a wrapper ``fun_wrapped(dynamic_donate, dynamic_nodonate,
static)``: the arrays of every argument in one flat tuple, the rest (Python numbers, strings,
the tree structure) in one static argument. JAX's own cache-miss explanation then names
``static`` or ``dynamic_nodonate['rest'][29]``. `user_arguments` rebuilds the user's
arguments (names from the user function's signature) from that form, as Equinox itself does
(``hashable_combine``), and `explain` tells why a call compiled at that level: each argument's
tree structure, its arrays' types and its other leaves' values (static under ``filter_jit``).
Only run when a watched Equinox function compiles (rare), or for transfers and donations.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxwise.compilation import Difference

__all__ = ["Signature", "explain", "is_equinox", "signature", "user_arguments"]

_EQX_PARAMETERS = ("dynamic_donate", "dynamic_nodonate", "static")
_MAX_REPR = 60
_EQUINOX_DIR = f"{os.sep}equinox{os.sep}"

# name -> (tree structure text, ((path, "array" | "value", text), ...))
Signature = dict[str, tuple[str, tuple[tuple[str, str, str], ...]]]


def is_equinox(fun: Any) -> bool:
    """True for the wrapper that Equinox's ``filter_jit`` hands to ``jax.jit``."""
    code = getattr(fun, "__code__", None)
    return (
        code is not None
        and code.co_varnames[:3] == _EQX_PARAMETERS
        and _EQUINOX_DIR in code.co_filename
    )


def _combine(dynamic: Any, static: Any) -> Any:
    """Equinox's ``hashable_combine``: the static leaves where present, else the dynamic."""
    static_leaves, treedef = static
    leaves = [d if s is None else s for d, s in zip(dynamic, static_leaves)]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _parameter_names(fun: Any, count: int) -> list[str]:
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(count):
        if i < len(params) and params[i].kind != params[i].VAR_POSITIONAL:
            names.append(params[i].name)
        else:
            names.append(f"args[{i}]")
    return names


def user_arguments(args: Sequence[Any], kwargs: dict[str, Any]) -> list[tuple[str, Any]] | None:
    """``(name, value)`` of each user argument of an Equinox ``filter_jit`` call.

    Args:
        args: the arguments Equinox passed to the jitted wrapper.
        kwargs: its keyword arguments (none, for Equinox).

    Returns:
        The user's arguments in order (keyword arguments last), or ``None`` when ``args`` is
        not Equinox's form.
    """
    if len(args) != 3 or kwargs:
        return None
    try:
        dynamic = {**args[0], **args[1]}
        static_fun, static_first, static_rest = args[2]
        fun = _combine(dynamic["fun"], static_fun)
        first = _combine(dynamic["first"], static_first)
        rest, keywords = _combine(dynamic["rest"], static_rest)
    except (TypeError, ValueError, KeyError):
        return None
    positional = ((first, *rest))[:-1]  # Equinox appends a dummy None
    named = list(zip(_parameter_names(fun, len(positional)), positional))
    return named + list(keywords.items())


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _leaf(leaf: Any) -> tuple[str, str]:
    if isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
        aval = jax.typeof(leaf)
        weak = "{weak_type=True}" if getattr(aval, "weak_type", False) else ""
        return "array", aval.str_short(short_dtypes=True) + weak
    return "value", _short(leaf)


def signature(arguments: Sequence[tuple[str, Any]]) -> Signature:
    """Each argument's tree structure and leaves: arrays by type, other leaves by value."""
    out: Signature = {}
    for name, value in arguments:
        flat, treedef = jax.tree_util.tree_flatten_with_path(value)
        leaves = tuple((jax.tree_util.keystr(p), *_leaf(leaf)) for p, leaf in flat)
        out[name] = (str(treedef), leaves)
    return out


def _common_path(paths: list[str]) -> str:
    """The longest path that every one of ``paths`` starts with (whole keys only)."""
    prefix = os.path.commonprefix(paths)
    while prefix and not all(p[len(prefix) : len(prefix) + 1] in ("", "[", ".") for p in paths):
        prefix = prefix[:-1]
    return prefix


def _array_kind(old: str, new: str) -> str:
    if old.split("{")[0] == new.split("{")[0]:
        return "weak_type"
    if old.split("[")[0] == new.split("[")[0]:
        return "shape"
    return "dtype"


def _argument_differences(name: str, old: Any, new: Any) -> list[Difference]:
    (old_tree, old_leaves), (new_tree, new_leaves) = old, new
    if old_tree != new_tree:
        old_paths = {p for p, _, _ in old_leaves}
        new_paths = {p for p, _, _ in new_leaves}
        where = name + _common_path(sorted(old_paths ^ new_paths))
        return [Difference("structure", where, _short(old_tree), _short(new_tree))]
    out = []
    for (path, old_kind, old_text), (_, new_kind, new_text) in zip(old_leaves, new_leaves):
        if (old_kind, old_text) == (new_kind, new_text):
            continue
        if old_kind == new_kind == "array":
            kind = _array_kind(old_text, new_text)
        else:
            kind = "static"
        out.append(Difference(kind, name + path, old_text, new_text))
    return out


def differences(old: Signature, new: Signature) -> list[Difference]:
    """Every difference between two signatures, argument by argument."""
    out = []
    for name, arg in new.items():
        if name not in old:
            out.append(Difference("structure", name, "not passed", "passed"))
        else:
            out.extend(_argument_differences(name, old[name], arg))
    out += [Difference("structure", n, "passed", "not passed") for n in old if n not in new]
    return out


def explain(earlier: Sequence[Signature], current: Signature) -> list[Difference]:
    """The differences from the closest (then latest) earlier signature (``[]`` if none)."""
    best: list[Difference] | None = None
    for old in earlier:
        diffs = differences(old, current)
        if best is None or len(diffs) <= len(best):  # ties: the latest
            best = diffs
    return best or []
