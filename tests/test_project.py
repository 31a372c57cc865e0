"""Project files: the license is the full Apache-2.0 text, the pins agree, the changelog's form."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_license_is_apache_2_with_our_copyright():
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0")
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) == 202
    assert re.search(r"^   Copyright \d{4} The jaxwise Authors$", text, re.MULTILINE)
    assert "[yyyy]" not in text
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert pyproject["license"] == "Apache-2.0" and pyproject["license-files"] == ["LICENSE"]


def test_pre_commit_pins_the_projects_ruff():
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ruff = [r for r in pins["optional-dependencies"]["test"] if r.startswith("ruff==")]
    config = (ROOT / ".pre-commit-config.yaml").read_text()
    assert ruff and f"rev: v{ruff[0].removeprefix('ruff==')}" in config
    assert "id: ruff-check" in config and "id: ruff-format" in config


def test_changelog_has_an_unreleased_section_in_keep_a_changelog_form():
    text = (ROOT / "CHANGELOG.md").read_text()
    unreleased = text.split("## [Unreleased]", 1)[1].split("\n## ", 1)[0]
    headings = re.findall(r"^### (\w+)$", unreleased, re.MULTILINE)
    allowed = ["Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"]
    assert headings and all(h in allowed for h in headings), headings
    assert len(headings) == len(set(headings))


def _requirements() -> dict[str, str]:
    """``{distribution: specifier}`` of the core and extras' requirements in pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found: dict[str, str] = {}
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["all"]]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement)
        assert name, requirement
        found[name.group(0).lower()] = requirement[name.end() :].split(";")[0].strip()
    for extra, requirements in project["optional-dependencies"].items():
        if extra in ("test", "test-run", "bench", "all"):
            continue
        for requirement in requirements:
            name = re.match(r"[A-Za-z0-9_.-]+", requirement)
            assert name, requirement
            found[name.group(0).lower()] = requirement[name.end() :].strip()
    return found


def test_the_supported_range_is_tested_at_its_oldest_end():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11"
    pins = _pins("oldest.txt")
    requirements = _requirements()
    assert requirements["jax"] == requirements["jaxlib"] == ">=0.10.2"  # no upper cap
    for name in ("jax", "jaxlib", "optax", "flax", "orbax-checkpoint", "equinox"):
        # every floor is the version the oldest lane installs, so the floor is tested
        assert requirements[name] == f">={pins[name]}", name
    from jaxwise._shared._jax import OLDEST_TESTED_JAX

    assert pins["jax"] == OLDEST_TESTED_JAX


def _pins(name: str) -> dict[str, str]:
    pins = {}
    for line in (ROOT / ".ci" / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            package, version = line.split("==")
            pins[package.strip().lower()] = version.strip()
    return pins


def test_the_newest_lane_is_pinned_to_what_was_tested():
    # a JAX released between two CI runs must not change what CI tests: the newest lane
    # installs .ci/newest.txt, whose JAX is the newest tested one that `jaxwise doctor` names
    from jaxwise._shared._jax import NEWEST_TESTED_JAX

    pins = _pins("newest.txt")
    assert pins["jax"] == pins["jaxlib"] == NEWEST_TESTED_JAX
    requirements = _requirements()
    for name in ("optax", "flax", "orbax-checkpoint", "equinox", "dp-accounting", "grain"):
        assert name in pins and name in requirements, name
    makefile = (ROOT / "Makefile").read_text()
    assert '-c .ci/newest.txt -e ".[test]"' in makefile
    assert "$(STAMP): pyproject.toml .ci/newest.txt" in makefile


def test_ci_runs_both_lanes_and_python_311_is_selected_for_the_oldest():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test\n" in ci and "make test-oldest\n" in ci
    # the files only the newest lane runs exist (a renamed file would silently join the oldest)
    listed = re.search(r"OLDEST_ONLY_NEWEST = ((?:.*\\\n)*.*)", (ROOT / "Makefile").read_text())
    assert listed is not None
    names = listed.group(1).replace("\\", " ").split()
    assert len(names) >= 10 and all((ROOT / "tests" / f"{n}.py").is_file() for n in names), names
    assert (ROOT / ".python-version").read_text().split() == ["3.12", "3.11"]
    makefile = (ROOT / "Makefile").read_text()
    assert "PYTHON_OLDEST ?= python3.11" in makefile and "-c .ci/oldest.txt" in makefile
