"""The loss-function contract shared by per_example, privacy and label_errors: types, checks."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Protocol, get_args

import jax
import jax.numpy as jnp

from jaxwise._shared._checks import (
    check_array,
    check_callable,
    check_choice,
    check_int,
    concrete_float,
)
from jaxwise._shared._params import check_alive
from jaxwise._shared._params import check_params as check_params

Method = Literal["auto", "ghost", "vmap", "chunked"]
ChunkSize = int | Literal["auto"] | None
METHODS: tuple[str, ...] = get_args(Method)
DEFAULT_MEMORY_BUDGET = 256 * 2**20


class LossFn(Protocol):
    """``loss(params, example) -> scalar``: the loss of ONE example.

    ``example`` is the batch with its leading example axis removed, of the same pytree
    structure (a tuple ``(x, y)``, a dict, a registered dataclass or NamedTuple). The
    per-example functions map this one function over the batch; ``params`` is shared.
    """

    def __call__(self, params: Any, example: Any, /) -> jax.Array: ...


def leaf_label(name: str, path: tuple[Any, ...]) -> str:
    """``batch['x']``, ``batch[0]``, ``batch.x``: a batch leaf named by its pytree path."""
    return name + jax.tree_util.keystr(path)


def batch_size_of(batch: Any, name: str = "batch") -> int:
    """The leading (example) size shared by every leaf of ``batch`` (ValueError: a mismatch)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(batch)
    if not flat:
        raise ValueError(
            f"`{name}` has no arrays: pass the examples as a pytree of arrays with a leading "
            "example axis, e.g. (x, y) or {'x': x, 'y': y}"
        )
    check_alive(batch, name)
    sizes = []
    for path, leaf in flat:
        label = leaf_label(name, path)
        if dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
            raise TypeError(
                f"`{label}` must be an array, got the dataclass {type(leaf).__name__}, which is "
                "not a JAX pytree: register it with `jax.tree_util.register_dataclass`"
            )
        shape = tuple(check_array(leaf, label).shape)
        if len(shape) == 0:
            raise ValueError(
                f"`{label}` is a scalar; every batch leaf needs a leading example axis"
            )
        sizes.append((label, int(shape[0])))
    if len({s for _, s in sizes}) != 1:
        listing = ", ".join(f"{label}: {s}" for label, s in sizes)
        raise ValueError(
            f"every leaf of `{name}` must share the leading (example) dimension, got {listing}"
        )
    if sizes[0][1] == 0:
        raise ValueError(f"`{name}` is empty: its arrays have 0 examples")
    return sizes[0][1]


def check_chunk(chunk_size: Any) -> None:
    """``chunk_size`` is None, ``"auto"`` or a positive int."""
    if chunk_size is None or (isinstance(chunk_size, str) and chunk_size == "auto"):
        return
    if isinstance(chunk_size, str):
        raise ValueError(f"`chunk_size` must be a positive int, 'auto' or None, got {chunk_size!r}")
    check_int(chunk_size, "chunk_size", min_value=1)


def check_loss(loss: Any) -> None:
    """``loss`` must be callable."""
    check_callable(loss, "loss")


def check_method(method: Any) -> str:
    """One of ``"auto"``, ``"ghost"``, ``"vmap"``, ``"chunked"``."""
    return check_choice(method, "method", METHODS)


def check_clip_norm(clip_norm: Any) -> None:
    """``clip_norm`` must be a positive number (``inf`` allowed: no clipping)."""
    if clip_norm is None or isinstance(clip_norm, (str, bytes)):
        raise TypeError(f"`clip_norm` must be a number > 0, got {clip_norm!r}")
    try:
        value = concrete_float(clip_norm)
    except TypeError:
        value = None
    if value is None or not value > 0:
        raise ValueError(f"`clip_norm` must be a number > 0, got {clip_norm!r}")


def clip_factor(norms: jax.Array, clip_norm: float) -> jax.Array:
    """``min(1, C / ‖g‖)`` with 1 for ``‖g‖ = 0`` (and for ``C = inf``)."""
    safe = jnp.where(norms > 0, norms, 1.0)
    return jnp.where(norms > clip_norm, clip_norm / safe, 1.0).astype(jnp.float32)


def weights_of(weights: Any, n: int) -> jax.Array:
    """Per-example weights ``(n,)`` float32 (ones by default)."""
    if weights is not None:
        check_array(weights, "weights")
    w = jnp.ones((n,), jnp.float32) if weights is None else jnp.asarray(weights).astype(jnp.float32)
    if w.shape != (n,):
        raise ValueError(f"`weights` must have shape ({n},), got {w.shape}")
    return w
