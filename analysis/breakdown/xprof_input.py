"""The input share of the step on XProf's definition, for its Overview reading (`analysis.rules.xprof`).

XProf merges the step's host and device events into one timeline where device compute and device
copies outrank the host's wait for input, and that wait outranks host-to-device copies: its input is
the host's wait and the batch copies where no device kernel or other copy runs. devprof's own input is
what the step is blocked on (DESIGN.md); the two differ where a device works while the host waits.
XProf finds steps only from markers and step groups, so the share is reproduced only for those.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis.read.view import TraceView

XPROF_STEP_SOURCES = ("markers", "trace_groups")


def xprof_input_pct(view: TraceView | None, steps: pd.DataFrame, step_source: str) -> float:
    """XProf's input share of `steps` (the steady ones), 0-100; NaN where XProf would not find these steps."""
    if view is None or step_source not in XPROF_STEP_SOURCES or steps.empty:
        return math.nan
    parts = view.device_parts
    exposed = iv.subtract(view.input_intervals, iv.union_of(parts["compute"], parts["copy"]))
    starts = steps["start_ns"].to_numpy(dtype=np.int64)
    ends = steps["end_ns"].to_numpy(dtype=np.int64)
    span = int((ends - starts).sum())
    return 100.0 * float(iv.overlap(exposed, starts, ends).sum()) / span if span > 0 else math.nan
