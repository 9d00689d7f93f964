"""The comparison chart: seconds per epoch per run, stacked by component."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.comparison.explain import LABELS
from analysis.render import plots

STACKED = ("input", "compute", "collective", "host")  # epoch-level work is drawn on top in grey


def chart_data(table: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """What the chart draws: per row the stacked parts and the total, and the unit.

    Runs that train the same number of images per epoch are drawn in seconds per epoch;
    when the counts differ, seconds per epoch would make the smaller run look faster, so
    every bar is milliseconds per image instead (rows whose image count is unknown get
    no bar and say so).
    """
    images = table["images_per_epoch"]
    per_image = images.nunique(dropna=True) > 1
    scale = 1000.0 / images if per_image else pd.Series(1.0, index=table.index)
    data = pd.DataFrame({part: table[f"{part}_s"] * scale for part in (*STACKED, "epoch_level")})
    data["total"] = table["seconds_per_epoch"] * scale
    data["label"] = [
        f"{r['device']}{' (ext)' if r['external'] else ''}"
        + (f"\n{r['run']}" if r["run"] != r["device"] else "")
        + (
            f"\n{r['images_per_epoch']:,.0f} images/epoch"
            if per_image and r["images_per_epoch"] == r["images_per_epoch"]
            else "\nimages unknown"
            if per_image
            else ""
        )
        for _, r in table.iterrows()
    ]
    return data, ("ms per image" if per_image else "seconds per epoch")


def plot_compare(table: pd.DataFrame, path: str | Path, named: bool = False) -> Path:
    """Horizontal bars per run, stacked input / compute / collective / host overhead (+ epoch-level), in the unit of
    `chart_data`. External rows have no breakdown and are drawn as one hatched bar."""
    data, unit = chart_data(table)
    fig, ax = plots._subplots((8, 1.0 + 0.55 * len(table)))
    y = np.arange(len(table))
    left = np.zeros(len(table))
    for part in STACKED:
        values = data[part].fillna(0.0).to_numpy()
        ax.barh(y, values, left=left, color=plots.PART_COLORS[part], label=f"{LABELS[part]}" if values.any() else None)
        left += values
    level = data["epoch_level"].fillna(0.0).to_numpy()
    ax.barh(y, level, left=left, color="#7f7f7f", label="epoch-level work" if level.any() else None)
    no_parts = table["input_s"].isna().to_numpy()
    if no_parts.any():
        ax.barh(
            y[no_parts],
            data["total"].fillna(0.0).to_numpy()[no_parts],
            color="white",
            edgecolor="black",
            hatch="//",
            label="no breakdown",
        )
    short = "ms" if unit == "ms per image" else "s"
    for yi, total in zip(y, data["total"]):
        if total == total:
            ax.text(total, yi, f" {total:.3g} {short}", va="center", fontsize="small")
    ax.set_yticks(y)
    ax.set_yticklabels(data["label"], fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(
        "Seconds per epoch by device"
        if unit == "seconds per epoch"
        else "Milliseconds per image by device (runs train different numbers of images per epoch)"
    )
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="x-small")
    return plots.save(fig, path, named)
