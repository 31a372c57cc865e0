"""The ``jaxwise watch`` report as HTML, from its JSON document (schema 1) only: ``report``
never imports ``jaxwise.watch`` (``Watch.report().to_json()`` is the document).

The JSON document is checked before anything is drawn: ``"schema": 1`` and the types of the
keys schema 1 defines (``functions``, ``nans``, ``donations``, ``transfers``, ``seconds``,
``exit_code``); unknown extra keys are ignored, so a newer watch still renders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jaxwise.report._page import badge, cell, page, section, table

__all__ = ["check_watch_json", "watch_chips", "watch_html", "watch_sections"]

_LISTS = {
    "functions": ("name", "compiles", "misses"),
    "nans": ("function", "primitive", "phase"),
    "donations": ("function", "argument", "cause"),
}


def _where(value: Any) -> str:
    return f"<code>{cell(value)}</code>" if value else "—"


def check_watch_json(doc: Mapping[str, Any], what: str = "report") -> Mapping[str, Any]:
    """Check a watch JSON document (schema 1) has the keys and types the page reads.

    Args:
        doc: the parsed ``watch --json`` document.
        what: how to name it in messages (e.g. its file).

    Returns:
        ``doc`` itself.

    Raises:
        ValueError: not schema 1, or a key of schema 1 missing or of the wrong type.
    """
    if not isinstance(doc, Mapping):
        raise ValueError(f"{what}: expected a watch JSON object, got {type(doc).__name__}")
    if doc.get("schema") != 1:
        raise ValueError(
            f'{what}: expected a watch report with "schema": 1, got {doc.get("schema")!r}'
        )
    for key, fields in _LISTS.items():
        items = doc.get(key)
        if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
            raise ValueError(f"{what}: {key!r} must be a list of objects, got {items!r:.60}")
        for i, item in enumerate(items):
            missing = [f for f in fields if f not in item]
            if missing:
                raise ValueError(f"{what}: {key}[{i}] lacks {', '.join(missing)}")
    transfers = doc.get("transfers")
    if transfers is not None and not (
        isinstance(transfers, list) and all(isinstance(t, Mapping) for t in transfers)
    ):
        raise ValueError(f"{what}: 'transfers' must be null or a list of objects")
    seconds = doc.get("seconds")
    if not isinstance(seconds, Mapping) or not all(
        isinstance(seconds.get(k), (int, float)) for k in ("total", "compiling")
    ):
        raise ValueError(f"{what}: 'seconds' must be an object with numbers 'total', 'compiling'")
    return doc


def _functions(doc: Mapping[str, Any]) -> str:
    rows = []
    for f in doc["functions"]:
        misses = [m for m in f["misses"] if isinstance(m, Mapping)]
        steady = sum(1 for m in misses if m.get("steady_state"))
        kinds = ", ".join(
            f"{m.get('kind', '?')}" + (f" ({m['argument']})" if m.get("argument") else "")
            for m in misses
        )
        compiles = cell(f["compiles"]) + (
            " " + badge(False, no=f"{steady} steady") if steady else ""
        )
        rows.append(
            (
                f"<code>{cell(f['name'])}</code>",
                _where(f.get("where")),
                cell(f.get("calls"), 6) if f.get("calls") is not None else "?",
                compiles,
                cell(f.get("compile_seconds"), 3),
                cell(kinds) if kinds else "—",
            )
        )
    if not rows:
        return '<p class="note">no jitted function was called</p>'
    columns = ("function", "jitted at", "calls", "compiles", "compile s", "cache misses")
    return table(columns, rows, numeric=(2, 3, 4))


def _findings(doc: Mapping[str, Any]) -> list[str]:
    out = []
    for f in doc["functions"]:
        for m in f["misses"]:
            if isinstance(m, Mapping) and m.get("steady_state"):
                change = f"{m.get('old', '')} → {m.get('new', '')}"
                out.append(
                    f"steady-state recompile of <code>{cell(f['name'])}</code> at "
                    f"{_where(m.get('where'))}: {cell(m.get('kind'))} of "
                    f"<code>{cell(m.get('argument'))}</code> ({cell(change)})"
                )
    for n in doc["nans"]:
        out.append(
            f"NaN in <code>{cell(n['function'])}</code>: <code>{cell(n['primitive'])}</code> "
            f"({cell(n['phase'])} pass) at {_where(n.get('where'))}"
        )
    for d in doc["donations"]:
        out.append(
            f"donation to <code>{cell(d['function'])}</code> of <code>{cell(d['argument'])}</code>"
            f" failed: {cell(d['cause'])}"
        )
    return out


def _transfers(transfers: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        (
            _where(t.get("where")),
            f"<code>{cell(t.get('function'))}</code>",
            cell(t.get("calls")),
            cell(t.get("transfers")),
            cell(t.get("bytes")),
            cell(t.get("arguments")),
        )
        for t in transfers
    ]
    if not rows:
        return '<p class="note">no host value was copied to the device implicitly</p>'
    return table(
        ("call site", "function", "calls", "transfers", "bytes", "arguments"), rows, (2, 3, 4)
    )


def watch_chips(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The header figures of a watch report (plain text)."""
    seconds = doc["seconds"]
    steady = sum(1 for f in doc["functions"] for m in f["misses"] if m.get("steady_state"))
    chips = [
        ("time", f"{seconds['total']:.2f} s"),
        ("compiling", f"{seconds['compiling']:.2f} s"),
        ("compiles", str(sum(int(f["compiles"]) for f in doc["functions"]))),
        ("functions", str(len(doc["functions"]))),
        ("steady recompiles", str(steady)),
        ("NaNs", str(len(doc["nans"]))),
        ("failed donations", str(len(doc["donations"]))),
    ]
    if doc.get("exit_code") is not None:
        chips.append(("exit code", str(doc["exit_code"])))
    return chips


def watch_sections(
    report: Mapping[str, Any], prefix: str = "watch", heading: str = ""
) -> list[tuple[str, str, str]]:
    """The sections of a watch report: functions, findings, transfers, notes.

    Args:
        report: the watch report's JSON document (schema 1).
        prefix: the sections' id prefix.
        heading: a prefix of their headings (``"watch: "`` in a run report).

    Returns:
        ``(id, heading, markup)`` per section.

    Raises:
        ValueError: a JSON document that is not a watch report of schema 1.
    """
    doc = check_watch_json(report)
    findings = _findings(doc)
    body = (
        '<ul class="findings">' + "".join(f"<li>{f}</li>" for f in findings) + "</ul>"
        if findings
        else f"<p>{badge(True, yes='nothing flagged')} no steady-state recompile, NaN or failed "
        "donation</p>"
    )
    sections = [
        (f"{prefix}-functions", "jitted functions", _functions(doc)),
        (f"{prefix}-findings", "findings", body),
    ]
    if doc.get("transfers") is not None:
        sections.append(
            (f"{prefix}-transfers", "host-to-device transfers", _transfers(doc["transfers"]))
        )
    notes = [str(n) for n in doc.get("notes") or ()] + [
        f"the watch could not finish a check: {e}" for e in doc.get("errors") or ()
    ]
    if notes:
        sections.append(
            (f"{prefix}-notes", "notes", "".join(f'<p class="note">{cell(n)}</p>' for n in notes))
        )
    return [
        (i, heading + h, section(i, heading + h, b, wide=i.endswith("functions")))
        for i, h, b in sections
    ]


def watch_html(report: Mapping[str, Any], title: str = "jaxwise watch") -> str:
    """The watch report as one self-contained HTML page.

    Args:
        report: the watch report's JSON document (``Watch.report().to_json()``; schema 1, as
            ``watch --json`` writes it).
        title: the page's heading.

    Returns:
        The HTML text (no script, no network).

    Raises:
        ValueError: a JSON document that is not a watch report of schema 1.

    Examples:
        >>> doc = {"schema": 1, "functions": [], "nans": [], "donations": [],
        ...        "transfers": None, "seconds": {"total": 1.0, "compiling": 0.5}}
        >>> "<h2>jitted functions</h2>" in watch_html(doc)
        True
    """
    doc = check_watch_json(report)
    return page(
        title,
        "what ran, what compiled and why, what was flagged",
        watch_chips(doc),
        watch_sections(doc),
    )
