"""Inline SVG charts for the HTML report, written as text (no matplotlib, no script).

Every chart has a bounded size whatever the length of the run: up to `MAX_BARS` bars
(longer step series are drawn with consecutive steps averaged into one bar, as
analysis/plots.py does) and up to `MAX_LINE_POINTS` points per line. Hover details are SVG
`<title>` elements, which browsers show as tooltips without JavaScript. Every text
passes through `html.escape`. The roofline is `html_roofline_chart`'s, the memory timeline
`html_memory_chart`'s.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analysis.render.names import distinct_labels, middle_cut
from analysis.render.plots import EPOCH_LEVEL_COLOR, PART_COLORS, min_max_points

MAX_BARS = 300
MAX_LINE_POINTS = 1200
WIDTH = 960  # viewBox units; the SVG scales to the page's width
LEFT, RIGHT = 64, 16  # plot area margins, shared by charts drawn on the same x axis
COMPILE_PATTERN = "compile-hatch"
OUTLIER_COLOR = "#e6007e"  # steps over 1.5x the median: apart from every part's colour
SERIES_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
)


_NARROW = frozenset("'ijlIJ .,:;/\\|")  # advance widths in em, rounded up from DejaVu Sans (Linux's sans-serif)
_SEMI = frozenset('ft-()[]r"*_`!')
_WIDE = frozenset("mwMW%@#+<=>^~")


def text_width(text: str, size: float = 12.0) -> float:
    """An upper estimate of `text`'s width at font size `size` in the charts' sans-serif font
    (DejaVu Sans, the widest common one, is the fallback of system-ui on Linux)."""
    em = 0.0
    for char in text:
        if char in _NARROW:
            em += 0.34
        elif char in _SEMI:
            em += 0.52
        elif char in _WIDE:
            em += 1.0
        else:
            em += (0.8 if char.isupper() or char == "&" else 0.7) if char.isascii() else 1.0
    return em * size


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def num(value: float, digits: int = 3) -> str:
    """A short number for labels and tooltips: 3 significant digits, thousands separated."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    value = float(value)
    if value == 0:
        return "0"
    if abs(value) >= 10**digits:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """0 and round values up to at least `top` (steps of 1, 2, 2.5 or 5 times a power of ten)."""
    if not top > 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    ticks = [0.0]
    while ticks[-1] < top - 1e-12 * top:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def _svg_open(height: int, label: str) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
        f'aria-label="{esc(label)}" '
        'preserveAspectRatio="xMinYMin meet" font-family="system-ui, sans-serif" font-size="12">'
    )


def _defs() -> str:
    return (
        f'<defs><pattern id="{COMPILE_PATTERN}" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#000" stroke-width="1.5"/>'
        "</pattern></defs>"
    )


def _y_axis(ticks: list[float], y_of, top: float, bottom: float, unit: str, fmt=num) -> list[str]:
    out = []
    for tick in ticks:
        y = y_of(tick)
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#444">{esc(fmt(tick))}</text>')
    middle = (top + bottom) / 2
    out.append(
        f'<text transform="translate(14 {middle:.1f}) rotate(-90)" text-anchor="middle" fill="#444">{esc(unit)}</text>'
    )
    return out


@dataclass(frozen=True)
class Bar:
    """One bar: its stacked parts (in the order of the chart's `parts`), tooltip and x label."""

    values: tuple[float, ...]
    title: str
    label: str = ""
    faded: bool = False  # partial steps: drawn lighter
    hatch: float = 0.0  # compile time drawn hatched inside the bar, on top of the parts before `hatch_after`
    peak: float | None = None  # slowest step of a bar that averages several, drawn as a tick


def stacked_bars(
    bars: list[Bar],
    parts: list[tuple[str, str]],
    unit: str,
    label: str,
    *,
    height: int = 280,
    hatch_after: int = 0,
    x_title: str = "",
    cap_outliers: bool = True,
    marked: dict[int, str] | None = None,
    median: float | None = None,
) -> tuple[str, bool]:
    """Vertical stacked bars; `parts` are (name, color). Bars far taller than the rest (a compile step)
    are cut at the top of the axis, marked with a triangle and their value, so the others stay readable.
    Bars in `marked` (bar index -> tooltip) are outlined in `OUTLIER_COLOR` with a dot above them;
    `median` is drawn as a dashed line across the bars. Returns the SVG and whether any bar was cut."""
    top_pad, bottom_pad = 14, 40
    plot_h = height - top_pad - bottom_pad
    totals = np.array([sum(v for v in bar.values if v == v) for bar in bars], dtype=float)
    peaks = np.array([bar.peak if bar.peak is not None else t for bar, t in zip(bars, totals)], dtype=float)
    highest = float(np.nanmax(peaks)) if len(bars) else 1.0
    limit = highest
    if cap_outliers and len(bars) >= 8:
        typical = float(np.nanpercentile(totals, 90))
        if typical > 0 and highest > 3 * typical:
            limit = 1.6 * typical
    ticks = nice_ticks(limit)
    y_max = ticks[-1] if ticks[-1] > 0 else 1.0

    def y_of(value: float) -> float:
        return top_pad + plot_h * (1 - min(value, y_max) / y_max)

    n = max(1, len(bars))
    slot = (WIDTH - LEFT - RIGHT) / n
    width = max(0.6, slot * (0.8 if slot >= 4 else 1.0))
    out = [_svg_open(height, label), _defs(), *_y_axis(ticks, y_of, top_pad, top_pad + plot_h, unit)]
    label_every = max(1, math.ceil(n / 16))
    cut = False
    for i, bar in enumerate(bars):
        x = LEFT + i * slot + (slot - width) / 2
        opacity = ' opacity="0.45"' if bar.faded else ""
        out.append(f"<g{opacity}><title>{esc(bar.title)}</title>")
        base = 0.0
        hatch_base = None
        for index, ((_, color), value) in enumerate(zip(parts, bar.values)):
            value = value if value == value and value > 0 else 0.0
            if index == hatch_after:
                hatch_base = base
            if value > 0 and base < y_max:
                y1, y0 = y_of(base + value), y_of(base)
                out.append(
                    f'<rect x="{x:.2f}" y="{y1:.2f}" width="{width:.2f}" height="{max(0.0, y0 - y1):.2f}" '
                    f'fill="{color}"/>'
                )
            base += value
        if bar.hatch > 0 and hatch_base is not None and hatch_base < y_max:
            y1, y0 = y_of(hatch_base + bar.hatch), y_of(hatch_base)
            out.append(
                f'<rect x="{x:.2f}" y="{y1:.2f}" width="{width:.2f}" height="{max(0.0, y0 - y1):.2f}" '
                f'fill="url(#{COMPILE_PATTERN})"/>'
            )
        if bar.peak is not None and bar.peak == bar.peak:
            y = y_of(bar.peak)
            out.append(
                f'<line x1="{x:.2f}" x2="{x + width:.2f}" y1="{y:.2f}" y2="{y:.2f}" stroke="#000" stroke-width="1"/>'
            )
        if max(base, bar.peak or 0.0) > y_max:  # cut at the top: say so, with the bar's own value
            cut = True
            cx = x + width / 2
            out.append(
                f'<path d="M{cx - 4:.1f} {top_pad + 6} L{cx + 4:.1f} {top_pad + 6} L{cx:.1f} {top_pad - 1} Z" '
                'fill="#000"/>'
            )
            if n <= 60:
                out.append(
                    f'<text x="{cx:.1f}" y="{top_pad + 18}" text-anchor="middle" font-size="10" '
                    f'fill="#fff" stroke="#000" stroke-width="2.5" paint-order="stroke">'
                    f"{esc(num(max(base, bar.peak or 0.0)))}</text>"
                )
        out.append("</g>")
        if marked and i in marked:
            drawn = min(max(base, bar.peak or 0.0), y_max)
            y, cx = y_of(drawn), x + width / 2
            dot = f'<circle cx="{cx:.2f}" cy="{y - 5:.2f}" r="2.5" fill="{OUTLIER_COLOR}"/>' if drawn < y_max else ""
            out.append(
                f'<g class="outlier"><title>{esc(marked[i])}</title><rect x="{x:.2f}" y="{y:.2f}" '
                f'width="{width:.2f}" height="{max(0.0, y_of(0.0) - y):.2f}" fill="none" '
                f'stroke="{OUTLIER_COLOR}" stroke-width="1.5"/>{dot}</g>'
            )
        if bar.label and (i % label_every == 0 or i == n - 1 and n <= 16):
            out.append(
                f'<text x="{x + width / 2:.1f}" y="{top_pad + plot_h + 15}" text-anchor="middle" '
                f'fill="#444">{esc(bar.label)}</text>'
            )
    out.append(
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{top_pad + plot_h}" y2="{top_pad + plot_h}" stroke="#888"/>'
    )
    if median is not None and median == median and 0 < median <= y_max:
        y = y_of(median)
        out.append(
            f'<g class="median"><title>median {esc(num(median))} {esc(unit)}</title><line x1="{LEFT}" '
            f'x2="{WIDTH - RIGHT}" y1="{y:.2f}" y2="{y:.2f}" stroke="#000" stroke-dasharray="6 3"/>'
            f'<text x="{WIDTH - RIGHT - 2}" y="{y - 3:.2f}" text-anchor="end" font-size="10" fill="#000" '
            f'stroke="#fff" stroke-width="2.5" paint-order="stroke">median {esc(num(median))} {esc(unit)}'
            "</text></g>"
        )
    if x_title:
        out.append(
            f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{height - 6}" text-anchor="middle" fill="#444">'
            f"{esc(x_title)}</text>"
        )
    out.append("</svg>")
    return "".join(out), cut


@dataclass(frozen=True)
class Series:
    """One line: x and y (NaN breaks the line), its legend name and style."""

    name: str
    x: np.ndarray
    y: np.ndarray
    color: str
    dash: str = ""  # SVG stroke-dasharray
    hold: bool = False  # draw as steps: each sample's value held back to the previous sample


@dataclass(frozen=True)
class Band:
    """A shaded span of the x axis with a label (an epoch)."""

    start: float
    end: float
    label: str
    title: str


def lines(
    series: list[Series],
    unit: str,
    label: str,
    *,
    x_range: tuple[float, float],
    y_max: float | None = None,
    height: int = 200,
    x_title: str = "",
    x_ticks: list[tuple[float, str]] | None = None,
    bands: Sequence[Band] = (),
    y_format=num,
) -> str:
    """Lines over a shared x range (the step chart's or seconds), with optional shaded bands."""
    top_pad, bottom_pad = 14, 40 if x_title else 24
    plot_h = height - top_pad - bottom_pad
    x0, x1 = x_range
    span = (x1 - x0) or 1.0
    highest = max((float(np.nanmax(s.y)) for s in series if np.isfinite(s.y).any()), default=1.0)
    ticks = nice_ticks(y_max if y_max is not None else highest)
    top = ticks[-1] if ticks[-1] > 0 else 1.0

    def x_of(value):
        return LEFT + (WIDTH - LEFT - RIGHT) * (np.asarray(value, dtype=float) - x0) / span

    def y_of(value):
        return top_pad + plot_h * (1 - np.clip(np.asarray(value, dtype=float), 0, top) / top)

    out = [_svg_open(height, label), *_y_axis(ticks, y_of, top_pad, top_pad + plot_h, unit, y_format)]
    for i, band in enumerate(bands):
        a, b = float(x_of(max(band.start, x0))), float(x_of(min(band.end, x1)))
        if b <= a:
            continue
        fill = "#f1f1f1" if i % 2 == 0 else "#e4e4e4"
        out.append(
            f'<g><title>{esc(band.title)}</title><rect x="{a:.1f}" y="{top_pad}" width="{b - a:.1f}" '
            f'height="{plot_h}" fill="{fill}" opacity="0.8"/>'
        )
        if b - a > 40:
            out.append(f'<text x="{a + 4:.1f}" y="{top_pad + 12}" fill="#666" font-size="11">{esc(band.label)}</text>')
        out.append("</g>")
    out.append('<g fill="none" stroke-width="1.6" stroke-linejoin="round">')
    for s in series:
        x, y = min_max_points(np.asarray(s.x, dtype=float), np.asarray(s.y, dtype=float), MAX_LINE_POINTS)
        if s.hold and len(x) > 1:  # a sample measures the interval since the previous one
            x = np.repeat(x, 2)[1:]
            y = np.repeat(y, 2)[:-1]
        keep = (x >= x0 - 1e-9 * span) & (x <= x1 + 1e-9 * span)
        px, py = x_of(np.clip(x, x0, x1)), y_of(y)
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        for run in _finite_runs(np.isfinite(py) & keep):
            points = " ".join(f"{px[j]:.1f},{py[j]:.1f}" for j in run)
            if len(run) == 1 or (len(px) <= 40 and not s.hold):  # few points: each one visible
                out += [
                    f'<circle cx="{px[j]:.1f}" cy="{py[j]:.1f}" r="2.5" fill="{s.color}" stroke="none"/>' for j in run
                ]
            if len(run) > 1:
                out.append(
                    f'<polyline points="{points}" stroke="{s.color}"{dash}><title>{esc(s.name)}</title></polyline>'
                )
    out.append("</g>")
    base = top_pad + plot_h
    out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{base}" y2="{base}" stroke="#888"/>')
    for value, text in x_ticks or []:
        tick_x = float(x_of(value))
        out.append(f'<text x="{tick_x:.1f}" y="{base + 15}" text-anchor="middle" fill="#444">{esc(text)}</text>')
    if x_title:
        out.append(
            f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{height - 6}" text-anchor="middle" fill="#444">'
            f"{esc(x_title)}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _finite_runs(mask: np.ndarray) -> list[np.ndarray]:
    """Index runs where `mask` holds (a missing value breaks a line)."""
    index = np.flatnonzero(mask)
    if index.size == 0:
        return []
    return np.split(index, np.flatnonzero(np.diff(index) > 1) + 1)


LABEL_CHARS = 32  # characters of an hbars row's label (distinct_labels: the part that tells rows apart)
LABEL_WIDTH = 300  # viewBox units of the label column at most


def _fit(label: str, width: float) -> str:
    """`label` cut in its middle until `text_width` puts it within `width` (wide characters)."""
    limit = len(label)
    while limit > 3 and text_width(middle_cut(label, limit)) > width:
        limit -= 1
    return middle_cut(label, limit)


def hbars(
    rows: list[tuple[str, tuple[float, ...], str, float]], parts: list[tuple[str, str]], unit: str, label: str
) -> str:
    """Horizontal stacked bars, one per row: (label, part values, tooltip, total drawn at the bar's end).
    A row whose parts are all missing is drawn as one outlined bar of its total. Labels too long lose
    what every row shares (`distinct_labels`), the tooltip keeps the whole; the label column is as
    wide as the longest label shown, so none starts past the chart's left edge."""
    row_h = 30
    shown = [_fit(name, LABEL_WIDTH) for name in distinct_labels([name for name, *_ in rows], LABEL_CHARS)]
    left = max(LEFT, math.ceil(max((text_width(name) for name in shown), default=0.0)) + 8 + 8)
    height = 20 + row_h * len(rows) + 34
    totals = [t for *_, t in rows if t == t]
    ticks = nice_ticks(max(totals, default=1.0) * 1.08)
    top = ticks[-1] or 1.0
    scale = (WIDTH - left - 70) / top
    out = [_svg_open(height, label)]
    axis_y = 20 + row_h * len(rows)
    for tick in ticks:
        x = left + tick * scale
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="12" y2="{axis_y}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{axis_y + 15}" text-anchor="middle" fill="#444">{esc(num(tick))}</text>')
    out.append(
        f'<text x="{left + (WIDTH - left - 70) / 2:.0f}" y="{height - 4}" text-anchor="middle" fill="#444">'
        f"{esc(unit)}</text>"
    )
    for i, (name, values, title, total) in enumerate(rows):
        y = 20 + i * row_h + 4
        out.append(f"<g><title>{esc(title)}</title>")
        out.append(
            f'<text class="label" x="{left - 8}" y="{y + 15}" text-anchor="end" fill="#222">{esc(shown[i])}</text>'
        )
        x = float(left)
        if all(not (v == v) for v in values):
            if total == total:
                out.append(
                    f'<rect x="{x:.1f}" y="{y}" width="{total * scale:.1f}" height="{row_h - 10}" '
                    'fill="#fff" stroke="#000" stroke-dasharray="4 2"/>'
                )
        for (_, color), value in zip(parts, values):
            if value == value and value > 0:
                out.append(
                    f'<rect x="{x:.1f}" y="{y}" width="{value * scale:.2f}" height="{row_h - 10}" fill="{color}"/>'
                )
                x += value * scale
        if total == total:
            end = left + total * scale
            out.append(f'<text x="{end + 4:.1f}" y="{y + 15}" fill="#222">{esc(num(total))}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def heat_map(
    values: np.ndarray,
    rows: list[str],
    columns: list[str],
    marked: dict[int, str],
    unit: str,
    label: str,
    *,
    max_height: int = 640,
) -> str:
    """A rows x columns grid of cells shaded from the smallest value (light) to the largest (dark red);
    rows in `marked` (row index -> note) get a red outline and their note at the right. Columns past
    `MAX_BARS` are averaged in consecutive groups, rows are at most `max_height` units tall in all."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return ""
    if values.shape[1] > MAX_BARS:
        group = math.ceil(values.shape[1] / MAX_BARS)
        pad = group * math.ceil(values.shape[1] / group) - values.shape[1]
        padded = np.pad(values, ((0, 0), (0, pad)), constant_values=np.nan)
        with np.errstate(all="ignore"):
            values = np.nanmean(padded.reshape(values.shape[0], -1, group), axis=2)
        columns = [
            f"{columns[k * group]}-{columns[min((k + 1) * group, len(columns)) - 1]}" for k in range(values.shape[1])
        ]
    count, steps = values.shape
    cell_h = max(1.0, min(14.0, max_height / count))
    top, left, right = 8, 80, 200
    cell_w = (WIDTH - left - right) / steps
    height = int(top + cell_h * count + 40)
    finite = values[np.isfinite(values)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    span = high - low or 1.0
    out = [_svg_open(height, label)]
    label_every = max(1, math.ceil(12 / cell_h))
    for r in range(count):
        y = top + r * cell_h
        if r % label_every == 0 or r in marked:
            out.append(f'<text x="{left - 4}" y="{y + cell_h / 2 + 4:.1f}" text-anchor="end">{esc(rows[r])}</text>')
        for c in range(steps):
            value = values[r, c]
            if not math.isfinite(value):
                continue
            shade = (value - low) / span
            color = f"rgb(255,{int(245 - 200 * shade)},{int(235 - 215 * shade)})"
            out.append(
                f'<rect x="{left + c * cell_w:.1f}" y="{y:.1f}" width="{cell_w:.2f}" height="{cell_h:.2f}" '
                f'fill="{color}"><title>{esc(rows[r])}, step {esc(columns[c])}: {num(value)} {esc(unit)}'
                "</title></rect>"
            )
    for r, note in marked.items():
        y = top + r * cell_h
        out.append(
            f'<rect class="marked" x="{left}" y="{y:.1f}" width="{cell_w * steps:.1f}" height="{cell_h:.2f}" '
            'fill="none" stroke="#d62728" stroke-width="2"/>'
        )
        out.append(f'<text x="{WIDTH - right + 6}" y="{y + cell_h / 2 + 4:.1f}" fill="#d62728">{esc(note)}</text>')
    bottom = top + cell_h * count
    out.append(f'<text x="{left}" y="{bottom + 16:.1f}">step {esc(columns[0])}</text>')
    out.append(f'<text x="{WIDTH - right}" y="{bottom + 16:.1f}" text-anchor="end">step {esc(columns[-1])}</text>')
    out.append(
        f'<text x="{left}" y="{bottom + 32:.1f}">light {num(low)} {esc(unit)}, dark {num(high)} {esc(unit)}</text>'
    )
    out.append("</svg>")
    return "".join(out)


def legend(items: list[tuple[str, str]], extra: str = "") -> str:
    """An HTML legend: (name, CSS background: a color or a pattern)."""
    spans = "".join(f'<span class="key"><i style="background:{color}"></i>{esc(name)}</span>' for name, color in items)
    return f'<div class="legend">{spans}{extra}</div>'


__all__ = [
    "Band",
    "Bar",
    "EPOCH_LEVEL_COLOR",
    "OUTLIER_COLOR",
    "PART_COLORS",
    "SERIES_COLORS",
    "Series",
    "esc",
    "hbars",
    "heat_map",
    "legend",
    "lines",
    "nice_ticks",
    "num",
    "stacked_bars",
]
