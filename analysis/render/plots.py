"""PNG plots of a breakdown, drawn with matplotlib's Agg backend (no display needed).

Every plot draws a bounded number of artists whatever the length of the run: up to
`BAR_LIMIT` steps (or epochs) get one labelled bar each; longer breakdowns are drawn as
stacked areas over the step number, with consecutive steps averaged into at most
`MAX_POINTS` points; sampler series longer than `MAX_LINE_POINTS` keep each bin's lowest
and highest sample, which draws the same line at the figure's resolution.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.read.run_files import UTILIZATION_COLUMNS
from analysis.render import mpl_config
from analysis.render.files import is_stream, open_stream, temporary_path

PART_COLORS = {"input": "#d62728", "compute": "#2ca02c", "host": "#1f77b4", "collective": "#9467bd"}
EPOCH_LEVEL_COLOR = "#7f7f7f"

BAR_LIMIT = 100  # up to this many steps or epochs: one bar each, every one labelled
MAX_POINTS = 1000  # above this many steps or epochs, consecutive ones are averaged into this many points at most
MAX_LINE_POINTS = 4000  # longer sampler series keep each bin's minimum and maximum
MAX_EPOCH_LINES = 100  # more epoch starts than this are marked by ticks at the bottom instead of dashed lines
WIDE_FIGURE = (12.0, 4.0)  # inches, for stacked areas


def _subplots(figsize: tuple[float, float]):
    """A figure and its axes without pyplot: no backend to select, no registry of open figures
    to close, and a third less import time (`savefig` draws PNG with Agg)."""
    mpl_config.ensure_config_dir()
    from matplotlib.figure import Figure

    # a label with a character no font draws (a control character from an input) warns in two lines,
    # the character raw; the label is drawn without it, which is all there is to say
    warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)

    fig = Figure(figsize=figsize)
    return fig, fig.subplots()


def save(fig, path: str | Path, named: bool = False) -> Path:
    """Write a figure as PNG (`named`: into a terminal, /dev/null or a FIFO the user chose, as
    `files.write_text_atomically` does)."""
    fig.tight_layout()
    path = Path(path)
    if named and is_stream(path):
        with open_stream(path) as stream:
            fig.savefig(stream, dpi=100, format="png")
        return path
    # A temporary name, then a rename: a full disk leaves no cut PNG behind.
    tmp = temporary_path(path.with_suffix(".png"))
    try:
        fig.savefig(tmp, dpi=100, format="png")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _layers(frame: pd.DataFrame, parts: list[tuple[str, str, str]]) -> list[tuple[np.ndarray, str, str]]:
    """(values, color, label) per part present in `frame`; missing values count as 0."""
    return [
        (frame[column].fillna(0.0).to_numpy(dtype=float), color, label)
        for column, color, label in parts
        if column in frame
    ]


def _bars(ax, frame: pd.DataFrame, key: str, parts: list[tuple[str, str, str]], rotate_over: int | None = None):
    """One stacked bar per row, each labelled with its `key`; returns the x positions."""
    x = np.arange(len(frame))
    bottom = np.zeros(len(frame))
    for values, color, label in _layers(frame, parts):
        ax.bar(x, values, bottom=bottom, color=color, label=label)
        bottom = bottom + values
    ax.set_xticks(x)
    rotation = 90 if rotate_over is not None and len(frame) > rotate_over else 0
    ax.set_xticklabels([str(v) for v in frame[key]], rotation=rotation)
    return x


def _points(frame: pd.DataFrame, key: str) -> tuple[np.ndarray, int]:
    """x per row (the `key` number where it increases, else the row's position) and how many rows
    go into one point (1, or enough that at most `MAX_POINTS` points are left)."""
    numbers = pd.to_numeric(frame[key], errors="coerce").to_numpy(dtype=float)
    increasing = numbers.size > 1 and not np.isnan(numbers).any() and bool((np.diff(numbers) > 0).all())
    x = numbers if increasing else np.arange(len(frame), dtype=float)
    return x, max(1, math.ceil(len(frame) / MAX_POINTS))


def _bin_mean(values: np.ndarray, per_point: int) -> np.ndarray:
    """Mean of each run of `per_point` consecutive values (the last run may be shorter)."""
    if per_point == 1:
        return values
    groups = np.arange(values.size) // per_point
    return np.bincount(groups, weights=values) / np.bincount(groups)


def _bin_max(values: np.ndarray, per_point: int) -> np.ndarray:
    if per_point == 1:
        return values
    return np.maximum.reduceat(values, np.arange(0, values.size, per_point))


def _edges(x: np.ndarray) -> np.ndarray:
    """Where each point's flat step begins, and where the last one ends: halfway to its neighbours,
    as wide as a bar at both ends."""
    if x.size == 1:
        return np.array([x[0] - 0.5, x[0] + 0.5])
    middles = (x[:-1] + x[1:]) / 2
    return np.concatenate([[x[0] - (middles[0] - x[0])], middles, [x[-1] + (x[-1] - middles[-1])]])


def _steps_between(ax, edges: np.ndarray, low: np.ndarray, high: np.ndarray, **style) -> None:
    """One flat step per point from `low` to `high` (one polygon, whatever the number of points)."""
    ax.fill_between(edges, np.append(low, low[-1]), np.append(high, high[-1]), step="post", **style)


def _areas(ax, frame: pd.DataFrame, key: str, parts: list[tuple[str, str, str]]) -> tuple[np.ndarray, int, float]:
    """Stacked areas over `key`, one flat step per point; returns the points' edges, how many rows go
    into one point and the lowest value drawn (0 unless a part is negative)."""
    x, per_point = _points(frame, key)
    edges = _edges(_bin_mean(x, per_point))
    bottom = np.zeros(edges.size - 1)
    lowest = 0.0
    for values, color, label in _layers(frame, parts):
        top = bottom + _bin_mean(values, per_point)
        _steps_between(ax, edges, bottom, top, color=color, linewidth=0, label=label)
        lowest = min(lowest, float(np.nanmin(top, initial=0.0)))
        bottom = top
    ax.set_xlim(edges[0], edges[-1])
    return edges, per_point, lowest


def _any_positive(frame: pd.DataFrame, column: str) -> bool:
    return column in frame and bool((frame[column].fillna(0.0) > 0).any())


def _per_point_title(title: str, rows: int, noun: str, per_point: int) -> str:
    if per_point == 1:
        return f"{title} ({rows:,} {noun})"
    return f"{title} ({rows:,} {noun}, each point the mean of {per_point})"


def plot_step_breakdown(steps: pd.DataFrame, path: str | Path, title: str = "Step time breakdown") -> Path:
    """Input, compute, (collective wait,) host overhead per step, compile hatched inside host: stacked
    bars up to `BAR_LIMIT` steps, stacked areas beyond (with the slowest step of each point when
    points average several steps)."""
    parts = [
        (f"{part}_ms", PART_COLORS[part], f"{part} (ms)")
        for part in ("input", "compute", "collective", "host")
        if part != "collective" or _any_positive(steps, "collective_ms")
    ]
    compiles = _any_positive(steps, "compile_ms")
    host_base = (
        (steps["input_ms"] + steps["compute_ms"] + (steps["collective_ms"] if "collective_ms" in steps else 0.0))
        .fillna(0.0)
        .to_numpy(dtype=float)
    )
    if len(steps) <= BAR_LIMIT:
        fig, ax = _subplots((max(6.0, 0.35 * len(steps) + 2), 4))
        x = _bars(ax, steps, "step", parts, rotate_over=20)
        if compiles:
            ax.bar(
                x,
                steps["compile_ms"],
                bottom=host_base,
                fill=False,
                hatch="//",
                edgecolor="black",
                label="compile (ms)",
            )
    else:
        fig, ax = _subplots(WIDE_FIGURE)
        edges, per_point, lowest = _areas(ax, steps, "step", parts)
        if compiles:
            base = _bin_mean(host_base, per_point)
            compile_ms = _bin_mean(steps["compile_ms"].fillna(0.0).to_numpy(dtype=float), per_point)
            _steps_between(
                ax,
                edges,
                base,
                base + compile_ms,
                facecolor="none",
                hatch="//",
                hatchcolor="black",
                linewidth=0,
                label="compile (ms)",
            )
        if per_point > 1 and "step_ms" in steps:
            slowest = _bin_max(steps["step_ms"].fillna(0.0).to_numpy(dtype=float), per_point)
            ax.stairs(
                slowest, edges, color="black", linewidth=0.6, baseline=None, label="slowest step of the point (ms)"
            )
        title = _per_point_title(title, len(steps), "steps", per_point)
        ax.set_ylim(bottom=lowest)  # last: the top is then the autoscaled one of everything drawn
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
    ax.set_title(title)
    # Outside the axes: the bars fill the plot, and a legend inside would hide the tallest.
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return save(fig, path)


def plot_epoch_breakdown(epochs: pd.DataFrame, path: str | Path) -> Path:
    """Input, step call, other host, epoch-level work (seconds) per epoch: stacked bars up to
    `BAR_LIMIT` epochs, stacked areas beyond."""
    parts = [
        ("input_s", PART_COLORS["input"], "input (s)"),
        ("call_s", PART_COLORS["compute"], "call (s)"),
        ("other_host_s", PART_COLORS["host"], "other_host (s)"),
        ("epoch_level_s", EPOCH_LEVEL_COLOR, "epoch_level (s)"),
    ]
    title = "Epoch time breakdown"
    if len(epochs) <= BAR_LIMIT:
        fig, ax = _subplots((max(5.0, 0.6 * len(epochs) + 2), 4))
        _bars(ax, epochs, "epoch", parts)
    else:
        fig, ax = _subplots(WIDE_FIGURE)
        _, per_point, lowest = _areas(ax, epochs, "epoch", parts)
        title = _per_point_title(title, len(epochs), "epochs", per_point)
        ax.set_ylim(bottom=lowest)
    ax.set_xlabel("epoch")
    ax.set_ylabel("s")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return save(fig, path)


def min_max_points(x: np.ndarray, y: np.ndarray, max_points: int = MAX_LINE_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most about `max_points` of (x, y), keeping in each run of consecutive samples its lowest and
    highest one in time order: drawn as a line at a width of `max_points / 2` pixels or less, it covers
    the same pixels as every sample. A run of missing values stays missing (a gap in the line)."""
    n = len(y)
    if n <= max_points:
        return x, y
    per_bin = math.ceil(n / (max_points // 2))
    bins = math.ceil(n / per_bin)
    padded = np.full(bins * per_bin, np.nan)
    padded[:n] = y
    grid = padded.reshape(bins, per_bin)
    missing = np.isnan(grid)
    low = np.where(missing, np.inf, grid).argmin(axis=1)
    high = np.where(missing, -np.inf, grid).argmax(axis=1)
    offsets = np.arange(bins) * per_bin
    index = np.minimum(np.stack([np.minimum(low, high), np.maximum(low, high)], axis=1) + offsets[:, None], n - 1)
    index = index.ravel()
    return x[index], y[index]


def plot_utilization(samplers: dict[str, pd.DataFrame], epoch_starts_s: list[float], path: str | Path) -> Path:
    """Utilization (%) over time from sampler CSVs, with a dashed line at each epoch start."""
    fig, ax = _subplots((8, 4))
    origin = min(float(frame["time_s"].min()) for frame in samplers.values())

    def line(frame: pd.DataFrame, values: pd.Series, **style) -> None:
        seconds = (frame["time_s"] - origin).to_numpy(dtype=float)
        ax.plot(*min_max_points(seconds, pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)), **style)

    for name, frame in samplers.items():
        for column in _utilization_columns(frame):
            line(frame, frame[column], label=f"{name}: {column}", linewidth=1)
        if "cpu_pct" in frame and "proc_cpu_pct" in frame:
            # proc_cpu_pct counts 100 per core; on the machine's scale the gap to cpu_pct is other processes
            cores = max(1, sum(1 for c in frame.columns if re.fullmatch(r"cpu\d+_pct", c)))
            line(
                frame,
                frame["proc_cpu_pct"] / cores,
                linewidth=1,
                linestyle=":",
                label=f"{name}: training process cpu (of all {cores} cores)",
            )
    starts = np.asarray(epoch_starts_s, dtype=float) - origin
    title = "Utilization (dashed: epoch starts)"
    if starts.size > MAX_EPOCH_LINES:  # dashed lines this close would grey the plot out: ticks along the bottom
        ax.vlines(starts, 0, 0.04, transform=ax.get_xaxis_transform(), color="gray", linewidth=0.6)
        title = f"Utilization (ticks at the bottom: {starts.size:,} epoch starts)"
    elif starts.size:
        ax.vlines(starts, 0, 1, transform=ax.get_xaxis_transform(), color="gray", linestyle="--", linewidth=0.8)
    ax.set_xlabel("seconds since first sample")
    ax.set_ylabel("%")
    ax.set_ylim(0, 105)
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize="x-small")
    return save(fig, path)


def _utilization_columns(frame: pd.DataFrame) -> list[str]:
    """Aggregate utilization columns (`cpu_pct`, `gpu_util_pct`, ...), not per-core ones."""
    preferred = [c for c in (*UTILIZATION_COLUMNS, "mem_util_pct") if c in frame]
    if preferred:
        return preferred
    return [c for c in frame.columns if c.endswith("_pct") and not c[:3] == "cpu"][:3]
