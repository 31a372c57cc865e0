"""jaxwise: tested building blocks for JAX training code.

One module or sub-package per concept; ``docs/design.md`` describes the layers.
"""

from jaxwise._version import __version__ as __version__

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
