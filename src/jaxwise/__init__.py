"""jaxwise: tested building blocks for JAX training code.

One module or sub-package per concept; ``docs/design.md`` describes the layers. Sub-packages
are imported on first use (``jaxwise.train`` imports JAX; ``import jaxwise`` alone does not).
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

    __version__: str

__all__ = [  # the version, then the sub-packages (each imported on first use)
    "__version__",
    "autodiff",
    "buckets",
    "checkpoint",
    "compilation",
    "data",
    "debug",
    "diagnose",
    "label_errors",
    "lint",
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
_SUBMODULES = frozenset(__all__[1:])


def __getattr__(name: str) -> _types.ModuleType | str:
    if name == "__version__":  # read from the installed metadata on first use
        from jaxwise._version import version

        return version()
    if name in _SUBMODULES:
        module = _importlib.import_module(f"jaxwise.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'jaxwise' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
