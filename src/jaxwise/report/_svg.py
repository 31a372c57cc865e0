"""Inline SVG line charts, generated in Python: no script, no font file, no network.

A chart is one ``<svg>`` element with a ``viewBox`` (it scales to the width of its box),
its axes, ticks at round numbers, one polyline per series (broken where a value is missing
or not finite), a legend, and a ``<title>`` for screen readers. Every text is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import NamedTuple

__all__ = ["PALETTE", "Series", "line_chart", "nice_ticks"]

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")

_W, _H = 560, 250
_LEFT, _RIGHT, _TOP, _BOTTOM = 58, 14, 34, 40


class Series(NamedTuple):
    """One line of a chart.

    Attributes:
        name: the legend's text.
        xs: the x values, length ``n``.
        ys: the y values, length ``n`` (``None`` or a non-finite value: a gap).
    """

    name: str
    xs: Sequence[float]
    ys: Sequence[float | None]


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering ``[lo, hi]`` (steps of 1, 2 or 5 × 10^k).

    Args:
        lo: the smallest value to cover.
        hi: the largest (``hi == lo`` gets a unit-wide range around it).
        count: the wanted number of intervals.

    Returns:
        Ascending tick values, the first ``<= lo`` and the last ``>= hi``.

    Examples:
        >>> nice_ticks(0.03, 0.97)
        [0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]
    """
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    raw = hi / max(count, 1) - lo / max(count, 1)  # no overflow when hi - lo exceeds float max
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.floor(lo / step)
    last = math.ceil(hi / step)
    ticks = [i * step for i in range(first, last + 1)]
    inside = [t for t in ticks if math.isfinite(t)]  # near float max a round tick overflows
    if inside[0] > lo:
        inside.insert(0, lo)
    if inside[-1] < hi:
        inside.append(hi)
    return inside


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        return f"{value:.1e}"
    return f"{value:.4g}"


def _segments(points: list[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    """The runs of consecutive finite points (a missing value breaks the line)."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if y is not None and _finite(x) and _finite(y):
            runs[-1].append((x, y))
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def _axes(xt: list[float], yt: list[float], sx, sy, x_label: str, y_label: str) -> list[str]:
    bottom, right = _H - _BOTTOM, _W - _RIGHT
    out = [
        f'<line class="axis" x1="{_LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}"/>',
        f'<line class="axis" x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{bottom}"/>',
    ]
    for t in yt:
        y = sy(t)
        out.append(f'<line class="grid" x1="{_LEFT}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}"/>')
        out.append(
            f'<text class="tick" x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{_label(t)}</text>"
        )
    for t in xt:
        x = sx(t)
        out.append(
            f'<text class="tick" x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">'
            f"{_label(t)}</text>"
        )
    out.append(
        f'<text class="axis-label" x="{(_LEFT + right) / 2:.0f}" y="{_H - 6}" '
        f'text-anchor="middle">{escape(x_label)}</text>'
    )
    out.append(
        f'<text class="axis-label" x="14" y="{(_TOP + bottom) / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {(_TOP + bottom) / 2:.0f})">{escape(y_label)}</text>'
    )
    return out


def _legend(series: Sequence[Series]) -> list[str]:
    out, x = [], float(_LEFT)
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        out.append(
            f'<rect x="{x:.0f}" y="10" width="14" height="4" rx="2" fill="{colour}"/>'
            f'<text class="legend" x="{x + 19:.0f}" y="16">{escape(s.name)}</text>'
        )
        x += 34 + 7 * len(s.name)
    return out


def line_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str) -> str:
    """An SVG line chart of ``series`` (shared axes), as markup to inline in HTML.

    Args:
        series: the lines; each ``xs``/``ys`` pair of equal length.
        title: the chart's accessible title.
        x_label: the x axis' label.
        y_label: the y axis' label.

    Returns:
        One ``<svg>`` element; an empty string when no series has a finite point.

    Raises:
        ValueError: a series whose ``xs`` and ``ys`` differ in length.

    Examples:
        >>> line_chart([Series("loss", [1, 2], [0.9, 0.5])], title="t", x_label="epoch",
        ...            y_label="loss").startswith("<svg")
        True
    """
    runs = []
    for s in series:
        if len(s.xs) != len(s.ys):
            raise ValueError(
                f"series {s.name!r}: {len(s.xs)} x values but {len(s.ys)} y values; "
                "expected one y per x"
            )
        runs.append(_segments(list(zip(s.xs, s.ys))))
    points = [p for r in runs for seg in r for p in seg]
    if not points:
        return ""
    xt = nice_ticks(min(p[0] for p in points), max(p[0] for p in points), 6)
    yt = nice_ticks(min(p[1] for p in points), max(p[1] for p in points), 5)
    width, height = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def fraction(v: float, lo: float, hi: float) -> float:  # halves: no overflow near float max
        return (v / 2 - lo / 2) / (hi / 2 - lo / 2)

    def sx(x: float) -> float:
        return _LEFT + fraction(x, xt[0], xt[-1]) * width

    def sy(y: float) -> float:
        return _H - _BOTTOM - fraction(y, yt[0], yt[-1]) * height

    body = _axes(xt, yt, sx, sy, x_label, y_label) + _legend(series)
    for i, segments in enumerate(runs):
        colour = PALETTE[i % len(PALETTE)]
        for seg in segments:
            coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in seg)
            if len(seg) == 1:
                x, y = seg[0]
                body.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>')
            else:
                body.append(f'<polyline class="line" stroke="{colour}" points="{coords}"/>')
    return (
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
        + "".join(body)
        + "</svg>"
    )
