"""Pytree utilities: names by key path, a parameter table, path masks, comparison, host copy."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any, cast

import jax
import numpy as np

from jaxwise._shared._checks import check_bool, check_float, is_key
from jaxwise._typing import Params, PyTree

__all__ = [
    "ParamRow",
    "ParamTable",
    "host_copy",
    "mask_by_path",
    "param_table",
    "path_names",
    "tree_allclose",
]


def _key_name(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _join(path: tuple[Any, ...]) -> str:
    return ".".join(_key_name(k) for k in path)


def path_names(tree: PyTree) -> list[str]:
    """Dotted names of every leaf, in ``jax.tree.leaves`` order.

    Dict keys, attribute names (dataclasses, NamedTuples) and sequence
    indices are joined with dots: ``"dense_0.w"``, ``"opt_state.0.mu.dense_0.w"``.

    Args:
        tree: any pytree.

    Returns:
        One name per leaf (``""`` for a tree that is a single leaf).

    Examples:
        >>> path_names({"b": 1, "a": [2, 3]})
        ['a.0', 'a.1', 'b']
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [_join(path) for path, _ in flat]


@dataclasses.dataclass(frozen=True)
class ParamRow:
    """One parameter leaf.

    Attributes:
        path: the dotted path (see [`path_names`][jaxwise.tree.path_names]).
        shape: the leaf's shape.
        dtype: its dtype's name.
        count: its number of elements.
        bytes: its size in bytes (a typed PRNG key: its raw key data).
    """

    path: str
    shape: tuple[int, ...]
    dtype: str
    count: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class ParamTable:
    """Rows per leaf with totals; ``str()`` renders an aligned text table.

    Attributes:
        rows: one [`ParamRow`][jaxwise.tree.ParamRow] per leaf, in flatten order.
        total_count: the sum of the counts.
        total_bytes: the sum of the sizes in bytes.
    """

    rows: tuple[ParamRow, ...]
    total_count: int
    total_bytes: int

    @property
    def text(self) -> str:
        """The aligned text table: a header, one line per leaf, and the totals."""
        header = ("path", "shape", "dtype", "count", "bytes")
        body = [
            (r.path, str(r.shape), r.dtype, f"{r.count:,}", _human_bytes(r.bytes))
            for r in self.rows
        ]
        footer = ("total", "", "", f"{self.total_count:,}", _human_bytes(self.total_bytes))
        widths = [max(len(row[i]) for row in [header, *body, footer]) for i in range(5)]

        def line(cells: tuple[str, ...]) -> str:
            return "  ".join(
                c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
            ).rstrip()

        rule = "  ".join("-" * w for w in widths)
        return "\n".join([line(header), rule, *map(line, body), rule, line(footer)])

    def __str__(self) -> str:
        return self.text


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def param_table(params: Params) -> ParamTable:
    """A table of every array leaf: path, shape, dtype, count, bytes, with totals.

    Args:
        params: any pytree of arrays (non-array leaves are read with ``np.asarray``).

    Returns:
        The table; ``str(table)`` is its text.

    Examples:
        >>> import jax.numpy as jnp
        >>> t = param_table({"w": jnp.ones((3, 4)), "b": jnp.zeros(4)})
        >>> t.total_count, [r.path for r in t.rows]
        (16, ['b', 'w'])
    """
    rows = []
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    for path, leaf in flat:
        if not hasattr(leaf, "dtype"):
            leaf = np.asarray(leaf)
        shape = tuple(leaf.shape)
        count = int(np.prod(shape, dtype=np.int64))
        if is_key(leaf):  # typed keys: their raw key data
            nbytes = int(jax.random.key_data(leaf).nbytes)
        else:
            nbytes = count * np.dtype(leaf.dtype).itemsize
        rows.append(ParamRow(_join(path), shape, str(leaf.dtype), count, nbytes))
    return ParamTable(tuple(rows), sum(r.count for r in rows), sum(r.bytes for r in rows))


def _searcher(pattern: re.Pattern[str]) -> Callable[[str], bool]:
    return lambda path: pattern.search(path) is not None


def mask_by_path(
    tree: PyTree, predicate_or_regex: str | re.Pattern[str] | Callable[[str], bool]
) -> PyTree:
    """A bool tree: ``True`` where the leaf's dotted path matches.

    Args:
        tree: any pytree (e.g. parameters).
        predicate_or_regex: a regular expression searched in each path
            (``re.search``), or a function ``path -> bool``.

    Returns:
        A tree of ``tree``'s structure with a Python bool per leaf.

    Raises:
        ValueError: an invalid regular expression.
        TypeError: ``predicate_or_regex`` is neither a regex nor callable.

    Examples:
        >>> import jax.numpy as jnp
        >>> mask_by_path({"dense_0": {"w": jnp.ones(2), "b": jnp.ones(2)}}, r"\\.w$")
        {'dense_0': {'b': False, 'w': True}}
    """
    predicate: Callable[[str], bool]
    if isinstance(predicate_or_regex, (str, re.Pattern)):
        try:
            pattern = re.compile(predicate_or_regex)
        except re.error as err:
            raise ValueError(
                "`predicate_or_regex` is not a valid regular expression: "
                f"{predicate_or_regex!r} ({err})"
            ) from err
        predicate = _searcher(pattern)
    elif callable(predicate_or_regex):
        predicate = predicate_or_regex
    else:
        raise TypeError(
            f"`predicate_or_regex` must be a regex string or a function path -> bool, got "
            f"{type(predicate_or_regex).__name__}"
        )
    return jax.tree_util.tree_map_with_path(lambda path, _: bool(predicate(_join(path))), tree)


def tree_allclose(
    a: PyTree,
    b: PyTree,
    rtol: float | np.floating = 1e-5,
    atol: float | np.floating = 1e-8,
    equal_nan: bool = False,
) -> bool:
    """Whether two pytrees have the same structure, shapes and ``allclose`` leaves.

    Args:
        a: a pytree of numeric arrays.
        b: another.
        rtol: relative tolerance, >= 0 (as ``np.allclose``).
        atol: absolute tolerance, >= 0.
        equal_nan: count NaNs in the same places as equal.

    Returns:
        True when the structures, every leaf's shape and every value match.

    Raises:
        TypeError: a leaf is not numeric, or an option has the wrong type.
        ValueError: a tolerance is negative or not finite.

    Examples:
        >>> import jax.numpy as jnp
        >>> a = {"w": jnp.ones(2)}
        >>> tree_allclose(a, {"w": jnp.ones(2) + 1e-9}), tree_allclose([1.0], [1.0, 2.0])
        (True, False)
    """
    rtol = check_float(rtol, "rtol", min_value=0.0)
    atol = check_float(atol, "atol", min_value=0.0)
    equal_nan = check_bool(equal_nan, "equal_nan")
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    if ta != tb:
        return False
    for name, x, y in zip(path_names(a), la, lb):
        x, y = _numeric_leaf(x, f"a.{name}"), _numeric_leaf(y, f"b.{name}")
        if x.shape != y.shape or not np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan):
            return False
    return True


def _numeric_leaf(leaf: Any, name: str) -> np.ndarray:
    arr = np.asarray(leaf)
    if arr.dtype.kind not in "biufcV":  # "V": bfloat16 and other ml_dtypes
        raise TypeError(f"`{name}` must be a numeric array, got dtype {arr.dtype}")
    return arr


def host_copy(tree: PyTree) -> PyTree:
    """A real NumPy copy of every array leaf (``np.array(x, copy=True)``).

    Safe to keep across donation: unlike ``np.asarray`` on CPU, it does not
    alias the device buffer (which would silently block donating it). Typed
    PRNG keys are copied as their raw ``key_data``.

    Args:
        tree: any pytree; its JAX and NumPy array leaves are copied.

    Returns:
        ``tree``'s structure with NumPy copies of the array leaves (other leaves as they
            are).

    Examples:
        >>> import jax.numpy as jnp
        >>> type(host_copy({"w": jnp.ones(2)})["w"]).__name__
        'ndarray'
    """

    def copy(leaf: Any) -> Any:
        if isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
            leaf = cast(Any, leaf)
            if is_key(leaf):
                return np.array(jax.random.key_data(leaf), copy=True)  # typed keys: their raw data
            return np.array(leaf, copy=True)
        return leaf

    return jax.tree.map(copy, tree)
