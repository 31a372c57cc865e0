"""Models from Flax NNX, Flax linen and Equinox as ``Model(params, model_state, apply)``.

Each adapter follows its library's own idiom to split a model into trainable parameters,
non-trainable state (BatchNorm statistics, NNX RNG counters, Equinox ``eqx.nn.State``) and a
pure function ``apply(params, model_state, *args, **kwargs) -> (out, new_model_state)`` that
works under ``jit``, ``vmap`` and ``grad``. Flax and Equinox are imported only when an adapter
is called (``pip install 'jaxwise[flax]'`` / ``'jaxwise[equinox]'``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from jaxwise._extras import require

__all__ = ["Model", "from_equinox", "from_linen", "from_nnx"]


class Model(NamedTuple):
    """A model split into arrays and a pure function.

    Attributes:
      params: the trainable parameters, a pytree of arrays (an NNX ``State``, a linen
        ``params`` dict, or an Equinox module whose non-array fields are ``None``).
      model_state: non-trainable state threaded through ``apply`` (BatchNorm running
        statistics, NNX RNG counters, an ``eqx.nn.State``); ``None`` when the model has none.
      apply: ``apply(params, model_state, *args, **kwargs) -> (out, new_model_state)``, pure:
        it never mutates its inputs, so it works under ``jit``, ``vmap`` and ``grad``.
    """

    params: Any
    model_state: Any
    apply: Callable[..., tuple[Any, Any]]


def _require(module: str, extra: str, adapter: str) -> Any:
    return require(module, extra=extra, feature=f"jaxwise.models.{adapter}")


def _named(fn: Callable[..., Any], model: Any) -> Callable[..., Any]:
    # jit names its program after the function: `jit(apply_MyNet)`, the user's model.
    fn.__name__ = fn.__qualname__ = f"apply_{type(model).__name__}"
    return fn


def from_nnx(module: Any, trainable: Any = None) -> Model:
    """Split a Flax NNX module with ``nnx.split(module, trainable, ...)``; ``apply`` merges it back.

    ``params`` is the ``nnx.Param`` state (or the ``trainable`` filter's), ``model_state`` every
    other variable: BatchNorm's ``BatchStat`` running statistics and the RNG state of
    ``nnx.Dropout``/``nnx.Rngs`` (key and counter, advanced on every call, so each step draws
    fresh dropout masks as long as the returned state is fed back). ``apply`` rebuilds the
    module with ``nnx.merge(..., copy=True)`` (the caller's arrays are never mutated), calls it
    and returns the output with the new non-trainable state.

    Train/eval mode is NNX's own: static attributes of the module (``deterministic``,
    ``use_running_average``). ``apply`` runs in the mode the module had when split; for the
    other mode split a view: ``from_nnx(nnx.view(module, deterministic=True,
    use_running_average=True)).apply`` takes the same ``params`` and ``model_state``.

    Args:
      module: an ``nnx.Module``.
      trainable: an NNX filter for the trainable variables (default ``nnx.Param``).

    Returns:
      ``Model(params, model_state, apply)``; ``model_state`` is ``None`` when the module has
      no variables besides its parameters.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from flax import nnx
        >>> model = from_nnx(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
        >>> out, state = jax.jit(model.apply)(model.params, model.model_state, jnp.ones((4, 3)))
        >>> out.shape, state
        ((4, 2), None)
    """
    nnx = _require("flax.nnx", "flax", "from_nnx")
    if not isinstance(module, nnx.Module):
        raise TypeError(
            f"`module` must be a flax.nnx.Module, got {type(module).__name__}" + _hint_for(module)
        )
    trainable = nnx.Param if trainable is None else trainable
    graphdef, params, rest = nnx.split(module, trainable, ...)
    has_state = bool(rest)

    def apply(params: Any, model_state: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        if (model_state is None) == has_state:
            raise ValueError(
                "`model_state` must be "
                + (
                    "the model's non-trainable state (Model.model_state)"
                    if has_state
                    else "None: this NNX module has no non-trainable variables"
                )
            )
        states = (params, model_state) if has_state else (params,)
        merged = nnx.merge(graphdef, *states, copy=True)
        out = merged(*args, **kwargs)
        _, _, new_state = nnx.split(merged, trainable, ...)
        return out, (new_state if has_state else None)

    return Model(params, rest if has_state else None, _named(apply, module))


def from_linen(module: Any, variables: Any) -> Model:
    """Split linen ``variables`` into ``params`` and the other collections (``model_state``).

    ``apply`` calls ``module.apply({"params": params, **model_state}, *args,
    mutable=[every other collection], **kwargs)`` and returns the output with the updated
    collections (e.g. ``batch_stats``), so BatchNorm trains as in linen's own examples.

    Train/eval mode and dropout are linen's own call arguments, passed through ``kwargs``:
    the module's ``train``/``deterministic`` argument (``apply(params, state, x,
    train=False)``) and ``rngs={"dropout": key}``. In eval mode the collections come back
    unchanged. Do not pass ``mutable``: the adapter owns it.

    Args:
      module: a ``flax.linen.Module``.
      variables: what ``module.init(...)`` returned (a dict or ``FrozenDict`` with a
        ``"params"`` collection).

    Returns:
      ``Model(params, model_state, apply)``; ``model_state`` is a dict of collections, or
      ``None`` when ``variables`` holds only ``"params"``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import flax.linen as nn
        >>> net = nn.Dense(2)
        >>> model = from_linen(net, net.init(jax.random.key(0), jnp.ones((1, 3))))
        >>> model.apply(model.params, model.model_state, jnp.ones((4, 3)))[0].shape
        (4, 2)
    """
    linen = _require("flax.linen", "flax", "from_linen")
    flax_core = _require("flax.core", "flax", "from_linen")
    if not isinstance(module, linen.Module):
        raise TypeError(
            f"`module` must be a flax.linen.Module, got {type(module).__name__}" + _hint_for(module)
        )
    if not hasattr(variables, "keys") or "params" not in variables:
        raise TypeError(
            "`variables` must be the dict that `module.init(key, ...)` returns, with a "
            f"'params' collection; got {type(variables).__name__}"
        )
    variables = flax_core.unfreeze(variables)
    params = variables.pop("params")
    collections = tuple(sorted(variables))

    def apply(params: Any, model_state: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        if "mutable" in kwargs:
            raise TypeError(
                "do not pass `mutable`: every collection besides 'params' "
                f"({list(collections)}) is mutable and returned as the new model_state"
            )
        if not collections:
            return module.apply({"params": params}, *args, **kwargs), None
        if model_state is None or set(model_state) != set(collections):
            got = None if model_state is None else sorted(model_state)
            raise ValueError(
                f"`model_state` must hold the collections {list(collections)}, got {got}"
            )
        out, updated = module.apply(
            {"params": params, **model_state}, *args, mutable=list(collections), **kwargs
        )
        updated = flax_core.unfreeze(updated)
        return out, {c: updated.get(c, model_state[c]) for c in collections}

    return Model(params, {c: variables[c] for c in collections} or None, _named(apply, module))


def from_equinox(module: Any, state: Any = None) -> Model:
    """Split an Equinox module with ``eqx.partition(module, eqx.is_inexact_array)``.

    ``params`` holds the floating-point arrays (the module with every other field ``None``);
    the rest (activation functions, sizes, integer arrays) is static and recombined with
    ``eqx.combine`` inside ``apply``. Stateful layers (``eqx.nn.BatchNorm``) keep their state
    in an ``eqx.nn.State``: build the model with ``eqx.nn.make_with_state(Model)(...)`` and
    pass that ``state``; ``apply`` then calls ``module(*args, model_state, **kwargs)`` and
    expects ``(out, new_state)``, Equinox's convention. Without a state it calls
    ``module(*args, **kwargs)``.

    Equinox modules take ONE example: ``jax.vmap`` the ``apply`` over the batch (with
    ``axis_name`` matching ``eqx.nn.BatchNorm(..., axis_name=...)``, and ``out_axes=(0,
    None)`` for the state). Dropout keys are Equinox's ``key=`` argument
    (``apply(params, state, x, key=key)``). Eval mode is Equinox's ``eqx.nn.inference_mode``:
    ``from_equinox(eqx.nn.inference_mode(module), state).apply`` takes the same ``params``.

    Args:
      module: an ``equinox.Module``.
      state: the ``eqx.nn.State`` of its stateful layers, or ``None``.

    Returns:
      ``Model(params, model_state, apply)`` with ``model_state`` the ``state``.

    Examples:
        >>> import jax, jax.numpy as jnp, equinox as eqx
        >>> model = from_equinox(eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0)))
        >>> batched = jax.vmap(model.apply, in_axes=(None, None, 0))  # one example per call
        >>> batched(model.params, None, jnp.ones((4, 3)))[0].shape
        (4, 2)
    """
    eqx = _require("equinox", "equinox", "from_equinox")
    if not isinstance(module, eqx.Module):
        raise TypeError(
            f"`module` must be an equinox.Module, got {type(module).__name__}" + _hint_for(module)
        )
    if state is not None and not isinstance(state, eqx.nn.State):
        raise TypeError(
            "`state` must be the eqx.nn.State from eqx.nn.make_with_state(...) or None, "
            f"got {type(state).__name__}"
        )
    params, static = eqx.partition(module, eqx.is_inexact_array)
    has_state = state is not None

    def apply(params: Any, model_state: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        model = eqx.combine(params, static)
        if not has_state:
            return model(*args, **kwargs), model_state
        out, new_state = model(*args, model_state, **kwargs)
        return out, new_state

    return Model(params, state, _named(apply, module))


def _hint_for(obj: Any) -> str:
    if isinstance(obj, tuple) and len(obj) == 2:
        return " (a tuple: pass the module and its state/variables as separate arguments)"
    return ""
