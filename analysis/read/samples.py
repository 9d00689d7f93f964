"""Summaries of sampler CSVs: time-weighted mean, p50, p95 and max per metric, per run and per epoch.

The samplers write these into run.json when a run ends; `analyze` and `compare` compute
them again from the CSVs with the same functions, so every command prints the same CPU %
for the same run.

A sample describes the interval since the previous sample: that is how CPU %, GPU
utilization and the I/O rates are measured (for gauges such as memory it makes a
difference of one interval). Each sample weighs the time since the previous one, which
keeps a stretch of slow or skipped ticks from counting less than it lasted. The first
sample has no previous one and weighs nothing (it still counts for the max), and in an
epoch window each sample weighs only the part of its interval inside the window,
including the first sample after the window's end.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import pandas as pd

from analysis.read.run_files import TIME_COLUMN

STATS = ("mean", "p50", "p95", "max")


def hold_weights(times: pd.Series | np.ndarray, start_s: float = -math.inf, end_s: float = math.inf) -> np.ndarray:
    """Seconds of each sample's interval (since the previous sample) inside ``[start_s, end_s)``."""
    t = np.asarray(times, dtype=float)
    if t.size == 0:
        return t
    covers_from = np.insert(t[:-1], 0, t[0])
    return np.clip(np.minimum(t, end_s) - np.maximum(covers_from, start_s), 0.0, None)


def weighted_stats(values: Iterable[float], weights: Iterable[float]) -> dict[str, float | None]:
    """Time-weighted mean, p50 and p95, and the max of all samples given; None when empty.

    Percentiles are the smallest value whose cumulative weight reaches the fraction. When
    every weight is zero (a single sample) the samples count equally.
    """
    v = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    keep = ~np.isnan(v) & (w >= 0)
    v, w = v[keep], w[keep]
    if v.size == 0:
        return dict.fromkeys(STATS)
    peak = float(v.max())
    if w.sum() > 0:
        v, w = v[w > 0], w[w > 0]
    else:
        w = np.ones_like(v)
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    cumulative = np.cumsum(w) / w.sum()

    def quantile(q: float) -> float:
        index = int(np.searchsorted(cumulative, q - 1e-12, side="left"))
        return float(v[min(index, v.size - 1)])

    return {
        "mean": float(np.average(v, weights=w)),
        "p50": quantile(0.50),
        "p95": quantile(0.95),
        "max": peak,
    }


def _window_summary(frame: pd.DataFrame, metrics: list[str], start_s: float, end_s: float) -> dict:
    times = frame[TIME_COLUMN].to_numpy(dtype=float) if len(frame) else np.array([])
    weights = hold_weights(times, start_s, end_s)
    in_window = (times >= start_s) & (times < end_s)
    return {
        "samples": int(in_window.sum()),
        "seconds": float(weights.sum()) if weights.size else 0.0,
        "metrics": {m: _stats_in_window(frame[m], weights, in_window) for m in metrics},
    }


def _stats_in_window(values: pd.Series, weights: np.ndarray, in_window: np.ndarray) -> dict:
    v = values.to_numpy(dtype=float)
    take = (weights > 0) | in_window
    return weighted_stats(v[take], weights[take])


def summarize(frame: pd.DataFrame, epochs: list[tuple] | None = None) -> dict:
    """Per-metric time-weighted ``mean``, ``p50``, ``p95`` and ``max``, for the run and each epoch.

    `frame` has `time_s` and one column per metric (`read_sampler_csv`); `epochs` is a list
    of ``(epoch, start_s, end_s)`` windows on the same clock. Returns JSON-ready
    ``{"samples", "seconds", "metrics": {metric: {stat: value}}, "epochs": [{"epoch",
    "start_s", "end_s", "samples", "seconds", "metrics"}]}``; a metric never measured in a
    window has None stats.
    """
    if TIME_COLUMN not in frame:
        if len(frame.columns):
            raise ValueError(f"sampler frame needs a {TIME_COLUMN!r} column, got {list(frame.columns)}")
        frame = pd.DataFrame({TIME_COLUMN: []})
    frame = frame.sort_values(TIME_COLUMN, kind="stable").reset_index(drop=True)
    metrics = [c for c in frame.columns if c != TIME_COLUMN]
    result = _window_summary(frame, metrics, -math.inf, math.inf)
    result["epochs"] = []
    for epoch, start_s, end_s in epochs or []:
        if end_s < start_s:
            raise ValueError(f"epoch {epoch} ends before it starts ({start_s} > {end_s})")
        window = _window_summary(frame, metrics, float(start_s), float(end_s))
        result["epochs"].append({"epoch": epoch, "start_s": float(start_s), "end_s": float(end_s), **window})
    return result


def summary_table(summary: dict) -> pd.DataFrame:
    """The run-level part of `summarize` as a frame: one row per metric, one column per stat."""
    rows = {metric: stats for metric, stats in summary.get("metrics", {}).items()}
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(STATS)).astype(float)
