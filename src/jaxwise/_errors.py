"""``UserError``: its own module, importing nothing, so the CLI can catch it before NumPy loads.

Examples:
    >>> issubclass(UserError, ValueError)
    False
"""

from __future__ import annotations

__all__ = ["UserError"]


class UserError(Exception):
    """A problem with the user's input or environment: the CLI reports it in one line, exit 2."""

    __module__ = "jaxwise.jobs"
