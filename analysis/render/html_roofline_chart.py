"""The roofline chart as inline SVG: each op at its arithmetic intensity and FLOP/s under its dtype's ceilings."""

from __future__ import annotations

import math
from dataclasses import dataclass

from analysis.render.html_charts import WIDTH, _svg_open, esc, num

KIND_COLORS = {"matrix": "#1f77b4", "vector": "#ff7f0e", "": "#7f7f7f"}  # an op's colour is its roof's
MEMORY_COLOR = "#555"
DTYPE_DASHES = ("", "7 4", "2 3", "10 3 2 3")  # one line style per dtype, in the order drawn
MAX_ROOF_POINTS = 1000
MIN_R = 1.5  # the smallest op's circle (viewBox units)
_SI = {-3: "n", -2: "\u00b5", -1: "m", 0: "", 1: "k", 2: "M", 3: "G", 4: "T", 5: "P", 6: "E"}


def si(value: float, unit: str) -> str:
    """`value` with an SI prefix and 3 significant digits: 1.95e13 FLOP/s -> '19.5 TFLOP/s'."""
    if value is None or not math.isfinite(value):
        return "-"
    if value == 0:
        return f"0 {unit}"
    group = max(-3, min(6, math.floor(math.log10(abs(value)) / 3)))
    scaled = float(f"{value / 10 ** (3 * group):.3g}")
    if abs(scaled) >= 1000 and group < 6:
        group, scaled = group + 1, scaled / 1000
    return f"{scaled:g} {_SI[group]}{unit}"


@dataclass(frozen=True)
class RoofPoint:
    """One op on the roofline: where it lands, its time (the marker's area), tooltip and label."""

    intensity: float  # FLOP/byte
    flops_per_second: float
    ms_per_step: float
    kind: str  # matrix | vector | ""
    title: str
    label: str = ""  # where not empty: the point is numbered and named under the plot, with `note` after its name
    note: str = ""


@dataclass(frozen=True)
class Roof:
    """One dtype's ceilings (NaN: unknown)."""

    dtype: str
    matrix: float  # FLOP/s
    vector: float  # FLOP/s
    bandwidth: float  # bytes/s


def _spread(wanted: list[float], gap: float, low: float, high: float) -> list[float]:
    """Positions as near `wanted` as can be while `gap` apart and inside [low, high] (labels that
    would overlap are pushed apart; the order is kept)."""
    order = sorted(range(len(wanted)), key=lambda i: wanted[i])
    placed = [0.0] * len(wanted)
    last = -math.inf
    for i in order:
        placed[i] = max(wanted[i], last + gap, low)
        last = placed[i]
    ceiling = high
    for i in reversed(order):  # pushed past the end: pack the run back from it
        placed[i] = min(placed[i], ceiling)
        ceiling = placed[i] - gap
    return placed


def _decades(values: list[float], pad: float, at_least: int) -> tuple[int, int]:
    """The powers of ten around `values` (log10 padded by `pad`), at least `at_least` decades."""
    logs = [math.log10(v) for v in values if v > 0 and math.isfinite(v)]
    if not logs:
        return 0, at_least
    low, high = math.floor(min(logs) - pad), math.ceil(max(logs) + pad)
    while high - low < at_least:
        low -= 1
        if high - low < at_least:
            high += 1
    return low, high


def roofline(points: list[RoofPoint], roofs: list[Roof], label: str, *, height: int = 470) -> str:
    """A log-log roofline: x arithmetic intensity (FLOP/byte), y FLOP/s. Each roof is the memory
    slope (bandwidth x intensity) up to its flat ceiling: the matrix roof and the vector roof of
    every dtype, in the colour of the ops they bound and the dash of their dtype. Points are
    circles whose area is proportional to their time per step, largest drawn first. Labelled points
    are numbered in the order given and named in a key under the plot (names beside the points would
    cover the points around them)."""
    flat_roofs = any(v > 0 and math.isfinite(v) for r in roofs for v in (r.matrix, r.vector))
    # The ceilings are named in a margin right of the plot, where no op can hide them.
    left, right, top_pad, bottom_pad = 104, 200 if flat_roofs else 20, 16, 46
    plot_w, plot_h = WIDTH - left - right, height - top_pad - bottom_pad
    points = [
        p
        for p in points
        if p.intensity > 0
        and p.flops_per_second > 0
        and p.ms_per_step > 0
        and math.isfinite(p.intensity)
        and math.isfinite(p.flops_per_second)
        and math.isfinite(p.ms_per_step)
    ]
    peaks = [v for r in roofs for v in (r.matrix, r.vector) if v > 0 and math.isfinite(v)]
    ridges = [
        p / r.bandwidth
        for r in roofs
        for p in (r.matrix, r.vector)
        if p > 0 and math.isfinite(p) and r.bandwidth > 0 and math.isfinite(r.bandwidth)
    ]
    x_lo, x_hi = _decades([p.intensity for p in points] + ridges, 0.15, 3)
    y_lo, y_hi = _decades([p.flops_per_second for p in points] + peaks, 0.25, 3)
    if peaks and math.log10(max(peaks)) > y_hi - 0.15:  # room for the highest ceiling's label
        y_hi += 1

    def x_of(value: float) -> float:
        return left + plot_w * (math.log10(value) - x_lo) / (x_hi - x_lo)

    def y_of(value: float) -> float:
        return top_pad + plot_h * (y_hi - math.log10(value)) / (y_hi - y_lo)

    labelled = [p for p in points if p.label]
    total_height = height + (17 * len(labelled) + 8 if labelled else 0)
    out = [
        _svg_open(total_height, label),
        f'<rect x="{left}" y="{top_pad}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>',
    ]
    x_step = max(1, math.ceil((x_hi - x_lo) / 10))
    for power in range(x_lo, x_hi + 1):
        x = x_of(10.0**power)
        text = (
            f'<text x="{x:.2f}" y="{top_pad + plot_h + 16}" text-anchor="middle" fill="#444">'
            f"{esc(num(10.0**power))}</text>"
            if (power - x_lo) % x_step == 0
            else ""
        )
        out.append(
            f'<g class="tick-x"><line x1="{x:.2f}" x2="{x:.2f}" y1="{top_pad}" y2="{top_pad + plot_h}" '
            f'stroke="#e6e6e6"/>{text}</g>'
        )
    y_step = max(1, math.ceil((y_hi - y_lo) / 8))
    for power in range(y_lo, y_hi + 1):
        y = y_of(10.0**power)
        text = (
            f'<text x="{left - 6}" y="{y + 4:.2f}" text-anchor="end" fill="#444">'
            f"{esc(si(10.0**power, 'FLOP/s'))}</text>"
            if (power - y_lo) % y_step == 0
            else ""
        )
        out.append(
            f'<g class="tick-y"><line x1="{left}" x2="{left + plot_w}" y1="{y:.2f}" y2="{y:.2f}" '
            f'stroke="#e6e6e6"/>{text}</g>'
        )
    out.append(
        f'<text x="{left + plot_w / 2:.0f}" y="{height - 8}" text-anchor="middle" fill="#444">'
        "arithmetic intensity (FLOP per byte read and written), log scale</text>"
    )
    out.append(
        f'<text transform="translate(14 {top_pad + plot_h / 2:.0f}) rotate(-90)" text-anchor="middle" '
        'fill="#444">achieved FLOP/s, log scale</text>'
    )
    x_min, x_max = 10.0**x_lo, 10.0**x_hi
    y_min, y_max = 10.0**y_lo, 10.0**y_hi
    ceiling_labels: list[tuple[float, str, str]] = []  # (y, text, colour) drawn right-aligned above the roofs
    slope_labels: dict[float, list[str]] = {}  # bandwidth -> dtypes
    out.append('<g fill="none" stroke-width="2">')
    for index, roof in enumerate(roofs):
        dash = DTYPE_DASHES[index % len(DTYPE_DASHES)]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<g class="roof" data-dtype="{esc(roof.dtype)}">')
        bandwidth = roof.bandwidth if roof.bandwidth > 0 and math.isfinite(roof.bandwidth) else math.nan
        flats = [
            (kind, value)
            for kind, value in (("matrix", roof.matrix), ("vector", roof.vector))
            if value > 0 and math.isfinite(value)
        ]
        if bandwidth == bandwidth:
            start = max(x_min, y_min / bandwidth)
            end = min(x_max, y_max / bandwidth, max((v / bandwidth for _, v in flats), default=math.inf))
            if end > start:
                out.append(
                    f'<line class="memory" x1="{x_of(start):.2f}" y1="{y_of(bandwidth * start):.2f}" '
                    f'x2="{x_of(end):.2f}" y2="{y_of(bandwidth * end):.2f}" stroke="{MEMORY_COLOR}"'
                    f"{dash_attr}><title>{esc(roof.dtype)} memory bandwidth: "
                    f"{esc(si(bandwidth, 'B/s'))}</title></line>"
                )
                slope_labels.setdefault(bandwidth, []).append(roof.dtype)
        for kind, value in flats:
            ridge = value / bandwidth if bandwidth == bandwidth else x_min
            text = f"{roof.dtype} {kind} {si(value, 'FLOP/s')}"
            out.append(
                f'<line class="{kind}" x1="{x_of(max(ridge, x_min)):.2f}" y1="{y_of(value):.2f}" '
                f'x2="{x_of(x_max):.2f}" y2="{y_of(value):.2f}" stroke="{KIND_COLORS[kind]}"{dash_attr}>'
                f"<title>{esc(text)}</title></line>"
            )
            ceiling_labels.append((y_of(value), text, KIND_COLORS[kind]))
        out.append("</g>")
    out.append("</g>")
    halo = 'stroke="#fff" stroke-width="3" paint-order="stroke"'
    if ceiling_labels:
        placed = _spread([y + 4 for y, _, _ in ceiling_labels], 14, top_pad + 4, top_pad + plot_h)
        for (_, text, color), y in zip(ceiling_labels, placed):
            out.append(f'<text class="ceiling" x="{left + plot_w + 6}" y="{y:.2f}" fill="{color}">{esc(text)}</text>')
    angle = -math.degrees(math.atan2(plot_h / (y_hi - y_lo), plot_w / (x_hi - x_lo)))
    on_top: list[str] = []  # labels inside the plot: drawn after every circle, never under one
    for number, (bandwidth, dtypes) in enumerate(slope_labels.items()):
        # Near the slope's lower end, where no ceiling label is; written along it.
        start = max(x_min, y_min / bandwidth) * 10 ** (0.25 + 0.5 * number)
        if start >= x_max or bandwidth * start >= y_max:
            continue
        x, y = x_of(start), y_of(bandwidth * start)
        names = "" if len(slope_labels) == 1 else " ".join(dtypes) + " "
        on_top.append(
            f'<text class="ceiling" transform="translate({x:.2f} {y - 6:.2f}) rotate({angle:.1f})" '
            f'fill="{MEMORY_COLOR}" {halo}>{esc(names)}memory {esc(si(bandwidth, "B/s"))}</text>'
        )
    if points:
        largest = max(p.ms_per_step for p in points)
        max_r = 18.0
        out.append('<g class="ops" stroke-width="1">')
        ranks = {id(p): n for n, p in enumerate(labelled, 1)}
        for point in sorted(points, key=lambda p: -p.ms_per_step):
            # Area proportional to time; at least MIN_R, so that every op can be seen and hovered.
            r = max(MIN_R, max_r * math.sqrt(point.ms_per_step / largest))
            cx, cy = x_of(point.intensity), y_of(point.flops_per_second)
            color = KIND_COLORS.get(point.kind, KIND_COLORS[""])
            out.append(
                f'<g class="op"><title>{esc(point.title)}</title><circle cx="{cx:.2f}" cy="{cy:.2f}" '
                f'r="{r:.3f}" fill="{color}" fill-opacity="0.55" stroke="{color}"/></g>'
            )
            if id(point) in ranks:
                on_top.append(
                    f'<text class="op-rank" x="{cx + 0.7 * r + 1:.2f}" y="{cy - 0.7 * r - 1:.2f}" '
                    f'font-weight="700" fill="#000" {halo}>{ranks[id(point)]}</text>'
                )
        out.append("</g>")
    out += on_top
    for n, point in enumerate(labelled, 1):
        y = height + 4 + 17 * n
        note = f'<tspan fill="#555">{esc(point.note)}</tspan>' if point.note else ""
        out.append(
            f'<text x="{left}" y="{y}"><tspan font-weight="700">{n}</tspan>'
            f'<tspan class="op-label" x="{left + 18}">{esc(point.label)}</tspan>{note}</text>'
        )
    out.append("</svg>")
    return "".join(out)


__all__ = [
    "KIND_COLORS",
    "Roof",
    "RoofPoint",
    "roofline",
    "si",
]
