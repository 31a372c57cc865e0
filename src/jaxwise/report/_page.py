"""The HTML page both reports share: one file, its style inline, no script, no network.

Everything that comes from data (names, paths, options, messages) goes through `cell` or
``html.escape``; markup is only ever built here and in the two report modules.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

from jaxwise._shared._page_target import GENERATOR

__all__ = ["GENERATOR", "badge", "cell", "page", "section", "table"]

#: The ``<meta name="generator">`` of every report (how an existing report is recognised).

_CSS = """
:root{--fg:#1f2937;--muted:#6b7280;--line:#e5e7eb;--bg:#f8fafc;--card:#fff;--ok:#15803d;
--bad:#b91c1c;--warn:#b45309;--accent:#2563eb}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
color:var(--fg);background:var(--bg)}
header{background:#0f172a;color:#f8fafc;padding:16px 24px}
header h1{margin:0 0 4px;font-size:20px;font-weight:600}
header .sub{color:#cbd5e1;font-size:12px;word-break:break-all}
.chips{display:flex;flex-wrap:wrap;gap:8px;margin-top:12px}
.chip{background:#1e293b;border:1px solid #334155;border-radius:8px;padding:6px 10px;min-width:96px}
.chip b{display:block;font-size:16px;font-weight:600}
.chip span{color:#94a3b8;font-size:11px;letter-spacing:.02em}
nav{padding:8px 24px;background:#e2e8f0;font-size:13px;display:flex;flex-wrap:wrap;gap:4px 14px}
nav a{color:#1e3a8a;text-decoration:none}
main{max-width:1280px;margin:0 auto;padding:16px 24px 40px;display:grid;
grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:16px}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:14px 16px;
min-width:0;overflow-x:auto}
section.wide{grid-column:1/-1}
h2{font-size:15px;margin:0 0 10px;font-weight:600}
p.note{color:var(--muted);margin:6px 0 0;font-size:12px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{color:var(--muted);font-weight:600;font-size:12px}
td.num{text-align:right;font-variant-numeric:tabular-nums}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;word-break:break-all}
.badge{display:inline-block;border-radius:4px;padding:0 6px;font-size:12px;font-weight:600;
color:#fff}
.badge.ok{background:var(--ok)}.badge.bad{background:var(--bad)}.badge.warn{background:var(--warn)}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(300px,1fr));gap:8px}
svg.chart{width:100%;height:auto;display:block}
svg .axis{stroke:#9ca3af;stroke-width:1}svg .grid{stroke:#f1f5f9;stroke-width:1}
svg .line{fill:none;stroke-width:2;stroke-linejoin:round}
svg text{font:11px system-ui,sans-serif;fill:#4b5563}svg .legend{fill:#1f2937}
img.plot{width:100%;height:auto;border:1px solid var(--line);border-radius:6px}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(380px,1fr));gap:12px}
figure{margin:0 0 12px}figcaption{color:var(--muted);font-size:12px}
ul.findings{margin:0;padding-left:18px}ul.findings li{margin:2px 0}
footer{color:var(--muted);font-size:12px;text-align:center;padding:0 0 24px}
@media (max-width:600px){main{grid-template-columns:1fr;padding:12px}}
"""


def cell(value: object, digits: int = 4) -> str:
    """A table cell's text, escaped: floats to ``digits`` significant digits, None as a dash.

    Args:
        value: the value (any JSON value).
        digits: significant digits of a float.

    Returns:
        Escaped HTML text.

    Examples:
        >>> cell("<b>"), cell(0.123456), cell(None)
        ('&lt;b&gt;', '0.1235', '—')
    """
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return escape(f"{value:.{digits}g}")
    if isinstance(value, (list, tuple)):
        return escape(", ".join(cell(v, digits) for v in value))
    return escape(str(value))


def badge(ok: bool, yes: str = "PASS", no: str = "FAIL") -> str:
    """A green or red label."""
    return f'<span class="badge {"ok" if ok else "bad"}">{escape(yes if ok else no)}</span>'


def table(
    columns: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = ()
) -> str:
    """A table; ``rows`` hold markup (escape data with `cell`), ``numeric`` right-aligned."""
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = (
            f'<td class="num">{v}</td>' if i in numeric else f"<td>{v}</td>"
            for i, v in enumerate(row)
        )
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def section(ident: str, title: str, body: str, *, wide: bool = False) -> str:
    """One titled section (``id`` for the navigation and the tests)."""
    cls = ' class="wide"' if wide else ""
    return f'<section id="{escape(ident)}"{cls}><h2>{escape(title)}</h2>{body}</section>'


def page(
    title: str,
    subtitle: str,
    chips: Sequence[tuple[str, str]],
    sections: Sequence[tuple[str, str, str]],
) -> str:
    """The whole HTML document.

    Args:
        title: the page's heading (plain text).
        subtitle: a line under it (plain text, e.g. the run directory).
        chips: ``(label, value)`` figures of the header summary (plain text).
        sections: ``(id, heading, section markup)`` in order, from `section`.

    Returns:
        The HTML text.
    """
    from jaxwise._version import version

    chip_html = "".join(
        f'<div class="chip"><span>{escape(label)}</span><b>{escape(value)}</b></div>'
        for label, value in chips
    )
    nav = "".join(f'<a href="#{escape(i)}">{escape(h)}</a>' for i, h, _ in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="{GENERATOR}">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
        f'<header><h1>{escape(title)}</h1><div class="sub">{escape(subtitle)}</div>'
        f'<div class="chips">{chip_html}</div></header><nav>{nav}</nav>'
        f"<main>{''.join(markup for _, _, markup in sections)}</main>"
        f"<footer>written by jaxwise {escape(version())}; a self-contained page (no scripts, "
        "no network)</footer></body></html>\n"
    )
