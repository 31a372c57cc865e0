"""Which backend-specific rewrites are on, per backend: one table, read at trace time.

Some of jaxwise's program rewrites exist for one compiler: XLA:CPU hands a convolution to Eigen
only in canonical layout, and only outside loops (`canonical_convolutions`); it generates a
random draw of an odd length about 2.3x slower than one of a multiple of 8 (`flat_draw`).
Neither helps elsewhere, so each is applied only on the backends where it was measured faster
(``benchmarks/bench_backend_rewrites.py``; its tables are in ``benchmarks/results/<backend>/``).
A rewrite never changes a value: only the program XLA compiles.

The backend is ``jax.default_backend()`` when the program is traced, or the one named by
`assume_backend` (tests use it to check the TPU's choice on a CPU).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping

import jax

__all__ = ["REWRITES", "assume_backend", "current_backend", "rewrite_on"]

#: rewrite name -> the backends it is on for. Measured (``bench_backend_rewrites.py``):
#: ``canonical_convolutions``: XLA:CPU runs a scanned CNN epoch's gradient convolutions as
#: naive loop nests without it (13x slower than a loop of jitted steps, issue #29); GPU/TPU
#: compilers choose convolution layouts themselves, so there it only adds transposes (off
#: unless a benchmark there shows it faster). ``padded_draws``: XLA:CPU generated 67,331
#: normals 2.3x slower than 67,336 (36 draws: 32 ms vs 14 ms); elsewhere not measured faster.
#: ``branching_guard``: the NaN guard of every update as two nested ``lax.cond`` (the optimizer
#: runs only for a finite gradient); XLA:CPU runs a ``jnp.where`` select of every state leaf up
#: to 1.5x slower per epoch. On a TPU the two ``conditional`` ops in the scanned step cost more
#: than the selects, which XLA fuses into the optimizer's update (the compiled CNN epoch was 1.26x
#: a bare ``lax.scan`` of the same step there with the branches, issue #47); GPUs keep the
#: branches until measured.
REWRITES: Mapping[str, frozenset[str]] = {
    "canonical_convolutions": frozenset({"cpu"}),
    "padded_draws": frozenset({"cpu"}),
    "branching_guard": frozenset({"cpu", "gpu"}),
}

_ASSUMED: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "jaxwise_assumed_backend", default=None
)


def current_backend() -> str:
    """The backend programs are traced for: `assume_backend`'s, else ``jax.default_backend()``.

    Returns:
        A platform name: ``"cpu"``, ``"gpu"`` or ``"tpu"`` (as ``jax.default_backend()``).

    Examples:
        >>> with assume_backend("tpu"):
        ...     current_backend()
        'tpu'
    """
    return _ASSUMED.get() or jax.default_backend()


def rewrite_on(name: str, backend: str | None = None) -> bool:
    """Whether the rewrite ``name`` is on for ``backend`` (default: `current_backend`).

    Args:
        name: a key of `REWRITES`.
        backend: a platform name (``"cpu"``, ``"gpu"``, ``"tpu"``), or ``None`` for the
            current one.

    Returns:
        ``True`` when `REWRITES` lists ``backend`` for ``name``.

    Raises:
        ValueError: ``name`` is not a known rewrite.

    Examples:
        >>> rewrite_on("padded_draws", "cpu"), rewrite_on("padded_draws", "tpu")
        (True, False)
    """
    if name not in REWRITES:
        raise ValueError(f"`name` must be one of {sorted(REWRITES)}, got {name!r}")
    return (backend or current_backend()).lower() in REWRITES[name]


@contextlib.contextmanager
def assume_backend(backend: str) -> Iterator[None]:
    """Trace programs inside the block as if for ``backend`` (tests of a backend's choices).

    Only the rewrites' choice changes; the program still runs on the default device.

    Args:
        backend: a platform name, e.g. ``"tpu"``.

    Raises:
        TypeError: ``backend`` is not a non-empty string.

    Examples:
        >>> with assume_backend("tpu"):
        ...     rewrite_on("canonical_convolutions")
        False
    """
    if not isinstance(backend, str) or not backend:
        raise TypeError(f"`backend` must be a platform name such as 'tpu', got {backend!r}")
    token = _ASSUMED.set(backend.lower())
    try:
        yield
    finally:
        _ASSUMED.reset(token)
