"""CSV: `analyze --format csv` (one row per step) and `compare --format csv` (one row per run).

Text cells that a spreadsheet would run as formulas (a run named `=HYPERLINK(...)`) are
quoted by `analysis.csv_safety`; numbers stay numbers.
"""

from __future__ import annotations

import pandas as pd

from analysis.render.csv_safety import frame_csv


def render_analysis(analysis) -> str:
    return frame_csv(analysis.steps)


def comparison_frame(table: pd.DataFrame) -> pd.DataFrame:
    """The comparison table with its list cells joined into text."""
    frame = table.copy()
    frame["flags"] = frame["flags"].map("; ".join)
    frame["findings"] = frame["findings"].map(lambda found: " ".join(f["rule"] for f in found))
    frame["workers"] = frame["workers"].map(lambda workers: " ".join(w["run"] for w in workers))
    frame["epochs_used"] = frame["epochs_used"].map(lambda e: " ".join(map(str, e)))
    if "matrix_flops_per_second" in frame:
        frame["matrix_flops_per_second"] = frame["matrix_flops_per_second"].map(
            lambda rates: " ".join(f"{dtype}={rate:.4g}" for dtype, rate in (rates or {}).items())
        )
    return frame


def render_comparison(comparison) -> str:
    return frame_csv(comparison_frame(comparison.table))
