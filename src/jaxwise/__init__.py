"""jaxwise: tested building blocks for JAX training code.

One module per concept (see DESIGN.md): ``compilation``, ``buckets``,
``numerics``, ``debug``, ``tree``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("jaxwise")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"

from jaxwise import autodiff as autodiff
from jaxwise import buckets as buckets
from jaxwise import compilation as compilation
from jaxwise import data as data
from jaxwise import debug as debug
from jaxwise import diagnose as diagnose
from jaxwise import models as models
from jaxwise import numerics as numerics
from jaxwise import optim as optim
from jaxwise import per_example as per_example
from jaxwise import privacy as privacy
from jaxwise import sequence as sequence
from jaxwise import train as train
from jaxwise import tree as tree

__all__ = ["__version__", "autodiff", "buckets", "compilation", "data", "debug", "diagnose", "models", "numerics", "optim", "per_example", "privacy", "sequence", "train", "tree"]
