"""One parameter check and one model-object detector, shared by every public boundary.

Parameters are what gradients are taken with respect to: a pytree of floating-point arrays.
A model object of Flax NNX, Flax linen or Equinox, a jaxwise ``Model``, linen ``variables``
or a Flax train state passed where parameters belong is named with the adapter that splits
it. Nothing here imports Flax or Equinox: objects are recognised by their classes' modules,
so the checks cost nothing for users who have neither installed.

>>> import numpy as np
>>> check_params({"w": np.ones(2, np.float32)})
>>> check_params({"w": np.ones(2, np.int32)})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
TypeError: `params` leaf `w` has dtype int32; parameters must be floating point ...
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.core import Tracer

from jaxwise.tree import path_names

__all__ = [
    "check_alive",
    "check_not_a_model",
    "check_params",
    "describe_leaves",
    "foreign_train_state",
    "model_library",
]

_ADAPTERS = {
    "flax.nnx": "from_nnx(module)",
    "flax.linen": "from_linen(module, variables)",
    "equinox": "from_equinox(module)",
}

_LINEN_COLLECTIONS = {"batch_stats", "cache", "intermediates", "spectral_stats"}

_TRAIN_STATES = {
    ("flax.training.train_state", "TrainState"): "a flax.training.train_state.TrainState",
    ("flax.nnx.helpers", "TrainState"): "a flax.nnx.TrainState",
    ("flax.nnx.training.optimizer", "Optimizer"): "a flax.nnx.Optimizer",
    ("flax.nnx.training.optimizer", "ModelAndOptimizer"): "a flax.nnx.ModelAndOptimizer",
}

_ARRAY_LEAVES = (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct, float, int, complex)


def model_library(obj: Any) -> str | None:
    """``"flax.nnx"``, ``"flax.linen"`` or ``"equinox"`` if ``obj`` is such a module, else None.

    >>> model_library({"w": 1.0}) is None
    True
    """
    for cls in type(obj).__mro__:
        module = cls.__module__ or ""
        if cls.__name__ == "Module":
            for library in _ADAPTERS:
                if module == library or module.startswith(library + "."):
                    return library
    return None


def foreign_train_state(obj: Any) -> str | None:
    """A description of ``obj`` if it is a Flax train state or NNX optimizer, else None."""
    for cls in type(obj).__mro__:
        kind = _TRAIN_STATES.get((cls.__module__, cls.__name__))
        if kind is not None:
            return kind
    return None


def _is_array_leaf(leaf: Any) -> bool:
    return isinstance(leaf, _ARRAY_LEAVES)


def check_not_a_model(tree: Any, name: str = "params") -> None:
    """``TypeError`` for a model object, linen ``variables`` or a Flax train state.

    A Flax module (NNX or linen) always; an Equinox module only when it holds non-array
    leaves (an Equinox module of arrays *is* a parameter pytree). The message names the
    adapter of `jaxwise.models` that splits the object.
    """
    if type(tree).__name__ == "Model" and type(tree).__module__.startswith("jaxwise.models"):
        raise TypeError(
            f"`{name}` must be a pytree of arrays, got a jaxwise.models.Model; pass its "
            "`.params` (and its `.model_state` where model state is expected)"
        )
    if isinstance(tree, dict) and "params" in tree and set(tree) & _LINEN_COLLECTIONS:
        raise TypeError(
            f"`{name}` must be the trainable parameters, got what looks like Flax linen "
            f"`variables` (collections {sorted(tree)}); use "
            "`jaxwise.models.from_linen(module, variables)` and pass its `.params`"
        )
    library = model_library(tree)
    if library is not None and (
        library != "equinox" or not all(_is_array_leaf(x) for x in jax.tree.leaves(tree))
    ):
        fields = " (it holds non-array fields)" if library == "equinox" else ""
        raise TypeError(
            f"`{name}` must be a pytree of arrays, got the {library} model object "
            f"{type(tree).__name__}; split the model first{fields}: `model = "
            f"jaxwise.models.{_ADAPTERS[library]}`, then pass `model.params` (and "
            "`model_state=model.model_state`) and call `model.apply(params, model_state, ...)` "
            "in the loss"
        )
    kind = foreign_train_state(tree)
    if kind is not None:
        raise TypeError(f"`{name}` must be a pytree of arrays, got {kind}; pass its `.params`")


def check_alive(tree: Any, name: str) -> None:
    """``ValueError`` naming the first deleted (donated) array of ``tree`` by its path.

    >>> import jax.numpy as jnp
    >>> x = jnp.ones(2)
    >>> x.delete()
    >>> check_alive({"x": x}, "batch")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: `batch` leaf `x` was deleted: this array was donated to an earlier call ...
    """
    for i, leaf in enumerate(jax.tree.leaves(tree)):  # the paths only for the error
        if isinstance(leaf, jax.Array) and not isinstance(leaf, Tracer) and leaf.is_deleted():
            path = path_names(tree)[i]
            raise ValueError(
                f"`{name}` leaf `{path or '<root>'}` was deleted: this array was donated to an "
                "earlier call (a jitted step donates its state); use that call's result, or "
                "pass a copy (jnp.array(x, copy=True))"
            )


def describe_leaves(tree: Any, name: str) -> str:
    """``name.path: float32[4, 3], ...`` for the leaves of ``tree`` (at most 8 shown).

    >>> import numpy as np
    >>> describe_leaves((np.zeros((4, 3), np.float32), np.zeros(5)), "batch")
    'batch[0]: float32[4, 3], batch[1]: float64[5]'
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    shown = [
        f"{name}{jax.tree_util.keystr(path)}: "
        f"{np.dtype(leaf.dtype if hasattr(leaf, 'dtype') else np.result_type(leaf)).name}"
        f"{list(np.shape(leaf))}"
        for path, leaf in flat[:8]
    ]
    return ", ".join(shown) + (f", … ({len(flat)} leaves)" if len(flat) > 8 else "")


def check_params(params: Any, name: str = "params") -> None:
    """``TypeError``/``ValueError`` unless ``params`` is a non-empty pytree of float arrays.

    Model objects are named with their adapter (see ``check_not_a_model``); a leaf that is
    not an array, or an integer, boolean or complex leaf, is named by its dotted path.
    Call it at a public boundary that takes parameters, before tracing.
    """
    if params is None or isinstance(params, (str, bytes)):
        raise TypeError(f"`{name}` must be a pytree of float arrays, got {params!r}")
    check_not_a_model(params, name)
    leaves = jax.tree.leaves(params)
    if not leaves:
        raise ValueError(f"`{name}` has no array leaves")
    check_alive(params, name)
    for path, leaf in zip(path_names(params), leaves):
        where = path or "<root>"
        if not _is_array_leaf(leaf):
            raise TypeError(
                f"`{name}` must be a pytree of float arrays; leaf `{where}` is a "
                f"{type(leaf).__name__}"
            )
        dtype = np.result_type(leaf) if isinstance(leaf, (float, int, complex)) else leaf.dtype
        if not jax.numpy.issubdtype(dtype, jax.numpy.floating):
            raise TypeError(
                f"`{name}` leaf `{where}` has dtype {np.dtype(dtype).name}; parameters must be "
                "floating point (gradients are taken with respect to them): keep integer, "
                f"boolean and complex values out of `{name}` (e.g. in the model state)"
            )
