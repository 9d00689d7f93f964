"""The comparison chart: seconds per epoch per run, stacked by component."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis import plots
from analysis.compare.explain import LABELS

STACKED = ("input", "compute", "host")  # epoch-level work is drawn on top in grey


def plot_compare(table: pd.DataFrame, path: str | Path) -> Path:
    """Horizontal bars of seconds per epoch per device, stacked input / compute / host overhead (+ epoch-level).

    External rows have no breakdown and are drawn as one hatched bar.
    """
    plt = plots._pyplot()
    labels = [f"{r['device']}{' (ext)' if r['external'] else ''}" + (f"\n{r['run']}" if r["run"] != r["device"] else "")
              for _, r in table.iterrows()]
    fig, ax = plt.subplots(figsize=(8, 1.0 + 0.55 * len(table)))
    y = np.arange(len(table))
    left = np.zeros(len(table))
    for part in STACKED:
        values = table[f"{part}_s"].fillna(0.0).to_numpy()
        ax.barh(y, values, left=left, color=plots.PART_COLORS[part], label=f"{LABELS[part]} (s)" if values.any() else None)
        left += values
    level = table["epoch_level_s"].fillna(0.0).to_numpy()
    ax.barh(y, level, left=left, color="#7f7f7f", label="epoch-level (s)" if level.any() else None)
    external = table["input_s"].isna().to_numpy()
    if external.any():
        ax.barh(y[external], table["seconds_per_epoch"].to_numpy()[external], color="white", edgecolor="black",
                hatch="//", label="no breakdown (s)")
    for yi, seconds in zip(y, table["seconds_per_epoch"]):
        ax.text(seconds, yi, f" {seconds:.3g} s", va="center", fontsize="small")
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("seconds per epoch")
    ax.set_title("Seconds per epoch by device")
    ax.legend(loc="lower right", fontsize="x-small")
    return plots.save(fig, path)
