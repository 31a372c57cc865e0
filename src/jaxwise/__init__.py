"""jaxwise: tested building blocks for JAX training code.

One module or sub-package per concept; ``docs/design.md`` describes the layers. Sub-packages
are imported on first use (``jaxwise.train`` imports JAX; ``import jaxwise`` alone does not).
`JaxwiseError` is the base of every jaxwise exception; `MissingExtraError` (an ``ImportError``)
names the extra that installs a missing optional dependency.
"""

import importlib as _importlib
import types as _types
import typing as _typing

if _typing.TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports lazily
    from jaxwise import (
        autodiff,
        buckets,
        checkpoint,
        compilation,
        data,
        debug,
        diagnose,
        label_errors,
        lint,
        metrics,
        models,
        numerics,
        optim,
        per_example,
        privacy,
        report,
        sequence,
        sharding,
        train,
        tree,
        watch,
    )
    from jaxwise._errors import JaxwiseError, MissingExtraError

    __version__: str

__all__ = [  # the version, the exception bases, then the sub-packages (imported on first use)
    "__version__",
    "JaxwiseError",
    "MissingExtraError",
    "autodiff",
    "buckets",
    "checkpoint",
    "compilation",
    "data",
    "debug",
    "diagnose",
    "label_errors",
    "lint",
    "metrics",
    "models",
    "numerics",
    "optim",
    "per_example",
    "privacy",
    "report",
    "sequence",
    "sharding",
    "train",
    "tree",
    "watch",
]
_ERRORS = frozenset(__all__[1:3])
_SUBMODULES = frozenset(__all__[3:])


def __getattr__(name: str) -> _types.ModuleType | str | type[Exception]:
    if name == "__version__":  # read from the installed metadata on first use
        from jaxwise._version import version

        return version()
    if name in _ERRORS:  # jaxwise._errors imports nothing: cheap, but kept lazy like the rest
        from jaxwise import _errors

        return getattr(_errors, name)
    if name in _SUBMODULES:
        module = _importlib.import_module(f"jaxwise.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'jaxwise' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
