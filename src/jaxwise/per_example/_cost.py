"""What the clipped sum costs on a backend: the operand rounding and the method chosen from shapes.

Two facts about the backend steer every choice of `jaxwise.per_example`:

- ``operand_bits``: the significand bits a float32 matmul operand is rounded to at the matmul
  precision in effect (a TPU's default: one bfloat16 pass, 8 bits; ``None``: float32
  arithmetic). The ghost norms round their operands to that format once, explicitly, so that
  every product of two operands is exact in float32 and the norm runs at the default
  precision (one pass) — not at ``HIGHEST`` (six bfloat16 passes on a TPU).
- ``flops_per_byte``: how many FLOPs at that precision cost as much as one byte of memory
  traffic (its arithmetic rate over its memory bandwidth). It weighs the two ways of
  forming a layer's per-example norm (`layer_costs`) and ghost book-keeping against
  micro-batched per-example gradients for the whole gradient (`choose`).

The table is small and calibrated where a machine was at hand: CPU (2 cores): the
transformer block of ``benchmarks/bench_mf_ghost.py`` (kept per-example gradients beat Gram
norms at T = 64, d = 128); TPU v5e: ``bench_dp_scale.py``'s models at the default precision,
where a materialised per-example gradient costs about two float32 passes over its ``P``
floats at 819 GB/s and the norm contractions run near the chip's achieved ~35% of 197
TFLOP/s (so ~85 FLOPs per byte): with embedding tables kept sparse, micro-batched
per-example gradients win on all three of its models (ghost clipping's Gram norms and kept
output gradients move more bytes). `backend_name` is the one place the backend is read, so a
test can stand a TPU in for the CPU.
"""

from __future__ import annotations

import dataclasses

import jax

BYTES = 4  # float32 per-example quantities


@dataclasses.dataclass(frozen=True)
class BackendCost:
    """How a backend computes and what its arithmetic costs relative to its memory traffic.

    Attributes:
        backend: ``"cpu"``, ``"gpu"`` or ``"tpu"``.
        default_bits: significand bits of a matmul operand at the backend's default
            precision (``None``: float32, nothing rounded).
        flops_per_byte: FLOPs (at the default precision, at the rate achieved) that cost as
            much as one byte of memory traffic.
        highest_passes: matmul passes of ``Precision.HIGHEST`` relative to the default.
        max_micro: the largest micro-batch worth taking (``None``: as many as fit).
        micro_bytes: the kept per-example gradient bytes a micro-batch does best within
            (``None``: as many as the memory budget holds).
    """

    backend: str
    default_bits: int | None
    flops_per_byte: float
    highest_passes: int = 1
    max_micro: int | None = None
    micro_bytes: int | None = None


BACKENDS: dict[str, BackendCost] = {
    # At most 16 per micro-batch: bench_privacy.py's transformer block (B 32, T 64, d 128,
    # embedding kept sparse), per-example gradients 16 at a time 0.73x the non-private
    # gradient, 8 at a time 0.85x, all 32 at once 1.20x (ghost 1.19x): what a micro-batch
    # keeps stays in cache.
    "cpu": BackendCost("cpu", None, 4.0, max_micro=16),
    "gpu": BackendCost("gpu", 11, 30.0, 3, 8),  # TF32 at the default precision (Ampere on)
    # One bfloat16 pass; HIGHEST takes six. A micro-batch's kept bfloat16 gradients do best
    # near 1 GiB: GPT-2-small LM (220 MB per example) 1.02x the non-private gradient at 4,
    # 1.10x at 8, 1.28x at 16; the 49M classifier (98 MB) 1.47x at 4, 1.34x at 8, 1.37x at
    # 16 (embedding tables then formed densely per example). With the tables kept sparse
    # (`._sparse`) the kept gradients cost what `micro_cost` derives (written once, read
    # once): 16.9M classifier, all 32 at once, 100 us per example (predicted 87), at 8 a
    # time 77 us (1.29x; 1.38x at 32); the 49M classifier at 8 and the LM at 4 cost less
    # than predicted (52 us and < 0 per example: 1.06x and 0.82x the non-private
    # gradient); ghost 150 and 324 us (one unit ~ 0.02 ps). Then the 16.9M classifier at 4,
    # 8, 16 and 32 a time in one run: 1.31x, 1.30x, 1.24x, 1.39x. So: at most 16, within
    # 1 GiB (which keeps the 49M classifier at 8 and the LM at 4).
    "tpu": BackendCost("tpu", 8, 85.0, 6, max_micro=16, micro_bytes=2**30),
}

# jax_default_matmul_precision -> operand bits on a backend that rounds (None: float32 exact)
_PRECISION_BITS: dict[str, int | None] = {
    "highest": None,
    "float32": None,
    "tensorfloat32": 11,
    "bfloat16": 8,
    "fastest": 8,
}


def backend_name() -> str:
    """The backend the program is compiled for (tests replace this to stand in another)."""
    return jax.default_backend()


def backend_cost(backend: str | None = None) -> BackendCost:
    """The `BackendCost` of ``backend`` (default: `backend_name`), unknown ones as the CPU's.

    Examples:
        >>> backend_cost("tpu").default_bits, backend_cost("cpu").default_bits
        (8, None)
    """
    name = backend or backend_name()
    return BACKENDS.get(name, dataclasses.replace(BACKENDS["cpu"], backend=name))


def operand_bits(cost: BackendCost) -> int | None:
    """Significand bits of a float32 matmul operand at the precision in effect (None: exact).

    Reads ``jax_default_matmul_precision`` (also under ``jax.default_matmul_precision(...)``):
    ``"highest"``/``"float32"`` round nothing; ``"bfloat16"`` rounds to 8 bits on a backend
    that rounds at all; any other setting (``None``, ``"default"``, ``"high"``) is taken as the
    backend's default: a bfloat16 pass on a TPU (``"high"``'s three passes are exact on
    operands already rounded to bfloat16), TF32 on a GPU, float32 on a CPU.

    Examples:
        >>> import jax
        >>> with jax.default_matmul_precision("default"):  # the backends' own defaults
        ...     operand_bits(backend_cost("tpu")), operand_bits(backend_cost("cpu"))
        (8, None)
        >>> with jax.default_matmul_precision("highest"):
        ...     operand_bits(backend_cost("tpu")) is None
        True
    """
    if cost.default_bits is None:
        return None
    configured = jax.config.jax_default_matmul_precision  # pyright: ignore[reportAttributeAccessIssue]
    key = str(configured).lower() if configured is not None else ""
    if key in _PRECISION_BITS:
        bits = _PRECISION_BITS[key]
        return None if bits is None else min(bits, cost.default_bits)
    return cost.default_bits


def _flop_weight(cost: BackendCost, bits: int | None) -> float:
    """The cost of one norm FLOP: one pass at the default, ``highest_passes`` at float32."""
    return 1.0 if bits is not None or cost.default_bits is None else float(cost.highest_passes)


def layer_costs(t: int, k: int, n: int, cost: BackendCost) -> dict[str, float]:
    """Per-example extra cost (FLOP units) of each way to clip a ``(K, N)`` weight used at ``T``
    positions, over what its non-private weight gradient costs.

    - ``"gram"``: the ``(T, T)`` Gram matrices of ``a`` and ``g`` (``2T²(K + N)`` FLOPs,
      ``2T²`` floats, and one more read of ``a`` and ``g``: ``T(K + N)`` floats); the
      clipped sum is then one weight-gradient contraction at ``f·g``.
    - ``"per-example"`` (kept): the per-example gradient ``(K, N)`` replaces the weight
      gradient's contraction; it is written once and read by the ``f``-weighted sum, its
      norm fused into one of the two (``4KN`` FLOPs, ``2·KN`` floats of traffic).
    - ``"per-example, dropped"``: formed for the norm only (reading ``a`` and ``g`` once
      more), then the weight-gradient contraction at ``f·g`` again (``2TKN + 2KN`` FLOPs,
      ``2·KN + T(K + N)`` floats).

    Examples:
        >>> c = layer_costs(64, 128, 128, backend_cost("cpu"))
        >>> min(c, key=c.get)
        'per-example'
    """
    w = _flop_weight(cost, operand_bits(cost))
    fpb = cost.flops_per_byte
    reread = t * (k + n)
    return {
        "gram": w * 2.0 * t * t * (k + n) + fpb * BYTES * (2.0 * t * t + reread),
        "per-example": w * 4.0 * k * n + fpb * BYTES * 2.0 * k * n,
        "per-example, dropped": w * (2.0 * t * k * n + 2.0 * k * n)
        + fpb * BYTES * (2.0 * k * n + reread),
    }


def stored_bytes(cost: BackendCost) -> int:
    """Bytes per entry of a kept per-example gradient: 2 (bfloat16) where the matmul operands
    are rounded to 8 bits anyway (`jaxwise.per_example._vmap.stored`), else 4."""
    return 2 if operand_bits(cost) == 8 else BYTES


def micro_cost(n_params: int, cost: BackendCost) -> float:
    """Per-example extra cost (FLOP units) of micro-batched per-example gradients.

    Each example's gradient (``P`` entries of `stored_bytes`; embedding tables kept sparse
    are not counted) is written once and read once, its norm fused into one of the two, as
    a kept layer's in `layer_costs`: ``4P`` FLOPs and ``2·P`` entries of traffic. The
    vector-Jacobian products themselves replace the non-private gradient's.

    Examples:
        >>> micro_cost(1000, backend_cost("cpu"))
        36000.0
    """
    return (4.0 + cost.flops_per_byte * stored_bytes(cost) * 2.0) * n_params


def micro_batch_size(
    n_params: int,
    batch_size: int,
    memory_budget: int,
    cap: int | None = None,
    entry_bytes: int = BYTES,
) -> int:
    """The largest power of two ``m ≤ B`` (and ``≤ cap``) whose ``m·P`` per-example gradient
    entries of ``entry_bytes`` fit the budget; ``B`` itself when all ``B`` fit (and
    ``B ≤ cap``); at least 1.

    Examples:
        >>> micro_batch_size(1000, 64, 40_000), micro_batch_size(1000, 6, 10**9)
        (8, 6)
        >>> micro_batch_size(1000, 64, 10**9, cap=8), micro_batch_size(1000, 64, 40_000, None, 2)
        (8, 16)
    """
    per_example = max(1, n_params * entry_bytes)
    limit = batch_size if cap is None else min(batch_size, cap)
    if batch_size <= limit and batch_size * per_example <= memory_budget:
        return batch_size
    m = 1
    while 2 * m <= limit and 2 * m * per_example <= memory_budget:
        m *= 2
    return m


def even_chunks(n: int, m: int) -> int:
    """The micro-batch size ``≤ m`` that covers ``n`` examples in as few micro-batches as ``m``
    does, with the least padding (a Poisson step's padded width is rarely a multiple of ``m``).

    Examples:
        >>> even_chunks(34, 16), even_chunks(64, 8), even_chunks(101, 16)
        (12, 8, 15)
    """
    return -(-n // -(-n // m))


def default_budget(cost: BackendCost, fallback: int) -> int:
    """Bytes of per-example quantities a step may hold: ``fallback`` on a CPU, a third of
    the device's memory on an accelerator (its ``memory_stats()`` limit, when it reports one).
    """
    if cost.backend == "cpu":
        return fallback
    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # a backend without memory statistics
        stats = {}
    limit = int(stats.get("bytes_limit", 0))
    return max(fallback, limit // 3)
