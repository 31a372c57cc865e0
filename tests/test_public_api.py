"""Every public name of jaxwise is in tests/public_api.txt, and nothing else is public.

A helper that becomes reachable as a public attribute (an import, a validator, a new
module) fails here; so does a public name that disappears. When the change is intended,
regenerate the list with ``python -m tests.gen_public_api`` and note it in CHANGELOG.md.
"""

import importlib
import pkgutil

import gen_public_api

import jaxwise

HOW = "if intended, run `python -m tests.gen_public_api` and commit tests/public_api.txt"


def test_public_names_are_the_committed_list():
    committed = gen_public_api.PATH.read_text().splitlines()
    assert committed == sorted(set(committed)), "tests/public_api.txt must be sorted, unique"
    current = gen_public_api.public_names()
    added = sorted(set(current) - set(committed))
    removed = sorted(set(committed) - set(current))
    assert not added and not removed, f"public API changed: added {added}, removed {removed}; {HOW}"


def test_every_public_module_is_a_namespace_or_a_listed_name():
    spaces = set(gen_public_api.namespaces())
    listed = set(gen_public_api.PATH.read_text().splitlines())
    public_modules = [
        info.name
        for info in pkgutil.walk_packages(jaxwise.__path__, "jaxwise.")
        if not any(part.startswith("_") for part in info.name.split("."))
    ]
    stray = [m for m in public_modules if m not in spaces and m not in listed]
    assert not stray, f"modules reachable as public names but not listed: {stray}; {HOW}"


# Namespaces whose modules still expose their imports (other engineers' work in progress,
# issue #24); remove each from this set once its public names equal its `__all__`.
STILL_LEAKING = {"jaxwise.debug", "jaxwise.diagnose"}


def test_namespaces_export_exactly_their_all():
    """``__all__`` (what the API pages render) is the public surface of each namespace."""
    for space in sorted(set(gen_public_api.namespaces()) - STILL_LEAKING):
        module = importlib.import_module(space)
        prefix = f"{space}."
        names = {
            n.removeprefix(prefix)
            for n in gen_public_api.public_names()
            if n.startswith(prefix) and "." not in n.removeprefix(prefix)
        }
        if space in ("jaxwise", "jaxwise.cli"):
            continue  # the package (sub-packages only) and the command line's modules
        assert names == set(module.__all__), (space, sorted(names ^ set(module.__all__)))


def test_public_exceptions_name_their_public_namespace():
    homes: dict[type, set[str]] = {}
    for name in gen_public_api.public_names():
        space, attr = name.rsplit(".", 1)
        obj = getattr(importlib.import_module(space), attr)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            homes.setdefault(obj, set()).add(space)
    assert homes
    for exc, spaces in homes.items():
        assert exc.__module__ in spaces, f"{exc.__name__}.__module__ is {exc.__module__!r}"
