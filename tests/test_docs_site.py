"""The API reference renders as its docstrings mean: examples as code, one row per item.

Builds the site once (``mkdocs build --strict``, as ``make docs`` does) and reads the HTML of
the API pages. ``tests/test_docstrings.py`` checks the docstrings' layout; this checks what
griffe and mkdocstrings make of it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocstrings")

ROOT = Path(__file__).resolve().parent.parent
PRE = re.compile(r"<pre\b.*?</pre>", re.DOTALL)
TITLE = re.compile(r'<span class="doc-section-title">(?P<name>[^<]*):</span>')

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api_pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``{namespace: HTML}`` for every page of the built API reference."""
    site = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", site],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    pages = {p.parent.name: p.read_text(encoding="utf-8") for p in site.glob("api/*/index.html")}
    assert "privacy" in pages and "numerics" in pages
    return pages


def sections_of(html: str, entry: str) -> dict[str, str]:
    """``{section title: its HTML}`` for the entry whose heading has id ``entry``."""
    start = html.index(">", html.index(f'id="{entry}"'))
    following = html.find('class="doc doc-heading"', start)
    body = html[start : following if following != -1 else len(html)]
    titles = list(TITLE.finditer(body))
    ends = [t.start() for t in titles[1:]] + [len(body)]
    return {t.group("name"): body[t.end() : end] for t, end in zip(titles, ends)}


def test_doctest_prompts_render_only_inside_code_blocks(api_pages: dict[str, str]) -> None:
    """A ``>>>`` outside ``<pre>`` is an example rendered as prose (or as a block quote)."""
    bad = [name for name, html in api_pages.items() if "&gt;&gt;&gt;" in PRE.sub("", html)]
    assert not bad, f"examples rendered as prose on the API pages of {bad}"


def test_every_examples_section_renders_code(api_pages: dict[str, str]) -> None:
    bad = []
    for name, html in api_pages.items():
        for title in TITLE.finditer(html):
            if title.group("name") != "Examples":
                continue
            after = html[title.end() :]
            following = TITLE.search(after)
            section = after[: following.start() if following else len(after)]
            if "<pre" not in section:
                bad.append(f"{name}: {html[title.start() - 200 : title.start()]!r}")
    assert not bad, "Examples: sections without a code block:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("page", "entry"),
    [("privacy", "jaxwise.privacy"), ("label_errors", "jaxwise.label_errors")],
)
def test_module_examples_render_as_pycon(api_pages: dict[str, str], page: str, entry: str) -> None:
    examples = sections_of(api_pages[page], entry)["Examples"]
    assert '<div class="language-pycon highlight"><pre>' in examples


@pytest.mark.parametrize(
    ("page", "entry"),
    [
        ("numerics", "jaxwise.numerics.safe_norm"),
        ("models", "jaxwise.models.from_linen"),
        ("train", "jaxwise.train.make_train_step"),
        ("privacy", "jaxwise.privacy.make_dp_train_epoch"),
    ],
)
def test_a_wrapped_returns_description_is_one_row(
    api_pages: dict[str, str], page: str, entry: str
) -> None:
    returns = sections_of(api_pages[page], entry)["Returns"]
    assert returns.count('class="doc-section-item"') == 1
