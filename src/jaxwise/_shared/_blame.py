"""Whose error it is, marked where it crosses a call boundary (no traceback walking).

A training program names the shapes it was given when the user's loss fails on its first
call, and passes jaxwise's own errors (already precise) unchanged. Both facts are marked on
the exception itself, by the code that knows them, instead of being read back from the
traceback's frames:

- `user_loss` wraps the user's loss where jaxwise calls it: a ``TypeError`` or ``ValueError``
  that leaves the loss is marked as having come out of it (`from_user_loss`);
- `own` marks an error that jaxwise raises on purpose from code that runs *inside* a user's
  loss (a model adapter's refusal, an MLP's shape check), and `own_errors` marks every error
  leaving a block of such code; an error keeps the first origin it is given (the innermost
  boundary it crossed), so a jaxwise error raised inside the loss stays jaxwise's.

The marks are attributes of the exception object (which JAX re-raises unchanged out of a
trace); nothing is kept anywhere else.

Examples:
    >>> def loss(params, batch):
    ...     raise TypeError("dot_general requires contracting dimensions to have the same shape")
    >>> try:
    ...     user_loss(loss)(1.0, 2.0)
    ... except TypeError as err:
    ...     from_user_loss(err)
    True
    >>> def adapter_loss(params, batch):
    ...     raise own(ValueError("`model_state` must be None"))
    >>> try:
    ...     user_loss(adapter_loss)(1.0, 2.0)
    ... except ValueError as err:
    ...     from_user_loss(err)
    False
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["from_user_loss", "own", "own_errors", "user_loss"]

_ORIGIN = "_jaxwise_origin"  # "jaxwise" or "loss": the innermost boundary the error crossed
_LOSS = "_jaxwise_left_loss"  # True once the error has left the user's loss
_E = TypeVar("_E", bound=BaseException)
_R = TypeVar("_R")


def _mark(err: BaseException, origin: str) -> None:
    if getattr(err, _ORIGIN, None) is None:
        try:
            setattr(err, _ORIGIN, origin)
        except AttributeError:  # an exception type without a __dict__: left unmarked
            pass


def own(err: _E) -> _E:
    """``err`` marked as jaxwise's own (precise) error: ``raise own(ValueError(...))``.

    Args:
        err: the exception about to be raised.

    Returns:
        ``err`` itself.
    """
    _mark(err, "jaxwise")
    return err


@contextlib.contextmanager
def own_errors() -> Iterator[None]:
    """Every ``TypeError``/``ValueError`` leaving the block is marked as jaxwise's own (unless
    an inner boundary marked it first)."""
    try:
        yield
    except (TypeError, ValueError) as err:
        _mark(err, "jaxwise")
        raise


def user_loss(loss: Callable[..., _R]) -> Callable[..., _R]:
    """``loss`` with the errors that leave it marked as the user's loss's.

    Args:
        loss: the user's loss (any callable).

    Returns:
        A function that calls ``loss`` with the same arguments and returns what it returns
        (``functools.wraps``: its name, docstring and signature are the loss's).
    """

    @functools.wraps(loss)
    def call(*args: Any, **kwargs: Any) -> _R:
        try:
            return loss(*args, **kwargs)
        except (TypeError, ValueError) as err:
            _mark(err, "loss")
            try:
                setattr(err, _LOSS, True)
            except AttributeError:
                pass
            raise

    return call


def from_user_loss(err: BaseException) -> bool:
    """Whether ``err`` left the user's loss and was not raised by jaxwise on purpose inside it.

    Args:
        err: the exception.

    Returns:
        True for an error of the user's loss (or of JAX inside it).
    """
    return bool(getattr(err, _LOSS, False)) and getattr(err, _ORIGIN, None) == "loss"
