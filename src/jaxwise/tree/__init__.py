"""Pytree utilities for parameters: names by key path, tables, masks, comparisons, host copies.

Names come from JAX key paths (``jax.tree_util.tree_flatten_with_path``),
never from zipping dict keys with leaves (dict leaves are flattened in
sorted-key order, which silently mismatches insertion order).

Examples:
    >>> import jax.numpy as jnp
    >>> params = {"dense_0": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}}
    >>> path_names(params)
    ['dense_0.b', 'dense_0.w']
"""

from jaxwise.tree._core import (
    ParamRow,
    ParamTable,
    host_copy,
    mask_by_path,
    param_table,
    path_names,
    tree_allclose,
)

__all__ = [
    "ParamRow",
    "ParamTable",
    "host_copy",
    "mask_by_path",
    "param_table",
    "path_names",
    "tree_allclose",
]
