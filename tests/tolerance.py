"""Float32 tolerances for comparisons with a float64 referee, from the backend's accuracy table.

XLA's float32 transcendentals are not equally accurate everywhere: on a CPU ``log``/``tanh``/
``exp`` are within a few ULP of the exact value, on TPU v2–v5e (whose elementwise unit is the
first-generation "EUP") within 4030.5 / 1365.5 / 116 ULP. A test that compares float32 results
with a float64 referee takes its tolerance from `rtol` — the test's own (tight, CPU-sized)
tolerance as the floor, raised to what the table allows for the operations the result passes
through on the device in use. On a CPU the floor wins, so CPU tolerances stay as tight as
written; on a TPU the table does.

The table is JAX's own float32 accuracy bounds (``jax/tests/numerics``: maximum ULP error per
device family, the figures of JAX's accuracy documentation). ULP is relative to the result:
one float32 ULP is at most ``EPS32`` = 2⁻²³ of it.

Comparisons that must stay tight on every backend are made on one device instead (ghost =
vmap = chunked norms; jaxwise's optimizers = Optax, bit for bit): this module is only for
comparisons with a float64 referee computed elsewhere.

Examples:
    >>> row("cpu", "cpu"), row("tpu", "TPU v5 lite"), row("tpu", "TPU v6 lite")
    ('cpu', 'tpu_v2-v5e', 'tpu_v6e')
    >>> ULPS["tpu_v2-v5e"]["log"]
    4030.5
    >>> rtol("log", floor=1e-5, device=("cpu", "cpu"))  # a CPU: the test's own tolerance
    1e-05
    >>> round(rtol("log", floor=1e-5, device=("tpu", "TPU v5 lite")), 6)  # 4030.5 · 2⁻²³
    0.00048
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

import host64
import jax
import numpy as np

__all__ = [
    "EPS32",
    "ULPS",
    "Tolerance",
    "allclose",
    "bound",
    "current_device",
    "row",
    "rtol",
    "ulps",
]

EPS32 = float(np.finfo(np.float32).eps)  # 2**-23: one float32 ULP, relative to the value, at most

# Maximum float32 error in ULP, per device family (JAX's accuracy bounds). CPU reciprocal is a
# correctly rounded division (0.5 ULP). Rows: "tpu_v2-v5e" covers v2, v3, v4, v4i (v4 lite) and
# v5e (v5 lite), the first-generation elementwise unit.
ULPS: dict[str, dict[str, float]] = {
    "cpu": {"log": 1.5, "log1p": 3.0, "tanh": 5.0, "logistic": 2.5, "reciprocal": 0.5, "exp": 1.5},
    "gpu": {"log": 1.0, "log1p": 1.0, "tanh": 5.5, "logistic": 4.0, "reciprocal": 1.0, "exp": 2.0},
    "tpu_v2-v5e": {
        "log": 4030.5,
        "log1p": 4034.0,
        "tanh": 1365.5,
        "logistic": 243.0,
        "reciprocal": 198.0,
        "exp": 116.0,
    },
    "tpu_v5p": {
        "log": 62.0,
        "log1p": 63.0,
        "tanh": 92.0,
        "logistic": 124.0,
        "reciprocal": 40.0,
        "exp": 109.5,
    },
    "tpu_v6e": {
        "log": 2.5,
        "log1p": 3.0,
        "tanh": 1.5,
        "logistic": 65.5,
        "reciprocal": 1.5,
        "exp": 64.5,
    },
    "tpu_7x": {
        "log": 2.5,
        "log1p": 3.0,
        "tanh": 1.5,
        "logistic": 64.0,
        "reciprocal": 1.5,
        "exp": 65.0,
    },
}


class Tolerance(TypedDict):
    """``rtol``/``atol`` keywords for ``np.testing.assert_allclose(..., **tolerance)``."""

    rtol: float
    atol: float


def current_device() -> tuple[str, str]:
    """``(platform, device_kind)`` of the device that uncommitted work runs on now.

    Honours ``jax.default_device`` / `host64.host_default`: inside them it is the CPU's.
    """
    device = jax.config.jax_default_device
    if device is None or isinstance(device, str):
        platform = host64.default_platform()
        return platform, jax.devices(platform)[0].device_kind
    return device.platform, device.device_kind


# Read through this name, so that a test can inject another device (monkeypatch it).
_device: Callable[[], tuple[str, str]] = current_device


def row(platform: str, kind: str) -> str:
    """The table row of a device: ``"cpu"``, ``"gpu"`` or a TPU family (``"tpu_v2-v5e"``, …).

    A TPU kind the table does not name gets the ``"tpu_v2-v5e"`` row, the widest bounds.
    """
    if platform == "cpu":
        return "cpu"
    if platform != "tpu":
        return "gpu"
    k = kind.lower().replace(" ", "")
    if "v5p" in k or k == "tpuv5":
        return "tpu_v5p"
    if "v6" in k:
        return "tpu_v6e"
    if "7x" in k or "v7" in k:
        return "tpu_7x"
    return "tpu_v2-v5e"


def ulps(op: str, device: tuple[str, str] | None = None) -> float:
    """The maximum float32 error of ``op`` in ULP on ``device`` (default: the current one)."""
    table = ULPS[row(*(device or _device()))]
    if op not in table:
        raise ValueError(f"`op` must be one of {sorted(table)}, got {op!r}")
    return table[op]


def rtol(
    *ops: str, floor: float, scale: float = 1.0, device: tuple[str, str] | None = None
) -> float:
    """A relative float32 tolerance: ``max(floor, scale · EPS32 · Σ ulps(op))``.

    Args:
        *ops: the table's operations the compared value passes through (repeat one to count it
            twice), e.g. ``rtol("log", "exp", floor=1e-6)`` for a logsumexp.
        floor: the test's own tolerance (what holds on a CPU); never lowered.
        scale: how much the value's error can exceed its inputs' (a derivative, a difference of
            near values); 1 for a value the ops give directly.
        device: ``(platform, device_kind)``; default the current device (`current_device`).
    """
    return max(floor, bound(*ops, scale=scale, device=device))


def bound(*ops: str, scale: float = 1.0, device: tuple[str, str] | None = None) -> float:
    """The table's relative bound: ``scale · EPS32 · Σ ulps(op)`` (`rtol` without a floor)."""
    if not ops:
        raise ValueError("`ops` must name at least one operation of the table")
    return scale * EPS32 * sum(ulps(op, device) for op in ops)


def allclose(
    *ops: str,
    rtol: float,
    atol: float,
    magnitude: float,
    scale: float = 1.0,
    device: tuple[str, str] | None = None,
) -> Tolerance:
    """``rtol``/``atol`` keywords for ``assert_allclose``: the test's own, or the table's if wider.

    Where the table's relative bound for ``ops`` (times ``scale``) is within the test's ``rtol``
    (a CPU), the test's own pair is returned unchanged. Where it is wider (a TPU), the bound is
    the relative tolerance and, for entries near zero, the bound times ``magnitude`` (the
    largest expected value: errors that arise upstream of a sum or a product are relative to
    it) the absolute one.

    Examples:
        >>> allclose("tanh", rtol=1e-5, atol=1e-6, magnitude=6.6, device=("cpu", "cpu"))
        {'rtol': 1e-05, 'atol': 1e-06}
        >>> tpu = allclose("tanh", rtol=1e-5, atol=1e-6, magnitude=6.6, device=("tpu", "TPU v4"))
        >>> round(tpu["rtol"], 6), round(tpu["atol"], 5)
        (0.000163, 0.00107)
    """
    wide = bound(*ops, scale=scale, device=device)
    if wide <= rtol:
        return Tolerance(rtol=rtol, atol=atol)
    return Tolerance(rtol=wide, atol=max(atol, wide * magnitude))
