"""Ahead-of-time compiled serving of variable-length requests, one program per bucket."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import numpy.typing as npt
from jax.typing import DTypeLike

from jaxwise._shared._checks import check_callable, is_int
from jaxwise.buckets._padding import _check_buckets, bucket_for, pad_to_bucket

__all__ = ["BucketStats", "BucketedFunction", "Padded"]


@dataclasses.dataclass(frozen=True)
class Padded:
    """Spec of an argument padded along one axis.

    ``shape`` contains exactly one ``None``: the variable-length axis that is
    padded up to the bucket with ``fill``.

    Attributes:
        shape: the argument's shape, ``None`` on the padded axis.
        dtype: its dtype (stored as a ``numpy.dtype``).
        fill: the padding value.

    Raises:
        ValueError: ``shape`` does not contain exactly one ``None``, or an entry is not an
            int >= 0.

    Examples:
        >>> Padded((None, 16), "float32").axis
        0
    """

    shape: tuple[int | np.integer | None, ...]
    dtype: DTypeLike
    fill: npt.ArrayLike = 0

    def __post_init__(self) -> None:
        shape = tuple(self.shape)
        if sum(d is None for d in shape) != 1:
            raise ValueError(
                f"`Padded.shape` must contain exactly one None (the padded axis), got {shape}"
            )
        for d in shape:
            if d is not None and (not is_int(d) or d < 0):
                raise ValueError(f"`Padded.shape` entries must be ints >= 0 or None, got {shape}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @property
    def axis(self) -> int:
        """The padded axis: the position of ``None`` in ``shape``."""
        return self.shape.index(None)

    def at(self, size: int) -> jax.ShapeDtypeStruct:
        """The concrete spec for one bucket size.

        Args:
            size: the bucket size put on the padded axis.

        Returns:
            ``jax.ShapeDtypeStruct`` of ``shape`` with ``None`` replaced by ``size``.
        """
        return jax.ShapeDtypeStruct(tuple(size if d is None else d for d in self.shape), self.dtype)


@dataclasses.dataclass
class BucketStats:
    """Per-bucket serving statistics.

    Attributes:
        bucket: the bucket size.
        requests: requests served by this bucket's program.
        real_items: their total length.
        padded_items: the padding added to them.
    """

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

    Each positional argument is described by a spec: [`Padded`][jaxwise.buckets.Padded] for
    an argument whose ``None`` axis has the request length (all padded arguments of one call
    must share that length), or a ``jax.ShapeDtypeStruct`` for a fixed argument (weights,
    scalars). At [`warmup`][jaxwise.buckets.BucketedFunction.warmup] every bucket is lowered
    and compiled from these specs; a call validates the request (shapes, dtypes, length)
    before anything else, pads with NumPy, runs the compiled executable and strips the
    padding from the outputs. Python scalars are cast to their spec's dtype,
    so ``0.5`` and ``np.float32(0.5)`` use the same program. After
    [`warmup`][jaxwise.buckets.BucketedFunction.warmup], calls never compile.

    ``fn`` receives the padded arguments and, if ``pass_mask=True``, a
    keyword ``mask`` (bool, shape ``(bucket,)``); masked reductions must use
    it in both numerator and denominator.

    Outputs are returned as NumPy arrays (host copies; slicing a device array
    to each request's length would compile one small program per length).

    Args:
        fn: the function to serve, ``fn(*args[, mask=mask]) -> pytree``.
        buckets: strictly increasing bucket sizes.
        arg_specs: one spec per positional argument.
        pass_mask: pass ``mask=`` to ``fn``.
        out_axes: the axis of each output leaf to strip back to the request
            length: an int for all leaves, or a pytree prefix of the output with
            an int or ``None`` (do not strip) per leaf.

    Attributes:
        jitted: ``jax.jit(fn)``, the program every bucket compiles from; it is
            named after ``fn`` (``jit(fn)``), so ``CompileCounter(served)`` or
            ``CompileBudget(n, served)`` counts exactly its compiles.
        stats: ``{bucket: BucketStats}``, per-bucket
            [`BucketStats`][jaxwise.buckets.BucketStats].

    Raises:
        TypeError: ``fn`` is not callable or a spec is not a ``Padded`` or
            ``jax.ShapeDtypeStruct``.
        ValueError: ``buckets`` is not strictly increasing and positive, or no spec is
            ``Padded``.

    Examples:
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
        check_callable(fn, "fn")
        self.buckets = _check_buckets(buckets)
        specs = tuple(arg_specs)
        for i, spec in enumerate(specs):
            if not isinstance(spec, (Padded, jax.ShapeDtypeStruct)):
                raise TypeError(
                    f"`arg_specs[{i}]` must be a Padded or jax.ShapeDtypeStruct, "
                    f"got {type(spec).__name__}"
                )
        if not any(isinstance(s, Padded) for s in specs):
            raise ValueError("`arg_specs` must contain at least one Padded argument")
        self.arg_specs = specs
        self.pass_mask = bool(pass_mask)
        self.out_axes = out_axes
        self._fn = fn
        # Jitted as it is, so the program is named after the user's function (``jit(fn)``)
        # and ``CompileCounter(served)`` finds it through ``.jitted``.
        self.jitted = jax.jit(fn)
        self._compiled: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.stats = {b: BucketStats(b) for b in self.buckets}

    def _mask_kwargs(self, mask: Any) -> dict[str, Any]:
        return {"mask": mask} if self.pass_mask else {}

    def _compile(self, size: int) -> Any:
        with self._lock:
            if size not in self._compiled:
                specs = [s.at(size) if isinstance(s, Padded) else s for s in self.arg_specs]
                mask = jax.ShapeDtypeStruct((size,), np.dtype(bool))
                self._compiled[size] = self.jitted.lower(
                    *specs, **self._mask_kwargs(mask)
                ).compile()
            return self._compiled[size]

    def warmup(self) -> None:
        """Compile every bucket ahead of time (one compilation per bucket)."""
        for size in self.buckets:
            self._compile(size)

    @property
    def compiled_buckets(self) -> tuple[int, ...]:
        """The bucket sizes compiled so far, increasing."""
        return tuple(sorted(self._compiled))

    def _prepare(self, args: tuple[Any, ...]) -> tuple[int, list[np.ndarray]]:
        if len(args) != len(self.arg_specs):
            raise TypeError(f"expected {len(self.arg_specs)} positional arguments, got {len(args)}")
        arrays, length = [], None
        for i, (arg, spec) in enumerate(zip(args, self.arg_specs)):
            arr = _as_typed_array(arg, spec.dtype, f"args[{i}]")
            _check_shape(arr, spec.shape, f"args[{i}]")
            if isinstance(spec, Padded):
                n = arr.shape[spec.axis]
                if length is None:
                    length = n
                elif n != length:
                    raise ValueError(
                        f"padded arguments must share one length: `args[{i}]` has {n}, "
                        f"an earlier one {length}"
                    )
            arrays.append(arr)
        assert length is not None
        if length > self.buckets[-1]:
            raise ValueError(
                f"request length {length} exceeds the largest bucket {self.buckets[-1]} "
                f"(buckets={self.buckets})"
            )
        return length, arrays

    def __call__(self, *args: Any) -> Any:
        """Serve one request.

        Args:
            *args: one array (or Python scalar) per spec, in the spec's dtype; the padded
                ones share their length along the padded axis.

        Returns:
            ``fn``'s outputs as NumPy arrays, with the padding stripped along ``out_axes``.

        Raises:
            TypeError: a wrong number of arguments, or an argument of the wrong dtype.
            ValueError: a wrong shape, padded lengths that differ, or a request longer than
                the largest bucket.
        """
        length, arrays = self._prepare(args)
        size = bucket_for(length, self.buckets)
        padded = []
        for arr, spec in zip(arrays, self.arg_specs):
            if isinstance(spec, Padded):
                arr, _ = pad_to_bucket(arr, (size,), axis=spec.axis, fill=spec.fill)
            padded.append(arr)
        out = self._compile(size)(*padded, **self._mask_kwargs(np.arange(size) < length))
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
            axes,
            out,
            is_leaf=lambda a: a is None,
        )

    def summary(self) -> str:
        """A text table of requests and padding waste per bucket.

        Returns:
            One header line and one line per bucket.
        """
        lines = [f"{'bucket':>8} {'requests':>9} {'real':>10} {'padding':>10} {'waste':>7}"]
        for s in self.stats.values():
            lines.append(
                f"{s.bucket:>8} {s.requests:>9} {s.real_items:>10} {s.padded_items:>10} "
                f"{s.waste:>7.1%}"
            )
        return "\n".join(lines)


def _strip_leaf(leaf: Any, axis: int | None, length: int) -> np.ndarray:
    arr = np.asarray(leaf)
    if axis is None:
        return arr
    index = [slice(None)] * arr.ndim
    index[axis] = slice(0, length)
    return arr[tuple(index)]


def _check_shape(arr: np.ndarray, expected: Sequence[int | np.integer | None], name: str) -> None:
    if arr.ndim != len(expected):
        raise ValueError(
            f"`{name}` must have {len(expected)} dims {_shape_str(expected)}, got shape {arr.shape}"
        )
    for axis, (got, want) in enumerate(zip(arr.shape, expected)):
        if want is not None and got != want:
            raise ValueError(
                f"`{name}` has shape {arr.shape}, expected {_shape_str(expected)} "
                f"(axis {axis} must be {want})"
            )


def _shape_str(shape: Sequence[int | np.integer | None]) -> str:
    return "(" + ", ".join("n" if d is None else str(d) for d in shape) + ")"


def _as_typed_array(arg: Any, spec_dtype: DTypeLike, name: str) -> np.ndarray:
    """Convert a request argument to its spec dtype, rejecting real dtype mismatches."""
    dtype = np.dtype(spec_dtype)
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
