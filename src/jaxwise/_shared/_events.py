"""The typed event channel between jaxwise's programs and the tools that observe them.

Programs (``jaxwise.train``'s steps and epochs) *publish*; observers (``jaxwise.watch``)
*subscribe*. Neither imports the other's private modules: this module is the whole contract.

- `publish(event)` hands an event to every subscriber, in subscription order.
- `subscribe(listener)` adds a listener and returns the function that removes it.
- `suspend_donation(reason)` is a context manager: while one is open, jitted programs do not
  donate and donation audits step aside (``jaxwise watch --nans`` replays failing calls, which
  needs their inputs alive); `donation_suspended()` returns the innermost reason, or ``None``.
  The suspension belongs to the context that opened it (a `contextvars.ContextVar`): another
  thread, or an ``asyncio`` task started before it, keeps donating.

Examples:
    >>> seen = []
    >>> stop = subscribe(seen.append)
    >>> publish(DonationFailed(function="step", argument="state.params['w']", error=None))
    >>> stop(); seen[0].function
    'step'
    >>> with suspend_donation("replaying"):
    ...     donation_suspended()
    'replaying'
    >>> donation_suspended() is None
    True
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from typing import NamedTuple

__all__ = [
    "DonationFailed",
    "Event",
    "donation_suspended",
    "publish",
    "subscribe",
    "suspend_donation",
]


class DonationFailed(NamedTuple):
    """A donation audit is about to raise: the function, the leaf at fault, and the error."""

    function: str
    argument: str
    error: Exception | None


Event = DonationFailed  # the union of every event type (one so far)

_LISTENERS: list[Callable[[Event], None]] = []
_SUSPENDED: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "jaxwise_donation_suspended", default=()
)
_LOCK = threading.Lock()


def publish(event: Event) -> None:
    """Hand ``event`` to every subscriber (a subscriber's exception propagates)."""
    with _LOCK:
        listeners = list(_LISTENERS)
    for listener in listeners:
        listener(event)


def subscribe(listener: Callable[[Event], None]) -> Callable[[], None]:
    """Add ``listener``; returns a function that removes it (calling it twice is harmless)."""
    with _LOCK:
        _LISTENERS.append(listener)

    def unsubscribe() -> None:
        with _LOCK, contextlib.suppress(ValueError):
            _LISTENERS.remove(listener)

    return unsubscribe


@contextlib.contextmanager
def suspend_donation(reason: str) -> Iterator[None]:
    """While open, programs do not donate and audits step aside (nested: innermost wins), in
    this context only."""
    token = _SUSPENDED.set((*_SUSPENDED.get(), reason))
    try:
        yield
    finally:
        _SUSPENDED.reset(token)


def donation_suspended() -> str | None:
    """The innermost open `suspend_donation` reason of this context, or ``None``."""
    reasons = _SUSPENDED.get()
    return reasons[-1] if reasons else None
