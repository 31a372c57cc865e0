"""Replay a jaxpr equation by equation, tagging every non-finite value with its origin.

Each equation is evaluated the way ``jax.core.eval_jaxpr`` does it (``get_bind_params`` then
``bind``: higher-order primitives such as ``shard_map`` get their sub-functions), so a loop or
a ``shard_map`` runs as one compiled program. Only where a tracked non-finite value is created
does the replay look inside:

- calls (``pjit``, ``closed_call``, ``remat2``/checkpoint, ``custom_jvp_call``,
  ``custom_vjp_call``): their jaxpr is replayed in place;
- ``cond``/``switch``: the branch that ran is replayed;
- ``scan`` (and ``fori_loop``): one scan (a compiled program) flags, per step, whether the
  body produced a non-finite value; a second computes the carry before the first such step;
  only that step's body is replayed. The cost does not grow with the scan's length beyond
  those two compiled runs;
- ``while_loop``: one compiled loop stops before the first body step producing a non-finite
  value; only that step is replayed.

- ``shard_map``: its body runs per device with collectives, so it cannot be replayed op by op
  outside its mesh. The body is run once more through the jaxpr evaluator inside
  ``jax.shard_map`` (its mesh, specs, collectives), each equation reporting through a
  ``jax.debug.callback`` whether its inputs, outputs (and a ``where``'s selected cases) hold a
  tracked value; the tags then flow on the host as they do everywhere else, and the value is
  located at its line in the body.

A tag flows through every primitive; through ``select_n`` (``jnp.where``) only from the cases
actually selected, so a NaN that a ``where`` discards is never blamed. Equations are evaluated
by the one jaxpr evaluator (`jaxwise.compilation.evaluate_jaxpr`), this module's hook
tagging each one.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal, jaxpr_as_fun

from jaxwise.compilation import evaluate_equation, evaluate_jaxpr

__all__ = ["Origin", "Replay", "bad_kind"]

_CALLS = frozenset(
    {
        "pjit",
        "jit",
        "closed_call",
        "core_call",
        "remat",
        "remat2",
        "checkpoint",
        "custom_jvp_call",
        "custom_vjp_call",
        "custom_vjp_call_jaxpr",
        "custom_lin",
    }
)
_CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where a tracked non-finite value was created: an equation, or an argument.

    Attributes:
        order: creation order; the earliest origin wins when several merge.
        kind: ``"nan"`` or ``"inf"``.
        eqn: the equation that created it (``None`` for an argument or a constant).
        argument: which argument or constant held it.
        context: the call, branch and loop equations it is nested in, outermost first (their
            name stacks tell the phase; their frames stand in when the equation's own are stale
            or missing).
    """

    order: int
    kind: str
    eqn: Any = None
    argument: str = ""
    context: tuple[Any, ...] = ()


def bad_mask(value: Any, check_inf: bool) -> np.ndarray | None:
    """Boolean mask of tracked non-finite entries of ``value`` (None for non-float values)."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.inexact):
        return None
    arr = np.asarray(value)
    return ~np.isfinite(arr) if check_inf else np.isnan(arr)


def bad_kind(value: Any, check_inf: bool) -> str | None:
    """``"nan"``/``"inf"`` if ``value`` holds a tracked non-finite entry, else ``None``."""
    mask = bad_mask(value, check_inf)
    if mask is None or not mask.any():
        return None
    return "nan" if np.isnan(np.asarray(value)).any() else "inf"


def _call_jaxpr(eqn: Any) -> tuple[Any, list[Any]] | None:
    """``(jaxpr, consts)`` of a call-like equation, else ``None``."""
    if eqn.primitive.name not in _CALLS:
        return None
    for name in _CALL_PARAMS:
        sub = eqn.params.get(name)
        if sub is None:
            continue
        if hasattr(sub, "consts") and hasattr(sub, "jaxpr"):
            return sub.jaxpr, list(sub.consts)
        if hasattr(sub, "eqns"):
            return sub, []
    return None


def _float_outputs_bad(outs: list[Any], check_inf: bool) -> jax.Array:
    """Traced: True when an inexact output holds a tracked non-finite entry."""
    flags = [
        jnp.any(~jnp.isfinite(o) if check_inf else jnp.isnan(o))
        for o in outs
        if jnp.issubdtype(jnp.result_type(o), jnp.inexact)
    ]
    return jnp.stack(flags).any() if flags else jnp.array(False)


def _scan_parts(params: dict[str, Any], invals: list[Any]) -> tuple[list, list, list]:
    """A ``scan`` equation's inputs split into ``(consts, carry, xs)``.

    JAX 0.12 describes the split with a flat tree (``ft_in``; ``update(...).unpack()``, as
    ``jax._src.lax.control_flow.loops`` does), earlier versions with ``num_consts`` and
    ``num_carry``; tests/test_debug.py::test_nan_in_a_long_scan_replays_one_step fails if
    both change.
    """
    if "ft_in" in params:
        consts, carry, xs = params["ft_in"].update(invals).unpack()
        return list(consts), list(carry), list(xs)
    n_consts, n_carry = params["num_consts"], params["num_carry"]
    return (
        invals[:n_consts],
        invals[n_consts : n_consts + n_carry],
        invals[n_consts + n_carry :],
    )


class Replay:
    """Evaluates a jaxpr, following tracked non-finite values to their origin."""

    def __init__(self, check_inf: bool) -> None:
        self.check_inf = check_inf
        self.counter = 0

    def new_origin(
        self, kind: str, eqn: Any = None, argument: str = "", context: tuple[Any, ...] = ()
    ) -> Origin:
        self.counter += 1
        return Origin(self.counter, kind, eqn, argument, context)

    def run(
        self,
        jaxpr: Any,
        consts: list[Any],
        args: list[Any],
        origins: list[Origin | None],
        context: tuple[Any, ...] = (),
    ) -> tuple[list[Any], list[Origin | None]]:
        """Evaluate ``jaxpr``; returns its outputs and the origin of each (``None``: clean)."""
        tags: dict[Any, Origin | None] = {}
        for var, val in zip(jaxpr.constvars, consts):
            kind = bad_kind(val, self.check_inf)
            tags[var] = self.new_origin(kind, argument="a captured constant") if kind else None
        tags.update(zip(jaxpr.invars, origins))

        def tag_of(v: Any) -> Origin | None:
            return None if isinstance(v, Literal) else tags[v]

        def hook(eqn: Any, invals: list[Any]) -> list[Any]:
            outvals, out_origins = self.equation(
                eqn, invals, [tag_of(v) for v in eqn.invars], context
            )
            tags.update(zip(eqn.outvars, out_origins))
            return outvals

        outvals = evaluate_jaxpr(jaxpr, args, hook, consts=consts)
        return outvals, [tag_of(v) for v in jaxpr.outvars]

    def equation(
        self, eqn: Any, invals: list[Any], in_origins: list[Origin | None], context: tuple[Any, ...]
    ) -> tuple[list[Any], list[Origin | None]]:
        """Evaluate one equation; look inside it only where it creates a tracked value."""
        inner = (*context, eqn)
        call = _call_jaxpr(eqn)
        if call is not None:  # cheap to look inside: always (a `where` in it is honoured)
            return self.run(call[0], call[1], invals, in_origins, inner)
        if eqn.primitive.name == "cond":
            branches = eqn.params["branches"]
            index = int(np.clip(np.asarray(invals[0]), 0, len(branches) - 1))
            branch = branches[index]
            return self.run(branch.jaxpr, list(branch.consts), invals[1:], in_origins[1:], inner)
        outvals = evaluate_equation(eqn, invals)
        bad = [bad_kind(o, self.check_inf) for o in outvals]
        if not any(bad):
            return outvals, [None] * len(outvals)
        upstream = [o for o in in_origins if o is not None]
        if not upstream and eqn.primitive.name in ("scan", "while", "shard_map"):
            if eqn.primitive.name == "shard_map":
                kind = next(b for b in bad if b is not None)
                found = self.inside_shard_map(eqn, invals, inner, kind)
            else:
                found = self.inside_loop(eqn, invals, inner)
            if found is not None:
                return outvals, [found if b else None for b in bad]
        return outvals, [self.origin_of(eqn, invals, in_origins, o, context) for o in outvals]

    def origin_of(
        self,
        eqn: Any,
        invals: list[Any],
        in_origins: list[Origin | None],
        out: Any,
        context: tuple[Any, ...],
    ) -> Origin | None:
        kind = bad_kind(out, self.check_inf)
        if kind is None:
            return None
        if eqn.primitive.name == "select_n":  # only the cases actually selected carry over
            pred = np.asarray(invals[0]).astype(np.int64)
            candidates = []
            for i, (case, origin) in enumerate(zip(invals[1:], in_origins[1:])):
                mask = bad_mask(case, self.check_inf)
                if origin is not None and mask is not None and (mask & (pred == i)).any():
                    candidates.append(origin)
        else:
            candidates = [o for o in in_origins if o is not None]
        if candidates:
            return min(candidates, key=lambda o: o.order)
        return self.new_origin(kind, eqn, context=context)

    # -- shard_map ---------------------------------------------------------------
    def inside_shard_map(
        self, eqn: Any, invals: list[Any], context: tuple[Any, ...], kind: str
    ) -> Origin | None:
        """The origin of the non-finite value a ``shard_map`` body creates (inputs clean)."""
        recorder = _BodyRecorder(self.check_inf)
        try:
            evaluate_equation(eqn, invals, recorder.hook)
            jax.effects_barrier()
        except Exception:  # an unusual body: blame the shard_map itself
            return None
        return recorder.origin(self, eqn.params["jaxpr"], context, kind)

    # -- loops ------------------------------------------------------------------
    def inside_loop(self, eqn: Any, invals: list[Any], context: tuple[Any, ...]) -> Origin | None:
        """The origin of the first non-finite value a loop's body creates (inputs clean)."""
        try:
            if eqn.primitive.name == "scan":
                body, step_args = self._first_bad_scan_step(eqn, invals)
            else:
                body, step_args = self._first_bad_while_step(eqn, invals)
        except Exception:  # an unusual loop: blame the loop itself
            return None
        if step_args is None:
            return None
        _, origins = self.run(
            body.jaxpr, list(body.consts), step_args, [None] * len(step_args), context
        )
        found = [o for o in origins if o is not None]
        return min(found, key=lambda o: o.order) if found else None

    def _first_bad_scan_step(self, eqn: Any, invals: list[Any]) -> tuple[Any, list | None]:
        p = eqn.params
        body, length, reverse = p["jaxpr"], int(p["length"]), bool(p["reverse"])
        consts, carry, xs = _scan_parts(p, invals)
        n_carry = len(carry)
        step = jaxpr_as_fun(body)
        check_inf = self.check_inf

        def flagged(c: list[Any], x: list[Any]) -> tuple[list[Any], jax.Array]:
            out = step(*consts, *c, *x)
            return list(out[:n_carry]), _float_outputs_bad(list(out), check_inf)

        _, flags = jax.lax.scan(flagged, carry, xs, length=length, reverse=reverse)
        flags = np.asarray(flags)
        if not flags.any():
            return body, None
        bad = np.flatnonzero(flags)
        index = int(bad[-1] if reverse else bad[0])  # the first step run
        done = [x[index + 1 :] for x in xs] if reverse else [x[:index] for x in xs]

        def advance(c: list[Any], x: list[Any]) -> tuple[list[Any], None]:
            return list(step(*consts, *c, *x)[:n_carry]), None

        steps = length - index - 1 if reverse else index
        carry_at = (
            jax.lax.scan(advance, carry, done, length=steps, reverse=reverse)[0] if steps else carry
        )
        x_at = [x[index] for x in xs]
        return body, [*consts, *carry_at, *x_at]

    def _first_bad_while_step(self, eqn: Any, invals: list[Any]) -> tuple[Any, list | None]:
        p = eqn.params
        cond, body = p["cond_jaxpr"], p["body_jaxpr"]
        n_cond, n_body = p["cond_nconsts"], p["body_nconsts"]
        cond_consts, body_consts = invals[:n_cond], invals[n_cond : n_cond + n_body]
        carry = invals[n_cond + n_body :]
        test, step = jaxpr_as_fun(cond), jaxpr_as_fun(body)
        check_inf = self.check_inf

        def keep_going(state: tuple[list[Any], jax.Array]) -> jax.Array:
            c, stopped = state
            return jnp.logical_and(test(*cond_consts, *c)[0], jnp.logical_not(stopped))

        def advance(state: tuple[list[Any], jax.Array]) -> tuple[list[Any], jax.Array]:
            c, _ = state
            new = list(step(*body_consts, *c))
            bad = _float_outputs_bad(new, check_inf)
            kept = [jnp.where(bad, old, nxt) for old, nxt in zip(c, new)]
            return kept, bad

        carry_at, stopped = jax.lax.while_loop(keep_going, advance, (carry, jnp.array(False)))
        if not bool(stopped):
            return body, None
        return body, [*body_consts, *carry_at]


@dataclasses.dataclass
class _Record:
    """One equation of a ``shard_map`` body as traced: its values' identities and flags."""

    eqn: Any
    start: int  # the index of the first record made inside it (its sub-programs)
    in_ids: list[int]
    out_ids: list[int]
    flags: np.ndarray | None = None  # in, out, selected cases; OR-ed over devices and steps


class _BodyRecorder:
    """The evaluator's hook inside a ``shard_map`` body: flags each equation's values.

    At trace time each equation is recorded with the identities of its input and output
    values; a ``jax.debug.callback`` reports at run time, per device (and per loop step),
    which of them hold a tracked value. ``origin`` then lets tags flow on the host.
    """

    def __init__(self, check_inf: bool) -> None:
        self.check_inf = check_inf
        self.records: list[_Record] = []
        self.alive: list[Any] = []  # the traced values, so that their ids stay unique

    def _bad(self, value: Any) -> jax.Array:
        if not jnp.issubdtype(jnp.result_type(value), jnp.inexact):
            return jnp.array(False)
        return jnp.any(~jnp.isfinite(value) if self.check_inf else jnp.isnan(value))

    def _note(self, index: int, flags: Any) -> None:
        record = self.records[index]
        flags = np.asarray(flags)
        record.flags = flags if record.flags is None else (record.flags | flags)

    def hook(self, eqn: Any, invals: list[Any]) -> list[Any]:
        start = len(self.records)
        outs = evaluate_equation(eqn, invals, self.hook)  # sub-programs through this hook
        self.alive += [*invals, *outs]
        flags = [self._bad(v) for v in (*invals, *outs)]
        if eqn.primitive.name == "select_n":  # a case counts where it is selected
            pred = jnp.asarray(invals[0]).astype(jnp.int32)
            for i, case in enumerate(invals[1:]):
                bad = ~jnp.isfinite(case) if self.check_inf else jnp.isnan(case)
                flags.append(jnp.any(bad & (pred == i)))
        index = len(self.records)
        self.records.append(_Record(eqn, start, [id(v) for v in invals], [id(o) for o in outs]))
        jax.debug.callback(functools.partial(self._note, index), jnp.stack(flags))
        return outs

    def origin(
        self, replay: Replay, body: Any, context: tuple[Any, ...], kind: str
    ) -> Origin | None:
        """The earliest origin among the body's outputs (tags flowed over the records)."""
        tag: dict[int, Origin] = {}
        made: list[Origin | None] = []  # the origin each record created, if any
        for record in self.records:
            made.append(
                self._flow(record, tag, made, lambda e: replay.new_origin(kind, e, context=context))
            )
        out_ids = {}
        for record in self.records:
            if any(record.eqn is e for e in body.eqns):
                out_ids.update(zip(record.eqn.outvars, record.out_ids))
        found = [tag[out_ids[v]] for v in body.outvars if out_ids.get(v) in tag]
        self.alive.clear()
        return min(found, key=lambda o: o.order) if found else None

    def _flow(
        self,
        record: _Record,
        tag: dict[int, Origin],
        made: list[Origin | None],
        new_origin: Callable[[Any], Origin],
    ) -> Origin | None:
        if record.flags is None:  # never ran (a branch not taken)
            return None
        n_in, n_out = len(record.in_ids), len(record.out_ids)
        in_bad, out_bad = record.flags[:n_in], record.flags[n_in : n_in + n_out]
        if not out_bad.any():
            return None
        if record.eqn.primitive.name == "select_n":
            selected = record.flags[n_in + n_out :]
            ids = [i for i, s in zip(record.in_ids[1:], selected) if s]
        else:
            ids = [i for i, b in zip(record.in_ids, in_bad) if b]
        candidates = [tag[i] for i in ids if i in tag]
        created = None
        if not candidates:
            inner = [o for o in made[record.start :] if o is not None]
            if inner:  # made inside its sub-program (a loop or call in the body)
                candidates = [min(inner, key=lambda o: o.order)]
            elif not in_bad.any():
                created = new_origin(record.eqn)
                candidates = [created]
        if candidates:
            origin = min(candidates, key=lambda o: o.order)
            for i, b in zip(record.out_ids, out_bad):
                if b:
                    tag[i] = origin
        return created
