"""Did a donating call reuse the donated buffers? One answer on every JAX of the range.

Donation saves memory only when XLA writes an output into the donated buffer. Something
else holding the buffer — a live NumPy view of a CPU array (``np.asarray(x)`` shares its
memory) — prevents that, and JAX says nothing. What the call leaves behind differs by version:

- up to JAX 0.12.0 the donated array is not deleted (JAX skipped the donation);
- from JAX 0.12.1 the array is deleted all the same, but its buffer lives on (the view holds
  it) and no output is written into it.

`donated_buffers` before the call and `kept` after it see both forms. An unreused buffer
alone does not prove a view (XLA:CPU also copies a donated buffer it cannot use in place, such
as one from ``jax.device_put(x, may_alias=False)``), so a deleted leaf counts only while its
buffer is exported to Python: the NumPy view's ``memoryview`` holds the array through a
``managedbuffer``, which the garbage collector names (read only for a leaf that tripped the
address check). Only a CPU buffer can be shared with NumPy, so on other devices only the
first form is looked for (no per-leaf cost). On the CPU, the buffers are not read at all when
no leaf has a reference beyond its container's and the leaves list's: a view's memoryview is
one more, so such a leaf can never be reported (a training loop's usual case).
"""

from __future__ import annotations

import gc
import itertools
import operator
import sys
import threading
from collections.abc import Sequence
from typing import Any

import jax

__all__ = ["buffer_ids", "donated_buffers", "kept", "unvouch", "vouch"]


def buffer_ids(x: jax.Array) -> tuple[int, ...]:
    """The device buffers (addresses) of ``x``: one per addressable shard, ``id(x)`` when its
    buffers cannot be read (a deleted array)."""
    try:
        return (x.unsafe_buffer_pointer(),)  # one device: the cheap way
    except Exception:
        pass
    try:
        return tuple(shard.data.unsafe_buffer_pointer() for shard in x.addressable_shards)
    except Exception:
        return (id(x),)


def _on_cpu(leaves: Sequence[Any]) -> bool:
    for leaf in leaves:
        if isinstance(leaf, jax.Array):
            try:
                return all(device.platform == "cpu" for device in leaf.devices())
            except Exception:  # a deleted array or a tracer: nothing to compare
                return False
    return False


def off_host(leaves: Sequence[Any]) -> bool:
    """True when the first array among ``leaves`` lives on accelerators only (no CPU device):
    no NumPy view can share its buffers, and a donation of it either happens or fails loudly.
    False with no array, a deleted one or a tracer.

    Examples:
        >>> import jax.numpy as jnp
        >>> off_host([jnp.zeros(2)]) == (jax.default_backend() != "cpu")
        True
    """
    for leaf in leaves:
        if isinstance(leaf, jax.Array):
            try:
                return all(device.platform != "cpu" for device in leaf.devices())
            except Exception:  # a deleted array or a tracer
                return False
    return False


def _refs_without_view() -> int:
    """``sys.getrefcount`` of a leaf held only by its container and a leaves list, counted as
    `donated_buffers` counts (measured, not assumed: the interpreter decides what it counts);
    ``-1`` (always read the buffers) if one more holder does not raise the count."""
    leaf = object()
    container, leaves = [leaf], [leaf]
    del leaf
    count = max(map(sys.getrefcount, leaves))
    one_more = [leaves[0]]  # as a view's memoryview holds the array
    tells = max(map(sys.getrefcount, leaves)) > count
    del container, one_more
    return count if tells else -1


_REFS_WITHOUT_VIEW = _refs_without_view()


class _Vouched(threading.local):
    leaves: Sequence[Any] | None = None


_vouched = _Vouched()


def vouch(leaves: Sequence[Any] | None) -> Sequence[Any] | None:
    """Around a donating call whose ``leaves`` `donated_buffers` answered ``None`` for: a
    check of the very same leaves nested in it (a watch of the audited program, whose own
    leaves list is one more reference to each) reads no buffer either. ``None`` vouches for
    nothing. Returns the previous value, for `unvouch` (per thread)."""
    previous = _vouched.leaves
    _vouched.leaves = leaves
    return previous


def unvouch(previous: Sequence[Any] | None) -> None:
    """Restore what `vouch` replaced."""
    _vouched.leaves = previous


def _is_vouched(leaves: Sequence[Any]) -> bool:
    vouched = _vouched.leaves
    return (
        vouched is not None
        and len(vouched) == len(leaves)
        and all(map(operator.is_, vouched, leaves))
    )


def donated_buffers(leaves: Sequence[Any]) -> list[tuple[int, ...]] | None:
    """Before a donating call: the buffers of its donated ``leaves`` (CPU arrays), or ``None``
    when no NumPy view can hold them: they are not on the CPU, or no leaf has a reference
    beyond its container's and ``leaves``' (a view's memoryview holds one, see `_exported`),
    or an enclosing call found so for the same leaves (`vouch`).

    ``leaves`` must be a list the caller holds, of leaves of a pytree it holds (the count
    assumes one container and that list)."""
    if not _on_cpu(leaves):
        return None
    if max(map(sys.getrefcount, leaves), default=0) <= _REFS_WITHOUT_VIEW or _is_vouched(leaves):
        return None  # no leaf can be `_exported`: none would ever be reported
    try:  # runs before every donating call: one C-level call per leaf when every leaf can
        return [(leaf.unsafe_buffer_pointer(),) for leaf in leaves]
    except Exception:  # a non-array leaf, a deleted or a multi-shard array: leaf by leaf
        return [buffer_ids(leaf) if hasattr(leaf, "is_deleted") else () for leaf in leaves]


def kept(leaves: Sequence[Any], before: list[tuple[int, ...]] | None, out: Any) -> list[int]:
    """After the call: the positions of donated ``leaves`` whose buffer was not reused.

    Runs after every donating call of a watch or a jaxwise step, so it asks each array only
    ``is_deleted()`` (no ``isinstance(leaf, jax.Array)``, a Python-level check), and reads
    the outputs' buffers only when a donated array was deleted.

    Args:
        leaves: the donated arrays, as passed to the call (other leaves are skipped).
        before: `donated_buffers` of ``leaves``, taken before the call (``None``: only
            undeleted arrays count).
        out: the call's output (any pytree).

    Returns:
        Positions in ``leaves`` of arrays that are still alive, or (``before`` given) deleted
        while no output lives in their buffer and a NumPy view still holds it. An alive array
        on none of the devices the outputs are on does not count: JAX copied it (uncommitted)
        to where the program runs and donated the copy; the caller's original is theirs.
    """
    alive, deleted = _split_deleted(leaves)
    if alive:
        alive = _not_moved(leaves, alive, out)
    if before is None or not deleted:
        return alive
    written = _live_buffers(out)
    if written.issuperset(itertools.chain.from_iterable(before)):
        return alive  # every donated buffer lives on in an output: no view holds one
    lost = [
        i for i in deleted if before[i] and written.isdisjoint(before[i]) and _exported(leaves[i])
    ]
    return sorted(alive + lost)


def _split_deleted(leaves: Sequence[Any]) -> tuple[list[int], list[int]]:
    """``(alive, deleted)``: the positions of the arrays among ``leaves`` (others are skipped)."""
    try:  # the usual case, every leaf an array: one C-level call each
        flags = [leaf.is_deleted() for leaf in leaves]
    except AttributeError:  # a leaf that is not an array (put in by hand): leaf by leaf
        flags = [getattr(leaf, "is_deleted", lambda: None)() for leaf in leaves]
    alive = [i for i, flag in enumerate(flags) if flag is False]
    deleted = [i for i, flag in enumerate(flags) if flag is True]
    return alive, deleted


def _live_buffers(out: Any) -> set[int]:
    """The buffers of the live arrays among ``out``'s leaves (read after every donating call)."""
    leaves = jax.tree.leaves(out)
    try:  # the usual outputs, live single-device arrays: one C-level call per leaf
        return {leaf.unsafe_buffer_pointer() for leaf in leaves}
    except Exception:  # a non-array or deleted leaf, a multi-shard array: leaf by leaf
        pass
    written: set[int] = set()
    for leaf in leaves:
        is_deleted = getattr(leaf, "is_deleted", None)
        if is_deleted is not None and not is_deleted():
            written.update(buffer_ids(leaf))
    return written


def _not_moved(leaves: Sequence[Any], alive: list[int], out: Any) -> list[int]:
    """The ``alive`` positions whose array is on a device the call's outputs are on.

    A program placed elsewhere (a ``shard_map`` over a mesh of other devices) receives a copy
    of an uncommitted donated array: the copy is donated, the original stays alive and is
    freed when the caller drops it (a training loop's next ``state = step(state, ...)``).
    """
    where: set[Any] = set()
    for leaf in jax.tree.leaves(out):
        devices = getattr(leaf, "devices", None)
        if devices is not None:
            try:
                where.update(devices())
            except Exception:  # a deleted output: nothing to compare
                pass
    if not where:
        return alive
    return [i for i in alive if not where.isdisjoint(leaves[i].devices())]


def _exported(leaf: jax.Array) -> bool:
    """Does a Python buffer export (a NumPy view's memoryview) still hold ``leaf``?"""
    return any(type(ref).__name__ == "managedbuffer" for ref in gc.get_referrers(leaf))
