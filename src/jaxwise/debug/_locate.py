"""`locate_nan`: replay a function's jaxpr and follow a NaN from its creation to the output."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, Literal

import jax

from jaxwise._shared._checks import check_callable
from jaxwise._shared._frames import Frame, is_library_file, live_rule_frames, source_frames
from jaxwise.debug._replay import Origin, Replay, bad_kind

__all__ = ["NanReport", "locate_nan"]


@dataclasses.dataclass(frozen=True)
class NanReport:
    """Where the non-finite value that reaches the output was created.

    Attributes:
        primitive: the JAX primitive that created it from values free of it (e.g. ``"log"``,
            ``"div"``, ``"mul"``); ``"argument"`` when it was already in an argument of ``fn``,
            ``"unknown"`` if the replay could not attribute it.
        kind: ``"nan"`` or ``"inf"``.
        phase: ``"forward"`` or ``"backward"`` (inside a transpose, i.e. the
            reverse pass of ``grad``/``vjp``).
        frame: the innermost user-code frame that created the operation (for a
            backward operation: the forward line it differentiates), or ``None``.
        stack: all user-code frames, outermost first.
        name_stack: JAX's name stack of the operation (e.g. ``transpose(jvp())``).
        message: a one-line summary (e.g. ``invalid value (nan) produced by `log` …``).
    """

    primitive: str
    kind: Literal["nan", "inf"]
    phase: Literal["forward", "backward"]
    frame: Frame | None
    stack: tuple[Frame, ...]
    name_stack: str
    message: str

    def __str__(self) -> str:
        if self.primitive == "argument":
            return f"{self.kind} already present in the input: {self.message}"
        where = str(self.frame) if self.frame else "an unknown location"
        return f"{self.kind} produced by `{self.primitive}` in the {self.phase} pass at {where}"


@contextlib.contextmanager
def _debug_flags_off() -> Iterator[None]:
    """Turn ``jax_debug_nans``/``jax_debug_infs`` off; restore the user's values (also on error)."""
    saved = {name: getattr(jax.config, name) for name in ("jax_debug_nans", "jax_debug_infs")}
    try:
        for name in saved:
            jax.config.update(name, False)
        yield
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)


def _library_source(eqn: Any) -> str | None:
    """The file of the function a call equation calls, when it is library code
    (``jnp.linalg.norm``, ``jax.nn.relu``, Equinox's jit wrapper, a jaxwise helper)."""
    for name in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        sub = eqn.params.get(name)
        if sub is None:
            continue
        info = getattr(getattr(sub, "jaxpr", sub), "debug_info", None)
        source = str(getattr(info, "func_src_info", "") or "")
        file = source.partition(" at ")[2].rpartition(":")[0]
        return file if file and is_library_file(file) else None
    return None


def _runs_user_code(eqn: Any, library_file: str) -> bool:
    """The equation was traced in user code that the library function called (Equinox's
    jit wrapper calling the user's model), not in the library's own code."""
    frames = list(getattr(getattr(eqn.source_info, "traceback", None), "frames", ()))
    for i, frame in enumerate(frames):  # innermost first
        if not is_library_file(frame.file_name):
            return any(f.file_name == library_file for f in frames[i + 1 :])
    return False


def _frames_of(origin: Origin) -> tuple[Frame, ...]:
    """The user's frames for the origin. Inside a library function's cached jaxpr, the
    equation's own frames may come from another trace (or be missing): the call of the
    library function says where the user called it, unless the library called user code."""
    frames = source_frames(origin.eqn.source_info)
    for call in origin.context:
        library = _library_source(call)
        if library is not None and not (frames and _runs_user_code(origin.eqn, library)):
            frames = source_frames(call.source_info)
            break
    for eqn in reversed(origin.context):  # none left (a derivative JAX built): the caller's
        if frames:
            break
        frames = source_frames(eqn.source_info)
    return frames


def _report(origin: Origin) -> NanReport:
    kind: Literal["nan", "inf"] = "inf" if origin.kind == "inf" else "nan"
    if origin.eqn is None:
        return NanReport(
            "argument",
            kind,
            "forward",
            None,
            (),
            "",
            f"invalid value ({kind}) in {origin.argument}",
        )
    eqn = origin.eqn
    stack = _frames_of(origin)
    name_stack = str(getattr(eqn.source_info, "name_stack", ""))
    stacks = [str(getattr(e.source_info, "name_stack", "")) for e in origin.context]
    stacks += [str(e.params.get("name", "")) for e in origin.context]
    backward = any("transpose" in n for n in (*stacks, name_stack))
    phase: Literal["forward", "backward"] = "backward" if backward else "forward"
    message = f"invalid value ({kind}) produced by `{eqn.primitive.name}` in the {phase} pass"
    return NanReport(
        eqn.primitive.name, kind, phase, stack[-1] if stack else None, stack, name_stack, message
    )


def locate_nan(
    fn: Callable[..., Any], *args: Any, check_inf: bool = False, **kwargs: Any
) -> NanReport | None:
    """Run ``fn(*args, **kwargs)``; if an output is NaN (or inf), report where it was created.

    Steps: run the call once with ``jax_debug_nans``/``jax_debug_infs`` turned off (the
    user's settings are restored afterwards, also on error, so a user who keeps them on gets
    a report, not a ``FloatingPointError``); if every output is finite, return ``None``.
    Otherwise trace ``fn`` to a jaxpr and replay it equation by equation, tagging every
    non-finite value with the equation that created it from non-finite-free inputs. Tags flow
    through every primitive; through ``select_n`` (``jnp.where``) only from the cases actually
    selected, so a NaN that a ``where`` discards is never blamed. The replay follows the value
    into ``jit`` calls, ``jax.checkpoint``, ``cond``/``switch`` branches, ``custom_jvp`` and
    ``custom_vjp`` rules (into the rule's own lines), and into the one step of a ``scan``,
    ``fori_loop`` or ``while_loop`` body that creates it (found by one compiled run of the
    loop, not by replaying every step). The report names the creator of the NaN that reaches
    the output (the earliest one if several do), at the innermost frame of the user's code:
    frames of JAX, Optax, Flax, Equinox and jaxwise are skipped. A value created inside a
    ``shard_map`` body is located at its line in the body (the body runs once more inside its
    mesh, each equation reporting its non-finite values through a debug callback).

    Args:
        fn: any function of arrays (jitted or not), e.g. ``jax.grad(loss)``.
        *args: its positional arguments.
        check_inf: also track ``inf`` (by default a NaN created from an ``inf``, such as
            ``0 · inf`` in a backward pass, is blamed on the operation making the NaN).
        **kwargs: its keyword arguments.

    Returns:
        A [`NanReport`][jaxwise.debug.NanReport], or ``None`` if every output is finite.

    Raises:
        TypeError: ``fn`` is not callable.

    Examples:
        >>> import jax.numpy as jnp
        >>> def f(x, y):
        ...     return jnp.where(x > 0, jnp.log(x), 0.0) + jnp.sqrt(y - 5.0)
        >>> r = locate_nan(f, jnp.zeros(2), jnp.ones(2))
        >>> r.primitive, r.phase, r.frame.function
        ('sqrt', 'forward', 'f')
    """
    check_callable(fn, "fn")
    with _debug_flags_off():
        out = jax.block_until_ready(fn(*args, **kwargs))
        if all(bad_kind(leaf, check_inf) is None for leaf in jax.tree.leaves(out)):
            return None
        with live_rule_frames():
            closed = jax.make_jaxpr(fn)(*args, **kwargs)
        replay = Replay(bool(check_inf))
        flat, _ = jax.tree_util.tree_flatten_with_path((args, kwargs))
        arg_origins = []
        for path, leaf in flat:
            kind = bad_kind(leaf, check_inf)
            label = "the argument " + _argument_name(path)
            arg_origins.append(replay.new_origin(kind, argument=label) if kind else None)
        _, out_origins = replay.run(
            closed.jaxpr, list(closed.consts), [leaf for _, leaf in flat], arg_origins
        )
    found = [o for o in out_origins if o is not None]
    if not found:  # the op-by-op replay disagrees with the compiled run (rare)
        return NanReport(
            "unknown", "nan", "forward", None, (), "", "non-finite output not reproduced op by op"
        )
    return _report(min(found, key=lambda o: o.order))


def _argument_name(path: tuple) -> str:
    """``args[0]['w']`` / ``scale`` for a flattened ``(args, kwargs)`` path."""
    head, rest = path[0], path[1:]
    if getattr(head, "idx", None) == 0 and rest:
        return f"args[{rest[0].idx}]" + jax.tree_util.keystr(rest[1:])
    if rest:
        return str(getattr(rest[0], "key", rest[0])) + jax.tree_util.keystr(rest[1:])
    return jax.tree_util.keystr(path)
