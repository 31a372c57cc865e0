"""Model state under DP-SGD: state computed from the examples is refused, the rest is carried.

With model state the per-example loss is ``loss(params, model_state, example) -> (loss,
new_model_state)``. Two kinds of state exist:

- state computed from the examples (BatchNorm's running statistics, any custom layer that
  accumulates activations): every example reaches it, per-example clipping does not bound
  that, and it is released without noise. It is refused: the new state is traced under
  ``vmap`` over the examples with ``out_axes=None``, which JAX refuses for any output that
  depends on the mapped (example) axis; the refused leaves are named by their path.
- per-example-safe state (RNG streams, step counters): carried and advanced every step. Every
  typed PRNG key in the state gets the example's index folded in for that example's loss
  (dropout masks differ between examples); the new state comes from the state as given (its
  keys unfolded), so it is the same for every example and advances by one call per step.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from jaxwise._shared._checks import is_key
from jaxwise._shared._loss_output import unpack_loss_output
from jaxwise._shared._model_modes import example_mixing_error, private_training
from jaxwise.tree import path_names

__all__ = ["NO_MODEL_STATE", "advance", "check_state_flags", "dp_context", "per_example"]


class _NoModelState:
    """The default of ``model_state=``: the loss takes no model state."""

    def __repr__(self) -> str:
        return "<no model state>"


NO_MODEL_STATE: Any = _NoModelState()

_AXIS = re.compile(r"unbound axis name: (\S+)")


def check_state_flags(freeze_model_state: Any) -> None:
    if not isinstance(freeze_model_state, bool):
        raise TypeError(
            f"`freeze_model_state` must be a bool, got {type(freeze_model_state).__name__}"
        )


@contextlib.contextmanager
def dp_context(freeze: bool) -> Iterator[None]:
    """Trace a DP-SGD loss: adapters refuse or freeze BatchNorm, collectives are refused.

    A collective over a named axis (``lax.pmean(x, "batch")``, ``eqx.nn.BatchNorm``
    outside its adapter) mixes the examples of the batch; a per-example loss has no such
    axis, and JAX's ``NameError`` becomes the one ``ValueError`` of state that mixes examples.
    """
    with private_training(freeze):
        try:
            yield
        except NameError as err:
            found = _AXIS.search(str(err))
            if found is None:
                raise
            raise example_mixing_error(
                "collective (e.g. eqx.nn.BatchNorm, lax.pmean) over the named axis",
                [found.group(1).rstrip(".,;:")],
            ) from err


def _unpack(out: Any) -> tuple[Any, Any]:
    loss, new_state, _ = unpack_loss_output(
        out, model_state=True, has_aux=False, name="`loss(params, model_state, example)`"
    )
    return loss, new_state


def _new_state(loss: Callable[..., Any], params: Any, model_state: Any) -> Callable[[Any], Any]:
    return lambda example: _unpack(loss(params, model_state, example))[1]


def _mixing_leaves(
    loss: Callable[..., Any], params: Any, model_state: Any, batch: Any
) -> list[str]:
    """Paths of the new state's leaves that depend on the example (empty: none does)."""
    new_state = _new_state(loss, params, model_state)
    try:
        jax.eval_shape(jax.vmap(new_state, out_axes=None), batch)
        return []
    except ValueError as err:
        if "out_axes" not in str(err):
            raise
    shapes = jax.eval_shape(jax.vmap(new_state), batch)
    leaves, treedef = jax.tree.flatten(shapes)
    names = [re.sub(r"\.value$", "", n) for n in path_names(shapes)]
    mixing = []
    for i, name in enumerate(names):
        axes = jax.tree.unflatten(treedef, [None if j == i else 0 for j in range(len(leaves))])
        try:
            jax.eval_shape(jax.vmap(new_state, out_axes=axes), batch)
        except ValueError:
            mixing.append(name)
    return mixing


def _fold(keys: jax.Array, index: jax.Array) -> jax.Array:
    """``fold_in(key, index)`` for every key of ``keys`` (any shape)."""
    flat = keys.reshape(-1)
    return jax.vmap(lambda k: jax.random.fold_in(k, index))(flat).reshape(keys.shape)


def advance(loss: Callable[..., Any], params: Any, model_state: Any, batch: Any) -> Any:
    """The new model state of one step: the loss's on the first example with the state as given.

    Refuses state that depends on the example first (``ValueError`` naming the leaves), so
    the first example's new state is every example's.

    Raises:
        ValueError: a leaf of the new model state depends on the example.
        TypeError: ``loss`` does not return ``(loss, new_model_state)`` or changes the state's
            structure.
    """
    mixing = _mixing_leaves(loss, params, model_state, batch)
    if mixing:
        raise example_mixing_error("model state computed from the examples", mixing)
    first = jax.tree.map(lambda x: x[0], batch)
    new_state = _new_state(loss, params, model_state)(first)
    if jax.tree.structure(new_state) != jax.tree.structure(model_state):
        raise TypeError(
            "`loss` returned a new model state of another structure than `model_state`: "
            f"{jax.tree.structure(new_state)} vs {jax.tree.structure(model_state)}"
        )
    return new_state


def per_example(
    loss: Callable[..., Any], model_state: Any, batch: Any, n: int, salt: Any = None
) -> tuple[Callable[[Any, Any], jax.Array], Any]:
    """``(stateless_loss, batch_with_keys)``: the state bound, its keys per example.

    ``stateless_loss(params, (keys, example))`` is ``loss(params, state, example)[0]`` with
    the state's typed keys replaced by ``keys``: each key with the example's index (plus
    ``salt · n``, e.g. the micro-batch) folded in; ``batch_with_keys`` is ``(keys, batch)``.
    """
    leaves, treedef = jax.tree.flatten(model_state)
    where = [i for i, leaf in enumerate(leaves) if is_key(leaf)]
    index = jnp.arange(n, dtype=jnp.uint32)
    if salt is not None:
        index = index + jnp.asarray(salt).astype(jnp.uint32) * jnp.uint32(n)
    keys = [jax.vmap(lambda i, k=leaves[w]: _fold(k, i))(index) for w in where]

    def stateless(params: Any, example: Any) -> jax.Array:
        example_keys, ex = example
        full = list(leaves)
        for w, k in zip(where, example_keys):
            full[w] = k
        return _unpack(loss(params, jax.tree.unflatten(treedef, full), ex))[0]

    return stateless, (keys, batch)
