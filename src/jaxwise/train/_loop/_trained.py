"""A streaming hash of every batch `fit` trains on, so a resume can check the batches trained.

Each batch is digested as it is pulled (in the prefetch thread, off the training thread),
and the digests are chained in training order: ``h(k+1) = sha256(h(k) || digest(batch k))``
from ``h = 0`` at the batch the chain starts. A batch's digest reads every byte once, in one
fused pass (SHA-256 of a whole batch cost 20% of a small MLP's epoch on a loaded 2-core
machine, this about 2%, hidden behind the step when a core is free): each leaf's 8-byte
words ``w[i]`` are weighted by fixed odd keys ``k[i]`` (splitmix64 of ``i``, per 512 KiB
block) and summed modulo 2**64, ``sum(w[i] * k[i])``; SHA-256 then covers the leaf's dtype,
shape, block sums and trailing bytes. Any change of one word changes the sum (``k`` is odd),
and so does moving words (rows reordered, another shuffle): the weights depend on the
position. A change of several words goes unseen only when its weighted differences cancel
modulo 2**64, e.g. flipping bit 63 of exactly two words (the signs of two float64s) and
nothing else. It detects accidents (other files,
another order, another preprocessing), not an adversary.

A checkpoint records the chain's span and value (``{"from": a, "to": b, "sha256": h}``); a
resume over a list recomputes the chain over ``batches[a:b]`` (the batches already trained)
and refuses other data, naming the span. Batches after the checkpoint are never
compared: they were not trained yet, so changing them is a new continuation, not other data.

Leaves on an accelerator are hashed by dtype and shape only (hashing their bytes would copy
them back to the host each step). In a multi-process job each process reads its own rows
while the checkpoint's metadata is process 0's, so no chain is kept there.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxwise._shared._checks import is_int

__all__ = ["TrainedHash", "batch_digest"]

_ZERO = bytes(32)
_BLOCK = 1 << 16  # words (512 KiB) per block sum


def _splitmix(n: int) -> np.ndarray:
    """``(n,)`` uint64: splitmix64 of 1..n, made odd (fixed: no library's random stream)."""
    with np.errstate(over="ignore"):
        z = (np.arange(n, dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))) | np.uint64(1)


_KEYS = _splitmix(_BLOCK)


def _word_sums(data: np.ndarray) -> bytes:
    """The key-weighted sums (mod 2**64) of ``data``'s (uint8, C order) 8-byte words, per block."""
    words = data[: data.size // 8 * 8].view(np.uint64)
    sums = np.empty(-(-words.size // _BLOCK), np.uint64)
    for i, start in enumerate(range(0, words.size, _BLOCK)):
        part = words[start : start + _BLOCK]
        sums[i] = np.einsum("i,i->", part, _KEYS[: part.size])  # one pass, wraps mod 2**64
    return sums.tobytes() + data[words.size * 8 :].tobytes()


def _leaf_bytes(leaf: Any) -> tuple[str, bytes]:
    """``(dtype and shape, what stands for its bytes)`` of one leaf (no copy when possible)."""
    if isinstance(leaf, jax.Array) and any(d.platform != "cpu" for d in leaf.devices()):
        return f"{leaf.dtype.str}{leaf.shape}@device", b""
    try:
        array = np.asarray(leaf)
    except Exception:  # not an array: its type stands for it
        return f"unreadable {type(leaf).__qualname__}", b""
    if array.dtype == object:  # no stable bytes: its type stands for it
        return f"object{array.shape}", type(leaf).__qualname__.encode()
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)  # a view: no copy
    return f"{array.dtype.str}{array.shape}", _word_sums(data)


def batch_digest(batch: Any) -> bytes:
    """The digest of one batch: each leaf's dtype, shape and bytes, in tree order.

    Args:
        batch: a pytree of arrays (host arrays, scalars, or arrays on a device).

    Returns:
        32 bytes.

    Examples:
        >>> import numpy as np
        >>> batch_digest((np.ones(3), 1)) == batch_digest((np.ones(3), 1))
        True
        >>> batch_digest(np.ones(3)) == batch_digest(np.ones(3, np.float32))
        False
        >>> x = np.zeros(100_000); y = x.copy(); y[77_777] = -0.0  # one bit of one value
        >>> batch_digest(x) == batch_digest(y)
        False
    """
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(batch):
        form, data = _leaf_bytes(leaf)
        digest.update(form.encode())
        digest.update(data)
    return digest.digest()


def _chain(start: bytes, digests: Any) -> bytes:
    value = start
    for d in digests:
        value = hashlib.sha256(value + d).digest()
    return value


def _span(saved: Any) -> tuple[int, int, bytes] | None:
    """``(from, to, value)`` of a saved chain record, or None when it is not one."""
    if not isinstance(saved, Mapping):
        return None
    start, end, value = saved.get("from"), saved.get("to"), saved.get("sha256")
    if not (is_int(start) and is_int(end) and isinstance(value, str)):
        return None
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        return None
    first, last = int(start), int(end)  # pyright: ignore[reportArgumentType]  # is_int above
    return (first, last, raw) if 0 <= first <= last else None


class TrainedHash:
    """The chained hash of the batches trained so far (``add`` one digest per batch trained).

    Args:
        first: the number of the first batch this call trains (batches counted over resumes).
        saved: the chain a checkpoint recorded (``metadata["fit"]["trained"]``), continued
            when it ends at ``first``; else a new chain starts at ``first``.

    Examples:
        >>> import numpy as np
        >>> data = [np.full(2, i) for i in range(4)]
        >>> chain = TrainedHash(0, None)
        >>> for batch in data[:3]:
        ...     chain.add(batch_digest(batch))
        >>> saved = chain.record()
        >>> saved["from"], saved["to"]
        (0, 3)
        >>> TrainedHash.differs(saved, data) is None
        True
        >>> TrainedHash.differs(saved, [data[0], np.full(2, 9), *data[2:]])
        'batches 0..2'
    """

    def __init__(self, first: int, saved: Any) -> None:
        span = _span(saved)
        if span is not None and span[1] == first:
            self._from, self._value = span[0], span[2]
        else:
            self._from, self._value = first, _ZERO
        self._to = first

    def add(self, digest: bytes) -> None:
        """Chain the digest of the next batch trained."""
        self._value = hashlib.sha256(self._value + digest).digest()
        self._to += 1

    def record(self) -> dict[str, Any]:
        """What a checkpoint records: ``{"from": a, "to": b, "sha256": hex}``."""
        return {"from": self._from, "to": self._to, "sha256": self._value.hex()}

    @staticmethod
    def differs(saved: Any, batches: Sequence[Any]) -> str | None:
        """The span of ``batches`` whose chain differs from ``saved`` (None: same, or unknown).

        Args:
            saved: a chain record a checkpoint holds (``metadata["fit"]["trained"]``).
            batches: the data as a list; the batches ``saved`` spans are hashed again.

        Returns:
            ``"batches a..b-1"`` when they differ from what the saved run trained, else None
            (also when there is no saved chain or ``batches`` is too short to hold it).
        """
        span = _span(saved)
        if span is None or span[1] == span[0] or span[1] > len(batches):
            return None
        start, end, value = span
        now = _chain(_ZERO, (batch_digest(batches[i]) for i in range(start, end)))
        return None if now == value else f"batches {start}..{end - 1}"
