"""Optional extras in the tests: a test that needs one is skipped, by name, where it is absent.

``@needs("mlflow")`` (a ``skipif`` marker) or ``pytest.param(..., marks=needs("mlflow"))``: the
skip reason names the module and the install that brings it, so a run without the extra (a TPU
machine's image, the oldest lane) counts skips, never failures. Availability is read with
``importlib.util.find_spec`` when the test module is collected, so hiding a module
(``sys.modules[name] = None``) before collection makes its tests skip.

Examples:
    >>> needs("numpy").args, needs("numpy").kwargs["reason"]
    ((False,), 'needs numpy: pip install numpy')
    >>> have("a_module_that_is_not_there")
    False
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

__all__ = ["INSTALL", "have", "needs"]

# Module -> what installs it (jaxwise's extra where there is one).
INSTALL = {
    "mlflow": "pip install 'jaxwise[mlflow]'",
    "tensorboardX": "pip install 'jaxwise[tensorboard]'",
    "tensorboard": "pip install tensorboard (its reader; in 'jaxwise[test-run]')",
    "orbax.checkpoint": "pip install 'jaxwise[checkpoint]'",
    "dp_accounting": "pip install 'jaxwise[privacy]'",
    "flax": "pip install 'jaxwise[flax]'",
    "equinox": "pip install 'jaxwise[equinox]'",
    "grain": "pip install 'jaxwise[grain]'",
    "jax_privacy": "pip install jax-privacy==2.0.0",
    "cleanlab": "pip install cleanlab",
}


def have(module: str) -> bool:
    """Whether ``module`` can be imported (``find_spec``; a hidden or missing parent is False).

    A package hidden by ``sys.modules[name] = None`` hides its submodules too, even one an
    earlier test imported (``find_spec`` would answer from ``sys.modules`` for it).
    """
    parts = module.split(".")
    if any(sys.modules.get(".".join(parts[:i]), ...) is None for i in range(1, len(parts) + 1)):
        return False
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package hidden or missing, or no __spec__
        return False


def needs(*modules: str) -> pytest.MarkDecorator:
    """A ``skipif`` marker: skip unless all of ``modules`` import; names the first missing."""
    if not modules:
        raise ValueError("`modules` must name at least one module")
    missing = [m for m in modules if not have(m)]
    name = (missing or list(modules))[0]
    reason = f"needs {name}: {INSTALL.get(name, f'pip install {name}')}"
    return pytest.mark.skipif(bool(missing), reason=reason)
