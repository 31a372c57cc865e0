"""The installed version of jaxwise (its own module: imported by the CLI without JAX).

``__version__`` is read from the installed distribution's metadata on first use (importing
``importlib.metadata`` costs tens of milliseconds, which ``jaxwise lint`` and ``--help`` do
not pay).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

__all__ = ["__version__", "version"]

if TYPE_CHECKING:
    __version__: str


@functools.cache
def version() -> str:
    """The installed version, or ``"0.0.0+unknown"`` when running from an uninstalled tree."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as distribution_version

    try:
        return distribution_version("jaxwise")
    except PackageNotFoundError:
        return "0.0.0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return version()
    raise AttributeError(f"module 'jaxwise._version' has no attribute {name!r}")
