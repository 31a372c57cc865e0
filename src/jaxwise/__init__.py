"""jaxwise: tested building blocks for JAX training code.

Modules (one per concept, see DESIGN.md): ``compilation``, ``buckets``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("jaxwise")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"

from jaxwise import buckets as buckets
from jaxwise import compilation as compilation

__all__ = ["__version__", "buckets", "compilation"]
