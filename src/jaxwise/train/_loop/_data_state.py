"""The position of a stateful data iterator (a ``grain`` loader), saved beside the TrainState."""

from __future__ import annotations

import base64
import collections
import itertools
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import jax

from jaxwise._errors import JaxwiseError
from jaxwise._shared._checks import is_int
from jaxwise.train._loop._fingerprint import fingerprint, mismatch
from jaxwise.train._loop._trained import TrainedHash, batch_digest

__all__ = ["DataPosition", "ResumeError", "ResumeWarning", "StatefulIterator"]


class ResumePoint(Protocol):
    """What a data position reads of `jaxwise.train.Resume` (the checkpoint's metadata, and
    whether the caller positioned the iterator itself)."""

    @property
    def metadata(self) -> Mapping[str, Any]: ...

    @property
    def positioned(self) -> bool: ...


class ResumeError(JaxwiseError, ValueError):
    """`fit` cannot continue the saved run over these ``batches`` (another pipeline's
    position, other data than the run that saved the checkpoint, a list too short)."""

    __module__ = "jaxwise.train"


class ResumeWarning(UserWarning):
    """`fit` resumes over a plain iterator it cannot move to the saved position: the batches
    restart at the iterator's own beginning unless the caller positioned it."""

    __module__ = "jaxwise.train"


@runtime_checkable
class StatefulIterator(Protocol):
    """An iterator whose position can be saved and restored (grain's ``DatasetIterator`` and
    ``DataLoader`` iterators are ones).

    ``get_state()`` returns the position after the last batch returned (a JSON-able value or
    ``bytes``); ``set_state(state)`` moves an iterator of the same pipeline there.
    """

    def __iter__(self) -> Iterator[Any]: ...

    def __next__(self) -> Any: ...

    def get_state(self) -> Any:
        """The iterator's position.

        Returns:
            The position after the last batch returned (JSON-able, or ``bytes``).
        """
        ...

    def set_state(self, state: Any) -> None:
        """Move to ``state``, a value ``get_state`` returned.

        Args:
            state: the saved position.
        """
        ...


def _encode(state: Any) -> dict[str, Any]:
    if isinstance(state, bytes):
        return {"bytes": base64.b64encode(state).decode("ascii")}
    return {"json": state}


def _decode(saved: Mapping[str, Any]) -> Any:
    if "bytes" in saved:
        return base64.b64decode(saved["bytes"])
    return saved["json"]


def _form(state: Any) -> str:
    return "bytes" if isinstance(state, bytes) else type(state).__name__


def _restore(iterator: Any, saved: Mapping[str, Any], batches: object) -> None:
    """``iterator.set_state`` of the saved position, refused by name when it is another kind's.

    A grain ``DataLoader`` keeps its position as bytes, an ``IterDataset`` iterator as a dict
    (keyed by its pipeline): a position saved by one kind (or another pipeline) given to the
    other fails deep inside grain, so the forms are compared first (a fresh iterator's
    ``get_state()``), and a ``set_state`` that still fails is reported with both.
    """
    try:
        state = _decode(saved)
    except (KeyError, TypeError, ValueError):
        raise ResumeError(
            "`Resume` holds a data position jaxwise cannot read "
            f"(metadata['fit']['data'] = {str(dict(saved))[:120]}): not one `fit` saved"
        ) from None
    fresh = iterator.get_state()
    kind = f"{type(batches).__name__} (its iterator {type(iterator).__name__})"
    same = _form(fresh) == _form(state) and (
        not isinstance(state, Mapping) or set(state) == set(fresh)
    )
    if not same:
        raise ResumeError(
            f"`Resume` holds the data position of another kind of pipeline "
            f"({_form(state)}{_keys(state)}) than `batches`, a {kind} whose position is "
            f"{_form(fresh)}{_keys(fresh)}: resume with the same kind of pipeline as the run "
            "that saved the checkpoint (a grain DataLoader's position fits only a DataLoader, "
            "an IterDataset's only the same IterDataset pipeline)"
        )
    try:
        iterator.set_state(state)
    except Exception as err:  # grain's own failure, deep in its internals
        raise ResumeError(
            f"`Resume`'s data position does not fit `batches`, a {kind}: its "
            f"set_state failed ({type(err).__name__}: {err}); resume with the same pipeline "
            "as the run that saved the checkpoint"
        ) from err


def _keys(state: Any) -> str:
    return f" with keys {sorted(map(str, state))}" if isinstance(state, Mapping) else ""


def hashing_ok() -> bool:
    """Whether batches are hashed: not in a multi-process job (each process has its rows)."""
    return jax.process_count() == 1


def _first_batch(record: Mapping[str, Any], default: int) -> int:
    batches = record.get("batches")
    return int(batches) if batches is not None and is_int(batches) else default


class DataPosition:
    """Where ``fit`` is in its data: the iterator, the positions queued by prefetch, the count.

    The prefetch thread pulls batches ahead of training, so the iterator's own state is ahead
    of the batch being trained; its state (and, when checkpoints are saved, the batch's
    digest) is read right after each batch is pulled and queued here, and ``consumed`` pops
    the one of the batch just dispatched (its digest joins the chain of batches trained).
    """

    def __init__(
        self,
        iterator: Iterator[Any],
        first: int,
        stateful: bool,
        print_: dict[str, Any] | None,
        trained: TrainedHash | None = None,
    ) -> None:
        self.first = first
        self._iterator = iterator
        self._stateful = stateful
        self._fingerprint = print_
        self._trained = trained
        self._queued: collections.deque[tuple[Any, bytes | None]] = collections.deque()
        self._current: Any = None

    @classmethod
    def start(
        cls,
        batches: Iterable[Any],
        resume: ResumePoint | None,
        default_first: int,
        saving: bool = True,
    ) -> DataPosition:
        """The position of ``batches``, moved to ``resume``'s saved one when it has one.

        The data's fingerprint is taken when it is saved (``saving``) or checked (``resume``);
        when saved, every batch trained is hashed too (`TrainedHash`), and a resume over a
        list checks the batches the saved run trained.
        """
        print_ = fingerprint(batches) if saving or resume is not None else None
        iterator = iter(batches)  # a grain DataLoader gives its stateful iterator
        stateful = isinstance(iterator, StatefulIterator)
        hashing = saving and hashing_ok()
        if resume is None:
            trained = TrainedHash(default_first, None) if hashing else None
            return cls(iterator, default_first, stateful, print_, trained)
        record = resume.metadata.get("fit", {})
        record = record if isinstance(record, Mapping) else {}
        first = _first_batch(record, default_first)
        different = mismatch(record.get("fingerprint"), print_)
        if different is None and isinstance(batches, Sequence) and not resume.positioned:
            span = TrainedHash.differs(record.get("trained"), batches) if hashing_ok() else None
            different = span and f"other {span} (their chained hash differs)"
        if different:
            raise ResumeError(
                f"`Resume`'s data is not `batches`: the run that saved the checkpoint "
                f"trained on {different}; resume over the same data (a fresh run needs no "
                "`Resume`)"
            )
        if not resume.positioned:
            iterator = _positioned(iterator, batches, record.get("data"), first, stateful)
        trained = TrainedHash(first, record.get("trained")) if hashing else None
        return cls(iterator, first, stateful, print_, trained)

    @property
    def source(self) -> Iterable[Any]:
        """The batches, each queueing the iterator's state after it and its digest."""
        if not self._stateful and self._trained is None:
            return self._iterator
        return self._tracked()

    def _tracked(self) -> Iterator[Any]:
        iterator: Any = self._iterator
        for batch in iterator:
            state = iterator.get_state() if self._stateful else None
            digest = batch_digest(batch) if self._trained is not None else None
            self._queued.append((state, digest))
            yield batch

    def consumed(self) -> None:
        """A batch was dispatched: its position becomes the current one, its digest chained."""
        if not self._stateful and self._trained is None:
            return
        state, digest = self._queued.popleft()
        if self._stateful:
            self._current = state
        if self._trained is not None and digest is not None:
            self._trained.add(digest)

    def saved(self, batches: int) -> dict[str, Any]:
        """What a checkpoint records (``metadata["fit"]``) after ``batches`` batches."""
        record: dict[str, Any] = {"batches": batches}
        if self._fingerprint:
            record["fingerprint"] = self._fingerprint
        if self._trained is not None:
            record["trained"] = self._trained.record()
        if self._stateful and self._current is not None:
            record["data"] = _encode(self._current)
        return record


def _positioned(
    iterator: Iterator[Any], batches: Iterable[Any], saved: Any, first: int, stateful: bool
) -> Iterator[Any]:
    """``iterator`` moved after the ``first`` batches trained (or refused, or warned about)."""
    if saved is not None and not stateful:
        raise ResumeError(
            "`Resume` holds a data position, but `batches` "
            f"({type(batches).__name__}) has no `get_state`/`set_state` to restore it: "
            "pass the same kind of stateful iterator (e.g. a grain DataLoader) as the run "
            "that saved the checkpoint"
        )
    if stateful and saved is None:
        raise ResumeError(
            "`batches` is a stateful iterator but `Resume` holds no data position "
            "(metadata['fit']['data']): the checkpoint was not saved by `fit` with this "
            "iterator; position the iterator yourself and pass Resume(..., positioned=True)"
        )
    if stateful and saved is not None:
        _restore(iterator, saved, batches)
    elif isinstance(batches, Sequence) and first > 0:
        # a list restarts where the checkpoint was taken, not at its batch 0
        if first > len(batches):
            raise ResumeError(
                f"`Resume` continues after batch {first}, but `batches` holds "
                f"{len(batches)}: pass the same batches as the run that saved it"
            )
        return itertools.islice(batches, first, None)
    elif first > 0 and not isinstance(batches, itertools.repeat):
        warnings.warn(
            f"`Resume` continues after batch {first}, but `batches` "
            f"({type(batches).__name__}) is a plain iterator that fit cannot move there: it "
            "starts at its own beginning, so the resumed run trains on other batches than an "
            "uninterrupted one. Pass a list or a stateful iterator (a grain loader), or "
            "position it yourself and say so with Resume(..., positioned=True)",
            ResumeWarning,
            stacklevel=4,
        )
    return iterator
