"""NaN checking of watched calls: a finiteness test of the outputs, then `locate_nan`.

``jax_debug_nans`` is not used: it prints to the script's stdout, raises inside eager code the
script may run on purpose, and (JAX 0.12.0.1) stops checking already compiled functions once
``vmap`` has run in the process. Instead each watched call's floating outputs are reduced to
one flag by a small compiled program, and a call that produced a non-finite value is replayed
by :func:`jaxwise.debug.locate_nan` on the same arguments (the watch keeps them alive by not
donating while NaN checking is on).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxwise.debug import locate_nan
from jaxwise.watch._patch import ORIGINAL_JIT, Tracked
from jaxwise.watch._report import NanFinding

__all__ = ["has_nan", "locate"]


@ORIGINAL_JIT
def _any_nan(leaves: list[jax.Array]) -> jax.Array:
    return jnp.stack([jnp.any(jnp.isnan(x)) for x in leaves]).any()


def has_nan(out: Any) -> bool:
    """True when a floating leaf of ``out`` holds a NaN (an inf alone may be meant: masks)."""
    leaves = [
        leaf
        for leaf in jax.tree.leaves(out)
        if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jnp.inexact)
    ]
    return bool(leaves) and bool(_any_nan(leaves))


def _bound(tracked: Tracked, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    """The function with its static arguments bound, and the remaining (traced) arguments."""
    plan = tracked.plan
    n = len(args)
    static_pos = {
        i: a for i, a in enumerate(args) if i in plan.static_nums or i - n in plan.static_nums
    }
    static_kw = {k: v for k, v in kwargs.items() if k in plan.static_names}
    if not static_pos and not static_kw:
        return tracked.fun, args, kwargs
    dynamic = tuple(a for i, a in enumerate(args) if i not in static_pos)
    dynamic_kw = {k: v for k, v in kwargs.items() if k not in static_kw}

    def fun(*dyn: Any, **dyn_kw: Any) -> Any:
        it = iter(dyn)
        full = [static_pos[i] if i in static_pos else next(it) for i in range(n)]
        return tracked.fun(*full, **dyn_kw, **static_kw)

    return fun, dynamic, dynamic_kw


def locate(tracked: Tracked, args: tuple, kwargs: dict, call_site: str | None) -> NanFinding:
    """Locate the NaN that ``tracked(*args, **kwargs)`` produced."""
    fun, dyn_args, dyn_kwargs = _bound(tracked, args, kwargs)
    report = locate_nan(fun, *dyn_args, **dyn_kwargs)
    if report is None:
        return NanFinding(tracked.name, "unknown", "forward", None, "", call_site)
    frame = report.frame
    return NanFinding(
        tracked.name,
        report.primitive,
        report.phase,
        frame.where if frame else None,
        frame.source if frame else "",
        call_site,
    )
