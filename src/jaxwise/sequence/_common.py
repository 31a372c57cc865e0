"""Helpers shared by the sequence modules: array conversion with named errors, host copies."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jax.typing import ArrayLike

from jaxwise._shared._checks import check_array, check_float

Array = jax.Array

__all__ = ["Array", "ArrayLike", "Tracer", "as_array", "as_float_array", "check_rate", "concrete"]


def concrete(x: Any) -> np.ndarray | None:
    """A host copy of ``x`` if it is concrete (not a tracer), else ``None``."""
    if isinstance(x, Tracer):
        return None
    return np.asarray(x)


def as_array(x: Any, name: str, *, dtype_kind: str | None = None) -> Array:
    """``x`` as a JAX array (tracers pass through); strings, None and objects raise naming ``name``.

    ``dtype_kind`` as in `jaxwise._shared._checks.check_array` (``"f"``, ``"iu"``, ``"b"``, ...).
    """
    if isinstance(x, Tracer):
        check_array(x, name, dtype_kind=dtype_kind)
        return x
    if not hasattr(x, "dtype"):
        check_array(x, name)  # rejects None, str, dict, ragged/object lists
    out = jnp.asarray(x)
    check_array(out, name, dtype_kind=dtype_kind)
    return out


def as_float_array(x: Any, name: str) -> Array:
    """``x`` as a real (float, int or bool) array cast to a floating dtype (float32 default)."""
    x = as_array(x, name, dtype_kind="fiub")
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


def check_rate(value: Any, name: str) -> Any:
    """A discount-like hyper-parameter in [0, 1] (finite); traced scalars pass unchecked."""
    if isinstance(value, Tracer):
        if value.shape != ():
            raise ValueError(f"`{name}` must be a scalar, got shape {value.shape}")
        return value
    check_float(value, name, min_value=0.0, max_value=1.0)
    return value
