"""Streaming input: put host batches on the devices ahead of time, from a background thread.

JAX is imported lazily (``jaxwise.data`` re-exports `prefetch_to_device` and must stay
importable without JAX).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from jaxwise._shared._checks import check_int

if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh

__all__ = ["Prefetcher", "place_batch", "prefetch_to_device"]

_DONE = object()


def place_batch(batch: Any, sharding: jax.sharding.Sharding) -> Any:
    """Put a batch on ``sharding`` (e.g. ``NamedSharding(mesh, P("data"))``).

    In one process ``batch`` is the global batch. In a multi-process job each
    process passes ITS OWN slice of the global batch (its local examples, the
    leading axis split across processes in process order) and the global array
    is assembled with ``jax.make_array_from_process_local_data``; leaves that
    already are global arrays on ``sharding`` are kept.

    Args:
        batch: a pytree of host (or device) arrays, leading axis the examples.
        sharding: where to put every leaf, e.g.
            [`batch_sharding`][jaxwise.sharding.batch_sharding]``(mesh)``.

    Returns:
        ``batch`` with every leaf a ``jax.Array`` on ``sharding``.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        >>> sharding = NamedSharding(Mesh(np.asarray(jax.devices()), ("data",)), P("data"))
        >>> x = place_batch(np.ones((8, 2), np.float32), sharding)
        >>> x.shape, x.sharding == sharding
        ((8, 2), True)
    """
    import jax
    import numpy as np

    def put(leaf: Any) -> Any:
        if isinstance(leaf, jax.Array) and leaf.sharding == sharding:
            return leaf
        if sharding.is_fully_addressable:
            return jax.device_put(leaf, sharding)
        return jax.make_array_from_process_local_data(sharding, np.asarray(leaf))

    return jax.tree.map(put, batch)


class Prefetcher(Iterator[Any]):
    """An iterator over device batches, filled ``size`` ahead by a background thread.

    Iterate it, or use it as a context manager; [`close`][jaxwise.data.Prefetcher.close]
    (also on ``break`` out of a ``with`` block) stops the thread. An exception raised by the
    source iterator (or by the transfer) is re-raised by ``next`` at the batch where it
    happened, after the batches before it. Made by
    [`prefetch_to_device`][jaxwise.data.prefetch_to_device], which checks the arguments.

    Args:
        iterator: the host batches (pytrees of arrays).
        size: how many transferred batches may wait, >= 1.
        sharding: where to put each batch (``None``: the default device).

    Attributes:
        produced: how many batches the thread has put on the devices so far.
    """

    def __init__(
        self, iterator: Iterable[Any], size: int, sharding: jax.sharding.Sharding | None
    ) -> None:
        self._source = iter(iterator)
        self._sharding = sharding
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=size)
        self._stop = threading.Event()
        self.produced = 0
        self._thread = threading.Thread(target=self._fill, name="jaxwise-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _transfer(self, batch: Any) -> Any:
        import jax

        if self._sharding is None:
            return jax.device_put(batch)
        return place_batch(batch, self._sharding)

    def _fill(self) -> None:
        try:
            for batch in self._source:
                if self._stop.is_set():
                    return
                if not self._put(("batch", self._transfer(batch))):
                    return
                self.produced += 1
            self._put(("done", _DONE))
        except BaseException as err:  # handed to the consumer, re-raised there
            self._put(("error", err))

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        if self._stop.is_set():
            raise StopIteration
        kind, value = self._queue.get()
        if kind == "batch":
            return value
        self.close()
        if kind == "error":
            raise value
        raise StopIteration

    def close(self) -> None:
        """Stop the background thread (pending device batches are dropped)."""
        self._stop.set()
        self._thread.join(timeout=5.0)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prefetch_to_device(
    iterator: Iterable[Any], size: int = 2, mesh: Mesh | None = None
) -> Prefetcher:
    """Overlap host batch preparation with device compute: batches arrive already on device.

    A background thread takes batches (pytrees of NumPy arrays) from ``iterator`` and
    transfers each to the device(s) while the previous ones are being trained on, keeping
    at most ``size`` transferred batches waiting. With ``mesh`` (a ``jax.sharding.Mesh``
    with a ``"data"`` axis) every batch is sharded over ``"data"`` (the same placement as
    ``make_train_step(..., mesh=mesh)``, so the step uses it as it is); in a multi-process
    job each process passes its local rows and gets global arrays.

    Args:
        iterator: any iterable of batches (a generator, a ``DataLoader``...).
        size: how many batches to keep ready on the devices (>= 1).
        mesh: optional mesh to shard each batch over its ``"data"`` axis.

    Returns:
        A [`Prefetcher`][jaxwise.data.Prefetcher] (an iterator; close it, or use ``with``,
            when stopping early).

    Raises:
        TypeError: ``iterator`` is not iterable, ``size`` not an int, or ``mesh`` not a mesh.
        ValueError: ``size < 1`` or ``mesh`` has no ``"data"`` axis.

    Examples:
        >>> import numpy as np
        >>> batches = ((np.full((4, 2), i, np.float32), np.arange(4)) for i in range(3))
        >>> with prefetch_to_device(batches, size=2) as device_batches:
        ...     print([float(x.sum()) for x, _ in device_batches])
        [0.0, 8.0, 16.0]
    """
    size = check_int(size, "size", min_value=1)
    if not isinstance(iterator, Iterable):
        raise TypeError(f"`iterator` must be an iterable of batches, got {type(iterator).__name__}")
    sharding = None
    if mesh is not None:
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        if not isinstance(mesh, Mesh):
            raise TypeError(f"`mesh` must be a jax.sharding.Mesh, got {type(mesh).__name__}")
        if "data" not in mesh.axis_names:
            raise ValueError(f"`mesh` needs an axis named 'data', got {mesh.axis_names}")
        sharding = NamedSharding(mesh, PartitionSpec("data"))
    return Prefetcher(iterator, size, sharding)
