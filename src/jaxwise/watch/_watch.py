"""`Watch`: see every jitted function of a block or script without changing its code.

While a watch is active:

- ``jax.jit`` is replaced (`._patch`) so that each function jitted in the block is
  tracked: its name, the user's line that jitted it, its calls and the time inside them
  (``jax.pmap`` and ahead-of-time ``.lower(...).compile()`` forms too);
- every backend compilation arrives from ``jax.monitoring`` through
  `jaxwise.compilation`'s listener with its structured `CacheMiss`, and is attributed to the
  innermost watched call running on this thread: each such event is queued, numbered, and
  the call claims its thread's events numbered after its start when it returns
  (`Watch.claim`; a call that needs no check does nothing else per call but count and time
  itself, and compare the newest number with the one it saw first); events outside any call
  are attributed by their function at the next `Watch.report`. Tracing and lowering times and
  JAX's donation warnings arrive the same way. An Equinox ``filter_jit`` function's compiles
  are explained by the user's own arguments (`._arguments`);
- donations: every donated input is checked after the call and a failure gets its cause
  (`._donations`: an unused argument, no output of its type, a live view, a duplicate);
  jaxwise steps' ``DonationError`` arrive as ``jaxwise._shared._events.DonationFailed`` events;
- with ``nans``: each watched call's outputs are checked, and the first non-finite one is
  located with `locate_nan` on the same arguments;
- with ``transfers``: host values (NumPy arrays, Python scalars) passed to watched calls,
  which JAX copies to the device on every call, are counted per call site.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import jax

from jaxwise._shared import _buffers, _events
from jaxwise._shared._checks import check_bool, check_int
from jaxwise._shared._frames import short_path
from jaxwise.compilation import CompileEvent, subscribe
from jaxwise.watch import _arguments, _calls, _donations, _patch
from jaxwise.watch._names import name_in_frame
from jaxwise.watch._patch import user_frame, user_site
from jaxwise.watch._report import (
    FAIL_ON,
    DonationFinding,
    NanFinding,
    NanStop,
    TransferSite,
    WatchReport,
)
from jaxwise.watch._stats import (
    CompileSink,
    Stats,
    compile_miss,
    explain_equinox,
    load_nan_checks,
    pmap_program,
)

__all__ = ["NanStop", "Watch"]

_TRACE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
)
_UNUSABLE = "Some donated buffers were not usable"
_ACTIVE: Watch | None = None
_now = time.perf_counter
_LISTENING = False
_LOCK = threading.Lock()
# an event seen during a watched call, handed the call that claims it (or None) and its number
_Handler = Callable[["_patch.Call | None", int], None]


def _duration_listener(event: str, duration_secs: float, **kwargs: Any) -> None:
    watch = _ACTIVE
    if watch is not None and event in _TRACE_EVENTS:
        watch._on_trace_time(duration_secs)


class Watch:
    """Context manager: watch every jitted function of a block, with no change to its code.

    Reports per function (its name and the line that jitted it): calls, compiles, compile
    time and each compile's [`CacheMiss`][jaxwise.compilation.CacheMiss] (kind, argument, old,
    new) with the user's call site; compiles after a function's first ``warmup`` ones are
    flagged as steady-state recompiles. Also: donations JAX could not use (and jaxwise steps'
    ``DonationError``), with ``nans`` the first non-finite output located to a primitive and
    a line, with ``transfers`` the host values copied to the device per call site, and the
    time spent compiling.

    Only functions jitted inside the block are watched call by call (``jax.jit`` is replaced
    for the duration of the block and restored on exit); compiles of functions jitted before
    are still counted. One watch may be active at a time.

    Args:
        nans: ``None`` (default: no NaN checking, no overhead), ``"stop"`` (end the block at
            the first watched call whose output is not finite, after locating it) or
            ``"report"`` (locate it and continue). With NaN checking on, watched functions do
            not donate their inputs (as with ``jax_debug_nans``), so that the failing call can
            be replayed.
        transfers: count host values (NumPy arrays, Python scalars) passed to watched calls.
        warmup: compiles per function that are expected (default 2: the first call and, e.g.,
            the last, smaller batch); later ones are steady-state recompiles.
        fail_on: conditions that make `WatchReport.triggered` (and ``jaxwise watch``'s
            exit code) fail: any of ``"recompile"``, ``"nan"`` (turns on ``nans="report"`` when
            ``nans`` is ``None``) and ``"donation"``.

    Raises:
        ValueError: a bad option.
        RuntimeError: on entry, when another watch is active.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> with Watch() as w:
        ...     step = jax.jit(lambda x, n: x * n, static_argnums=1)
        ...     for n in (1, 2, 3, 4):
        ...         _ = step(jnp.ones(3), n)
        >>> f = w.report().functions[0]
        >>> f.calls, f.compiles, [m.kind for m in f.steady_state_recompiles]
        (4, 4, ['static', 'static'])
        >>> f.misses[3].argument, f.misses[3].old, f.misses[3].new  # compilation.CacheMiss
        ('n', '3', '4')
    """

    def __init__(
        self,
        *,
        nans: str | None = None,
        transfers: bool = False,
        warmup: int = 2,
        fail_on: tuple[str, ...] | list[str] = (),
    ) -> None:
        if nans not in (None, "stop", "report"):
            raise ValueError(f"`nans` must be None, 'stop' or 'report', got {nans!r}")
        check_bool(transfers, "transfers")
        self.warmup = check_int(warmup, "warmup", min_value=1)
        if isinstance(fail_on, str) or not isinstance(fail_on, (tuple, list)):
            raise TypeError(f"`fail_on` must be a tuple of conditions, got {fail_on!r}")
        unknown = [c for c in fail_on if c not in FAIL_ON]
        if unknown:
            raise ValueError(f"`fail_on` must be among {FAIL_ON}, got {unknown}")
        self.fail_on = tuple(fail_on)
        self.nans = nans if nans is not None or "nan" not in self.fail_on else "report"
        self.transfers = bool(transfers)
        self.passthrough = True  # read by every watched call: True when not watching
        self._active = False
        self._internal = 0
        self._stats: dict[tuple[str, str | None, bool], Stats] = {}
        self._eager_seconds = 0.0
        self._compiling = 0.0
        self._nans: list[NanFinding] = []
        self._donations: dict[tuple[str, str, str], int] = {}
        self._transfers: dict[tuple[str | None, str], list[Any]] = {}
        self._start = self._end = 0.0
        self._stopped = False
        self._errors: list[str] = []
        self._undonated: dict[str, None] = {}  # functions not donating under NaN checking
        self._restore: list[Callable[[], None]] = []
        self._sink = CompileSink(self)
        self._nan_checks: Any = None  # watch._nans, imported on entry when NaN checking
        # the last watched call to start, by name only (keeping the function alive would
        # change what JAX's caches hit)
        self._last = "?"
        # events seen during watched calls, per thread: (number, handler), claimed by the call
        self.queued = 0  # the newest event's number: read by every watched call, twice
        self._pending: dict[int, list[tuple[int, _Handler]]] = {}
        self._queue_lock = threading.Lock()

    # -- entering and leaving ------------------------------------------------
    def __enter__(self) -> Watch:
        global _ACTIVE, _LISTENING
        if self._active or self._start:
            raise RuntimeError("this Watch was already used; create a new one per block")
        with _LOCK:
            if _ACTIVE is not None:
                raise RuntimeError("another jaxwise Watch is active; one watch at a time")
            patch = _patch.installed(self._track)
            patch.__enter__()
            _ACTIVE = self
            if not _LISTENING:
                jax.monitoring.register_event_duration_secs_listener(_duration_listener)
                _LISTENING = True
        self._restore.append(lambda: _ignore(patch.__exit__(None, None, None)))
        self._restore.append(subscribe(self._sink.record))
        self._restore.append(_events.subscribe(self._on_event))
        if self.nans is not None:  # nothing donates: jaxwise steps must not expect it
            self._nan_checks = load_nan_checks()
            suspended = _events.suspend_donation("jaxwise watch: NaN checking")
            suspended.__enter__()
            self._restore.append(lambda: _ignore(suspended.__exit__(None, None, None)))
        self._hook_warnings()
        self._start = time.perf_counter()
        self._active = True
        self.passthrough = False
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        global _ACTIVE
        self._end = time.perf_counter()
        self.passthrough = True
        self._active = False
        for stats in self._stats.values():
            stats.live = False
        try:
            while self._restore:
                self._restore.pop()()
        finally:
            _ACTIVE = None
        if isinstance(exc, NanStop):
            self._stopped = True
            return True
        return False

    def _hook_warnings(self) -> None:
        warnings.filterwarnings("always", message=_UNUSABLE)
        entry = warnings.filters[0]
        previous = warnings.showwarning

        def showwarning(message: Any, category: Any, filename: Any, lineno: Any, *rest: Any) -> Any:
            if str(message).startswith(_UNUSABLE):
                self._on_unusable_donation(str(message))
            return previous(message, category, filename, lineno, *rest)

        warnings.showwarning = showwarning

        def restore() -> None:
            if warnings.showwarning is showwarning:
                warnings.showwarning = previous
            filters: list[Any] = warnings.filters  # type: ignore[assignment]
            if entry in filters:
                filters.remove(entry)
                mutated = getattr(warnings, "_filters_mutated", None)  # invalidates caches
                if mutated is not None:
                    mutated()

        self._restore.append(restore)

    # -- the patched jax.jit ---------------------------------------------------
    def _track(self, fun: Any, options: dict[str, Any], where: str | None, kind: str) -> Any:
        real = dict(options)
        if self.nans is not None:  # as jax_debug_nans does: keep inputs for the replay
            donated = real.pop("donate_argnums", None), real.pop("donate_argnames", None)
            if any(d not in (None, (), []) for d in donated):
                self._undonated.setdefault(_patch.function_name(fun), None)
        original = _patch.ORIGINAL_PMAP if kind == "pmap" else _patch.ORIGINAL_JIT
        jitted = original(fun, **real)
        tracked = _patch.Tracked(jitted, fun, where, options, self, kind)
        tracked.equinox = _arguments.is_equinox(fun)
        if kind == "pmap" and "static_broadcasted_argnums" in options:
            options = {**options, "static_argnums": options["static_broadcasted_argnums"]}
        key = (tracked.name, where, True)
        stats = self._stats.get(key)
        if stats is None:
            stats = self._stats[key] = Stats(tracked.name, where, True)
            stats.first = (self.queued, 1)  # after the events queued so far
        tracked.stats = stats
        tracked.plan = plan = _calls.CallPlan.of(fun, options, donations=self.nans is None)
        tracked.counted = not (plan.donates or self.transfers or self.nans)
        return tracked

    def call(self, tracked: _patch.Tracked, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One watched call (not under a JAX transformation); called by the patched ``jax.jit``.

        Args:
            tracked: the watched jitted function.
            args: the call's positional arguments.
            kwargs: the call's keyword arguments.

        Returns:
            The jitted function's output.
        """
        plan: _calls.CallPlan = tracked.plan
        stats: Stats = tracked.stats
        donated = plan.donated_leaves(args, kwargs) if plan.donates else None
        buffers = _buffers.donated_buffers(donated) if donated else None
        if self.transfers:
            self._count_transfers(tracked, args, kwargs)
        out = self._run(tracked, tracked.jitted, args, kwargs, donated is not None)
        try:
            if donated:
                alive = [donated[i] for i in _buffers.kept(donated, buffers, out)]
                if alive:
                    self._on_live_donations(tracked, args, kwargs, alive, out)
            if self.nans is not None and not stats.nan_checked:
                self._check_nans(tracked, args, kwargs, out)
        except Exception as err:  # the watch never breaks the watched program
            self._errors.append(f"{type(err).__name__} while checking `{tracked.name}`: {err}")
        return out

    def _run(
        self, tracked: _patch.Tracked, run: Any, args: tuple, kwargs: dict, donates: bool
    ) -> Any:
        """``run(*args, **kwargs)`` as a watched call of ``tracked``: timed, counted, and the
        events its thread queued meanwhile claimed."""
        stats: Stats = tracked.stats
        self._last = tracked.name
        seen = self.queued
        start = _now()
        try:
            return run(*args, **kwargs)
        except Exception as err:
            if donates and any(m in str(err) for m in _donations.DUPLICATE_ERRORS):
                self._on_duplicate(tracked, args, kwargs)
            raise
        finally:
            stats.timed_seconds += _now() - start
            stats.timed_calls += 1
            stats.calls = (stats.calls or 0) + 1
            if self.queued != seen:
                self.claim((tracked, args, kwargs, True), seen)

    def stage(self, tracked: _patch.Tracked, run: Callable[[], Any]) -> Any:
        """``run()`` (a ``.lower`` or ``.compile``) with its compiles counted as ``tracked``'s.

        Args:
            tracked: the watched jitted function being staged.
            run: the staging call (``.lower(...)`` or ``.compile()``), called once.

        Returns:
            What ``run()`` returns.
        """
        if self.passthrough:
            return run()
        seen = self.queued
        try:
            return run()
        finally:
            if self.queued != seen:
                self.claim((tracked, None, None, None), seen)

    def call_compiled(
        self, tracked: _patch.Tracked, compiled: Any, args: tuple, kwargs: dict
    ) -> Any:
        """One call of ``tracked`` compiled ahead of time (``.lower(...).compile()``).

        Args:
            tracked: the watched jitted function the compiled program came from.
            compiled: the ``jax.stages.Compiled`` program.
            args: its positional arguments.
            kwargs: its keyword arguments.

        Returns:
            The compiled program's outputs.
        """
        return self._run(tracked, compiled, args, kwargs, False)

    # -- events during a call: queued, then claimed by the call -------------------
    def _queue(self, handler: _Handler) -> None:
        """Queue ``handler`` (an event seen on this thread) for the innermost watched call in
        progress here, which claims it when it returns; outside any call, `report` hands it
        ``None``."""
        with self._queue_lock:
            self.queued = number = self.queued + 1
            self._pending.setdefault(threading.get_ident(), []).append((number, handler))

    def claim(self, call: _patch.Call, since: int) -> None:
        """Hand the events queued on this thread after event number ``since`` to ``call``.

        Called by a watched call that returns (or raises) when `queued` moved during it: the
        events are its own, or those of calls nested in it that did not claim them first.

        Args:
            call: ``(tracked, args, kwargs, timed)`` of the call that is ending.
            since: `queued` when the call started.
        """
        with self._queue_lock:
            pending = self._pending.get(threading.get_ident())
            if not pending:
                return
            first = len(pending)
            while first and pending[first - 1][0] > since:
                first -= 1
            mine = pending[first:]
            del pending[first:]
        self._handle(mine, call)

    def _flush(self) -> None:
        """Events outside any watched call, in order: attributed by their function."""
        with self._queue_lock:
            items = sorted(
                (item for pending in self._pending.values() for item in pending),
                key=lambda item: item[0],
            )
            self._pending.clear()
        self._handle(items, None)

    def _handle(self, items: list[tuple[int, _Handler]], call: _patch.Call | None) -> None:
        for number, handler in items:
            try:
                handler(call, number)
            except Exception as err:  # the watch never breaks the watched program
                self._errors.append(f"{type(err).__name__} while attributing an event: {err}")

    # -- compiles --------------------------------------------------------------
    def _on_trace_time(self, seconds: float) -> None:
        if not self._active or self._internal:
            return
        self._compiling += seconds

        def charge(call: _patch.Call | None, number: int) -> None:
            if call is not None:
                call[0].stats.charge(seconds, call[3])

        self._queue(charge)

    def _on_compile(self, event: CompileEvent) -> None:
        if not self._active or self._internal:
            return
        self._compiling += event.seconds
        where = user_site(sys._getframe(1))
        self._queue(lambda call, number: self._attribute(event, where, call, number))

    def _attribute(
        self, event: CompileEvent, where: str | None, call: _patch.Call | None, number: int
    ) -> None:
        """Record a compile seen at ``where`` as ``call``'s, or (``None``) by its function."""
        tracked, args, kwargs, timed = call if call is not None else (None, None, None, None)
        if event.internal and (tracked is None or not pmap_program(tracked, event)):
            self._eager_seconds += event.seconds
            if tracked is not None:  # inside the call all the same: not its compile
                tracked.stats.charge(event.seconds, timed, compile=False)
            return
        miss = compile_miss(event, where)
        if tracked is not None:
            stats = tracked.stats
            if tracked.equinox and args is not None:
                miss = explain_equinox(stats, miss, args, kwargs or {})
        else:
            defined = short_path(event.defined_at) if event.defined_at else None
            key = (event.function or event.fun_name, defined, False)
            stats = self._stats.get(key)
            if stats is None:
                stats = self._stats[key] = Stats(key[0], defined, False)
                stats.first = (number, 0)
        stats.charge(event.seconds, timed)
        stats.misses.append(miss)

    # -- donations -------------------------------------------------------------
    def _record_donation(self, function: str, argument: str, cause: str) -> None:
        key = (function, argument, cause)
        self._donations[key] = self._donations.get(key, 0) + 1

    def _on_unusable_donation(self, message: str) -> None:
        avals = _calls.unusable_avals(message)

        def record(call: _patch.Call | None, number: int) -> None:
            if call is not None:
                call[0].stats.unusable.update(avals)

        self._queue(record)

    def _on_live_donations(
        self, tracked: _patch.Tracked, args: tuple, kwargs: dict, alive: list[Any], out: Any
    ) -> None:
        if jax.config.jax_disable_jit:
            return  # nothing was compiled, so nothing was donated
        plan: _calls.CallPlan = tracked.plan
        self._internal += 1
        try:
            unused = plan.unused_leaves(tracked.jitted, args, kwargs)
        finally:
            self._internal -= 1
        donated = [leaf for _, leaf in plan.arrays(args, kwargs, donated=True)]
        counts = Counter(_donations.aval_key(leaf) for leaf in donated)
        outputs = _donations.output_avals(out)
        names = self._namer(tracked, args, kwargs)
        for argument, leaf in plan.donated_paths(args, kwargs, alive):
            aval = _calls.aval_text(leaf)
            cause = _donations.why_alive(
                leaf,
                aval,
                unused=id(leaf) in unused,
                unusable=aval in tracked.stats.unusable,
                donated=counts,
                outputs=outputs,
            )
            self._record_donation(tracked.name, names(leaf) or argument, cause)

    def _namer(self, tracked: _patch.Tracked, args: tuple, kwargs: dict) -> Callable[[Any], str]:
        """The user's name of a leaf: by the Equinox arguments, or found in the caller's frame."""
        if tracked.equinox:
            arguments = _arguments.user_arguments(args, kwargs) or []
            paths = {
                id(leaf): name + jax.tree_util.keystr(path)
                for name, value in arguments
                for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]
            }
            return lambda leaf: paths.get(id(leaf), "")
        caller = user_frame(sys._getframe(1))
        return lambda leaf: name_in_frame(leaf, caller) or ""

    def _on_duplicate(self, tracked: _patch.Tracked, args: tuple, kwargs: dict) -> None:
        plan: _calls.CallPlan = tracked.plan
        found = _donations.duplicate(
            plan.arrays(args, kwargs, donated=True), plan.arrays(args, kwargs, donated=False)
        )
        if found is not None:
            argument, other = found
            self._record_donation(tracked.name, argument, _donations.DUPLICATE.format(other=other))

    def _on_event(self, event: _events.Event) -> None:
        if not self._active or not isinstance(event, _events.DonationFailed):
            return
        name = event.function or self._last  # unnamed: the call in progress, or the last one
        argument = event.argument or "?"
        for key in [k for k in self._donations if k[:2] == (name, argument)]:
            del self._donations[key]  # the step's own audit says it better
        self._record_donation(name, argument, f"DonationError: {event.error}")

    # -- transfers and NaNs -----------------------------------------------------
    def _count_transfers(self, tracked: _patch.Tracked, args: tuple, kwargs: dict) -> None:
        plan: _calls.CallPlan = tracked.plan
        found = plan.host_values(args, kwargs)
        if not found:
            return
        if tracked.equinox:  # Python scalars are static there: only NumPy values are copied
            arguments = _arguments.user_arguments(args, kwargs)
            if arguments is not None:
                found = _calls.host_arrays(arguments)
        where = user_site(sys._getframe(2))
        site = self._transfers.setdefault((where, tracked.name), [0, 0, 0, {}])
        site[0] += 1
        site[1] += len(found)
        site[2] += sum(nbytes for _, nbytes in found)
        for argument, _ in found:
            site[3].setdefault(argument, None)

    def _check_nans(self, tracked: _patch.Tracked, args: tuple, kwargs: dict, out: Any) -> None:
        _nans = self._nan_checks
        self._internal += 1
        self.passthrough = True
        try:
            if not _nans.has_nan(out):
                return
            tracked.stats.nan_checked = True
            finding = _nans.locate(tracked, args, kwargs, user_site(sys._getframe(2)))
        finally:
            self._internal -= 1
            self.passthrough = not self._active or self._internal > 0
        if finding.primitive == "argument" and self._nans:
            return  # a NaN passed on from one already reported
        self._nans.append(finding)
        if self.nans == "stop":
            raise NanStop(finding)

    # -- the report ---------------------------------------------------------------
    def report(self, exit_code: int | None = None) -> WatchReport:
        """What the watch saw so far (or in all, after the block).

        Args:
            exit_code: the exit code to record (``jaxwise watch`` passes the script's).

        Returns:
            The [`WatchReport`][jaxwise.watch.WatchReport].
        """
        end = self._end if self._end else time.perf_counter()
        self._flush()
        functions = tuple(
            s.report(self.warmup)
            for s in sorted(self._stats.values(), key=lambda s: s.first)
            if (s.calls or 0) > 0 or s.misses
        )
        donations = tuple(DonationFinding(f, a, c, n) for (f, a, c), n in self._donations.items())
        transfers = None
        if self.transfers:
            transfers = tuple(
                TransferSite(where, fn, calls, count, size, tuple(args))
                for (where, fn), (calls, count, size, args) in self._transfers.items()
            )
        return WatchReport(
            functions,
            tuple(self._nans),
            donations,
            transfers,
            max(0.0, end - self._start) if self._start else 0.0,
            self._compiling,
            exit_code,
            self._stopped,
            self.warmup,
            tuple(self._errors),
            self._notes(),
        )

    def _notes(self) -> tuple[str, ...]:
        if not self._undonated:
            return ()
        names = ", ".join(f"`{n}`" for n in self._undonated)
        return (
            f"NaN checking is on, so {names} did not donate (the failing call must be "
            "replayable, as with jax_debug_nans): donations were not checked; run without "
            "--nans to check them",
        )


def _ignore(value: Any) -> None:
    """Drop a return value (the restore callbacks return nothing)."""
    del value
