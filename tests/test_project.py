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
