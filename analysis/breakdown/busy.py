"""Each device's busy and idle spans: when its own activity ran, and the gaps between.

A device is busy where any of its own events runs (`TraceView.device`: kernels and copies on its
streams, `XLA Ops` on a TPU), overlapping events counted once; idle spans are the gaps between its
busy spans, from its first event to its last. A device plane without events has no spans: not
recorded, never idle.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis.read.view import TraceView

SPAN_COLUMNS = {"device": "category", "start_ns": "int64", "end_ns": "int64", "busy": bool}


def busy_spans(view: TraceView | None) -> pd.DataFrame:
    """One row per span (`SPAN_COLUMNS`), by device, in time order."""
    frames = []
    device = view.device if view is not None else None
    if device is not None and not device.empty:
        for name, events in device.groupby("plane_name", observed=True, sort=True):  # a category: no per-row str
            starts, ends = iv.union(events["start_ns"].to_numpy(), events["end_ns"].to_numpy())
            if not starts.size:
                continue
            span_starts = np.empty(2 * starts.size - 1, dtype=np.int64)
            span_ends = np.empty_like(span_starts)
            span_starts[0::2], span_ends[0::2] = starts, ends
            span_starts[1::2], span_ends[1::2] = ends[:-1], starts[1:]
            busy = np.zeros(span_starts.size, dtype=bool)
            busy[0::2] = True
            frames.append(
                pd.DataFrame({"device": str(name), "start_ns": span_starts, "end_ns": span_ends, "busy": busy})
            )
    if not frames:
        return pd.DataFrame({column: pd.Series(dtype=kind) for column, kind in SPAN_COLUMNS.items()})
    spans = pd.concat(frames, ignore_index=True)
    return spans.assign(device=spans["device"].astype("category"))  # a million spans, a few devices
