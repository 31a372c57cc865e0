"""Clear errors when a model object or a foreign train state arrives where arrays are expected.

Nothing here imports Flax or Equinox: objects are recognised by their classes' modules, so
the checks cost nothing for users who have neither installed.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

__all__ = ["check_not_foreign_train_state", "check_params", "model_library"]

_ADAPTER = {
    "flax.nnx": "a Flax NNX module; use `jaxwise.models.from_nnx(module)` and pass its `.params`",
    "flax.linen": (
        "a Flax linen module; use `jaxwise.models.from_linen(module, variables)` and "
        "pass its `.params`"
    ),
    "equinox": "an Equinox module with non-array fields; use `jaxwise.models.from_equinox(module)` "
    "and pass its `.params`",
}

_LINEN_COLLECTIONS = {"batch_stats", "cache", "intermediates", "spectral_stats"}

_TRAIN_STATES = {
    ("flax.training.train_state", "TrainState"): "a flax.training.train_state.TrainState",
    ("flax.nnx.helpers", "TrainState"): "a flax.nnx.TrainState",
    ("flax.nnx.training.optimizer", "Optimizer"): "a flax.nnx.Optimizer",
    ("flax.nnx.training.optimizer", "ModelAndOptimizer"): "a flax.nnx.ModelAndOptimizer",
}


def model_library(obj: Any) -> str | None:
    """``"flax.nnx"``, ``"flax.linen"`` or ``"equinox"`` if ``obj`` is such a module, else None.

    Examples:
        >>> model_library({"w": 1.0}) is None
        True
    """
    for cls in type(obj).__mro__:
        module = cls.__module__ or ""
        if cls.__name__ == "Module":
            for library in _ADAPTER:
                if module == library or module.startswith(library + "."):
                    return library
    return None


def _is_array_leaf(leaf: Any) -> bool:
    return isinstance(
        leaf,
        (jax.Array, np.ndarray, np.number, np.bool_, jax.ShapeDtypeStruct, int, float, complex),
    )


def check_params(tree: Any, name: str = "params") -> None:
    """``TypeError`` unless ``tree`` is a pytree of arrays (or numbers).

    A Flax module, a linen module, or an Equinox module with non-array fields is named with
    the adapter to use; any other non-array leaf is named by its dotted path. Call it at a
    public boundary that takes parameters, before tracing.

    Examples:
        >>> import jax.numpy as jnp
        >>> check_params({"w": jnp.ones(2)})
        >>> check_params({"w": "oops"})
        Traceback (most recent call last):
        ...
        TypeError: `params` must be a pytree of arrays; leaf `w` is a str
    """
    if type(tree).__name__ == "Model" and type(tree).__module__.startswith("jaxwise.models"):
        raise TypeError(
            f"`{name}` must be a pytree of arrays, got a jaxwise.models.Model; pass "
            "its `.params` (and `.model_state` where model state is expected)"
        )
    if isinstance(tree, dict) and "params" in tree and set(tree) & _LINEN_COLLECTIONS:
        raise TypeError(
            f"`{name}` must be the trainable parameters, got what looks like Flax linen "
            f"`variables` (collections {sorted(tree)}); use "
            "`jaxwise.models.from_linen(module, variables)` and pass its `.params`"
        )
    library = model_library(tree)
    bad = [
        (path, leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
        if not _is_array_leaf(leaf)
    ]
    if library is not None and (library != "equinox" or bad):
        raise TypeError(
            f"`{name}` must be a pytree of arrays, got {type(tree).__name__}, "
            f"which looks like {_ADAPTER[library]}"
        )
    foreign = _train_state_kind(tree)
    if foreign is not None:
        raise TypeError(f"`{name}` must be a pytree of arrays, got {foreign}; pass its `.params`")
    if bad:
        path, leaf = bad[0]
        raise TypeError(
            f"`{name}` must be a pytree of arrays; leaf `{_dotted(path)}` is a "
            f"{type(leaf).__name__}"
        )


def _train_state_kind(obj: Any) -> str | None:
    for cls in type(obj).__mro__:
        kind = _TRAIN_STATES.get((cls.__module__, cls.__name__))
        if kind is not None:
            return kind
    return None


def check_not_foreign_train_state(state: Any, name: str = "state") -> None:
    """``TypeError`` if ``state`` is a Flax ``TrainState`` or ``nnx.Optimizer``.

    jaxwise steps take a ``jaxwise.train.TrainState``; the message says how to build one
    from the Flax object. Anything else passes (the caller checks its own type).

    Examples:
        >>> check_not_foreign_train_state(object())
    """
    kind = _train_state_kind(state)
    if kind is None:
        return
    raise TypeError(
        f"`{name}` must be a jaxwise.train.TrainState, got {kind}; build one with "
        "`jaxwise.train.TrainState.create(params, optimizer, key, model_state=...)` from the "
        "Flax object's params (for NNX: `jaxwise.models.from_nnx(model)`), and pass the same "
        "optax optimizer to `make_train_step`"
    )


def _dotted(path: tuple[Any, ...]) -> str:
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts)
