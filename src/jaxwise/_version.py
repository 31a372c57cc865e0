"""The installed version of jaxwise (its own module: imported by the CLI without JAX)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("jaxwise")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
