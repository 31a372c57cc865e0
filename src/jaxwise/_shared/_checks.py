"""Validators shared by every public boundary, and `UserError`.

The ground floor of the package: imports nothing from jaxwise and nothing from JAX at module
level (so ``jaxwise --help`` and ``jaxwise lint`` stay JAX-free). Every check names the argument
and what was expected, and accepts NumPy scalars wherever a Python ``int``/``float`` is
expected (``np.int64(3)`` is an int; ``True`` is not).

>>> check_int(np.int64(3), "steps", min_value=1)
3
>>> check_float(0.5, "rate", min_value=0.0, max_value=1.0)
0.5
"""

from __future__ import annotations

import errno
import math
import numbers
import os
import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxwise._errors import UserError as UserError

__all__ = [
    "UserError",
    "check_array",
    "check_bool",
    "check_callable",
    "check_choice",
    "check_float",
    "check_int",
    "check_key",
    "check_path",
    "check_probability",
    "concrete_float",
    "is_int",
    "is_key",
    "missing_path",
]


def is_int(value: Any) -> bool:
    """True for Python/NumPy integers (and 0-d integer arrays), False for bools.

    >>> is_int(3), is_int(np.int32(3)), is_int(True), is_int(3.0)
    (True, True, False, False)
    """
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, numbers.Integral):
        return True
    return (
        isinstance(value, np.ndarray) and value.ndim == 0 and np.issubdtype(value.dtype, np.integer)
    )


def check_int(
    value: Any, name: str, *, min_value: int | None = None, max_value: int | None = None
) -> int:
    """``value`` as a Python int, or ``TypeError``/``ValueError`` naming ``name``.

    >>> check_int(0, "seed", min_value=0)
    0
    """
    if not is_int(value):
        raise TypeError(f"`{name}` must be an int, got {_describe(value)}")
    v = int(value)
    if min_value is not None and v < min_value:
        raise ValueError(f"`{name}` must be >= {min_value}, got {v}")
    if max_value is not None and v > max_value:
        raise ValueError(f"`{name}` must be <= {max_value}, got {v}")
    return v


def concrete_float(value: Any) -> float | None:
    """The float value of a concrete real scalar, None for anything traced or non-scalar.

    Raises ``TypeError`` for bools (a bool hyper-parameter is always a mistake).
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"expected a number, got the bool {value!r}")
    if isinstance(value, numbers.Real):
        return float(value)
    if (
        isinstance(value, (np.ndarray, np.generic))
        and np.ndim(value) == 0
        and np.issubdtype(np.asarray(value).dtype, np.number)
    ):
        return float(value)
    shape = getattr(value, "shape", None)
    if (
        shape == ()
        and type(value).__module__.startswith("jax")
        and "Tracer" not in type(value).__name__
    ):
        try:
            return float(value)
        except Exception:  # a tracer in disguise: not concrete
            return None
    return None


def check_float(
    value: Any,
    name: str,
    *,
    min_value: float | None = None,
    max_value: float | None = None,
    min_inclusive: bool = True,
    max_inclusive: bool = True,
    allow_traced: bool = False,
) -> float:
    """``value`` as a finite Python float in the given range, or an error naming ``name``.

    With ``allow_traced=True`` a traced scalar is accepted unchecked (returned as ``nan``:
    callers that allow tracers keep the original value).

    >>> check_float(np.float32(0.25), "lr", min_value=0.0, min_inclusive=False)
    0.25
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be a number, got the bool {value!r}")
    v = concrete_float(value)
    if v is None:
        if allow_traced and hasattr(value, "shape") and getattr(value, "shape", None) == ():
            return math.nan
        raise TypeError(f"`{name}` must be a real number, got {_describe(value)}")
    if not math.isfinite(v):
        raise ValueError(f"`{name}` must be finite, got {v}")
    if min_value is not None and (v < min_value or (not min_inclusive and v == min_value)):
        op = ">=" if min_inclusive else ">"
        raise ValueError(f"`{name}` must be {op} {min_value}, got {v}")
    if max_value is not None and (v > max_value or (not max_inclusive and v == max_value)):
        op = "<=" if max_inclusive else "<"
        raise ValueError(f"`{name}` must be {op} {max_value}, got {v}")
    return v


def check_probability(
    value: Any, name: str, *, open_low: bool = False, open_high: bool = False
) -> float:
    """A float in [0, 1] (ends excluded on request).

    >>> check_probability(0.01, "sample_rate", open_low=True)
    0.01
    """
    return check_float(
        value,
        name,
        min_value=0.0,
        max_value=1.0,
        min_inclusive=not open_low,
        max_inclusive=not open_high,
    )


def check_choice(value: Any, name: str, choices: tuple[str, ...] | list[str]) -> str:
    """``value`` if it is one of ``choices``, else ``ValueError`` listing them.

    >>> check_choice("rdp", "accountant", ("rdp", "pld"))
    'rdp'
    """
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"`{name}` must be one of {listed}, got {value!r}")
    return value


def check_callable(value: Any, name: str) -> Callable[..., Any]:
    """``value`` if callable, else ``TypeError`` naming ``name``."""
    if not callable(value):
        raise TypeError(f"`{name}` must be callable, got {_describe(value)}")
    return value


def check_array(
    value: Any,
    name: str,
    *,
    ndim: int | tuple[int, ...] | None = None,
    dtype_kind: str | None = None,
    non_empty: bool = False,
) -> Any:
    """Check that ``value`` is an array (JAX or NumPy) with the given rank and dtype kind.

    ``dtype_kind`` is a string of NumPy kind codes: ``"f"`` float, ``"iu"`` integers, ``"b"``
    bool, ``"fiu"`` any real number. Python lists and scalars are converted with NumPy first;
    strings, None and objects are rejected.

    >>> check_array(np.zeros((2, 3)), "x", ndim=2, dtype_kind="f").shape
    (2, 3)
    """
    if value is None or isinstance(value, (str, bytes, dict)):
        raise TypeError(f"`{name}` must be an array, got {_describe(value)}")
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        try:
            value = np.asarray(value)
        except Exception as err:
            raise TypeError(f"`{name}` must be an array, got {_describe(value)}") from err
        if value.dtype == object or value.dtype.kind in "SUV":
            raise TypeError(f"`{name}` must be a numeric array, got {_describe(value)}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if len(value.shape) not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ValueError(
                f"`{name}` must have {want} dimension(s), got shape {tuple(value.shape)}"
            )
    if dtype_kind is not None and _kind(value.dtype) not in dtype_kind:
        raise TypeError(
            f"`{name}` must have a {_KIND_NAMES.get(dtype_kind, dtype_kind)} dtype, "
            f"got {value.dtype}"
        )
    if non_empty and int(np.prod(value.shape)) == 0:
        raise ValueError(f"`{name}` must not be empty, got shape {tuple(value.shape)}")
    return value


def is_key(x: Any) -> bool:
    """True for a typed PRNG key: an array, tracer or abstract value with a key dtype.

    Imports JAX lazily so that this module stays importable without JAX's start-up cost.

    >>> import jax
    >>> is_key(jax.random.key(0)), is_key(jax.random.PRNGKey(0)), is_key(3)  # noqa: JW004
    (True, False, False)
    """
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return False
    import jax

    return bool(jax.numpy.issubdtype(dtype, jax.dtypes.prng_key))


def check_key(key: Any, name: str = "key") -> None:
    """Raise ``TypeError`` unless ``key`` is a JAX PRNG key (typed, or a legacy uint32[2]).

    Imports JAX lazily so that this module stays importable without JAX's start-up cost.
    """
    import jax

    if isinstance(key, jax.Array) or type(key).__name__.endswith("Tracer"):
        if is_key(key):
            return
        if key.dtype == np.uint32 and tuple(key.shape)[-1:] == (2,):
            return
    raise TypeError(f"`{name}` must be a JAX PRNG key (jax.random.key(seed)), got {_describe(key)}")


def check_bool(value: Any, name: str) -> bool:
    """``value`` as a Python bool (``np.bool_`` accepted), else ``TypeError`` naming ``name``.

    >>> check_bool(np.True_, "donate")
    True
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be a bool, got {_describe(value)}")
    return bool(value)


def check_path(value: Any, name: str = "path") -> Any:
    """``value`` as a ``pathlib.Path`` if it is a ``str`` or ``os.PathLike``, else ``TypeError``.

    >>> check_path("runs/a", "out").name
    'a'
    """
    if isinstance(value, (bytes, bytearray)) or not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"`{name}` must be a path (str or os.PathLike), got {_describe(value)}")
    if isinstance(value, str) and not value:
        raise ValueError(f"`{name}` must not be empty")
    return pathlib.Path(value)


def missing_path(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be reached (``"no such file"``, ``"a symlink loop"``, ``"a broken
    symlink to …"``), or None when it exists.

    >>> missing_path("/no/such/place")
    'no such file'
    """
    p = pathlib.Path(path)
    try:
        p.stat()
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "a symlink loop (the link points back at itself)"
        if p.is_symlink():
            return f"a broken symlink (to {os.readlink(p)}, which does not exist)"
        if err.errno == errno.ENOENT:
            return "no such file"
        return err.strerror or str(err)


def _kind(dtype: Any) -> str:
    """NumPy's kind code, with ml_dtypes' bfloat16/float8 (kind ``"V"``) counted as floating."""
    dt = np.dtype(dtype)
    return "f" if dt.kind == "V" and "float" in dt.name else dt.kind


_KIND_NAMES = {
    "f": "floating",
    "iu": "integer",
    "b": "bool",
    "fiu": "real numeric",
    "fc": "inexact",
}


def _describe(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{type(value).__name__} with shape {tuple(value.shape)} and dtype {value.dtype}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"
