"""What the adapters do while DP-SGD traces a loss: BatchNorm in training mode is refused or frozen.

BatchNorm normalises with statistics of the whole batch and keeps running averages of them:
every example reaches every other example's output and the carried state, so per-example
clipping does not bound one example's influence (Opacus refuses BatchNorm for this reason).
`jaxwise.privacy` traces the per-example loss inside `private_training`; while it is
active the adapters' ``apply`` either refuse such layers with one ``ValueError`` naming them
(the default) or, with ``freeze=True``, run them in inference mode from the statistics in
``model_state`` (which then never change). Layers are found by each library's own type:
``nnx.BatchNorm`` (its ``use_running_average`` attribute), linen ``nn.BatchNorm`` (the
effective ``use_running_average`` of each call, through ``nn.intercept_methods``) and
``eqx.nn.BatchNorm`` (its ``inference`` field).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import jax

from jaxwise._shared._blame import own

__all__ = ["example_mixing_error", "private_training"]

Mode = Literal["refuse", "freeze"]
_MODE: contextvars.ContextVar[Mode | None] = contextvars.ContextVar("jaxwise_dp", default=None)

_FIX = (
    "use GroupNorm or LayerNorm (per-example normalisation) instead, or pass "
    "freeze_model_state=True to run BatchNorm in inference mode from the statistics in "
    "`model_state` (they then never change)"
)


@contextlib.contextmanager
def private_training(freeze: bool) -> Iterator[None]:
    """Adapters refuse (or, with ``freeze``, freeze) BatchNorm in training mode inside the block.

    Examples:
        >>> with private_training(freeze=True):
        ...     _MODE.get()
        'freeze'
        >>> _MODE.get() is None
        True
    """
    token = _MODE.set("freeze" if freeze else "refuse")
    try:
        yield
    finally:
        _MODE.reset(token)


def example_mixing_error(what: str, paths: Sequence[str]) -> ValueError:
    """The one error for a layer or model state that mixes examples under DP-SGD.

    Examples:
        >>> str(example_mixing_error("nnx.BatchNorm layer", ["bn"]))[:52]
        'DP-SGD cannot train the nnx.BatchNorm layer `bn`: it'
    """
    names = ", ".join(f"`{p}`" for p in paths)
    return own(  # raised inside the user's loss: a training program passes it on unchanged
        ValueError(
            f"DP-SGD cannot train the {what} {names}: it mixes examples (statistics of the whole "
            "batch reach every example's output, or the state carried to the next step), so "
            f"per-example clipping does not bound one example's influence; {_FIX}"
        )
    )


def _dotted(path: Sequence[Any]) -> str:
    """``('blocks', 0)`` or a JAX key path as ``blocks.0``."""
    parts = []
    for key in path:
        for attr in ("name", "key", "idx"):
            if hasattr(key, attr):
                key = getattr(key, attr)
                break
        parts.append(str(key))
    return ".".join(parts) or "<root>"


def nnx_mode(nnx: Any, module: Any) -> None:
    """Refuse, or switch to running averages, the NNX BatchNorm layers of ``module`` (a copy)."""
    mode = _MODE.get()
    if mode is None:
        return
    training = [
        (path, layer)
        for path, layer in nnx.iter_modules(module)
        if isinstance(layer, nnx.BatchNorm) and not layer.use_running_average
    ]
    if training and mode == "refuse":
        raise example_mixing_error("nnx.BatchNorm layer", [_dotted(p) for p, _ in training])
    for _, layer in training:
        layer.use_running_average = True


def linen_mode(linen: Any) -> contextlib.AbstractContextManager[Any]:
    """A linen interceptor that refuses or freezes ``nn.BatchNorm`` calls in training mode."""
    mode = _MODE.get()
    if mode is None:
        return contextlib.nullcontext()

    def intercept(next_fun: Any, args: Any, kwargs: dict[str, Any], context: Any) -> Any:
        module = context.module
        if not (isinstance(module, linen.BatchNorm) and context.method_name == "__call__"):
            return next_fun(*args, **kwargs)
        call_value = args[1] if len(args) > 1 else kwargs.get("use_running_average")
        if module.use_running_average if call_value is None else call_value:
            return next_fun(*args, **kwargs)  # inference mode already
        if mode == "refuse":
            raise example_mixing_error("linen nn.BatchNorm layer", [_dotted(module.path)])
        if call_value is not None:  # the call chose training mode: choose inference instead
            rest = {k: v for k, v in kwargs.items() if k != "use_running_average"}
            return next_fun(args[0], *args[2:], use_running_average=True, **rest)
        # the module's attribute chose it (linen refuses both): flip it for this call only
        object.__setattr__(module, "use_running_average", True)
        try:
            return next_fun(*args, **kwargs)
        finally:
            object.__setattr__(module, "use_running_average", False)

    return linen.intercept_methods(intercept)


def equinox_mode(eqx: Any, model: Any) -> Any:
    """``model`` with its ``eqx.nn.BatchNorm`` layers refused or set to ``inference=True``."""
    mode = _MODE.get()
    if mode is None:
        return model

    def is_batch_norm(x: Any) -> bool:
        return isinstance(x, eqx.nn.BatchNorm)

    found = [
        (path, layer)
        for path, layer in jax.tree_util.tree_flatten_with_path(model, is_leaf=is_batch_norm)[0]
        if is_batch_norm(layer) and not layer.inference
    ]
    if not found:
        return model
    if mode == "refuse":
        raise example_mixing_error("eqx.nn.BatchNorm layer", [_dotted(p) for p, _ in found])

    def flags(m: Any) -> list[Any]:  # every BatchNorm's flag (`where` may not read leaves)
        return [x.inference for x in jax.tree.leaves(m, is_leaf=is_batch_norm) if is_batch_norm(x)]

    return eqx.tree_at(flags, model, replace=[True] * len(flags(model)))
