"""Regenerate ``tests/public_api.txt``, the committed list of every public name of jaxwise.

Run from the repository root after adding or removing a public name on purpose::

    python -m tests.gen_public_api

One line per public name, ``namespace.name``, sorted. A namespace is ``jaxwise``, each
sub-package in ``jaxwise.__all__`` (the exception bases there are names of ``jaxwise``), and
the command-line module ``jaxwise.cli`` and ``jaxwise.pytest_plugin``;
its public names are the attributes not starting with ``_`` (``dir`` and ``vars``), the
namespaces themselves excepted.
"""

from __future__ import annotations

import importlib
from pathlib import Path

PATH = Path(__file__).with_name("public_api.txt")
ENTRY_POINTS = ("cli", "pytest_plugin")  # public modules outside jaxwise.__all__


def namespaces() -> list[str]:
    """Every public namespace, by dotted name."""
    import jaxwise

    packages = [name for name in jaxwise.__all__ if name in jaxwise._SUBMODULES]
    return ["jaxwise", *(f"jaxwise.{name}" for name in [*packages, *ENTRY_POINTS])]


def public_names() -> list[str]:
    """``namespace.name`` for every public attribute of every namespace, sorted."""
    spaces = namespaces()
    names = set()
    for space in spaces:
        module = importlib.import_module(space)
        for name in set(dir(module)) | set(vars(module)):
            # (pytest's assertion rewriting adds `@py_builtins`: not an identifier)
            if name.isidentifier() and not name.startswith("_") and f"{space}.{name}" not in spaces:
                names.add(f"{space}.{name}")
    return sorted(names)


def main() -> None:
    names = public_names()
    PATH.write_text("".join(f"{name}\n" for name in names))
    print(f"wrote {len(names)} public names to {PATH}")


if __name__ == "__main__":
    main()
