"""The one place that patches JAX: ``jax.jit`` and ``jax.pmap``, for the duration of a watch.

Every function jitted (or ``pmap``-ed) while a watch is active is wrapped in a `Tracked` that
forwards each call to the real jitted function and lets the watch count it; its ahead-of-time
forms (``.lower(...)``, then ``.compile()``) are wrapped too, so that their compiles and the
compiled function's calls are counted as the function's. That covers ``jax.jit`` as a
decorator, ``jax.jit(f, static_argnums=...)``, ``functools.partial(jax.jit, ...)`` and the
libraries that call ``jax.jit`` when a function is decorated (Flax's ``nnx.jit``, Equinox's
``filter_jit``, jaxwise's train steps). `installed` restores the original ``jax.jit`` on
exit, also when the block raises. tests/test_watch.py::test_jax_jit_patch_still_fits fails if
JAX changes what the patch relies on: ``jax.jit``'s signature, and the jitted function's
attributes (``lower``, ``trace``, ``eval_shape``, ``clear_cache``, ``__wrapped__``) and
method binding.

A watched call sets nothing while it runs. What happens during it on its thread (a compile,
a trace time, a donation warning) is queued by the watch, numbered (`Session.queued` is the
newest number); when the call returns it compares that number with the one it read before it
started and, only when they differ, claims the events its thread queued since
(`Session.claim`): the innermost call claims first, and nothing reads a frame's locals to find
the call. A counted call's whole cost is one read of the number before and one comparison
after (a ``ContextVar`` set and reset costs ~4 times more). The user's line that
jitted a function (or compiled it, or passed it a host array) is `user_site`, the innermost
live frame outside the libraries: the watch's own reading of the live stack
(tests/test_layering.py lists the few modules that may read frames or tracebacks).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import jax

from jaxwise._shared._frames import is_library_file, short_path
from jaxwise._shared._jax import concrete_array_type, hot_trace_state, trace_state_clean

__all__ = [
    "ORIGINAL_JIT",
    "ORIGINAL_PMAP",
    "Call",
    "Tracked",
    "installed",
    "under_transformation",
    "user_frame",
    "user_site",
]

ORIGINAL_JIT = jax.jit
ORIGINAL_PMAP = jax.pmap
_now = time.perf_counter
_TIME_FIRST = 64  # counted calls timed one by one; after them, one in eight
_SAMPLE = 7
# `trace_state_clean()`, inlined in the hot path (tests/test_watch.py checks they agree)
_TRACE, _EVAL, _AXES, _NO_AXES = hot_trace_state()
_MAX_DEPTH = 400
_ARRAY = concrete_array_type()

# (function, args, kwargs, timed): a counted call (timed or not), a checked call (timed), or a
# staging (``.lower``/``.compile``: no arguments, ``timed`` None).
Call = tuple["Tracked", "tuple[Any, ...] | None", "dict[str, Any] | None", "bool | None"]


class Session(Protocol):
    """What a `Tracked` function needs from the watch that created it."""

    passthrough: bool
    _last: str  # the name of the last watched call to start
    queued: int  # the number of the newest event queued during a call, on any thread

    def claim(self, call: Call, since: int) -> None: ...

    def call(self, tracked: Tracked, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...

    def stage(self, tracked: Tracked, run: Callable[[], Any]) -> Any: ...

    def call_compiled(
        self, tracked: Tracked, compiled: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any: ...


class Tracked:
    """A jitted function created during a watch: forwards every call, attribute and binding.

    Attributes:
        jitted: the real jitted function.
        fun: the Python function it traces.
        name: the function's name.
        where: ``"file.py:LINE"`` of the user's line that jitted it.
        options: the keyword arguments given to ``jax.jit`` (or ``jax.pmap``).
        kind: ``"jit"`` or ``"pmap"``.
        stats: the watch's record for this function (shared by functions jitted at one place);
            its ``live`` is true while the watch is active.
        plan: what the watch checks per call (donated and static arguments).
        counted: set by the session when a call needs no check: it is then only counted
            here (``stats.calls``), and timed (``stats.timed_seconds``) for its first 64
            calls and one in eight after them, with no other work per call than reading
            `Session.queued` before it and comparing after it (claiming what its thread queued
            meanwhile, when that changed).
    """

    # the attributes a call reads live in slots (a little faster than the instance dict,
    # which holds what ``functools.update_wrapper`` copies)
    __slots__ = (
        "__dict__",
        "__weakref__",
        "counted",
        "equinox",
        "fun",
        "jitted",
        "kind",
        "name",
        "options",
        "plan",
        "session",
        "stats",
        "where",
    )

    def __init__(
        self,
        jitted: Any,
        fun: Any,
        where: str | None,
        options: dict[str, Any],
        session: Session,
        kind: str = "jit",
    ) -> None:
        functools.update_wrapper(self, jitted, updated=())
        self.__wrapped__ = fun  # what JAX traces: counters identify the program by it
        self.jitted = jitted
        self.fun = fun
        self.name = function_name(fun)
        self.where = where
        self.options = options
        self.session = session
        self.kind = kind
        self.stats: Any = None
        self.plan: Any = None
        self.counted = False
        self.equinox = False  # Equinox's filter_jit wrapper: arguments in Equinox's form

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        stats = self.stats
        if not (self.counted and stats.live):
            if self.session.passthrough or not trace_state_clean():
                return self.jitted(*args, **kwargs)
            return self.session.call(self, args, kwargs)
        # the hot path: count (and time a sample); a call staged into an outer trace (its
        # output not a concrete array, and JAX tracing) is taken back afterwards
        session = self.session
        last, session._last = session._last, self.name
        calls = stats.calls = stats.calls + 1
        seen = session.queued
        start = _now() if calls <= _TIME_FIRST or not calls & _SAMPLE else None
        try:  # no keywords: a plain call (unpacking an empty dict costs ~0.1 µs)
            out = self.jitted(*args, **kwargs) if kwargs else self.jitted(*args)
        except BaseException:
            self._end(seen, args, kwargs, None, last)  # counted, not timed
            raise
        if type(out) is _ARRAY:  # it ran: no trace-state test needed
            if start is not None:
                stats.timed_seconds += _now() - start
                stats.timed_calls += 1
            if session.queued != seen:
                session.claim((self, args, kwargs, start is not None), seen)
            return out
        self._end(seen, args, kwargs, start, last)
        return out

    def _end(self, seen: int, args: tuple, kwargs: dict, start: float | None, last: str) -> None:
        """The rest of a counted call whose output is not one concrete array (or that raised:
        ``start`` then ``None``): taken back when it was staged, else timed and claiming."""
        stats, session = self.stats, self.session
        if under_transformation():
            stats.calls -= 1
            session._last = last
            return
        if start is not None:
            stats.timed_seconds += _now() - start
            stats.timed_calls += 1
        if session.queued != seen:
            session.claim((self, args, kwargs, start is not None), seen)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        return self if instance is None else types.MethodType(self, instance)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """``jitted.lower(...)``, its compiles counted as this function's."""
        lowered = self.session.stage(self, lambda: self.jitted.lower(*args, **kwargs))
        return _Lowered(lowered, self)

    def __getattr__(self, name: str) -> Any:
        if name in ("jitted", "session"):  # not yet set (during unpickling, copy)
            raise AttributeError(name)
        return getattr(self.jitted, name)

    def __repr__(self) -> str:
        return f"<watched {self.jitted!r}>"


class _Lowered:
    """A watched function's ``Lowered``: ``compile()`` gives a watched compiled function."""

    def __init__(self, lowered: Any, tracked: Tracked) -> None:
        self._lowered = lowered
        self._tracked = tracked

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        tracked = self._tracked
        compiled = tracked.session.stage(tracked, lambda: self._lowered.compile(*args, **kwargs))
        return _Compiled(compiled, tracked)

    def __getattr__(self, name: str) -> Any:
        if name in ("_lowered", "_tracked"):
            raise AttributeError(name)
        return getattr(self._lowered, name)


class _Compiled:
    """A watched function compiled ahead of time: each call is counted as the function's."""

    def __init__(self, compiled: Any, tracked: Tracked) -> None:
        self._compiled = compiled
        self._tracked = tracked

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tracked = self._tracked
        if tracked.session.passthrough or not trace_state_clean():
            return self._compiled(*args, **kwargs)
        return tracked.session.call_compiled(tracked, self._compiled, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in ("_compiled", "_tracked"):
            raise AttributeError(name)
        return getattr(self._compiled, name)


def function_name(fun: Any) -> str:
    """The name of the Python function behind ``fun`` (partials and wrappers unwrapped)."""
    while isinstance(fun, functools.partial):
        fun = fun.func
    name = getattr(fun, "__name__", None)
    if isinstance(name, str) and name:
        return name
    return type(fun).__name__


def under_transformation() -> bool:
    """True while JAX is tracing (inside ``jit``, ``grad``, ``vmap``…): a call is staged, not
    run, and a watched call passes straight through. ``jax._src.core.trace_state_clean``
    inlined (private, but the one cheap test); tests/test_watch.py fails if they disagree."""
    trace = _TRACE.value
    return not (trace is None or (trace is _EVAL and _AXES.value is _NO_AXES))


def user_frame(frame: types.FrameType | None) -> types.FrameType | None:
    """The innermost live frame outside the libraries, starting at ``frame`` and walking out."""
    for _ in range(_MAX_DEPTH):
        if frame is None or not is_library_file(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
    return None


def user_site(frame: types.FrameType | None = None) -> str | None:
    """``"file.py:LINE"`` of the innermost live frame outside the libraries, or ``None``.

    Args:
        frame: where to start walking outwards (default: the caller's frame).
    """
    found = user_frame(frame if frame is not None else sys._getframe(1))
    if found is None:
        return None
    return f"{short_path(found.f_code.co_filename)}:{found.f_lineno}"


Factory = Callable[[Any, dict[str, Any], "str | None", str], Any]


def _patched(factory: Factory, original: Any, kind: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def transform(*args: Any, **kwargs: Any) -> Any:
        if not args:  # jax.jit(static_argnums=...) used as a decorator factory
            return functools.partial(transform, **kwargs)
        return factory(args[0], kwargs, user_site(sys._getframe(1)), kind)

    return transform


@contextlib.contextmanager
def installed(factory: Factory) -> Iterator[None]:
    """Replace ``jax.jit`` and ``jax.pmap`` by ``factory(fun, options, where, kind)`` inside
    the block (``kind``: ``"jit"`` or ``"pmap"``).

    Args:
        factory: builds the transformed function; it calls `ORIGINAL_JIT` or `ORIGINAL_PMAP`.

    Raises:
        RuntimeError: ``jax.jit`` is already replaced (another watch is active).
    """
    if jax.jit is not ORIGINAL_JIT:
        raise RuntimeError(
            "jax.jit is already replaced (is another jaxwise watch active?); one watch at a time"
        )
    jax.jit = _patched(factory, ORIGINAL_JIT, "jit")
    jax.pmap = _patched(factory, ORIGINAL_PMAP, "pmap")
    try:
        yield
    finally:
        jax.jit = ORIGINAL_JIT
        jax.pmap = ORIGINAL_PMAP
