"""Per-call checks of a watched function's arguments: donated and host (NumPy, scalar) values.

A `CallPlan` is computed once, when the function is jitted, from ``jax.jit``'s options
and the function's signature: which positions and keywords are donated or static. Per call it
costs one flatten of the donated arguments (and, with transfer counting, of the others).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

__all__ = ["CallPlan", "aval_text", "host_arrays", "unusable_avals"]

_HOST = (np.ndarray, bool, int, float, complex, np.generic)  # copied to the device per call
_AVAL = re.compile(r"[a-z]+[0-9]*\[[^\]]*\]")


def _as_tuple(value: Any, kind: type) -> tuple[Any, ...]:
    if value is None:
        return ()
    if isinstance(value, kind):
        return (value,)
    return tuple(value)


def _positional_names(fun: Any) -> list[str]:
    try:
        params = inspect.signature(fun).parameters.values()
    except (TypeError, ValueError):
        return []
    names = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL:
            break
    return names


@dataclasses.dataclass(frozen=True)
class CallPlan:
    """Which arguments of a watched function are donated and which are static.

    Attributes:
        names: the positional parameters' names (as far as the signature tells).
        donated_nums, donated_names: donated positions and keywords (both forms resolved).
        static_nums, static_names: static positions and keywords.
    """

    names: tuple[str, ...]
    donated_nums: frozenset[int]
    donated_names: frozenset[str]
    static_nums: frozenset[int]
    static_names: frozenset[str]

    @classmethod
    def of(cls, fun: Any, options: dict[str, Any], *, donations: bool) -> CallPlan:
        """The plan for ``jax.jit(fun, **options)``; ``donations=False`` ignores donation."""
        names = _positional_names(fun)

        def resolve(nums_key: str, names_key: str) -> tuple[frozenset[int], frozenset[str]]:
            nums = {int(i) for i in _as_tuple(options.get(nums_key), int)}
            keys = set(_as_tuple(options.get(names_key), str))
            nums |= {names.index(k) for k in keys if k in names}
            keys |= {names[i] for i in nums if 0 <= i < len(names)}
            return frozenset(nums), frozenset(keys)

        donated = (
            resolve("donate_argnums", "donate_argnames")
            if donations
            else (
                frozenset(),
                frozenset(),
            )
        )
        static = resolve("static_argnums", "static_argnames")
        return cls(tuple(names), donated[0], donated[1], static[0], static[1])

    @functools.cached_property
    def donates(self) -> bool:  # read on every call: computed once
        return bool(self.donated_nums or self.donated_names)

    def argument_name(self, index: int) -> str:
        return self.names[index] if index < len(self.names) else f"args[{index}]"

    def _selected(
        self, args: tuple, kwargs: dict, nums: frozenset[int], keys: frozenset[str], keep: bool
    ) -> Iterable[tuple[str, Any]]:
        """``(name, value)`` of the arguments in (``keep=True``) or out of the selection."""
        n = len(args)
        for i, value in enumerate(args):
            if ((i in nums) or (i - n in nums)) == keep:
                yield self.argument_name(i), value
        for key, value in kwargs.items():
            if (key in keys) == keep:
                yield key, value

    def donated_leaves(self, args: tuple, kwargs: dict) -> list[Any]:
        """The donated arguments' arrays (whatever can be deleted by a donation)."""
        leaves = []
        for _, value in self._selected(args, kwargs, self.donated_nums, self.donated_names, True):
            leaves.extend(leaf for leaf in jax.tree.leaves(value) if hasattr(leaf, "is_deleted"))
        return leaves

    def donated_paths(self, args: tuple, kwargs: dict, leaves: list[Any]) -> list[tuple[str, Any]]:
        """``(argument path, leaf)`` for each of ``leaves`` among the donated arguments."""
        wanted = {id(leaf) for leaf in leaves}
        found = []
        for name, value in self._selected(
            args, kwargs, self.donated_nums, self.donated_names, True
        ):
            for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
                if id(leaf) in wanted:
                    found.append((name + jax.tree_util.keystr(path), leaf))
                    wanted.discard(id(leaf))
        return found

    def arrays(self, args: tuple, kwargs: dict, *, donated: bool) -> list[tuple[str, Any]]:
        """``(argument path, array)`` of the donated (or of the other) arguments' arrays."""
        selected = self._selected(args, kwargs, self.donated_nums, self.donated_names, donated)
        return [
            (name + jax.tree_util.keystr(path), leaf)
            for name, value in selected
            for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]
            if hasattr(leaf, "is_deleted")
        ]

    def unused_leaves(self, jitted: Any, args: tuple, kwargs: dict) -> set[int]:
        """``id`` of the traced leaves ``jitted`` does not use: ``jit`` drops them
        (``keep_unused=False``), so their buffers are never donated. Traces the call (cached
        by JAX); only asked when a donation failed."""
        from jax.extend.core import Literal  # not at import: jax.extend loads Pallas

        try:
            jaxpr = jitted.trace(*args, **kwargs).jaxpr.jaxpr
        except Exception:
            return set()
        atoms = [v for eqn in jaxpr.eqns for v in eqn.invars] + list(jaxpr.outvars)
        used = {id(v) for v in atoms if not isinstance(v, Literal)}
        dynamic = (
            tuple(v for _, v in self._selected(args, {}, self.static_nums, frozenset(), False)),
            {k: v for k, v in kwargs.items() if k not in self.static_names},
        )
        leaves = jax.tree.leaves(dynamic)
        if len(leaves) != len(jaxpr.invars):
            return set()
        return {id(leaf) for leaf, var in zip(leaves, jaxpr.invars) if id(var) not in used}

    def host_values(self, args: tuple, kwargs: dict) -> list[tuple[str, int]]:
        """``(argument path, bytes)`` of every host value (NumPy array, Python or NumPy
        scalar) among the traced arguments: JAX copies each to the device on every call."""
        found = []
        for name, value in self._selected(args, kwargs, self.static_nums, self.static_names, False):
            leaves = jax.tree.leaves(value)
            if not any(isinstance(leaf, _HOST) for leaf in leaves):
                continue
            for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
                if isinstance(leaf, _HOST):
                    found.append((name + jax.tree_util.keystr(path), int(np.asarray(leaf).nbytes)))
        return found


def host_arrays(arguments: Iterable[tuple[str, Any]]) -> list[tuple[str, int]]:
    """``(argument path, bytes)`` of every NumPy array or scalar among named ``arguments``."""
    return [
        (name + jax.tree_util.keystr(path), int(np.asarray(leaf).nbytes))
        for name, value in arguments
        for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]
        if isinstance(leaf, (np.ndarray, np.generic))
    ]


def aval_text(leaf: Any) -> str:
    """``"float32[3,4]"``: a leaf's type as JAX writes it in its donation warning."""
    shape = ",".join(str(d) for d in getattr(leaf, "shape", ()))
    return f"{getattr(leaf, 'dtype', '?')}[{shape}]"


def unusable_avals(message: str) -> list[str]:
    """The types listed in JAX's "Some donated buffers were not usable: …" warning.

    >>> unusable_avals("Some donated buffers were not usable: float32[3,4], int32[].\\nSee …")
    ['float32[3,4]', 'int32[]']
    """
    head = message.split("\n", 1)[0]
    return _AVAL.findall(head.partition(":")[2])
