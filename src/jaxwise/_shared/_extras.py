"""Optional dependencies: one clear `MissingExtraError` naming the extra that installs them.

The core of jaxwise needs only jax, numpy and optax. Everything else is an extra of the
package (``pip install 'jaxwise[NAME]'``); modules that need one call `require` at the
point of use, never at import time of a core module.

>>> require("math", extra="cli").__name__
'math'
"""

from __future__ import annotations

import importlib
from types import ModuleType

from jaxwise._errors import MissingExtraError

__all__ = ["EXTRAS", "require"]

# extra -> the distributions it installs (what `pip install 'jaxwise[extra]'` brings)
EXTRAS: dict[str, tuple[str, ...]] = {
    "checkpoint": ("orbax-checkpoint",),
    "privacy": ("dp-accounting", "scipy"),
    "cli": ("rich", "matplotlib"),
    "flax": ("flax",),
    "equinox": ("equinox",),
    "tensorboard": ("tensorboardX",),
    "mlflow": ("mlflow-skinny",),
    "grain": ("grain",),
}


def require(module: str, *, extra: str, feature: str | None = None) -> ModuleType:
    """Import ``module`` or raise one `MissingExtraError` naming the extra that provides it.

    Args:
        module: the dotted module name to import, e.g. ``"orbax.checkpoint"``.
        extra: the jaxwise extra that installs it, one of `EXTRAS`.
        feature: what needs it, for the message (default: the extra's name).

    Returns:
        The imported module.

    Raises:
        MissingExtraError: ``module`` is not installed (an ``ImportError``); the message is
            one line:
            ``"<feature> needs <module>: pip install 'jaxwise[<extra>]'"``.
    """
    if extra not in EXTRAS:
        raise ValueError(f"`extra` must be one of {sorted(EXTRAS)}, got {extra!r}")
    try:
        return importlib.import_module(module)
    except ImportError as err:
        what = feature or f"jaxwise's {extra} support"
        raise MissingExtraError(
            f"{what} needs {module.split('.')[0]}, which is not installed: "
            f"pip install 'jaxwise[{extra}]'",
            name=err.name,
        ) from None
