"""A small MLP as plain functions: parameters are a nested dict ``dense_i/{w, b}``.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> params = init_mlp(jax.random.key(0), (2, 64, 64, 3))
    >>> mlp_apply(params, jnp.ones((5, 2))).shape
    (5, 3)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from jaxwise._shared._blame import own_errors
from jaxwise._shared._checks import check_array, check_callable, check_int, check_key, is_int

__all__ = ["init_mlp", "mlp_apply", "mlp_loss"]

Params = dict[str, dict[str, jax.Array]]


def init_mlp(
    key: jax.Array | int, sizes: Sequence[int] = (2, 64, 64, 3), dtype: DTypeLike = jnp.float32
) -> Params:
    """He-initialised ReLU MLP: ``w ~ N(0, 2 / fan_in)``, ``b = 0``.

    Args:
        key: a PRNG key (typed or raw) or an int seed.
        sizes: layer widths, input first: ``(2, 64, 64, 3)`` is 2 → 64 → 64 → 3.
        dtype: parameter dtype (floating).

    Returns:
        ``{"dense_0": {"w": (sizes[0], sizes[1]), "b": (sizes[1],)}, …}`` in ``dtype``.

    Raises:
        TypeError: ``sizes`` is not a sequence, ``key`` not a key or seed, or ``dtype`` not
            floating.
        ValueError: fewer than two sizes, a size < 1, or a seed out of range.

    References:
        He et al., Delving Deep into Rectifiers, ICCV 2015, https://arxiv.org/abs/1502.01852

    Examples:
        >>> p = init_mlp(0, (3, 8, 2))
        >>> sorted(p), p["dense_1"]["w"].shape
        (['dense_0', 'dense_1'], (8, 2))
    """
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Iterable):
        raise TypeError(
            f"`sizes` must be a sequence of layer widths such as (2, 64, 3), got {sizes!r}"
        )
    sizes = tuple(sizes)
    if len(sizes) < 2 or any(not is_int(s) or s < 1 for s in sizes):
        raise ValueError(
            f"`sizes` must be at least two positive ints (input, …, output), got {sizes}"
        )
    sizes = tuple(int(s) for s in sizes)
    if is_int(key):
        key = jax.random.key(check_int(key, "key", min_value=0, max_value=2**32 - 1))
    else:
        check_key(key)
    try:
        dtype = jnp.dtype(dtype)
    except TypeError as err:
        raise TypeError(f"`dtype` must be a floating dtype, got {dtype!r}") from err
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"`dtype` must be a floating dtype, got {dtype}")
    return _init_mlp(key, sizes, dtype)


@functools.partial(jax.jit, static_argnames=("sizes", "dtype"))
def _init_mlp(key: jax.Array, sizes: tuple[int, ...], dtype: Any) -> Params:
    # One compiled program for all layers (eagerly, each op would compile on its own).
    keys = jax.random.split(key, len(sizes) - 1)
    params = {}
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = jax.random.normal(keys[i], (fan_in, fan_out), dtype) * jnp.asarray(
            np.sqrt(2.0 / fan_in), dtype
        )
        params[f"dense_{i}"] = {"w": w, "b": jnp.zeros((fan_out,), dtype)}
    return params


def _mlp_layers(params: Params) -> list[dict[str, jax.Array]]:
    """The layers ``dense_0, dense_1, …`` in order (checks the naming)."""
    if not isinstance(params, Mapping):
        raise TypeError(
            "`params` must be the dict of an MLP ({'dense_0': {'w': ..., 'b': ...}, ...}), got "
            f"{type(params).__name__}"
        )
    n = len(params)
    if n == 0:
        raise ValueError("`params` is empty: expected MLP layers dense_0, dense_1, …")
    try:
        return [params[f"dense_{i}"] for i in range(n)]
    except KeyError as err:
        raise ValueError(
            f"MLP params must be named dense_0 … dense_{n - 1}, got {sorted(params)}"
        ) from err


def mlp_apply(params: Params, x: jax.Array) -> jax.Array:
    """Logits of the ReLU MLP for one example ``(d,)`` or a batch ``(B, d)``.

    Args:
        params: the MLP's parameters (from [`init_mlp`][jaxwise.models.init_mlp]).
        x: ``(d,)`` or ``(B, d)`` features.

    Returns:
        ``(C,)`` or ``(B, C)`` logits.

    Raises:
        TypeError: ``params`` is not an MLP's dict, or ``x`` is not a numeric array.
        ValueError: ``x`` is a scalar or has the wrong number of features.

    Examples:
        >>> import jax.numpy as jnp
        >>> mlp_apply(init_mlp(0, (2, 4, 3)), jnp.zeros(2)).tolist()
        [0.0, 0.0, 0.0]
    """
    with own_errors():  # precise already: a training program passes them on unchanged
        layers = _mlp_layers(params)
        x = check_array(x, "x", dtype_kind="fiu")
        if x.ndim == 0:
            raise ValueError("`x` must be one example (d,) or a batch (B, d), got a scalar")
        if x.shape[-1] != layers[0]["w"].shape[0]:
            raise ValueError(
                f"`x` has {x.shape[-1]} features, the MLP expects {layers[0]['w'].shape[0]}"
            )
    for layer in layers[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ layers[-1]["w"] + layers[-1]["b"]


def mlp_loss(
    loss_from_logits: Callable[[jax.Array, jax.Array], jax.Array],
) -> Callable[[Params, tuple[jax.Array, jax.Array]], jax.Array]:
    """``loss(params, (x, y)) = loss_from_logits(mlp_apply(params, x), y)``: the MLP's loss.

    The loss of ONE example ``(x, y)`` in the convention of `jaxwise.per_example` and
    `jaxwise.privacy` (a convenience: any ``loss(params, example)`` works there).

    Args:
        loss_from_logits: ``(logits (C,), label ()) -> scalar`` for one example,
            e.g. ``lambda z, y: -jax.nn.log_softmax(z)[y]``.

    Returns:
        ``loss(params, (x, y)) -> scalar``.

    Raises:
        TypeError: ``loss_from_logits`` is not callable.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> loss = mlp_loss(lambda z, y: -jax.nn.log_softmax(z)[y])
        >>> params = init_mlp(0, (2, 8, 3))
        >>> round(float(loss(params, (jnp.zeros(2), jnp.int32(1)))), 3)  # uniform: log 3
        1.099
    """
    check_callable(loss_from_logits, "loss_from_logits")

    def loss(params: Params, example: tuple[jax.Array, jax.Array]) -> jax.Array:
        x, y = example
        return loss_from_logits(mlp_apply(params, x), y)

    return loss
