"""Bucket sizes and NumPy padding: never triggers a JAX compilation."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from jaxwise._shared._checks import check_array, check_int, is_int

__all__ = ["bucket_for", "pad_to_bucket", "padding_waste", "power_of_two_buckets"]


def _check_buckets(buckets: Sequence[int], name: str = "buckets") -> tuple[int, ...]:
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Sequence):
        raise TypeError(f"`{name}` must be a sequence of ints, got {type(buckets).__name__}")
    values = tuple(buckets)
    if not values:
        raise ValueError(f"`{name}` must not be empty")
    for b in values:
        if not is_int(b):
            raise TypeError(f"`{name}` must contain ints, got {b!r} in {values}")
        if b < 1:
            raise ValueError(f"`{name}` must contain positive sizes, got {b} in {values}")
    if any(a >= b for a, b in zip(values, values[1:])):
        raise ValueError(f"`{name}` must be strictly increasing, got {values}")
    return tuple(int(b) for b in values)


def _check_length(n: Any, name: str = "n") -> int:
    return check_int(n, name, min_value=0)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``n`` items.

    Args:
        n: the request length, an int >= 0.
        buckets: strictly increasing positive sizes.

    Returns:
        The bucket size.

    Raises:
        TypeError: ``n`` is not an int or ``buckets`` not a sequence of ints.
        ValueError: ``n`` is negative or exceeds the largest bucket, or ``buckets`` is empty,
            not increasing or not positive.

    Examples:
        >>> bucket_for(5, (4, 8, 16))
        8
    """
    n = _check_length(n)
    buckets = _check_buckets(buckets)
    index = int(np.searchsorted(buckets, n, side="left"))
    if index == len(buckets):
        raise ValueError(
            f"length {n} exceeds the largest bucket {buckets[-1]} (buckets={buckets}); "
            "add a larger bucket or truncate the request"
        )
    return buckets[index]


def pad_to_bucket(
    x: npt.ArrayLike, buckets: Sequence[int], axis: int = 0, fill: npt.ArrayLike = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Pad ``x`` along ``axis`` up to its bucket with ``fill`` (NumPy only).

    Args:
        x: array-like of any shape with ``ndim >= 1``.
        buckets: strictly increasing positive sizes.
        axis: the axis to pad.
        fill: the padding value; it must fit ``x``'s dtype exactly (an integer in range for
            integer arrays, 0/1 or a bool for bool arrays, a real number for real arrays).

    Returns:
        ``(padded, mask)``: ``padded`` has ``x.shape`` with ``shape[axis]``
            replaced by the bucket, and ``x``'s dtype; ``mask`` is a bool vector of the
            bucket's length, ``True`` for real entries.

    Raises:
        TypeError: ``x`` is not an array or ``axis`` not an int.
        ValueError: ``x`` is a scalar, ``axis`` is out of range, ``x`` is longer than the
            largest bucket, or ``fill`` is a value ``x``'s dtype cannot hold (``300`` in
            ``uint8``, ``0.5`` or NaN in integers): it would be stored as another value.

    Examples:
        >>> p, m = pad_to_bucket([[1, 2, 3]], (2, 4), axis=1, fill=-1)
        >>> p.tolist(), m.tolist()
        ([[1, 2, 3, -1]], [True, True, True, False])
    """
    x = np.asarray(check_array(x, "x"))
    if x.ndim == 0:
        raise ValueError("`x` must have at least one dimension to pad, got a scalar")
    axis = check_int(axis, "axis")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(
            f"`axis` must be in [{-x.ndim}, {x.ndim}) for x of shape {x.shape}, got {axis}"
        )
    axis %= x.ndim
    _check_fill(fill, x.dtype)
    n = x.shape[axis]
    size = bucket_for(n, buckets)
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - n)
    padded = np.pad(x, widths, constant_values=fill) if size != n else x.copy()
    mask = np.arange(size) < n
    return padded, mask


def _check_fill(fill: Any, dtype: np.dtype) -> None:
    """``ValueError`` unless ``dtype`` can hold ``fill`` (floats may round, not overflow)."""
    if dtype.kind not in "biufcV":
        return  # strings, objects: NumPy's own rules
    value = np.asarray(fill) if not isinstance(fill, (str, bytes)) else np.asarray(None)
    if value.ndim != 0 or value.dtype.kind not in "biufc":
        raise ValueError(f"`fill` must be a number that fits dtype {dtype}, got {fill!r}")
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # NumPy's ComplexWarning: judged below
        stored = value.astype(dtype)
    v, kind = value.item(), "f" if dtype.kind == "V" else dtype.kind  # V: ml_dtypes floats
    if kind == "b":
        fits = v in (0, 1)
    elif kind in "iu":
        fits = value.dtype.kind in "biu" or (np.isfinite(v) and v == int(v.real))
        fits = fits and not (isinstance(v, complex) and v.imag) and stored.item() == v
    else:
        real = kind == "f" and isinstance(v, complex) and v.imag != 0
        overflow = np.all(np.isfinite(value)) and not np.all(np.isfinite(stored.astype(complex)))
        fits = not real and not overflow
    if not fits:
        raise ValueError(
            f"`fill` {fill!r} does not fit the dtype {dtype} of `x` (it would be stored as "
            f"{stored.item()!r}); choose a fill value that {dtype} can hold"
        )


def power_of_two_buckets(max_len: int, min_bucket: int = 1) -> tuple[int, ...]:
    """Power-of-two buckets ``min_bucket, 2·min_bucket, …`` up to cover ``max_len``.

    Args:
        max_len: the longest request, >= 0.
        min_bucket: the smallest bucket, >= 1.

    Returns:
        The increasing bucket sizes; the last one is >= ``max_len``.

    Raises:
        TypeError: an argument is not an int.
        ValueError: ``max_len < 0`` or ``min_bucket < 1``.

    Examples:
        >>> power_of_two_buckets(100, 8)
        (8, 16, 32, 64, 128)
    """
    max_len = _check_length(max_len, "max_len")
    min_bucket = check_int(min_bucket, "min_bucket", min_value=1)
    out = [min_bucket]
    while out[-1] < max_len:
        out.append(out[-1] * 2)
    return tuple(out)


def padding_waste(lengths: Sequence[int] | np.ndarray, buckets: Sequence[int]) -> tuple[int, float]:
    """Total padded items and the padded fraction of all work.

    Args:
        lengths: the request lengths, a non-empty 1-D sequence of ints >= 0.
        buckets: strictly increasing positive sizes.

    Returns:
        ``(padding, fraction)`` where ``padding = Σ (bucket_for(n) − n)`` and
            ``fraction = padding / Σ bucket_for(n)``.

    Raises:
        TypeError: ``lengths`` or ``buckets`` do not hold ints.
        ValueError: a length is negative or exceeds the largest bucket, or ``buckets`` is
            empty, not increasing or not positive.

    Examples:
        >>> padding_waste([3, 4, 5], (4, 8))
        (4, 0.25)
    """
    lengths = _check_lengths(lengths)
    buckets = _check_buckets(buckets)
    if lengths.max() > buckets[-1]:
        raise ValueError(f"a length {int(lengths.max())} exceeds the largest bucket {buckets[-1]}")
    sizes = np.asarray(buckets)[np.searchsorted(buckets, lengths, side="left")]
    padding = int((sizes - lengths).sum())
    return padding, padding / float(sizes.sum())


def _check_lengths(lengths: Any) -> np.ndarray:
    if isinstance(lengths, (str, bytes)) or lengths is None:
        raise TypeError(f"`lengths` must be a sequence of ints, got {type(lengths).__name__}")
    arr = np.asarray(lengths)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(
            f"`lengths` must be a non-empty 1-D sequence of ints, got shape {arr.shape}"
        )
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"`lengths` must contain ints, got dtype {arr.dtype}")
    if arr.min() < 0:
        raise ValueError(f"`lengths` must be >= 0, got {int(arr.min())}")
    return arr.astype(np.int64)
