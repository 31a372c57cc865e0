"""Name an array by the user's own variables: ``model.out.kernel``, ``state.params['w']``.

A library between the user and ``jax.jit`` (Flax's ``nnx.jit``, Equinox's ``filter_jit``)
passes the jitted function its own flattened form of the arguments, whose paths mean nothing
to the user. When a finding is about one array, the variables of the user's calling frame
are searched for it instead: plain pytrees by path, Flax NNX objects by their graph path.
Only run for findings (rare), never per call.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import jax

__all__ = ["name_in_frame"]

_SKIP = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)


def _in_nnx(leaf: Any, value: Any) -> str | None:
    nnx = sys.modules.get("flax.nnx")
    is_node = getattr(getattr(nnx, "graphlib", None), "is_graph_node", None)
    if nnx is None or is_node is None or not is_node(value):
        return None
    for path, node in nnx.iter_graph(value):
        getter = getattr(node, "get_value", None)
        if isinstance(node, nnx.Variable) and getter is not None and getter() is leaf:
            return "." + ".".join(str(p) for p in path)
    return None


def _path_to(leaf: Any, value: Any) -> str | None:
    if value is leaf:
        return ""
    found = _in_nnx(leaf, value)
    if found is not None:
        return found
    try:
        flat = jax.tree_util.tree_flatten_with_path(value)[0]
    except Exception:
        return None
    for path, other in flat:
        if other is leaf:
            return jax.tree_util.keystr(path)
    return None


def name_in_frame(leaf: Any, frame: types.FrameType | None) -> str | None:
    """The user's name for ``leaf`` among ``frame``'s local then global variables, if any."""
    if frame is None:
        return None
    seen: set[int] = set()
    for namespace in (frame.f_locals, frame.f_globals):
        for name, value in list(namespace.items()):
            if name.startswith("__") or isinstance(value, _SKIP) or id(value) in seen:
                continue
            seen.add(id(value))
            try:
                path = _path_to(leaf, value)
            except Exception:  # an object that does not want to be looked into
                continue
            if path is not None:
                return name + path
    return None
