"""The exception hierarchy: `JaxwiseError` is the base of every jaxwise exception.

Each jaxwise exception also keeps its built-in base (``DataError`` is a ``ValueError``,
`MissingExtraError` an ``ImportError``), so ``except ValueError`` keeps working while
``except jaxwise.JaxwiseError`` catches everything jaxwise raises on purpose. This module
imports nothing, so the command line can catch these classes before NumPy or JAX load.
Warnings stay warnings (``CheckpointWarning`` is a ``UserWarning``), and the signals used for
control flow (``Terminated``, a ``SystemExit``) are not exceptions in this sense.

Examples:
    >>> issubclass(MissingExtraError, ImportError) and issubclass(MissingExtraError, JaxwiseError)
    True
    >>> issubclass(UserError, ValueError)
    False
"""

from __future__ import annotations

__all__ = ["JaxwiseError", "MissingExtraError", "UserError"]


class JaxwiseError(Exception):
    """The base of every exception jaxwise raises on purpose.

    Subclasses also derive from the built-in class they had before the hierarchy existed
    (``class DonationError(JaxwiseError, ValueError)``), so existing ``except`` clauses keep
    catching them.

    Examples:
        >>> try:
        ...     raise MissingExtraError("needs orbax: pip install 'jaxwise[checkpoint]'")
        ... except JaxwiseError as err:
        ...     print(type(err).__name__)
        MissingExtraError
    """

    __module__ = "jaxwise"


class MissingExtraError(JaxwiseError, ImportError):
    """An optional dependency is not installed; the message names the extra that installs it.

    Raised by every feature that needs an extra (``pip install 'jaxwise[NAME]'``); the command
    line reports it in one line with exit code 2.

    Examples:
        >>> issubclass(MissingExtraError, ImportError)
        True
    """

    __module__ = "jaxwise"


class UserError(JaxwiseError):
    """A problem with the user's input or environment: the CLI reports it in one line, exit 2."""

    __module__ = "jaxwise.cli._jobs"
