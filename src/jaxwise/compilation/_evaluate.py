"""One jaxpr evaluator with a per-equation hook, for every jaxpr interpreter of jaxwise.

``evaluate_jaxpr`` runs a jaxpr equation by equation, as ``jax.core.eval_jaxpr`` does
(``get_bind_params`` then ``bind``, inside the equation's source location and context, so
errors, NaN reports and new equations keep the user's line). A *hook* sees every equation
with its input values and may return the outputs instead (rewrite one convolution, tag a
NaN, record a value). Sub-programs run the same hook, each where it belongs:

- a closed sub-program (``jit``, ``scan``, ``cond``/``switch``, ``while``, ``checkpoint``,
  ``custom_jvp``/``custom_vjp`` calls) is re-traced *when its equation is bound*, from its
  own abstract values (varying mesh axes included), so it is traced inside the caller's
  axis environment;
- a ``shard_map`` body is evaluated inside ``jax.shard_map`` with the equation's mesh,
  specs and manual axes, so collectives (``psum``, ``pmean``) find their axis names.

With a hook, every sub-program goes through it unless ``descend`` declines it (a declined
one is bound unchanged); without a hook, equations are bound as ``jax.core.eval_jaxpr``
binds them. A hook's values need not be arrays (the ghost-clipping graph evaluates with
graph references as values and a hook that never computes).

The parameter names of ``shard_map`` (``mesh``, ``in_specs``, ``out_specs``,
``newly_manual_axes``, ``check_vma``) are read here and nowhere else;
tests/test_compilation_evaluate.py fails when a JAX upgrade renames them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import jax
import jax.extend.core as jex
import jax.extend.source_info_util as source_info

from jaxwise._shared._checks import check_callable
from jaxwise._shared._jax import is_program, program_parts, same_kind

__all__ = ["EquationHook", "evaluate_equation", "evaluate_jaxpr"]

_SHARD_MAP_PARAMS = frozenset({"mesh", "in_specs", "out_specs", "jaxpr", "check_vma"})


class EquationHook(Protocol):
    """``hook(eqn, invals) -> outputs | None``: replace one equation's outputs, or decline.

    The hook is called for every equation the evaluator meets, sub-programs included; it
    returns the equation's outputs (one value per ``eqn.outvars``), or ``None`` to have the
    equation evaluated as usual. It may call
    [`evaluate_equation`][jaxwise.compilation.evaluate_equation] itself (e.g. to evaluate
    first and inspect the outputs).
    """

    def __call__(self, eqn: jex.JaxprEqn, invals: list[Any], /) -> Sequence[Any] | None:
        """The outputs of ``eqn`` at ``invals``, or ``None`` to evaluate it as usual."""
        ...


def _descend_all(jaxpr: Any) -> bool:
    del jaxpr
    return True


def evaluate_jaxpr(
    jaxpr: Any,
    args: Sequence[Any],
    hook: EquationHook | None = None,
    *,
    consts: Sequence[Any] | None = None,
    descend: Callable[[Any], bool] | None = None,
) -> list[Any]:
    """Evaluate ``jaxpr`` on ``args``, letting ``hook`` replace any equation's outputs.

    Args:
        jaxpr: the program (``jax.make_jaxpr``'s result, or a sub-program of an equation:
            open or closed, whichever the installed JAX gives).
        args: values of ``jaxpr.invars`` (arrays or tracers), in order.
        hook: called on every equation, sub-programs included; ``None``: evaluate as
            ``jax.core.eval_jaxpr`` does.
        consts: values of ``jaxpr.constvars`` (default: the program's own ``consts``).
        descend: whether to evaluate a sub-program through the hook (default: all); a
            declined sub-program is bound unchanged.

    Returns:
        The values of ``jaxpr.outvars``, a list.

    Raises:
        TypeError: ``jaxpr`` is not a jaxpr, or ``hook``/``descend`` is not callable.
        ValueError: ``consts`` or ``args`` do not match the program's variables, or the hook
            returned another number of outputs than the equation has.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> program = jax.make_jaxpr(lambda x: jnp.sin(x) * 2.0)(1.0)
        >>> def cos_for_sin(eqn, invals):
        ...     return [jnp.cos(invals[0])] if eqn.primitive.name == "sin" else None
        >>> float(evaluate_jaxpr(program, [0.0], cos_for_sin)[0])
        2.0
    """
    if not is_program(jaxpr):
        raise TypeError(f"`jaxpr` must be a jaxpr (jax.make_jaxpr's result), got {type(jaxpr)}")
    if hook is not None:
        check_callable(hook, "hook")
    if descend is not None:
        check_callable(descend, "descend")
    jaxpr, own_consts = program_parts(jaxpr)
    consts = own_consts if consts is None else consts
    for name, values, variables in (
        ("consts", consts, jaxpr.constvars),
        ("args", args, jaxpr.invars),
    ):
        if len(values) != len(variables):
            raise ValueError(f"`{name}` must hold {len(variables)} values, got {len(values)}")
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))

    def read(atom: Any) -> Any:
        return atom.val if isinstance(atom, jex.Literal) else env[atom]

    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        with _at(eqn):  # errors, NaN reports and new equations keep the user's line
            out = hook(eqn, invals) if hook is not None else None
            if out is None:
                out = evaluate_equation(eqn, invals, hook, descend=descend)
            elif len(out) != len(eqn.outvars):
                raise ValueError(
                    f"`hook` returned {len(out)} outputs for `{eqn.primitive.name}`, which has "
                    f"{len(eqn.outvars)}"
                )
        for var, value in zip(eqn.outvars, out, strict=True):
            if not isinstance(var, jex.DropVar):
                env[var] = value
    return [read(v) for v in jaxpr.outvars]


@contextlib.contextmanager
def _at(eqn: jex.JaxprEqn) -> Iterator[None]:
    """The context of ``eqn``: its source location and name stack, and its own context."""
    name_stack = source_info.current_name_stack() + eqn.source_info.name_stack
    with source_info.user_context(eqn.source_info.traceback, name_stack=name_stack):
        with eqn.ctx.manager:
            yield


def evaluate_equation(
    eqn: jex.JaxprEqn,
    invals: Sequence[Any],
    hook: EquationHook | None = None,
    *,
    descend: Callable[[Any], bool] | None = None,
) -> list[Any]:
    """Evaluate one equation (not through ``hook``), its sub-programs through ``hook``.

    Args:
        eqn: the equation.
        invals: its input values, one per ``eqn.invars``.
        hook: applied to the equations of its sub-programs; ``None``: bind ``eqn`` as
            ``jax.core.eval_jaxpr`` does.
        descend: which sub-programs go through the hook (default: all).

    Returns:
        Its outputs, one per ``eqn.outvars``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> eqn = jax.make_jaxpr(jnp.sin)(0.0).eqns[0]
        >>> float(evaluate_equation(eqn, [0.0])[0])
        0.0
    """
    descend = descend or _descend_all
    params = eqn.params
    if hook is not None:
        if eqn.primitive.name == "shard_map" and descend(params["jaxpr"]):
            return _shard_map(eqn, list(invals), hook, descend)
        params = {k: _sub_program(v, hook, descend) for k, v in params.items()}
    out = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(params))
    return list(out) if eqn.primitive.multiple_results else [out]


def _sub_program(value: Any, hook: EquationHook, descend: Callable[[Any], bool]) -> Any:
    """A parameter with every sub-program (alone or in a tuple) re-traced through ``hook``."""
    if isinstance(value, tuple) and value and all(is_program(v) for v in value):
        return tuple(_sub_program(v, hook, descend) for v in value)
    if not is_program(value) or not descend(value):
        return value
    program: Any = value

    def run(*args: Any) -> list[Any]:
        return evaluate_jaxpr(program, args, hook, descend=descend)

    # traced here, inside the caller's axis environment, from avals that keep their weak
    # types and varying mesh axes
    traced = jax.make_jaxpr(run)(*program.in_avals)
    if traced.out_avals != program.out_avals:  # the hook changed a type: keep the original
        return value
    if program_parts(traced)[1] and not program_parts(value)[1]:  # bound without constants
        return value
    like = same_kind(value, traced)
    return value if like is None else like


def _shard_map(
    eqn: jex.JaxprEqn, invals: list[Any], hook: EquationHook, descend: Callable[[Any], bool]
) -> list[Any]:
    """A ``shard_map`` equation with its body evaluated through ``hook``, inside its mesh."""
    p = eqn.params
    missing = _SHARD_MAP_PARAMS - p.keys()
    manual = p.get("newly_manual_axes", p.get("manual_axes"))
    if missing or manual is None:
        raise NotImplementedError(
            f"this JAX's `shard_map` equation lacks {sorted(missing) or ['newly_manual_axes']}; "
            "jaxwise.compilation._evaluate reads its parameters"
        )
    body = p["jaxpr"]

    def run(*args: Any) -> tuple[Any, ...]:
        return tuple(evaluate_jaxpr(body, args, hook, descend=descend))

    mapped = jax.shard_map(
        run,
        mesh=p["mesh"],
        in_specs=p["in_specs"],
        out_specs=p["out_specs"],
        axis_names=manual,
        check_vma=p["check_vma"],
    )
    return list(mapped(*invals))
