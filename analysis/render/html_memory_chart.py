"""The memory timeline as inline SVG: bytes in use over the traced window, its steps shaded and its peak marked."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from analysis.render.html_charts import (
    LEFT,
    MAX_LINE_POINTS,
    RIGHT,
    WIDTH,
    Band,
    _svg_open,
    _y_axis,
    esc,
    nice_ticks,
    num,
)
from analysis.render.plots import min_max_points

MEMORY_LINE_COLOR = "#1f77b4"
PEAK_COLOR = "#d62728"


def _binary_unit(top: float) -> tuple[float, str]:
    for factor, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if top >= factor:
            return float(factor), unit
    return 1.0, "bytes"


def memory_timeline(
    time_ms: np.ndarray,
    in_use: np.ndarray,
    bands: Sequence[Band],
    peak: tuple[float, float, str],
    label: str,
    *,
    capacity: float = math.nan,
    height: int = 380,
) -> str:
    """Bytes in use over the window as steps (each event's value holds until the next one), the steps
    shaded, the peak marked with a line and a dot (its tooltip says what held it); the capacity drawn
    where the peak reaches half of it."""
    time_ms, in_use = np.asarray(time_ms, dtype=float), np.asarray(in_use, dtype=float)
    known = np.isfinite(in_use)
    time_ms, in_use = time_ms[known], in_use[known]
    peak_ms, peak_bytes, peak_title = peak
    show_capacity = capacity == capacity and capacity > 0 and peak_bytes >= 0.5 * capacity
    highest = max(float(in_use.max()) if in_use.size else 1.0, capacity if show_capacity else 0.0)
    factor, unit = _binary_unit(highest)
    ticks = nice_ticks(highest / factor)
    top = ticks[-1] * factor if ticks[-1] > 0 else 1.0
    x0 = min([float(time_ms.min())] + [b.start for b in bands]) if time_ms.size else 0.0
    x1 = max([float(time_ms.max())] + [b.end for b in bands]) if time_ms.size else 1.0
    span = (x1 - x0) or 1.0
    top_pad, bottom_pad = 16, 40
    plot_h = height - top_pad - bottom_pad

    def x_of(value):
        return LEFT + (WIDTH - LEFT - RIGHT) * (np.asarray(value, dtype=float) - x0) / span

    def y_of(value):
        return top_pad + plot_h * (1 - np.clip(np.asarray(value, dtype=float), 0, top) / top)

    out = [
        _svg_open(height, label),
        *_y_axis([t * factor for t in ticks], y_of, top_pad, top_pad + plot_h, unit, lambda value: num(value / factor)),
    ]
    for i, band in enumerate(bands):
        a, b = float(x_of(band.start)), float(x_of(band.end))
        if b <= a:
            continue
        fill = "#f1f1f1" if i % 2 == 0 else "#e4e4e4"
        out.append(
            f'<g><title>{esc(band.title)}</title><rect x="{a:.1f}" y="{top_pad}" width="{b - a:.1f}" '
            f'height="{plot_h}" fill="{fill}"/>'
            + (
                f'<text x="{a + 4:.1f}" y="{top_pad + 12}" fill="#666" font-size="11">{esc(band.label)}</text>'
                if b - a > 40
                else ""
            )
            + "</g>"
        )
    if show_capacity:
        cap_y = float(y_of(capacity))
        out.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{cap_y:.1f}" y2="{cap_y:.1f}" stroke="#555" '
            f'stroke-dasharray="6 4"><title>capacity {num(capacity / factor)} {unit}</title></line>'
        )
    x, y = min_max_points(time_ms, in_use, MAX_LINE_POINTS)
    if len(x):
        x, y = np.append(x, x1), np.append(y, y[-1])  # the last value holds to the window's end
        xs, ys = np.repeat(x, 2)[1:], np.repeat(y, 2)[:-1]  # hold each value until the next event
        points = " ".join(f"{px:.1f},{py:.1f}" for px, py in zip(x_of(xs), y_of(ys)))
        out.append(
            f'<polyline points="{points}" fill="none" stroke="{MEMORY_LINE_COLOR}" stroke-width="1.6" '
            f'stroke-linejoin="round"><title>bytes in use</title></polyline>'
        )
    px, py = float(x_of(peak_ms)), float(y_of(peak_bytes))
    anchor = "end" if px > WIDTH * 0.7 else "start"
    shift = -6 if anchor == "end" else 6
    out.append(
        f"<g><title>{esc(peak_title)}</title>"
        f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{top_pad}" y2="{top_pad + plot_h}" stroke="{PEAK_COLOR}" '
        f'stroke-dasharray="3 3"/><circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="{PEAK_COLOR}"/>'
        f'<text x="{px + shift:.1f}" y="{max(py - 6, top_pad + 10):.1f}" text-anchor="{anchor}" '
        f'fill="{PEAK_COLOR}" font-weight="600">peak {num(peak_bytes / factor)} {unit}</text></g>'
    )
    base = top_pad + plot_h
    out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{base}" y2="{base}" stroke="#888"/>')
    step = nice_ticks(span, 5)[1]
    for index in range(math.ceil(x0 / step), math.floor(x1 / step) + 1):
        out.append(
            f'<text x="{float(x_of(index * step)):.1f}" y="{base + 15}" text-anchor="middle" fill="#444">'
            f"{esc(num(index * step))}</text>"
        )
    out.append(
        f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{height - 6}" text-anchor="middle" fill="#444">'
        "ms into the traced window</text></svg>"
    )
    return "".join(out)
