"""Selecting trace events by what they are: host or device, a producer's meaning, a thread.

Every module that reads the events table selects through these functions, so a plane or
line name is known in one place (`analysis.producers`) and name patterns are tried once
per distinct name, not once per event.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis.producers import planes
from analysis.producers import tpu as tpu_producer

NS_PER_MS = 1e6


def matches(names: pd.Series, pattern: re.Pattern, *, search: bool = False) -> pd.Series:
    """Whether each name matches `pattern` (`re.match`; `re.search` with `search=True`).

    The pattern (with its flags) is tried once per distinct name, not once per row:
    the trace's name columns are categorical, and a trace repeats a few hundred names
    over hundreds of thousands of events.
    """
    names = names if isinstance(names.dtype, pd.CategoricalDtype) else names.astype("category")
    test = pattern.search if search else pattern.match
    categories = names.cat.categories
    hit = np.fromiter((test(name) is not None for name in categories), dtype=bool, count=len(categories))
    codes = names.cat.codes.to_numpy()
    return pd.Series(hit[codes] & (codes >= 0), index=names.index)


def intervals(frame: pd.DataFrame) -> iv.Intervals:
    """The union of the events' [start, end) spans."""
    return iv.union(frame["start_ns"].to_numpy(), frame["end_ns"].to_numpy())


def host_events(events: pd.DataFrame) -> pd.DataFrame:
    return events[matches(events["plane_name"], planes.HOST_PLANE)]


def on_device_planes(events: pd.DataFrame) -> pd.DataFrame:
    """Every event on a GPU or TPU plane, derived lines included."""
    return events[matches(events["plane_name"], planes.DEVICE_PLANE)]


def device_events(events: pd.DataFrame) -> pd.DataFrame:
    """The devices' own activity: on GPU planes the stream lines (else every line not derived
    from them), on TPU planes (no streams) the `XLA Ops` line."""
    on_device = on_device_planes(events)
    if on_device.empty:
        return on_device
    is_tpu = on_device["plane_name"].astype(str).str.contains("TPU", case=False).to_numpy()
    stream = matches(on_device["line_name"], planes.STREAM_LINE).to_numpy()
    derived = ((on_device["line_id"].astype("int64") >= planes.DERIVED_LINE_MIN_ID)
               | on_device["line_name"].isin(planes.DERIVED_LINE_NAMES)).to_numpy()
    planes_with_streams = set(on_device.loc[stream, "plane"])
    has_streams = on_device["plane"].isin(planes_with_streams).to_numpy()
    tpu_activity = is_tpu & (on_device["line_name"] == tpu_producer.ACTIVITY_LINE).to_numpy()
    keep = np.where(is_tpu, tpu_activity, np.where(has_streams, stream, ~derived))
    return on_device[keep]


def device_kind(events: pd.DataFrame, plane_table: pd.DataFrame | None = None) -> str:
    """`cpu`, or `gpu`/`tpu` (with a count) when device planes hold events; from `plane_table`
    (the trace's planes) when they hold none: a GPU whose activity was not recorded is still a GPU."""
    on_device = device_events(events)
    if on_device.empty:
        names = [] if plane_table is None else [n for n in plane_table["plane_name"].astype(str) if is_device_plane(n)]
        if not names:
            return "cpu"
        kind = planes.DEVICE_PLANE.match(names[0]).group(1).lower()
        return kind if len(names) == 1 else f"{kind} x{len(names)}"
    names = on_device["plane_name"].unique()
    kind = planes.DEVICE_PLANE.match(names[0]).group(1).lower()
    return kind if len(names) == 1 else f"{kind} x{len(names)}"


def is_device_plane(name: str) -> bool:
    return bool(planes.DEVICE_PLANE.match(name))


def on_lines(events: pd.DataFrame, lines: pd.DataFrame) -> pd.Series:
    """Whether each event lies on one of the (`plane`, `line`) pairs of `lines`."""
    width = int(max(events["line"].max(), lines["line"].max())) + 1 if len(events) and len(lines) else 1
    key = events["plane"].to_numpy(dtype=np.int64) * width + events["line"].to_numpy(dtype=np.int64)
    wanted = lines["plane"].to_numpy(dtype=np.int64) * width + lines["line"].to_numpy(dtype=np.int64)
    return pd.Series(np.isin(key, wanted), index=events.index)


def present(column: pd.Series) -> np.ndarray:
    """Which rows have a value, as a plain boolean array: the trace's rarely set stats are sparse
    columns, and combining a sparse mask with a dense one costs a hundred times more."""
    return column.notna().to_numpy(dtype=bool)
