"""The run report: one self-contained HTML page of everything a run directory holds.

Sections (each only when its artifact exists): ``curves`` (SVG charts from
``metrics.jsonl``), ``compilation`` (compile counts and times), ``guarantees`` (the checks
made at run time), ``privacy`` (DP ε, and the audit's lower bound), ``label-issues`` (the top
suspected label errors), ``hard-examples``, ``confusion``, ``watch-*`` (a ``watch.json``'s
findings), ``plots`` (the job's PNGs, embedded) and ``configuration`` (the run's options).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxwise.report._collect import RunData, finite_number
from jaxwise.report._page import badge, cell, page, section, table
from jaxwise.report._svg import BUCKETS, MAX_POINTS, Series, as_floats, line_chart
from jaxwise.report._watch_html import check_watch_json, watch_sections

__all__ = ["run_html"]

_SKIP = frozenset({"epoch", "step", "seconds", "skipped"})
_TOP = 20


def _x_axis(metrics: Sequence[Mapping[str, Any]]) -> tuple[str, list[float]]:
    for key in ("epoch", "step"):
        xs = [finite_number(m.get(key)) for m in metrics]
        if all(x is not None for x in xs):
            return key, [float(x) for x in xs if x is not None]
    return "record", [float(i + 1) for i in range(len(metrics))]


def ordered_metrics(
    metrics: Sequence[Mapping[str, Any]],
) -> tuple[list[Mapping[str, Any]], str]:
    """The records sorted by epoch (or step), the last record of a repeated one kept.

    A resumed run may leave an epoch twice or out of order in ``metrics.jsonl``; plotted in
    file order the line would run backwards. Records without a finite epoch/step stay in file
    order. Returns the records and a note saying what was reordered (empty when nothing was).

    >>> records, note = ordered_metrics([{"epoch": 2, "loss": 1}, {"epoch": 1}, {"epoch": 2}])
    >>> records
    [{'epoch': 1}, {'epoch': 2}]
    >>> print(note)
    epoch 2 appears 2 times: its last record is plotted; records sorted by epoch (...)
    """
    for key in ("epoch", "step"):
        xs = [x for x in (finite_number(m.get(key)) for m in metrics) if x is not None]
        if not metrics or len(xs) != len(metrics):
            continue
        last: dict[float, Mapping[str, Any]] = {}
        counts: dict[float, int] = {}
        for x, m in zip(xs, metrics):
            last[x] = m
            counts[x] = counts.get(x, 0) + 1
        out = [last[x] for x in sorted(last)]
        notes = []
        repeated = [x for x in sorted(counts) if counts[x] > 1]
        if repeated:
            shown = ", ".join(f"{key} {x:g} appears {counts[x]} times" for x in repeated[:5])
            more = f" (and {len(repeated) - 5} more)" if len(repeated) > 5 else ""
            verb = "its" if len(repeated) == 1 else "each one's"
            notes.append(f"{shown}{more}: {verb} last record is plotted")
        if xs != sorted(xs):
            notes.append(f"records sorted by {key} (the file has them out of order)")
        return out, "; ".join(notes)
    return list(metrics), ""


_PLAIN = frozenset({int, float, type(None)})


def _layout(metrics: Sequence[Mapping[str, Any]]) -> tuple[str, ...] | None:
    """The keys every record has, in order, when all records share them (else None)."""
    layout = tuple(metrics[0]) if metrics else ()
    return layout if all(tuple(m) == layout for m in metrics) else None


def _columns(
    metrics: Sequence[Mapping[str, Any]], keys: list[str], layout: tuple[str, ...] | None
) -> dict[str, np.ndarray]:
    """Each key's values as float64 (NaN: missing or not a number), one conversion if it can.

    Records that share one ``layout`` holding only numbers and nulls (what a writer produces)
    convert as one table; others key by key.
    """
    values = itertools.chain.from_iterable(m.values() for m in metrics)
    if layout is not None and _PLAIN.issuperset(set(map(type, values))):
        try:
            table = np.array([tuple(m.values()) for m in metrics], np.float64)
        except OverflowError:  # an integer beyond float64: key by key
            pass
        else:
            where = {k: i for i, k in enumerate(layout)}
            return {k: table[:, where[k]] for k in keys}
    return {k: as_floats([m.get(k) for m in metrics]) for k in keys}


def _curves(metrics: Sequence[Mapping[str, Any]]) -> str:
    """One chart per metric, its ``val_`` twin on the same axes (``loss`` with ``val_loss``)."""
    count = len(metrics)
    metrics, reordered = ordered_metrics(metrics)
    x_name, xs = _x_axis(metrics)
    layout = _layout(metrics)
    every = layout if layout is not None else dict.fromkeys(k for m in metrics for k in m)
    keys = [k for k in every if k not in _SKIP]
    columns = _columns(metrics, keys, layout)
    numeric = [k for k in keys if np.isfinite(columns[k]).any()]
    groups: dict[str, list[str]] = {}
    for key in numeric:
        base = key[4:] if key.startswith("val_") and key[4:] in numeric else key
        groups.setdefault(base, []).append(key)
    x_values = np.asarray(xs, np.float64)
    charts = []
    for base, members in groups.items():
        series = [
            Series(
                "validation"
                if k.startswith("val_") and k != base
                else "training"
                if len(members) > 1
                else k,
                x_values,
                columns[k],
            )
            for k in members
        ]
        chart = line_chart(series, title=f"{base} per {x_name}", x_label=x_name, y_label=base)
        if chart:
            charts.append(f"<figure>{chart}</figure>")
    if not charts:
        return '<p class="note">metrics.jsonl holds no numeric series</p>'
    note = f'<p class="note">{count} records of metrics.jsonl</p>'
    if len(metrics) > MAX_POINTS:
        note += (
            f'<p class="note">downsampled, as TensorBoard does for long curves: a curve of '
            f"more than {MAX_POINTS} points is drawn from its first and last points and the "
            f"smallest and largest value of each of {BUCKETS} runs of consecutive "
            f"{x_name}s (every spike and dip is kept)</p>"
        )
    if reordered:
        note += f'<p class="note">{cell(reordered)}</p>'
    return f'<div class="charts">{"".join(charts)}</div>{note}'


def _seconds(value: Any) -> str:
    number = finite_number(value)
    return "—" if number is None else f"{number:.2f} s"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _compilation(summary: Mapping[str, Any]) -> str:
    info, timings = _mapping(summary.get("compile")), _mapping(summary.get("timings"))
    rows = [
        (
            "compilations of the training program",
            cell(info.get("compiled", summary.get("compiles"))),
        ),
        ("loaded from the compilation cache", cell(info.get("loaded_from_cache"))),
        ("compiling", _seconds(info.get("seconds", timings.get("compile_s")))),
        ("training", _seconds(timings.get("train_s"))),
        ("total", _seconds(timings.get("total_s"))),
    ]
    for key, label in (("final_model", "final model"), ("oof", "out-of-fold phase")):
        phase = summary.get(key)
        if isinstance(phase, Mapping):
            rows.append(
                (
                    label,
                    f"{cell(phase.get('compiles'))} compilation(s), "
                    + _seconds(phase.get("seconds")),
                )
            )
    if info.get("cache_dir"):
        rows.append(("compilation cache", f"<code>{cell(info['cache_dir'])}</code>"))
    return table(("", ""), rows)


def _guarantees(checks: Mapping[str, Any]) -> str:
    rows = []
    for name, check in checks.items():
        ok = isinstance(check, Mapping) and check.get("ok") is True
        detail = check.get("detail") if isinstance(check, Mapping) else check
        rows.append((f"<code>{cell(name)}</code>", badge(ok), cell(detail)))
    passed = sum(1 for c in checks.values() if isinstance(c, Mapping) and c.get("ok") is True)
    note = f'<p class="note">{passed} of {len(checks)} checks passed</p>'
    return table(("check", "result", "detail"), rows) + note


def _privacy(dp: Mapping[str, Any]) -> str:
    labels = {
        "epsilon": "ε (theory)",
        "delta": "δ",
        "noise_multiplier": "noise multiplier σ",
        "clip_norm": "clip norm C",
        "sample_rate": "sampling rate q",
        "steps": "steps",
        "sampling": "sampling",
        "mechanism": "noise mechanism",
        "bands": "bands",
        "expected_error_vs_dpsgd": "expected error vs DP-SGD",
        "epsilon_audit_lower_bound": "ε lower bound (audit)",
        "confidence": "audit confidence",
        "canaries": "canaries",
        "canaries_included": "canaries included",
    }
    rows = [(labels.get(k, k.replace("_", " ")), cell(v)) for k, v in dp.items() if k != "note"]
    body = table(("", ""), rows)
    eps, bound = (
        finite_number(dp.get("epsilon")),
        finite_number(dp.get("epsilon_audit_lower_bound")),
    )
    if eps is not None and bound is not None:
        ok = bound <= eps + 1e-9
        body += (
            f'<p class="note">{badge(ok, "consistent", "audit exceeds theory")} the audit\'s '
            f"lower bound {bound:.3g} {'≤' if ok else '>'} the accountant's ε {eps:.3g}</p>"
        )
    return body


def _rows_table(rows: Sequence[Any], columns: Sequence[str]) -> str:
    shown = [r for r in rows[:_TOP] if isinstance(r, Mapping)]
    numeric = [
        i for i, c in enumerate(columns) if any(isinstance(r.get(c), (int, float)) for r in shown)
    ]
    body = table(columns, [[cell(r.get(c)) for c in columns] for r in shown], numeric)
    if len(rows) > _TOP:
        body += f'<p class="note">the first {_TOP} of {len(rows)} rows</p>'
    return body


def _label_issues(summary: Mapping[str, Any]) -> str:
    columns = ["row", "given_label", "suggested_label", "p_given", "grad_norm"]
    body = _rows_table(summary["suspects"], columns)
    notes = [f"method: {summary.get('method', '?')}"]
    if summary.get("num_issues") is not None:
        notes.append(f"confident learning estimates {summary['num_issues']} wrong label(s)")
    where = _mapping(summary.get("outputs")).get("suspects")
    if where:
        notes.append(f"all rows: {where}")
    return body + f'<p class="note">{cell("; ".join(map(str, notes)))}</p>'


def _confusion(summary: Mapping[str, Any]) -> str:
    matrix = summary["confusion_matrix"]
    classes = summary.get("classes") or list(range(len(matrix)))
    peak = max((v for row in matrix for v in row if isinstance(v, (int, float))), default=0) or 1
    rows = []
    for r, (name, row) in enumerate(zip(classes, matrix)):
        cells = [f"<b>{cell(name)}</b>"]
        for i, v in enumerate(row):
            shade = 0.08 + 0.6 * (float(v) / peak if isinstance(v, (int, float)) else 0)
            hue = "37,99,235" if i == r else "220,38,38"  # blue: right, red: confused
            cells.append(
                f'<span style="background:rgba({hue},{shade:.2f});padding:0 6px">{cell(v)}</span>'
            )
        rows.append(cells)
    return table(["true \\ predicted", *map(str, classes)], rows) + (
        '<p class="note">rows: true class, columns: predicted (validation rows)</p>'
    )


def _configuration(data: RunData) -> str:
    rows: list[tuple[str, str]] = [("run directory", f"<code>{cell(data.path)}</code>")]
    marker, summary = data.marker or {}, data.summary or {}
    rows += [("job", cell(data.job)), ("run id", cell(marker.get("run_id")))]
    options = marker.get("options")
    if isinstance(options, Mapping):
        rows += [(cell(f"--{str(k).replace('_', '-')}"), cell(v)) for k, v in options.items()]
    for key in (
        "epochs",
        "steps",
        "batch_size",
        "rows",
        "train_rows",
        "validation_rows",
        "parameters",
    ):
        if key in summary:
            rows.append((key.replace("_", " "), cell(summary[key])))
    for key in ("features", "classes"):
        if isinstance(summary.get(key), list):
            rows.append((key, cell(summary[key])))
    fingerprint = marker.get("data")
    if isinstance(fingerprint, Mapping) and fingerprint.get("sha256"):
        rows.append(("data sha256", f"<code>{cell(fingerprint['sha256'])}</code>"))
    if summary.get("params_sha256"):
        rows.append(("parameters sha256", f"<code>{cell(summary['params_sha256'])}</code>"))
    return table(("setting", "value"), rows)


def _plots(data: RunData) -> str:
    return (
        '<div class="plots">'
        + "".join(
            f'<figure><img class="plot" alt="{cell(caption)}" src="data:image/png;base64,{b64}">'
            f"<figcaption>{cell(name)}: {cell(caption)}</figcaption></figure>"
            for name, caption, b64 in data.plots
        )
        + "</div>"
    )


def _chips(data: RunData) -> list[tuple[str, str]]:
    s, chips = data.summary or {}, []
    checks = s.get("checks")
    if isinstance(checks, Mapping) and checks:
        passed = sum(1 for c in checks.values() if isinstance(c, Mapping) and c.get("ok") is True)
        chips.append(("guarantees", f"{passed}/{len(checks)} pass"))
    for key, label in (
        ("train_accuracy", "train accuracy"),
        ("val_accuracy", "test accuracy" if data.job == "spiral" else "validation accuracy"),
        ("final_loss", "final loss"),
    ):
        if finite_number(s.get(key)) is not None:
            chips.append((label, f"{s[key]:.4g}"))
    if data.metrics and not any(label == "final loss" for label, _ in chips):
        last = finite_number(ordered_metrics(data.metrics)[0][-1].get("loss"))
        if last is not None:
            chips.append(("final loss", f"{last:.4g}"))
    if s.get("compiles") is not None:
        chips.append(("compiles", cell(s["compiles"])))
    total = finite_number(_mapping(s.get("timings")).get("total_s"))
    if total is not None:
        chips.append(("time", f"{total:.1f} s"))
    dp = s.get("dp")
    if isinstance(dp, Mapping) and finite_number(dp.get("epsilon")) is not None:
        chips.append(("privacy ε", f"{dp['epsilon']:.3g} (δ={dp.get('delta', '?')})"))
    if s.get("num_issues") is not None:
        chips.append(("label issues", str(s["num_issues"])))
    return chips


def _summary_sections(data: RunData) -> list[tuple[str, str, str, bool]]:
    s = data.summary or {}
    out = []
    if s:
        out.append(("compilation", "compile counts and times", _compilation(s), False))
    if isinstance(s.get("checks"), Mapping) and s["checks"]:
        out.append(
            ("guarantees", "guarantees checked at run time", _guarantees(s["checks"]), False)
        )
    if isinstance(s.get("dp"), Mapping):
        out.append(("privacy", "differential privacy", _privacy(s["dp"]), False))
    if isinstance(s.get("suspects"), list):
        title = f"top suspected label errors (--method {s.get('method', '?')})"
        out.append(("label-issues", title, _label_issues(s), True))
    if isinstance(s.get("hard_examples"), list) and s["hard_examples"]:
        columns = ["index", "x", "true", "predicted", "p_true", "grad_norm", "loss"]
        title = "hardest training examples (largest per-example gradient norm)"
        out.append(("hard-examples", title, _rows_table(s["hard_examples"], columns), True))
    if isinstance(s.get("confusion_matrix"), list) and s["confusion_matrix"]:
        out.append(("confusion", "confusion matrix", _confusion(s), False))
    return out


def run_html(data: RunData) -> str:
    """The report of one run directory as a self-contained HTML page.

    Args:
        data: what `collect` read from the run directory.

    Returns:
        The HTML text.

    Raises:
        ValueError: a ``watch.json`` there that is not a watch report of schema 1.
    """
    parts: list[tuple[str, str, str, bool]] = []
    if data.metrics:
        parts.append(("curves", "training and validation curves", _curves(data.metrics), True))
    parts += _summary_sections(data)
    parts.append(("configuration", "configuration", _configuration(data), False))
    parts.sort(key=lambda part: part[3] and part[0] != "curves")  # the half-width ones first
    sections = [(i, h, section(i, h, body, wide=wide)) for i, h, body, wide in parts]
    if data.watch is not None:
        doc = check_watch_json(data.watch, f"{data.path / 'watch.json'}")
        sections += watch_sections(doc, heading="watch: ")
    if data.plots:
        plots = section("plots", "the job's plots", _plots(data), wide=True)
        sections.append(("plots", "plots", plots))
    ok = (data.summary or {}).get("ok")
    status = "" if ok is None else (" — all checks pass" if ok else " — a check failed")
    return page(f"jaxwise {data.job} run{status}", str(data.path), _chips(data), sections)
