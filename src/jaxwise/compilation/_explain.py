"""Structured cache-miss explanations: what changed between a call and the earlier ones.

A `CacheMiss` is computed from the tracing-cache keys JAX compares (read by
`jaxwise._shared._jax`): the current call's signature against every earlier signature of the *same*
function object. The earlier key with the fewest differences is the one the call "should"
have hit; its differences are the reason. A static argument that changed is reported as such
even when an older key differs in shape too. `parse_cache_miss` reads JAX's prose
instead; it is only a fallback for JAX versions whose internals we cannot read.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from typing import Any

from jaxwise._shared._jax import ArgSig, CallSig, LeafType, MissContext

__all__ = ["KINDS", "CacheMiss", "Difference", "parse_cache_miss"]

KINDS = (
    "first",
    "shape",
    "dtype",
    "weak_type",
    "static",
    "structure",
    "sharding",
    "config",
    "donation",
    "new_function",
    "eager",
    "other",
)
"""Every ``CacheMiss.kind``: the kinds of `CacheMiss`."""
# When one call differs from its closest earlier key in several ways, the headline is the
# difference a user would fix first. A JAX config flip comes first: it is the cause of the
# dtype changes it brings (x64 turns every Python float into f64).
_PRIORITY = (
    "config",
    "structure",
    "static",
    "shape",
    "dtype",
    "weak_type",
    "sharding",
    "donation",
    "other",
)
IDENTITY_NOTE = "hashed by identity"
_MAX_REPR = 80


@dataclasses.dataclass(frozen=True)
class Difference:
    """One difference between a call and an earlier call of the same function.

    Attributes:
        kind: one of [`KINDS`][jaxwise.compilation.KINDS] (never ``"first"``, ``"new_function"`` or
            ``"eager"``).
        argument: the argument, with the path inside it: ``"x"``, ``"batch[0]"``, ``"cfg"``.
        old: the earlier value or type, as text (``"f32[3]"``, ``"2"``).
        new: the current one.
        note: an extra hint (``"hashed by identity"`` for a static object compared by ``is``).
    """

    kind: str
    argument: str
    old: str
    new: str
    note: str = ""

    def describe(self) -> str:
        """One line, e.g. ``static argument `n`: 2 → 3``.

        Returns:
            The line.
        """
        if self.kind == "static":
            line = f"static argument `{self.argument}`: {self.old} → {self.new}"
            if self.note == IDENTITY_NOTE:
                line += (
                    " (an equal-looking object hashed by identity: make its class a frozen "
                    "dataclass, or reuse one instance)"
                )
            return line
        if self.kind == "structure":
            return f"structure of `{self.argument}`: {self.old} → {self.new}"
        if self.kind == "config":
            return (
                f"JAX config `{self.argument}` flipped: {self.old} → {self.new} (every jitted "
                "function retraces; set it once, before the first call)"
            )
        if self.kind == "donation":
            return f"donation of `{self.argument}`: {self.old} → {self.new}"
        return f"argument `{self.argument}`: {self.old} → {self.new}"


@dataclasses.dataclass(frozen=True)
class CacheMiss:
    """Why one call missed JAX's tracing cache.

    Attributes:
        function: name of the traced Python function, e.g. ``"step"``.
        defined_at: ``"file.py:LINE"`` where it is defined, if known.
        call_site: ``"file.py:LINE (caller)"`` of the call that missed, if known.
        kind: ``"first"`` (first compile of this function), ``"new_function"`` (a new function
            object defined at the same place as one compiled before: a ``jax.jit`` of a
            lambda, closure or bound method re-created per call), ``"static"``, ``"shape"``,
            ``"dtype"``, ``"weak_type"``, ``"structure"`` (pytree structure, ``None`` leaves,
            positional vs keyword), ``"sharding"`` (an input's sharding, device, or committed vs
            uncommitted placement), ``"config"`` (a JAX config flip such as ``jax_enable_x64``,
            named in ``argument``), ``"donation"`` (the same program jitted with and without
            donating an argument), ``"eager"`` (an eager operation outside ``jit``, see
            [`CompileEvent.miss`][jaxwise.compilation.CompileEvent.miss]) or ``"other"``.
        argument: the argument that changed, e.g. ``"x"``, ``"batch[0]"``, ``"cfg"``, or the
            config option (``"jax_enable_x64"``); ``""`` for ``"first"``/``"new_function"``/
            ``"eager"``.
        old: its earlier value or type as text (``"2"``, ``"f32[3]"``), ``""`` if none.
        new: its current value or type as text.
        differences: every [`Difference`][jaxwise.compilation.Difference] from the closest
            earlier call.
        reasons: one human-readable line per difference.
        text: the full human-readable explanation.
        jax_text: JAX's own log message, if it wrote one.
    """

    function: str
    defined_at: str | None
    call_site: str | None
    kind: str
    argument: str
    old: str
    new: str
    differences: tuple[Difference, ...]
    reasons: tuple[str, ...]
    text: str
    jax_text: str = ""

    @property
    def summary(self) -> str:
        """The reasons joined into one line."""
        return "; ".join(self.reasons)

    @property
    def note(self) -> str:
        """The hint of the headline difference (``""`` if none)."""
        return self.differences[0].note if self.differences else ""


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _static_equal(a: Any, b: Any) -> bool:
    """JAX's equality for static arguments: same type, and ``==`` if hashable else ``is``."""
    if type(a) is not type(b):
        return False
    try:
        hash(a)
    except TypeError:
        return a is b
    try:
        return bool(a == b)
    except Exception:
        return a is b


def _diff_static(name: str, old: Any, new: Any) -> Difference | None:
    if _static_equal(old, new):
        return None
    note = ""
    if type(old) is type(new) and type(new).__eq__ is object.__eq__:
        note = IDENTITY_NOTE
    return Difference("static", name, _short_repr(old), _short_repr(new), note)


def _type_text(leaf: LeafType, kind: str) -> str:
    if kind == "weak_type":
        return f"{leaf.short}{{weak_type={leaf.weak_type}}}"
    if kind == "sharding":
        return f"{leaf.short} {leaf.sharding or 'on one device'}"
    return leaf.short


def _diff_leaf(argument: str, old: LeafType, new: LeafType) -> Difference | None:
    if old == new:
        return None
    if old.shape != new.shape:
        kind = "shape"
    elif old.dtype != new.dtype:
        kind = "dtype"
    elif old.weak_type != new.weak_type:
        kind = "weak_type"
    elif old.sharding != new.sharding:
        kind = "sharding"
    else:
        kind = "other"
    return Difference(kind, argument, _type_text(old, kind), _type_text(new, kind))


def _diff_arg(old: ArgSig, new: ArgSig) -> list[Difference]:
    name = new.name
    if old.passed != new.passed:
        return [Difference("structure", name, f"passed {old.passed}", f"passed {new.passed}")]
    if old.static != new.static:
        return [
            Difference(
                "other",
                name,
                "static" if old.static else "traced",
                "static" if new.static else "traced",
            )
        ]
    if new.static:
        diff = _diff_static(name, old.value, new.value)
        return [diff] if diff else []
    if old.tree != new.tree:
        old_paths = [p for p, _ in old.leaves]
        new_paths = [p for p, _ in new.leaves]
        changed = [p for p in new_paths if p not in old_paths] + [
            p for p in old_paths if p not in new_paths
        ]
        where = name + _common_path(changed)  # the argument itself when its top changed
        return [Difference("structure", where, old.tree, new.tree)]
    out = []
    for (path, a), (_, b) in zip(old.leaves, new.leaves):
        diff = _diff_leaf(name + path, a, b)
        if diff is not None:
            out.append(diff)
    return out


def _common_path(paths: list[str]) -> str:
    """The longest path (whole keys only) that every one of ``paths`` starts with."""
    if not paths:
        return ""
    prefix = os.path.commonprefix(paths)
    while prefix and not all(p[len(prefix) : len(prefix) + 1] in ("", "[", ".") for p in paths):
        prefix = prefix[:-1]
    return prefix


def diff_calls(old: CallSig, new: CallSig) -> list[Difference]:
    """Every difference between an earlier call signature and the current one."""
    out = [
        Difference("config", n, b, a) for (n, a), (_, b) in zip(new.context, old.context) if a != b
    ]
    old_by = {a.name: a for a in old.args}
    new_by = {a.name: a for a in new.args}
    for arg in new.args:
        before = old_by.get(arg.name)
        if before is None:
            out.append(Difference("structure", arg.name, "not passed", f"passed {arg.passed}"))
        else:
            out.extend(_diff_arg(before, arg))
    for arg in old.args:
        if arg.name not in new_by:
            out.append(Difference("structure", arg.name, f"passed {arg.passed}", "not passed"))
    return out


def _headline(diffs: list[Difference]) -> list[Difference]:
    """The differences ordered by `_PRIORITY` (stable within a kind)."""
    return sorted(diffs, key=lambda d: _PRIORITY.index(d.kind))


def _where(defined_at: str | None) -> str:
    return f" (defined at {defined_at})" if defined_at else ""


def _build(
    ctx: MissContext,
    kind: str,
    diffs: tuple[Difference, ...],
    reasons: tuple[str, ...],
    text: str,
    jax_text: str,
) -> CacheMiss:
    first = diffs[0] if diffs else Difference(kind, "", "", "")
    return CacheMiss(
        ctx.name,
        ctx.defined_at,
        ctx.call_site,
        kind,
        first.argument,
        first.old,
        first.new,
        diffs,
        reasons,
        text,
        jax_text,
    )


def _closest(ctx: MissContext, recent: Sequence[CallSig]) -> list[Difference]:
    """Differences from the closest earlier key: fewest differences; on a tie, the newest.

    JAX's key order is not a history, so ``recent`` (the calls we saw miss, oldest first)
    decides ties.
    """

    def age(sig: CallSig) -> int:
        for i in range(len(recent) - 1, -1, -1):
            if recent[i] == sig:
                return len(recent) - i
        return len(recent) + 1

    scored = [(len(d), age(old), d) for old in ctx.previous for d in (diff_calls(old, ctx.new),)]
    return min(scored, key=lambda t: (t[0], t[1]))[2]


def from_context(
    ctx: MissContext, seen_before: bool, jax_text: str = "", recent: Sequence[CallSig] = ()
) -> CacheMiss:
    """Build a `CacheMiss` from the keys JAX compared.

    Args:
        ctx: the miss as read from JAX.
        seen_before: a function defined at the same place was compiled before (by another
            function object).
        jax_text: JAX's own message, kept for reference.
        recent: earlier call signatures of this function that missed, oldest first (breaks ties
            between equally close earlier keys in favour of the newest).
    """
    head = f"{ctx.name}{_where(ctx.defined_at)}"
    if not ctx.previous and ctx.wrapper:
        reason = (
            f"first compile of `{ctx.name}`{_where(ctx.defined_at)} as transformed by JAX "
            f"(`{ctx.wrapper}`, e.g. the transpose that grad needs)"
        )
        return _build(ctx, "first", (), (reason,), reason, jax_text)
    if not ctx.previous and (seen_before or ctx.same_source_alive):
        reason = (
            f"new function object `{ctx.name}`{_where(ctx.defined_at)}: a function defined at the "
            "same place was compiled before; if it is re-created per call (jax.jit of a lambda, "
            "closure or bound method inside the call), create it once"
        )
        return _build(ctx, "new_function", (), (reason,), f"{head}: {reason}", jax_text)
    if not ctx.previous:
        reason = f"first compile of `{ctx.name}`{_where(ctx.defined_at)}"
        return _build(ctx, "first", (), (reason,), reason, jax_text)
    ordered = tuple(_headline(_closest(ctx, recent)))
    if not ordered:
        reason = (
            "no difference in the arguments JAX keys on (debug information or another part of "
            "JAX's cache key changed)"
        )
        return _build(ctx, "other", (), (reason,), f"{head}: {reason}", jax_text)
    reasons = tuple(d.describe() for d in ordered)
    text = f"{head} recompiled: " + "; ".join(reasons)
    return _build(ctx, ordered[0].kind, ordered, reasons, text, jax_text)


def placement_miss(
    kind: str, name: str, defined_at: str | None, argument: str, old: str, new: str
) -> CacheMiss:
    """A recompile of an already traced program (JAX's tracing cache hit): one input's
    sharding or placement (``kind="sharding"``) or donation (``kind="donation"``) changed."""
    diff = Difference(kind, argument, old, new)
    reason = diff.describe()
    return CacheMiss(
        name,
        defined_at,
        None,
        kind,
        argument,
        old,
        new,
        (diff,),
        (reason,),
        f"{name}{_where(defined_at)} recompiled: {reason}",
    )


# --------------------------------------------------------------------------
# Fallback: JAX's prose
# --------------------------------------------------------------------------

_RE_AT = re.compile(r"^TRACING CACHE MISS at (?P<site>.*):\s*$")
_RE_NEVER = re.compile(r"^\s*(?P<name>\S.*?) id=\d+(?: defined at (?P<loc>\S+))?\s*$")
_RE_FOR = re.compile(r"^\s*for (?P<name>.+?)(?: defined at (?P<loc>\S+))?\s*$")
_RE_TYPE = re.compile(
    r"^\s*\* at (?P<arg>.+?), now (?P<new>.+?) and before (?P<old>.+?)(?:https://\S*)?$"
)
_RE_TREE = re.compile(
    r"^\s*\* at input path (?P<path>\S+), now (?P<new>.+?) and before (?P<old>.+?), so .*$"
)
_RE_CTX = re.compile(r"^\s*\* (?P<name>\S+) differs: now (?P<new>.+) and before (?P<old>.+)$")
_RE_SHORT = re.compile(r"^(?P<dtype>[a-z]+[0-9]*)\[(?P<shape>[^\]]*)\]")


def _prose_type_kind(old: str, new: str) -> str:
    if ("weak_type=True" in old) != ("weak_type=True" in new):
        return "weak_type"
    mo, mn = _RE_SHORT.match(old), _RE_SHORT.match(new)
    if mo and mn and mo.group("dtype") != mn.group("dtype"):
        return "dtype"
    if mo and mn and mo.group("shape") == mn.group("shape"):
        return "sharding"
    return "shape"


def _prose_differences(body: list[str]) -> list[Difference]:
    joined = "\n".join(body)
    diffs: list[Difference] = []
    for line in body:
        if "different input types" in joined and (m := _RE_TYPE.match(line)):
            old, new = m.group("old").replace("({})", ""), m.group("new").replace("({})", "")
            diffs.append(Difference(_prose_type_kind(old, new), m.group("arg"), old, new))
        elif m := _RE_TREE.match(line):
            diffs.append(Difference("structure", m.group("path"), m.group("old"), m.group("new")))
        elif m := _RE_CTX.match(line):
            diffs.append(Difference("config", m.group("name"), m.group("old"), m.group("new")))
    return diffs


def parse_cache_miss(text: str, seen_before: bool = False) -> CacheMiss:
    """Turn JAX's ``TRACING CACHE MISS`` prose into a `CacheMiss` (fallback only).

    JAX's prose compares with its own "closest" earlier key and cannot see static
    arguments; jaxwise reads the real cache keys instead and uses this parser only when
    they are unavailable.

    Args:
        text: JAX's log message.
        seen_before: whether a function defined at the same place compiled before (a
            ``"never seen function"`` is then a ``"new_function"``, not a ``"first"``).

    Returns:
        The structured explanation (kind ``"other"`` when the prose names no difference).

    Raises:
        TypeError: ``text`` is not a string.

    Examples:
        >>> m = parse_cache_miss("TRACING CACHE MISS at a.py:3 (g):\\n  for f defined at a.py:1\\n"
        ...     "  all previously seen cache keys differ. For the closest previous key:\\n"
        ...     "  different input types:\\n  * at x, now f32[4] and before f32[3]")
        >>> m.kind, m.argument, m.old, m.new
        ('shape', 'x', 'f32[3]', 'f32[4]')
    """
    if not isinstance(text, str):
        raise TypeError(f"`text` must be a cache-miss message (str), got {type(text).__name__}")
    lines = text.splitlines()
    site = m.group("site") if lines and (m := _RE_AT.match(lines[0])) else None
    body = lines[1:]
    if any("never seen function" in line for line in body):
        name, loc = "?", None
        for line in body:
            if m := _RE_NEVER.match(line):
                name, loc = m.group("name"), m.group("loc")
                break
        ctx = MissContext(None, name, loc, site, CallSig((), ()), (), False)
        return from_context(ctx, seen_before, text)
    name, loc = "?", None
    for line in body:
        if m := _RE_FOR.match(line):
            name, loc = m.group("name"), m.group("loc")
            break
    ordered = tuple(_headline(_prose_differences(body)))
    if not ordered:
        reason = (
            "JAX gave no difference (a static argument changed value, or is hashed by identity)"
        )
        return CacheMiss(name, loc, site, "other", "", "", "", (), (reason,), reason, text)
    first = ordered[0]
    reasons = tuple(d.describe() for d in ordered)
    return CacheMiss(
        name,
        loc,
        site,
        first.kind,
        first.argument,
        first.old,
        first.new,
        ordered,
        reasons,
        f"{name}{_where(loc)} recompiled: " + "; ".join(reasons),
        text,
    )
