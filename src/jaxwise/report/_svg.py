"""Inline SVG line charts, generated in Python: no script, no font file, no network.

A chart is one ``<svg>`` element with a ``viewBox`` (it scales to the width of its box),
its axes, ticks at round numbers, one polyline per series (broken where a value is missing
or not finite), a legend, and a ``<title>`` for screen readers. Every text is escaped.

A long line is downsampled before it is drawn, as TensorBoard thins its curves: a run of more
than `MAX_POINTS` points keeps its first and last point and, in each of `BUCKETS` buckets of
consecutive points, the smallest and the largest value (min-max decimation: every spike and
dip stays visible; the chart is about one bucket per pixel wide).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "BUCKETS",
    "MAX_POINTS",
    "PALETTE",
    "Series",
    "as_floats",
    "downsample",
    "line_chart",
    "nice_ticks",
]

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")

_W, _H = 560, 250
_LEFT, _RIGHT, _TOP, _BOTTOM = 58, 14, 34, 40
BUCKETS = 500  # about one per pixel of the plot's width
MAX_POINTS = 2 * BUCKETS  # a run of more points than this is downsampled


class Series(NamedTuple):
    """One line of a chart.

    Attributes:
        name: the legend's text.
        xs: the x values, length ``n`` (a sequence or an array).
        ys: the y values, length ``n`` (``None`` or a non-finite value: a gap).
    """

    name: str
    xs: Sequence[float] | np.ndarray
    ys: Sequence[float | None] | np.ndarray


def as_floats(values: Any) -> np.ndarray:
    """``values`` as float64, NaN where one is not a number (``None``, a bool, a string).

    >>> as_floats([1, None, True, 2.5, "x"]).tolist()
    [1.0, nan, nan, 2.5, nan]
    """
    if isinstance(values, np.ndarray) and values.dtype.kind in "fiu":
        return values.astype(np.float64)
    number = (int, float, np.integer, np.floating)
    return np.fromiter(
        (
            float(v) if isinstance(v, number) and not isinstance(v, bool | np.bool_) else math.nan
            for v in values
        ),
        np.float64,
        len(values),
    )


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


def _segments(xs: np.ndarray, ys: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """The runs of consecutive finite points (a missing value breaks the line)."""
    ok = np.concatenate([[False], np.isfinite(xs) & np.isfinite(ys), [False]])
    edges = np.flatnonzero(ok[1:] != ok[:-1])
    return [(xs[a:b], ys[a:b]) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def downsample(
    xs: np.ndarray, ys: np.ndarray, buckets: int = BUCKETS
) -> tuple[np.ndarray, np.ndarray]:
    """A run of points thinned to its first and last point and each bucket's extremes.

    The points are split into ``buckets`` buckets of consecutive points; each keeps its
    smallest and largest ``y`` (in their order), so no spike is lost. A run of at most
    ``2 * buckets`` points is returned as it is.

    Args:
        xs: ``(n,)`` float64 x values, finite, in drawing order.
        ys: ``(n,)`` float64 y values, finite.
        buckets: the number of buckets.

    Returns:
        ``(xs, ys)`` of at most ``2 * buckets + 2`` points, the first and last included.

    Examples:
        >>> ys = np.zeros(10_000); ys[1234] = 5.0; ys[7777] = -3.0
        >>> x, y = downsample(np.arange(10_000.0), ys, buckets=50)
        >>> len(x) <= 102, float(x[0]), float(x[-1]), float(y.max()), float(y.min())
        (True, 0.0, 9999.0, 5.0, -3.0)
    """
    n = len(xs)
    if n <= 2 * buckets:
        return xs, ys
    width = -(-n // buckets)  # points per bucket (the last one may be short)
    padded = np.full(buckets * width, np.nan)
    padded[:n] = ys
    grid = padded.reshape(buckets, width)
    base = np.arange(buckets) * width
    low = base + np.where(np.isnan(grid), np.inf, grid).argmin(axis=1)
    high = base + np.where(np.isnan(grid), -np.inf, grid).argmax(axis=1)
    keep = np.unique(np.concatenate([[0, n - 1], low[low < n], high[high < n]]))
    return xs[keep], ys[keep]


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
        One ``<svg>`` element; an empty string when no series has a finite point. A run of
        more than `MAX_POINTS` finite points is drawn `downsample`d.

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
        runs.append([downsample(x, y) for x, y in _segments(as_floats(s.xs), as_floats(s.ys))])
    if not any(runs):
        return ""
    x_all = np.concatenate([x for r in runs for x, _ in r])
    y_all = np.concatenate([y for r in runs for _, y in r])
    xt = nice_ticks(float(x_all.min()), float(x_all.max()), 6)
    yt = nice_ticks(float(y_all.min()), float(y_all.max()), 5)
    width, height = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def fraction(v: Any, lo: float, hi: float) -> Any:  # halves: no overflow near float max
        return (v / 2 - lo / 2) / (hi / 2 - lo / 2)

    def sx(x: Any) -> Any:
        return _LEFT + fraction(x, xt[0], xt[-1]) * width

    def sy(y: Any) -> Any:
        return _H - _BOTTOM - fraction(y, yt[0], yt[-1]) * height

    body = _axes(xt, yt, sx, sy, x_label, y_label) + _legend(series)
    for i, segments in enumerate(runs):
        colour = PALETTE[i % len(PALETTE)]
        for xs, ys in segments:
            px, py = sx(xs).tolist(), sy(ys).tolist()
            if len(px) == 1:
                body.append(f'<circle cx="{px[0]:.1f}" cy="{py[0]:.1f}" r="3" fill="{colour}"/>')
            else:
                coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(px, py))
                body.append(f'<polyline class="line" stroke="{colour}" points="{coords}"/>')
    return (
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
        + "".join(body)
        + "</svg>"
    )
