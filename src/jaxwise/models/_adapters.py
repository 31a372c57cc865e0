"""Models from Flax NNX, Flax linen and Equinox as ``Model(params, model_state, apply)``.

Each adapter follows its library's own idiom to split a model into trainable parameters,
non-trainable state (BatchNorm statistics, NNX RNG counters, Equinox ``eqx.nn.State``) and a
pure function ``apply(params, model_state, *args, **kwargs) -> (out, new_model_state)`` that
works under ``jit``, ``vmap`` and ``grad``. Flax and Equinox are imported only when an adapter
is called (``pip install 'jaxwise[flax]'`` / ``'jaxwise[equinox]'``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

import jax

from jaxwise._shared._blame import own
from jaxwise._shared._checks import is_key
from jaxwise._shared._extras import require
from jaxwise._shared._model_modes import equinox_mode, linen_mode, nnx_mode

if TYPE_CHECKING:  # optional extras: imported only for type checkers
    import equinox as eqx
    import flax.linen as linen
    from flax import nnx

__all__ = ["Model", "from_equinox", "from_linen", "from_nnx"]


class Model(NamedTuple):
    """A model split into arrays and a pure function.

    Attributes:
        params: the trainable parameters, a pytree of arrays (an NNX ``State``, a linen
            ``params`` dict, or an Equinox module whose non-array fields are ``None``).
        model_state: non-trainable state threaded through ``apply`` (BatchNorm running
            statistics, NNX RNG counters, an ``eqx.nn.State``); ``None`` when the model has
            none.
        apply: ``apply(params, model_state, *args, **kwargs) -> (out, new_model_state)``,
            pure: it never mutates its inputs, so it works under ``jit``, ``vmap`` and
            ``grad``.
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


def from_nnx(module: nnx.Module, trainable: Any = None) -> Model:
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
            no variables besides its parameters. ``apply`` raises ``ValueError`` when given a
            ``model_state`` the module does not have (or none when it has one).

    Raises:
        ImportError: Flax is not installed (``pip install 'jaxwise[flax]'``).
        TypeError: ``module`` is not an ``nnx.Module``.

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
            raise own(
                ValueError(
                    "`model_state` must be "
                    + (
                        "the model's non-trainable state (Model.model_state)"
                        if has_state
                        else "None: this NNX module has no non-trainable variables"
                    )
                )
            )
        states = (params, model_state) if has_state else (params,)
        merged = nnx.merge(graphdef, *states, copy=True)
        nnx_mode(nnx, merged)  # under DP-SGD: BatchNorm in training mode refused or frozen
        out = merged(*args, **kwargs)
        _, _, new_state = nnx.split(merged, trainable, ...)
        return out, (new_state if has_state else None)

    return Model(params, rest if has_state else None, _named(apply, module))


def from_linen(
    module: linen.Module, variables: Mapping[str, Any], *, rngs: Mapping[str, Any] | None = None
) -> Model:
    """Split linen ``variables`` into ``params`` and the other collections (``model_state``).

    ``apply`` calls ``module.apply({"params": params, **model_state}, *args,
    mutable=[every other collection], **kwargs)`` and returns the output with the updated
    collections (e.g. ``batch_stats``), so BatchNorm trains as in linen's own examples.

    Train/eval mode and dropout are linen's own call arguments, passed through ``kwargs``:
    the module's ``train``/``deterministic`` argument (``apply(params, state, x,
    train=False)``) and ``rngs={"dropout": key}``. In eval mode the collections come back
    unchanged. Do not pass ``mutable``: the adapter owns it.

    With ``rngs`` (e.g. ``{"dropout": jax.random.key(1)}``) the adapter carries those RNG
    streams in ``model_state["rngs"]`` instead: every call splits each stream's key, hands
    one half to linen and returns the other in the new state, so a training loop that feeds
    the state back draws fresh dropout masks at every step (and DP-SGD, which folds the
    example index into every key of the state, a different mask for every example).

    Args:
        module: a ``flax.linen.Module``.
        variables: what ``module.init(...)`` returned (a dict or ``FrozenDict`` with a
            ``"params"`` collection).
        rngs: optional RNG streams carried in the state: a mapping from stream name to a
            typed key (``jax.random.key``).

    Returns:
        ``Model(params, model_state, apply)``; ``model_state`` is a dict of collections (and
            ``"rngs"``), or ``None`` when ``variables`` holds only ``"params"`` and no ``rngs``.
            ``apply`` raises ``TypeError`` when given ``mutable`` (or ``rngs`` while it carries
            them) and ``ValueError`` for a ``model_state`` without the module's collections.

    Raises:
        ImportError: Flax is not installed (``pip install 'jaxwise[flax]'``).
        TypeError: ``module`` is not a linen module, ``variables`` has no ``"params"``, or an
            ``rngs`` entry is not a typed key.
        ValueError: a collection is named ``"rngs"`` while ``rngs`` is given.

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
    params, unfrozen, streams = _linen_variables(variables, rngs, flax_core)
    collections = tuple(sorted(unfrozen))
    apply = _linen_apply(module, collections, streams, linen, flax_core)
    initial = {c: unfrozen[c] for c in collections}
    if streams:
        initial["rngs"] = streams
    return Model(params, initial or None, _named(apply, module))


def _linen_variables(
    variables: Mapping[str, Any], rngs: Mapping[str, Any] | None, flax_core: ModuleType
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``(params, the other collections, the RNG streams)`` of ``from_linen``'s arguments."""
    if not hasattr(variables, "keys") or "params" not in variables:
        raise TypeError(
            "`variables` must be the dict that `module.init(key, ...)` returns, with a "
            f"'params' collection; got {type(variables).__name__}"
        )
    unfrozen = flax_core.unfreeze(variables)
    params = unfrozen.pop("params")
    streams = _check_streams(rngs, "rngs")
    if streams and "rngs" in unfrozen:
        raise ValueError(
            "`variables` has a collection named 'rngs', which the RNG streams of `rngs` would "
            "hide in model_state; rename the collection or pass the keys to apply"
        )
    return params, unfrozen, streams


def _linen_apply(
    module: linen.Module,
    collections: tuple[str, ...],
    streams: dict[str, Any],
    linen: ModuleType,
    flax_core: ModuleType,
) -> Callable[..., tuple[Any, Any]]:
    """``apply(params, model_state, *args, **kwargs) -> (out, new_model_state)`` of a linen
    module whose mutable ``collections`` (and carried RNG ``streams``) are the model state."""
    names = (*collections, "rngs") if streams else collections

    def apply(params: Any, model_state: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        if "mutable" in kwargs:
            raise own(
                TypeError(
                    "do not pass `mutable`: every collection besides 'params' "
                    f"({list(collections)}) is mutable and returned as the new model_state"
                )
            )
        if not names:
            with linen_mode(linen):
                return module.apply({"params": params}, *args, **kwargs), None
        if model_state is None or set(model_state) != set(names):
            got = None if model_state is None else sorted(model_state)
            raise own(
                ValueError(f"`model_state` must hold the collections {list(names)}, got {got}")
            )
        new_streams = {}
        if streams:
            if "rngs" in kwargs:
                raise own(
                    TypeError(
                        "do not pass `rngs`: this model carries its RNG streams "
                        f"{sorted(streams)} in model_state['rngs']"
                    )
                )
            halves = {name: jax.random.split(k) for name, k in model_state["rngs"].items()}
            new_streams = {"rngs": {name: pair[0] for name, pair in halves.items()}}
            kwargs = {**kwargs, "rngs": {name: pair[1] for name, pair in halves.items()}}
        state = {c: model_state[c] for c in collections}
        with linen_mode(linen):  # under DP-SGD: BatchNorm in training mode refused or frozen
            out, updated = module.apply(
                {"params": params, **state}, *args, mutable=list(collections), **kwargs
            )
        updated = flax_core.unfreeze(updated)
        return out, {**{c: updated.get(c, state[c]) for c in collections}, **new_streams}

    return apply


def _check_streams(rngs: Any, name: str) -> dict[str, Any]:
    """``rngs`` as a dict of typed keys (empty for None)."""
    if rngs is None:
        return {}
    if not isinstance(rngs, Mapping):
        raise TypeError(
            f"`{name}` must map stream names to typed keys, e.g. "
            f"{{'dropout': jax.random.key(1)}}, got {type(rngs).__name__}"
        )
    for stream, k in rngs.items():
        if not (is_key(k) and getattr(k, "shape", None) == ()):
            raise TypeError(
                f"`{name}[{stream!r}]` must be one typed key (jax.random.key(seed)), got "
                f"{type(k).__name__}"
            )
    return dict(rngs)


def from_equinox(
    module: eqx.Module, state: eqx.nn.State | None = None, *, key: jax.Array | None = None
) -> Model:
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
    (``apply(params, state, x, key=key)``), or, with ``key`` here, a stream carried in the
    state: ``model_state`` is then ``{"state": state, "key": key}`` and every call splits
    the key, passes one half as ``key=`` and returns the other in the new state (fresh
    dropout masks at every step of a loop that feeds the state back; DP-SGD folds the
    example index into it, so every example gets its own mask). Eval mode is Equinox's
    ``eqx.nn.inference_mode``: ``from_equinox(eqx.nn.inference_mode(module), state).apply``
    takes the same ``params``.

    Args:
        module: an ``equinox.Module``.
        state: the ``eqx.nn.State`` of its stateful layers, or ``None``.
        key: an optional typed key (``jax.random.key``): the RNG stream of ``key=``.

    Returns:
        ``Model(params, model_state, apply)`` with ``model_state`` the ``state`` (or
            ``{"state": state, "key": key}`` with ``key``).

    Raises:
        ImportError: Equinox is not installed (``pip install 'jaxwise[equinox]'``).
        TypeError: ``module`` is not an Equinox module, ``state`` not an ``eqx.nn.State`` or
            ``key`` not a typed key.

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
    if key is not None:
        _check_streams({"key": key}, "key")
    params, static = eqx.partition(module, eqx.is_inexact_array)
    has_state = state is not None

    def call(params: Any, model_state: Any, args: Any, kwargs: Any) -> tuple[Any, Any]:
        model = equinox_mode(eqx, eqx.combine(params, static))  # under DP-SGD: BatchNorm
        if not has_state:
            return model(*args, **kwargs), model_state
        return model(*args, model_state, **kwargs)

    def apply(params: Any, model_state: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        if key is None:
            return call(params, model_state, args, kwargs)
        if "key" in kwargs:
            message = "do not pass `key`: this model carries its key in model_state['key']"
            raise own(TypeError(message))
        if not (isinstance(model_state, Mapping) and set(model_state) == {"state", "key"}):
            raise own(ValueError("`model_state` must be the model's {'state': ..., 'key': ...}"))
        carried, use = jax.random.split(model_state["key"])
        out, new_state = call(params, model_state["state"], args, {**kwargs, "key": use})
        return out, {"state": new_state, "key": carried}

    initial = state if key is None else {"state": state, "key": key}
    return Model(params, initial, _named(apply, module))


def _hint_for(obj: Any) -> str:
    if isinstance(obj, tuple) and len(obj) == 2:
        return " (a tuple: pass the module and its state/variables as separate arguments)"
    return ""
