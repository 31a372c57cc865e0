"""Bucketed padding and ahead-of-time compiled serving.

A jitted function compiles once per input shape, so serving requests of
variable length with plain ``jit`` pays a compile for every new length.
Padding every request up to one of a few *bucket* sizes bounds the number of
programs; :func:`plan_buckets` chooses the buckets that minimise the padded
work for an observed length histogram, and :class:`BucketedFunction`
compiles every bucket ahead of time so that no request ever compiles.

The helpers here (:func:`bucket_for`, :func:`pad_to_bucket`,
:func:`plan_buckets`, :func:`padding_waste`) are pure NumPy and never trigger a
JAX compilation.

Example:
    >>> import numpy as np
    >>> padded, mask = pad_to_bucket(np.arange(5.0), (4, 8, 16))
    >>> padded.shape, int(mask.sum())
    ((8,), 5)
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

__all__ = [
    "BucketStats",
    "BucketedFunction",
    "Padded",
    "bucket_for",
    "pad_to_bucket",
    "padding_waste",
    "plan_buckets",
    "power_of_two_buckets",
]


def _check_buckets(buckets: Sequence[int], name: str = "buckets") -> tuple[int, ...]:
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Sequence):
        raise TypeError(f"`{name}` must be a sequence of ints, got {type(buckets).__name__}")
    values = tuple(buckets)
    if not values:
        raise ValueError(f"`{name}` must not be empty")
    for b in values:
        if isinstance(b, (bool, np.bool_)) or not isinstance(b, (int, np.integer)):
            raise TypeError(f"`{name}` must contain ints, got {b!r} in {values}")
        if b < 1:
            raise ValueError(f"`{name}` must contain positive sizes, got {b} in {values}")
    if any(a >= b for a, b in zip(values, values[1:])):
        raise ValueError(f"`{name}` must be strictly increasing, got {values}")
    return tuple(int(b) for b in values)


def _check_length(n: Any, name: str = "n") -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"`{name}` must be an int, got {n!r}")
    if n < 0:
        raise ValueError(f"`{name}` must be >= 0, got {n}")
    return int(n)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``n`` items.

    Args:
      n: the request length, an int >= 0.
      buckets: strictly increasing positive sizes.

    Raises:
      ValueError: ``n`` exceeds the largest bucket.

    Example:
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
    x: Any, buckets: Sequence[int], axis: int = 0, fill: Any = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Pad ``x`` along ``axis`` up to its bucket with ``fill`` (NumPy only).

    Args:
      x: array-like of any shape with ``ndim >= 1``.
      buckets: strictly increasing positive sizes.
      axis: the axis to pad.
      fill: the padding value.

    Returns:
      ``(padded, mask)``: ``padded`` has ``x.shape`` with ``shape[axis]``
      replaced by the bucket; ``mask`` is a bool vector of the bucket's
      length, ``True`` for real entries.

    Example:
        >>> p, m = pad_to_bucket([[1, 2, 3]], (2, 4), axis=1, fill=-1)
        >>> p.tolist(), m.tolist()
        ([[1, 2, 3, -1]], [True, True, True, False])
    """
    x = np.asarray(x)
    if x.ndim == 0:
        raise ValueError("`x` must have at least one dimension to pad, got a scalar")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"`axis` must be in [{-x.ndim}, {x.ndim}) for x of shape {x.shape}, got {axis}")
    axis %= x.ndim
    n = x.shape[axis]
    size = bucket_for(n, buckets)
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - n)
    padded = np.pad(x, widths, constant_values=fill) if size != n else x.copy()
    mask = np.arange(size) < n
    return padded, mask


def power_of_two_buckets(max_len: int, min_bucket: int = 1) -> tuple[int, ...]:
    """Power-of-two buckets ``min_bucket, 2·min_bucket, …`` up to cover ``max_len``.

    Example:
        >>> power_of_two_buckets(100, 8)
        (8, 16, 32, 64, 128)
    """
    max_len = _check_length(max_len, "max_len")
    min_bucket = _check_length(min_bucket, "min_bucket")
    if min_bucket < 1:
        raise ValueError(f"`min_bucket` must be >= 1, got {min_bucket}")
    out = [min_bucket]
    while out[-1] < max_len:
        out.append(out[-1] * 2)
    return tuple(out)


def padding_waste(lengths: Sequence[int] | np.ndarray, buckets: Sequence[int]) -> tuple[int, float]:
    """Total padded items and the padded fraction of all work.

    Returns:
      ``(padding, fraction)`` where ``padding = Σ (bucket_for(n) − n)`` and
      ``fraction = padding / Σ bucket_for(n)``.

    Example:
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
    arr = np.asarray(lengths)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"`lengths` must be a non-empty 1-D sequence of ints, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"`lengths` must contain ints, got dtype {arr.dtype}")
    if arr.min() < 0:
        raise ValueError(f"`lengths` must be >= 0, got {int(arr.min())}")
    return arr.astype(np.int64)


def plan_buckets(lengths: Sequence[int] | np.ndarray, max_buckets: int) -> tuple[int, ...]:
    """Bucket boundaries minimising total padding for observed request lengths.

    Exact dynamic programming over the sorted distinct lengths: with values
    ``v_1 < … < v_m`` seen ``c_i`` times, choose at most ``max_buckets``
    boundaries among them (``v_m`` always included) minimising
    ``Σ_i c_i (bucket(v_i) − v_i)``. O(K·m²) time, m = distinct lengths.

    Args:
      lengths: observed request lengths (a histogram as raw samples).
      max_buckets: the number of programs you are willing to compile.

    Returns:
      Sorted tuple of at most ``max_buckets`` bucket sizes.

    Example:
        >>> plan_buckets([1, 1, 2, 9, 10, 10], 2)
        (2, 10)
    """
    lengths = _check_lengths(lengths)
    if isinstance(max_buckets, bool) or not isinstance(max_buckets, (int, np.integer)):
        raise TypeError(f"`max_buckets` must be an int, got {max_buckets!r}")
    if max_buckets < 1:
        raise ValueError(f"`max_buckets` must be >= 1, got {max_buckets}")
    values, counts = np.unique(lengths, return_counts=True)
    m = len(values)
    k = min(int(max_buckets), m)
    # cost[i, j]: padding when values[i..j] are all padded to values[j] (inf for i > j).
    # Float64 is exact for totals below 2**53.
    c_cum = np.concatenate([[0], np.cumsum(counts)]).astype(np.float64)
    cv_cum = np.concatenate([[0], np.cumsum(counts * values)]).astype(np.float64)
    i, j = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    cost = values[j] * (c_cum[j + 1] - c_cum[i]) - (cv_cum[j + 1] - cv_cum[i])
    cost = np.where(j >= i, cost, np.inf)
    # dp[j]: least padding of values[0..j] with b buckets, the last one at values[j].
    dp = cost[0].copy()
    parents = []
    shifted = np.vstack([cost[1:], np.full((1, m), np.inf)])  # shifted[p, j] = cost[p + 1, j]
    for _ in range(1, k):
        candidates = dp[:, None] + shifted  # candidates[p, j]: previous bucket ends at p
        parent = candidates.argmin(axis=0)
        dp = candidates[parent, np.arange(m)]
        parents.append(parent)
    # With k <= m distinct values, k buckets are never worse than fewer; backtrack.
    result, last = [int(values[-1])], m - 1
    for parent in reversed(parents):
        last = int(parent[last])
        result.append(int(values[last]))
    return tuple(sorted(result))


# --------------------------------------------------------------------------
# BucketedFunction
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Padded:
    """Spec of an argument padded along one axis.

    ``shape`` contains exactly one ``None``: the variable-length axis that is
    padded up to the bucket with ``fill``.

    Example:
        >>> Padded((None, 16), "float32").axis
        0
    """

    shape: tuple[int | None, ...]
    dtype: Any
    fill: Any = 0

    def __post_init__(self) -> None:
        shape = tuple(self.shape)
        if sum(d is None for d in shape) != 1:
            raise ValueError(f"`Padded.shape` must contain exactly one None (the padded axis), got {shape}")
        for d in shape:
            if d is not None and (not isinstance(d, (int, np.integer)) or d < 0):
                raise ValueError(f"`Padded.shape` entries must be ints >= 0 or None, got {shape}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @property
    def axis(self) -> int:
        return self.shape.index(None)

    def at(self, size: int) -> jax.ShapeDtypeStruct:
        """The concrete spec for one bucket size."""
        return jax.ShapeDtypeStruct(tuple(size if d is None else d for d in self.shape), self.dtype)


@dataclasses.dataclass
class BucketStats:
    """Per-bucket serving statistics."""

    bucket: int
    requests: int = 0
    real_items: int = 0
    padded_items: int = 0

    @property
    def waste(self) -> float:
        """Fraction of computed items that were padding."""
        total = self.real_items + self.padded_items
        return self.padded_items / total if total else 0.0


class BucketedFunction:
    """Serve ``fn`` on variable-length inputs with one AOT-compiled program per bucket.

    Each positional argument is described by a spec: :class:`Padded` for an
    argument whose ``None`` axis has the request length (all padded
    arguments of one call must share that length), or a
    ``jax.ShapeDtypeStruct`` for a fixed argument (weights, scalars). At
    :meth:`warmup` every bucket is lowered and compiled from these specs; a
    call validates the request (shapes, dtypes, length) before anything
    else, pads with NumPy, runs the compiled executable and strips the
    padding from the outputs. Python scalars are cast to their spec's dtype,
    so ``0.5`` and ``np.float32(0.5)`` use the same program. After
    :meth:`warmup`, calls never compile.

    ``fn`` receives the padded arguments and, if ``pass_mask=True``, a
    keyword ``mask`` (bool, shape ``(bucket,)``); masked reductions must use
    it in both numerator and denominator.

    Args:
      fn: the function to serve, ``fn(*args[, mask=mask]) -> pytree``.
      buckets: strictly increasing bucket sizes.
      arg_specs: one spec per positional argument.
      pass_mask: pass ``mask=`` to ``fn``.
      out_axes: the axis of each output leaf to strip back to the request
        length: an int for all leaves, or a pytree prefix of the output with
        an int or ``None`` (do not strip) per leaf.

    Outputs are returned as NumPy arrays (host copies; slicing a device array
    to each request's length would compile one small program per length).

    Example:
        >>> import jax.numpy as jnp
        >>> def total(x, *, mask):
        ...     return jnp.sum(jnp.where(mask, x, 0.0)), 2 * x
        >>> served = BucketedFunction(total, (4, 8), [Padded((None,), "float32")],
        ...                           pass_mask=True, out_axes=(None, 0))
        >>> served.warmup()
        >>> s, doubled = served([1.0, 2.0, 3.0])
        >>> float(s), doubled.tolist()
        (6.0, [2.0, 4.0, 6.0])
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        buckets: Sequence[int],
        arg_specs: Sequence[Padded | jax.ShapeDtypeStruct],
        *,
        pass_mask: bool = False,
        out_axes: Any = 0,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"`fn` must be callable, got {type(fn).__name__}")
        self.buckets = _check_buckets(buckets)
        specs = tuple(arg_specs)
        for i, spec in enumerate(specs):
            if not isinstance(spec, (Padded, jax.ShapeDtypeStruct)):
                raise TypeError(
                    f"`arg_specs[{i}]` must be a Padded or jax.ShapeDtypeStruct, got {type(spec).__name__}"
                )
        if not any(isinstance(s, Padded) for s in specs):
            raise ValueError("`arg_specs` must contain at least one Padded argument")
        self.arg_specs = specs
        self.pass_mask = bool(pass_mask)
        self.out_axes = out_axes
        self._fn = fn
        self._jitted = jax.jit(self._call_fn)
        self._compiled: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.stats = {b: BucketStats(b) for b in self.buckets}

    def _call_fn(self, *args: Any) -> Any:
        if self.pass_mask:
            *args, mask = args
            return self._fn(*args, mask=mask)
        return self._fn(*args)

    def _specs_for(self, size: int) -> list[jax.ShapeDtypeStruct]:
        specs = [s.at(size) if isinstance(s, Padded) else s for s in self.arg_specs]
        if self.pass_mask:
            specs.append(jax.ShapeDtypeStruct((size,), np.dtype(bool)))
        return specs

    def _compile(self, size: int) -> Any:
        with self._lock:
            if size not in self._compiled:
                self._compiled[size] = self._jitted.lower(*self._specs_for(size)).compile()
            return self._compiled[size]

    def warmup(self) -> None:
        """Compile every bucket ahead of time (one compilation per bucket)."""
        for size in self.buckets:
            self._compile(size)

    @property
    def compiled_buckets(self) -> tuple[int, ...]:
        return tuple(sorted(self._compiled))

    def _prepare(self, args: tuple[Any, ...]) -> tuple[int, list[np.ndarray]]:
        if len(args) != len(self.arg_specs):
            raise TypeError(f"expected {len(self.arg_specs)} positional arguments, got {len(args)}")
        arrays, length = [], None
        for i, (arg, spec) in enumerate(zip(args, self.arg_specs)):
            arr = _as_typed_array(arg, spec.dtype, f"args[{i}]")
            expected = spec.shape
            if arr.ndim != len(expected):
                raise ValueError(f"`args[{i}]` must have {len(expected)} dims {_shape_str(expected)}, got shape {arr.shape}")
            for axis, (got, want) in enumerate(zip(arr.shape, expected)):
                if want is not None and got != want:
                    raise ValueError(
                        f"`args[{i}]` has shape {arr.shape}, expected {_shape_str(expected)} (axis {axis} must be {want})"
                    )
            if isinstance(spec, Padded):
                n = arr.shape[spec.axis]
                if length is None:
                    length = n
                elif n != length:
                    raise ValueError(f"padded arguments must share one length: `args[{i}]` has {n}, an earlier one {length}")
            arrays.append(arr)
        assert length is not None
        if length > self.buckets[-1]:
            raise ValueError(
                f"request length {length} exceeds the largest bucket {self.buckets[-1]} "
                f"(buckets={self.buckets})"
            )
        return length, arrays

    def __call__(self, *args: Any) -> Any:
        """Serve one request; returns the outputs with padding stripped (NumPy)."""
        length, arrays = self._prepare(args)
        size = bucket_for(length, self.buckets)
        padded = []
        for arr, spec in zip(arrays, self.arg_specs):
            if isinstance(spec, Padded):
                arr, _ = pad_to_bucket(arr, (size,), axis=spec.axis, fill=spec.fill)
            padded.append(arr)
        if self.pass_mask:
            padded.append(np.arange(size) < length)
        out = self._compile(size)(*padded)
        result = self._strip(out, length)
        stats = self.stats[size]
        stats.requests += 1
        stats.real_items += length
        stats.padded_items += size - length
        return result

    def _strip(self, out: Any, length: int) -> Any:
        axes = self.out_axes
        if isinstance(axes, int) or axes is None:
            return jax.tree.map(lambda leaf: _strip_leaf(leaf, axes, length), out)
        return jax.tree.map(
            lambda ax, sub: jax.tree.map(lambda leaf: _strip_leaf(leaf, ax, length), sub),
            axes, out, is_leaf=lambda a: a is None,
        )

    def summary(self) -> str:
        """A text table of requests and padding waste per bucket."""
        lines = [f"{'bucket':>8} {'requests':>9} {'real':>10} {'padding':>10} {'waste':>7}"]
        for s in self.stats.values():
            lines.append(f"{s.bucket:>8} {s.requests:>9} {s.real_items:>10} {s.padded_items:>10} {s.waste:>7.1%}")
        return "\n".join(lines)


def _strip_leaf(leaf: Any, axis: int | None, length: int) -> np.ndarray:
    arr = np.asarray(leaf)
    if axis is None:
        return arr
    index = [slice(None)] * arr.ndim
    index[axis] = slice(0, length)
    return arr[tuple(index)]


def _shape_str(shape: Sequence[int | None]) -> str:
    return "(" + ", ".join("n" if d is None else str(d) for d in shape) + ")"


def _as_typed_array(arg: Any, dtype: np.dtype, name: str) -> np.ndarray:
    """Convert a request argument to its spec dtype, rejecting real dtype mismatches."""
    if isinstance(arg, (bool, int, float, complex)) or (
        isinstance(arg, (list, tuple)) and not isinstance(arg, np.ndarray)
    ):
        arr = np.asarray(arg)
        if arr.dtype.kind == "f" and dtype.kind in "iub":
            raise TypeError(f"`{name}` has float values but the spec dtype is {dtype}")
        return arr.astype(dtype)
    if isinstance(arg, (np.ndarray, np.generic, jax.Array)):
        arr = np.asarray(arg)
        if arr.dtype != dtype:
            raise TypeError(f"`{name}` has dtype {arr.dtype}, expected {dtype} (cast it first)")
        return arr
    raise TypeError(f"`{name}` must be an array or Python scalar, got {type(arg).__name__}")

