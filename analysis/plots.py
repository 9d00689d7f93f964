"""PNG plots of a breakdown, drawn with matplotlib's Agg backend (no display needed)."""

from __future__ import annotations

import re

from pathlib import Path

import pandas as pd

from analysis.run_files import UTILIZATION_COLUMNS

PART_COLORS = {"input": "#d62728", "compute": "#2ca02c", "host": "#1f77b4"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: str | Path) -> Path:
    """Write a figure as PNG and free it (pyplot keeps every open figure alive)."""
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path


def plot_step_breakdown(steps: pd.DataFrame, path: str | Path, title: str = "Step time breakdown") -> Path:
    """Stacked bars per step: input, compute, host overhead (compile hatched inside host)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(steps) + 2), 4))
    x = range(len(steps))
    bottom = pd.Series(0.0, index=steps.index)
    for part in ("input", "compute", "host"):
        values = steps[f"{part}_ms"]
        ax.bar(x, values, bottom=bottom, color=PART_COLORS[part], label=f"{part} (ms)")
        bottom = bottom + values
    if (steps["compile_ms"] > 0).any():
        host_base = steps["input_ms"] + steps["compute_ms"]
        ax.bar(x, steps["compile_ms"], bottom=host_base, fill=False, hatch="//", edgecolor="black", label="compile (ms)")
    ax.set_xticks(list(x))
    ax.set_xticklabels([str(s) for s in steps["step"]], rotation=90 if len(steps) > 20 else 0)
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
    ax.set_title(title)
    # Outside the axes: the bars fill the plot, and a legend inside would hide the tallest.
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return save(fig, path)


def plot_epoch_breakdown(epochs: pd.DataFrame, path: str | Path) -> Path:
    """Stacked bars per epoch: input, step call, other host, epoch-level work (seconds)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(epochs) + 2), 4))
    x = range(len(epochs))
    bottom = pd.Series(0.0, index=epochs.index)
    colors = {"input": PART_COLORS["input"], "call": PART_COLORS["compute"], "other_host": PART_COLORS["host"],
              "epoch_level": "#7f7f7f"}
    for part, color in colors.items():
        values = epochs[f"{part}_s"]
        ax.bar(x, values, bottom=bottom, color=color, label=f"{part} (s)")
        bottom = bottom + values
    ax.set_xticks(list(x))
    ax.set_xticklabels([str(e) for e in epochs["epoch"]])
    ax.set_xlabel("epoch")
    ax.set_ylabel("s")
    ax.set_title("Epoch time breakdown")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return save(fig, path)


def plot_utilization(samplers: dict[str, pd.DataFrame], epoch_starts_s: list[float], path: str | Path) -> Path:
    """Utilization (%) over time from sampler CSVs, with a dashed line at each epoch start."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    origin = min(float(frame["time_s"].min()) for frame in samplers.values())
    for name, frame in samplers.items():
        for column in _utilization_columns(frame):
            ax.plot(frame["time_s"] - origin, frame[column], label=f"{name}: {column}", linewidth=1)
        if "cpu_pct" in frame and "proc_cpu_pct" in frame:
            # proc_cpu_pct counts 100 per core; on the machine's scale the gap to cpu_pct is other processes
            cores = max(1, sum(1 for c in frame.columns if re.fullmatch(r"cpu\d+_pct", c)))
            ax.plot(frame["time_s"] - origin, frame["proc_cpu_pct"] / cores, linewidth=1, linestyle=":",
                    label=f"{name}: training process cpu (of all {cores} cores)")
    for start in epoch_starts_s:
        ax.axvline(start - origin, color="gray", linestyle="--", linewidth=0.8)
    ax.set_xlabel("seconds since first sample")
    ax.set_ylabel("%")
    ax.set_ylim(0, 105)
    ax.set_title("Utilization (dashed: epoch starts)")
    ax.legend(loc="lower right", fontsize="x-small")
    return save(fig, path)


def _utilization_columns(frame: pd.DataFrame) -> list[str]:
    """Aggregate utilization columns (`cpu_pct`, `gpu_util_pct`, ...), not per-core ones."""
    preferred = [c for c in (*UTILIZATION_COLUMNS, "mem_util_pct") if c in frame]
    if preferred:
        return preferred
    return [c for c in frame.columns if c.endswith("_pct") and not c[:3] == "cpu"][:3]
