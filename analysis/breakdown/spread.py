"""How the steady steps spread around their median, and what made each slow one slow.

A mean hides its outliers: 19 steps of 7.7 ms and two of 14-15 ms average 8.5 ms. The spread
gives the median and p90 of the steady steps' time and names every step over
`OUTLIER_FACTOR` x the median with the part that grew most: that part's excess over its own
median across the steady steps (`compute` -> `device`, `host`, `input`, `collective`).

Device work is the devices' own: where the trace records devices, each step's compute is the
most any device computed in its own step (`device_ms`, grouped by the device's steps, never
cut by host intervals), else the step's `compute_ms` (TensorFlow op execution on a CPU run).

Fewer than `MIN_STEPS` steady steps have no spread: `spread` returns None, never zeros.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

OUTLIER_FACTOR = 1.5
MIN_STEPS = 2
# Each part of the step, as the cause of a slow step is named; on a tie the first one listed wins.
CAUSES = {"compute_ms": "device", "host_ms": "host", "input_ms": "input", "collective_ms": "collective"}
OUTLIER_COLUMNS = ["step", "step_ms", "cause", "excess_ms"]


def _parts(steps: pd.DataFrame, device_ms: pd.Series | None) -> pd.DataFrame:
    """The parts each cause is read from, one column per cause (parts the table lacks are left out)."""
    parts = pd.DataFrame(
        {cause: steps[column].astype(float) for column, cause in CAUSES.items() if column in steps}, index=steps.index
    )
    if device_ms is not None:
        device = device_ms.reindex(steps.index)
        if device.notna().all():  # one basis for every step, or none
            parts["device"] = device.astype(float)
    return parts


def outliers(steps: pd.DataFrame, device_ms: pd.Series | None = None) -> pd.DataFrame:
    """Steps over `OUTLIER_FACTOR` x the median step, slowest first: `step`, `step_ms`, `cause` (the part
    whose excess over its own median is largest) and `excess_ms` (that excess, per step).
    `device_ms`: each step's device work, indexed as `steps` (see the module's docstring)."""
    if len(steps) < MIN_STEPS:
        return pd.DataFrame(columns=OUTLIER_COLUMNS)
    step_ms = steps["step_ms"].astype(float)
    median = float(step_ms.median())
    slow = steps[step_ms > OUTLIER_FACTOR * median] if median > 0 else steps.iloc[:0]
    if slow.empty:
        return pd.DataFrame(columns=OUTLIER_COLUMNS)
    parts = _parts(steps, device_ms)
    excess = parts.loc[slow.index] - parts.median()
    values = excess.to_numpy(dtype=float)
    largest = np.argmax(np.where(np.isnan(values), -np.inf, values), axis=1)
    frame = pd.DataFrame(
        {
            "step": slow["step"].to_numpy(),
            "step_ms": slow["step_ms"].to_numpy(dtype=float),
            "cause": np.asarray(excess.columns)[largest],
            "excess_ms": values[np.arange(len(values)), largest],
        }
    )
    return frame.sort_values("step_ms", ascending=False, kind="stable").reset_index(drop=True)


def spread(steps: pd.DataFrame, device_ms: pd.Series | None = None) -> dict | None:
    """`{median_ms, p90_ms, outliers: [{step, step_ms, cause, excess_ms}]}` of the steady `steps`
    (p90 interpolated linearly between steps); None with fewer than `MIN_STEPS` of them."""
    if len(steps) < MIN_STEPS:
        return None
    step_ms = steps["step_ms"].to_numpy(dtype=float)
    slow = outliers(steps, device_ms)
    return {
        "median_ms": float(np.median(step_ms)),
        "p90_ms": float(np.percentile(step_ms, 90)),
        "outliers": [
            {"step": int(step), "step_ms": float(ms), "cause": str(cause), "excess_ms": float(excess)}
            for step, ms, cause, excess in slow.itertuples(index=False)
        ],
    }
