"""The one module that knows JAX's internals, across the supported range (0.10.2 and newer).

Everything jaxwise needs from JAX beyond its public API is read here and nowhere else (a test,
tests/test_layering.py, fails if another module imports ``jax._src``):

- **jaxprs.** JAX 0.10/0.11 give a ``ClosedJaxpr`` (an open ``Jaxpr`` plus its constants) for
  ``jax.make_jaxpr`` and most sub-programs, and an open ``Jaxpr`` for some (``remat``'s); JAX
  0.12 has one ``Jaxpr`` type that carries its constants. `program_parts` gives the open jaxpr
  and its constants of either, `is_program` recognises both, `same_kind` turns a re-traced
  program back into the kind its equation held.
- **trace state.** Whether JAX is tracing right now (``jax._src.core``), for ``watch``'s hot
  path.
- **source locations.** The frames JAX records for new equations
  (``jax._src.source_info_util.current``), for ``locate_nan`` inside ``custom_vjp`` rules.
- **loggers.** The names of JAX's internal loggers that jaxwise listens to or silences.

- **tracing-cache keys and the compiling call.** JAX's public surface tells us *that* a
  program compiled (``jax.monitoring``) and prints a prose guess of *why*
  (``jax_explain_cache_misses``, comparing against the "closest" key by its own severity order,
  which misses static arguments). To say exactly what changed we need the keys JAX really
  compares. They are read from the frames of two JAX functions while they run:
  ``jax._src.interpreters.partial_eval.explain`` (called on every tracing-cache miss while
  ``jax_explain_cache_misses`` is on; locals ``fun``, ``in_avals``, ``debug_info``, ``keys``,
  ``callsite``) and ``jax._src.pjit._pjit_call_impl_python`` (the call that compiles a ``jit``
  program; locals ``jaxpr``, ``args``, ``donated_invars``). The argument tree is a ``FlatTree``
  of argument nodes on JAX 0.12 and one ``PyTreeDef`` over ``(args, kwargs)`` with ``Static``
  nodes on 0.10/0.11; both become the same plain records (`CallSig`, `ArgSig`, `LeafType`).
  If JAX changes these internals `miss_context`/`compile_context` return ``None`` and the
  caller falls back to JAX's prose; tests/test_compilation.py::test_private_jax_hooks_still_work
  fails so that we notice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import sys
from collections.abc import Iterator
from typing import Any

import jax
import jax.extend.core as jex
from jax._src import core as _core
from jax._src import source_info_util as _source_info_util

__all__ = [
    "ArgSig",
    "CallSig",
    "CompileContext",
    "LeafType",
    "MissContext",
    "compile_context",
    "miss_context",
    "DropVar",
    "Jaxpr",
    "JaxprEqn",
    "Literal",
    "COMPILER_LOGGERS",
    "EXPLAIN_LOGGER",
    "hot_trace_state",
    "is_program",
    "NEWEST_TESTED_JAX",
    "OLDEST_TESTED_JAX",
    "jax_version",
    "live_traceback",
    "program_parts",
    "same_kind",
    "source_info_current",
    "trace_state_clean",
    "with_source_info_current",
]

Jaxpr = jex.Jaxpr
JaxprEqn = jex.JaxprEqn
Literal = jex.Literal
DropVar = jex.DropVar
# JAX < 0.12: ``ClosedJaxpr`` is its own class (an open jaxpr and its constants); 0.12: the
# same class as ``Jaxpr``.
_CLOSED: type = getattr(jex, "ClosedJaxpr", jex.Jaxpr)
_PROGRAM_TYPES: tuple[type, ...] = (jex.Jaxpr, _CLOSED)

# the logger of JAX's cache-miss explanations (jax/_src/interpreters/partial_eval.py, ``explain``)
EXPLAIN_LOGGER = "jax._src.interpreters.partial_eval"
# loggers that print compile-cache chatter at start-up (silenced by the CLI)
COMPILER_LOGGERS = ("jax._src.xla_bridge", "jax._src.compiler", "jax._src.compilation_cache")


# the two ends of the supported range that CI tests (.ci/run: the oldest and the newest lane)
OLDEST_TESTED_JAX = "0.10.2"
NEWEST_TESTED_JAX = "0.12.1"


def jax_version(version: str | None = None) -> tuple[int, ...]:
    """A JAX version (default: the installed one) as integers, e.g. ``(0, 10, 2)``.

    Examples:
        >>> jax_version("0.12.0.1"), jax_version("0.13.0rc1")
        ((0, 12, 0, 1), (0, 13, 0))
    """
    parts: list[int] = []
    for part in (version or jax.__version__).split(".")[:4]:
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if digits != part:  # "0rc1": a pre-release ends the version
            break
    return tuple(parts)


def is_program(value: Any) -> bool:
    """True for a jaxpr of any kind (``jax.make_jaxpr``'s result or an equation's sub-program)."""
    return isinstance(value, _PROGRAM_TYPES)


def program_parts(program: Any) -> tuple[Any, list[Any]]:
    """``(open jaxpr, constants)`` of a program: its ``constvars``/``invars``/``eqns``/``outvars``
    and the values of its ``constvars``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> body, consts = program_parts(jax.make_jaxpr(jnp.sin)(1.0))
        >>> [e.primitive.name for e in body.eqns], consts
        (['sin'], [])
    """
    if isinstance(program, _CLOSED) and not isinstance(program, jex.Jaxpr):
        return program.jaxpr, list(program.consts)  # JAX < 0.12
    return program, list(getattr(program, "consts", ()) or ())


def same_kind(original: Any, traced: Any) -> Any | None:
    """``traced`` (``jax.make_jaxpr``'s result) as the kind of program ``original`` is, or
    ``None`` when it cannot be (an open jaxpr cannot hold the constants ``traced`` has)."""
    if isinstance(original, jex.Jaxpr) and not isinstance(traced, jex.Jaxpr):  # JAX < 0.12
        body, consts = program_parts(traced)
        return None if consts else body
    return traced


def trace_state_clean() -> bool:
    """True when JAX is not tracing (no ``jit``/``grad``/``vmap`` trace is active)."""
    return bool(_core.trace_state_clean())


def hot_trace_state() -> tuple[Any, Any, Any, Any]:
    """``(trace_ref, eval_trace, axis_env, no_axes)``: the objects `trace_state_clean` reads,
    for a hot path that inlines it as ``trace_ref.value is None or (trace_ref.value is
    eval_trace and axis_env.value is no_axes)`` (tests/test_watch.py checks they agree)."""
    return _core.trace_state_strong_ref, _core.eval_trace, _core.axis_env_state, _core.top_axis_env


def concrete_array_type() -> type:
    """The type of a concrete (not traced) array a jitted call returns (``ArrayImpl``): a hot
    path that sees one needs no trace-state test (a staged call returns tracers)."""
    from jax._src.array import ArrayImpl

    return ArrayImpl


def source_info_current() -> Any:
    """JAX's ``source_info_util.current`` (the frames recorded for a new equation)."""
    return _source_info_util.current


@contextlib.contextmanager
def with_source_info_current(replacement: Any) -> Iterator[None]:
    """Replace JAX's ``source_info_util.current`` inside the block (restored on exit)."""
    original = _source_info_util.current
    _source_info_util.current = replacement
    try:
        yield
    finally:
        _source_info_util.current = original


def live_traceback() -> Any:
    """The Python traceback of the running code, as JAX records it (or ``None``)."""
    from jax._src.lib import xla_client  # pyright: ignore[reportPrivateImportUsage]

    return xla_client.Traceback.get_traceback()


# --- tracing-cache keys and the compiling call --------------------------------------------------

_MAX_FRAMES = 40
_JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__)) + os.sep


@dataclasses.dataclass(frozen=True)
class LeafType:
    """Type of one traced leaf: what ``jit`` specialises on."""

    shape: tuple[int, ...]
    dtype: str
    weak_type: bool
    sharding: str
    short: str  # e.g. "f32[3]"


@dataclasses.dataclass(frozen=True)
class ArgSig:
    """One argument of a call as JAX keys it."""

    name: str  # "x", "cfg", "args[2]"
    passed: str  # "positionally" | "by keyword"
    static: bool
    value: Any  # the static value (static arguments only)
    tree: str  # the pytree structure, as text ("" for static arguments)
    leaves: tuple[tuple[str, LeafType], ...]  # (path inside the argument, type)


@dataclasses.dataclass(frozen=True)
class CallSig:
    """Everything a tracing-cache key holds about one call, in plain records."""

    args: tuple[ArgSig, ...]
    context: tuple[tuple[str, str], ...]  # (config name, value) of the trace context


@dataclasses.dataclass(frozen=True)
class MissContext:
    """What JAX knew when it missed its tracing cache for one call."""

    fun: Any
    name: str
    defined_at: str | None
    call_site: str | None
    new: CallSig
    previous: tuple[CallSig, ...]  # earlier keys of the same function object (JAX cache order)
    same_source_alive: bool  # another live function object with the same definition is cached
    wrapper: str = ""  # a JAX-internal function traced for the user's one (grad's transpose…)


@dataclasses.dataclass(frozen=True)
class CompileContext:
    """The ``jit`` call that is compiling (absent for AOT ``.lower().compile()``)."""

    name: str
    defined_at: str | None
    internal: bool  # the program is defined inside JAX (an eager operation)
    arg_names: tuple[str, ...]  # aligned with the inputs below (captured constants first)
    shardings: tuple[str, ...]
    committed: tuple[bool | None, ...]  # per input: committed to its device(s)
    donated: tuple[bool, ...]  # per input: donated to the program
    jaxpr: Any


def _find_frame(code_name: str, file_suffix: str) -> Any:
    frame = sys._getframe(2)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_name == code_name and code.co_filename.endswith(file_suffix):
            return frame
        frame = frame.f_back
    return None


def _jax_wrapper(fun: Any) -> str:
    """The name of ``fun`` if it is a function defined inside JAX (a transformation's wrapper
    traced on behalf of a user function, e.g. ``transposed`` for ``grad``), else ``""``."""
    fn = inspect.unwrap(fun)
    while isinstance(fn, functools.partial):
        fn = inspect.unwrap(fn.func)
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None or not os.path.abspath(code.co_filename).startswith(_JAX_DIR):
        return ""
    return str(getattr(fn, "__name__", "?"))


def _src_info(debug_info: Any) -> tuple[str, str | None]:
    """(function name, "file:line") from a JAX DebugInfo."""
    text = str(getattr(debug_info, "func_src_info", "") or "")
    name, _, where = text.partition(" at ")
    return (name or "?"), (where or None)


def _leaf_type(aval: Any) -> LeafType:
    shape = tuple(int(d) for d in getattr(aval, "shape", ()))
    sharding = getattr(aval, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    axes = tuple(getattr(mesh, "axis_names", ()) or ())
    sharding_text = ""
    if axes:
        sizes = tuple(getattr(mesh, "axis_sizes", ()) or ())
        where = (
            ", ".join(f"{a}={s}" for a, s in zip(axes, sizes))
            if sizes
            else ", ".join(map(str, axes))
        )
        sharding_text = f"{getattr(sharding, 'spec', '?')} on mesh({where})"
    return LeafType(
        shape,
        str(getattr(aval, "dtype", "?")),
        bool(getattr(aval, "weak_type", False)),
        sharding_text,
        aval.str_short(short_dtypes=True),
    )


def _sharding_text(sharding: Any) -> str:
    """Short text for an input sharding: ``"on cpu:3"``, ``"P('data',) on mesh(data=8)"``."""
    if sharding is None:
        return "unplaced"
    mesh, spec = getattr(sharding, "mesh", None), getattr(sharding, "spec", None)
    if mesh is not None and spec is not None:
        sizes = ", ".join(f"{n}={k}" for n, k in zip(mesh.axis_names, mesh.axis_sizes))
        return f"{spec} on mesh({sizes})"
    devices = list(getattr(sharding, "device_set", ()) or ())
    if len(devices) == 1:
        return f"on {devices[0].platform}:{devices[0].id}"
    return str(sharding)


def _paths(treedef: Any, n: int) -> list[str]:
    try:
        flat, _ = jax.tree_util.tree_flatten_with_path(treedef.unflatten(list(range(n))))
    except Exception:
        return [f"[{i}]" for i in range(n)]
    if [leaf for _, leaf in flat] != list(range(n)):
        return [f"[{i}]" for i in range(n)]
    return [jax.tree_util.keystr(path) for path, _ in flat]


def _param_names(fun: Any, n_positional: int) -> list[str]:
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return [f"args[{i}]" for i in range(n_positional)]
    names: list[str] = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL:
            names.extend(f"{p.name}[{i}]" for i in range(n_positional - len(names)))
            break
    names.extend(f"args[{i}]" for i in range(len(names), n_positional))
    return names[:n_positional]


def _arg_sig(name: str, passed: str, ft: Any) -> ArgSig:
    kind = type(ft).__name__
    if kind == "FTStatic":
        return ArgSig(name, passed, True, ft.val, "", ())
    if kind == "FTPyTree":
        avals = list(ft.xs)
        paths = _paths(ft.tree, len(avals))
        return ArgSig(
            name,
            passed,
            False,
            None,
            str(ft.tree),
            tuple((p, _leaf_type(a)) for p, a in zip(paths, avals)),
        )
    raise LookupError(f"unknown FlatTree node {kind}")


def _call_sig(fun: Any, in_avals: Any, context: tuple[tuple[str, str], ...]) -> CallSig:
    if not hasattr(in_avals, "elts"):  # JAX 0.10/0.11: one PyTreeDef over (args, kwargs)
        return CallSig(_tree_arg_sigs(fun, in_avals), context)
    args_ft, kwargs_ft = in_avals.elts
    positional = list(args_ft.elts)
    names = _param_names(fun, len(positional))
    sigs = [_arg_sig(n, "positionally", ft) for n, ft in zip(names, positional)]
    sigs += [_arg_sig(str(k), "by keyword", ft) for k, ft in zip(kwargs_ft.keys, kwargs_ft._vals)]
    return CallSig(tuple(sigs), context)


def _tree_arg_sigs(fun: Any, in_avals: Any) -> tuple[ArgSig, ...]:
    """The arguments of a JAX 0.10/0.11 key: ``in_avals.tree`` is one ``PyTreeDef`` over
    ``(args, kwargs)`` whose static arguments are ``Static`` nodes (no leaves), and
    ``in_avals.vals`` the avals of the other leaves, in order."""
    args_def, kwargs_def = in_avals.tree.children()
    positional = list(args_def.children())
    keywords = [str(k) for k in (kwargs_def.node_data() or (None, ()))[1] or ()]
    named = [(n, "positionally") for n in _param_names(fun, len(positional))]
    named += [(k, "by keyword") for k in keywords]
    vals = list(in_avals.vals)
    sigs: list[ArgSig] = []
    for (name, passed), child in zip(named, positional + list(kwargs_def.children())):
        data = child.node_data()
        if data is not None and getattr(data[0], "__name__", "") == "Static":
            sigs.append(ArgSig(name, passed, True, getattr(data[1], "val", data[1]), "", ()))
            continue
        avals, vals = vals[: child.num_leaves], vals[child.num_leaves :]
        leaves = tuple(zip(_paths(child, len(avals)), map(_leaf_type, avals)))
        sigs.append(ArgSig(name, passed, False, None, str(child), leaves))
    if vals:
        raise LookupError("the key's avals do not match its tree")
    return tuple(sigs)


def _context(values: Any) -> tuple[tuple[str, str], ...]:
    values = tuple(values)
    try:
        from jax._src import config as jax_config

        names = tuple(jax_config.trace_context_names())
    except Exception:
        names = ()
    if len(names) != len(values):
        names = tuple(f"context[{i}]" for i in range(len(values)))
    return tuple((n, repr(v)) for n, v in zip(names, values))


def _same_source_alive(fun: Any, src_info: str) -> bool:
    try:
        from jax._src.interpreters import partial_eval

        keys = partial_eval.trace_to_jaxpr.cache_keys()
    except Exception:
        return False
    for key in keys:
        try:
            other = key[0]()
            dbg = key[2][1]
        except Exception:
            continue
        if (
            other is not None
            and other is not fun
            and getattr(dbg, "func_src_info", None) == src_info
        ):
            return True
    return False


def miss_context() -> MissContext | None:
    """Read the tracing-cache miss JAX is explaining right now (from a logging filter).

    Returns ``None`` outside JAX's ``explain`` or when its internals changed.
    """
    frame = _find_frame("explain", os.path.join("interpreters", "partial_eval.py"))
    if frame is None:
        return None
    try:
        local = frame.f_locals
        fun, debug_info = local["fun"], local["debug_info"]
        name, defined_at = _src_info(debug_info)
        from jax._src import config as jax_config

        new = _call_sig(fun, local["in_avals"], _context(jax_config.trace_context()))
        previous = tuple(
            _call_sig(fun, key[1][0], _context(key[0]))
            for key in local["keys"]
            if isinstance(key, (list, tuple))
        )
        wrapper = _jax_wrapper(fun)
        alive = (
            not previous and not wrapper and _same_source_alive(fun, str(debug_info.func_src_info))
        )
        site = str(local.get("callsite") or "") or None
        return MissContext(fun, name, defined_at, site, new, previous, alive, wrapper)
    except Exception:
        return None
    finally:
        del frame


def compile_context() -> CompileContext | None:
    """Read the ``jit`` call that is compiling right now (from a ``jax.monitoring`` listener)."""
    frame = _find_frame("_pjit_call_impl_python", "pjit.py")
    if frame is None:
        return None
    try:
        local = frame.f_locals
        jaxpr, args = local["jaxpr"], local["args"]
        debug_info = jaxpr.debug_info
        name, defined_at = _src_info(debug_info)
        file = defined_at.rsplit(":", 1)[0] if defined_at else ""
        internal = os.path.abspath(file).startswith(_JAX_DIR) if file else False
        names = tuple(str(a) for a in (debug_info.arg_names or ()))
        extra = max(0, len(args) - len(names))  # captured constants come first
        arg_names = tuple(f"constant[{i}]" for i in range(extra)) + names
        shardings = tuple(_sharding_text(getattr(a, "sharding", None)) for a in args)
        committed = tuple(getattr(a, "committed", None) for a in args)
        donated = tuple(bool(d) for d in local.get("donated_invars", ()) or ())
        donated = donated if len(donated) == len(args) else (False,) * len(args)
        return CompileContext(
            name, defined_at, internal, arg_names, shardings, committed, donated, jaxpr
        )
    except Exception:
        return None
    finally:
        del frame
