"""A trace's events split once into host and device tables, and the selections every stage uses.

`TraceView` is the only place that selects events by plane or by what a producer's name
means: the steps, the device rows, the ops, the tf.data stages and the rule facts all query
its tables, each made once on first use and kept (HTA's and Perfetto's shape: parse once, then
query). A plane or line name is known in one place (`analysis.producers`), and name patterns
are tried once per distinct name, not once per event.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import TypeVar, cast

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis import producers
from analysis.producers import matches, planes
from analysis.producers import tensorflow as tf_producer
from analysis.producers import tpu as tpu_producer
from analysis.read.trace import DeviceSpecs, Trace, device_specs

NS_PER_MS = 1e6
T = TypeVar("T")
# The allocators' events (`TraceView.memory`): bytes in use is the allocator's bytes_allocated plus
# bytes_reserved after the event (XProf's heap + stack), NaN where the event does not say.
MEMORY_COLUMNS = {
    "allocator": object,
    "start_ns": "int64",
    "allocation": bool,
    "bytes_in_use": float,
    "bytes_reserved": float,
    "bytes_available": float,
    "peak_bytes_in_use": float,
    "requested_bytes": float,
    "allocation_bytes": float,
    "fragmentation": float,
    "address": float,
    "op": object,
    "region": object,
    "dtype": object,
    "shape": object,
    "group_id": float,
}
STAGE_RE = re.compile(tf_producer.INPUT_STAGE)
HOST_OP_RE = re.compile(tf_producer.XPROF_HOST_OP)
TPU_PLANE = re.compile("TPU", re.IGNORECASE)
DEVICE_PLANE_INDEX = re.compile(r"^/device:([A-Z]+):(\d+)$")
# What a timeline of the trace's own events needs of each (analysis/render/perfetto.py).
TIMELINE_COLUMNS = ["plane", "line", "plane_name", "line_name", "name", "start_ns", "end_ns"]


def intervals(frame: pd.DataFrame) -> iv.Intervals:
    """The union of the events' [start, end) spans."""
    return iv.union(frame["start_ns"].to_numpy(), frame["end_ns"].to_numpy())


def on_lines(events: pd.DataFrame, lines: pd.DataFrame) -> pd.Series:
    """Whether each event lies on one of the (`plane`, `line`) pairs of `lines`."""
    width = int(max(events["line"].max(), lines["line"].max())) + 1 if len(events) and len(lines) else 1
    key = events["plane"].to_numpy(dtype=np.int64) * width + events["line"].to_numpy(dtype=np.int64)
    wanted = lines["plane"].to_numpy(dtype=np.int64) * width + lines["line"].to_numpy(dtype=np.int64)
    return pd.Series(np.isin(key, wanted), index=events.index)


def thread_nesting(events: pd.DataFrame, enclosing: bool = False) -> tuple[pd.DataFrame, np.ndarray]:
    """`events` in the order a thread's nesting is read (thread, start, longest first), and each one's
    parent there (its position in that order; -1: none): the innermost event on its thread still running
    when it starts, or with `enclosing` the innermost that holds it whole (XProf's `ConnectIntraThread`).
    The two differ only where events on one thread overlap without nesting."""
    events = events.sort_values(
        ["plane", "line", "start_ns", "end_ns"], ascending=[True, True, True, False], kind="stable"
    )
    starts, ends = events["start_ns"].to_numpy(dtype=np.int64), events["end_ns"].to_numpy(dtype=np.int64)
    thread = (events["plane"].to_numpy(dtype=np.int64) << 32) + events["line"].to_numpy(dtype=np.int64)
    parent = np.full(starts.size, -1, dtype=np.int64)
    # Read and written through memoryviews: as fast as lists of Python ints, without a million of them.
    threads, begin, end, found = (
        np.ascontiguousarray(values, dtype=np.int64).data for values in (thread, starts, ends, parent)
    )
    stack: list[int] = []
    for i in range(len(begin)):
        if enclosing:
            while stack and (
                threads[stack[-1]] != threads[i] or end[stack[-1]] < end[i] or begin[stack[-1]] > begin[i]
            ):
                stack.pop()
        else:
            while stack and (threads[stack[-1]] != threads[i] or end[stack[-1]] <= begin[i]):
                stack.pop()
        if stack:
            found[i] = stack[-1]
        stack.append(i)
    return events, parent


def present(column: pd.Series) -> np.ndarray:
    """Which rows have a value, as a plain boolean array: the trace's rarely set stats are sparse
    columns, and combining a sparse mask with a dense one costs a hundred times more."""
    return column.notna().to_numpy(dtype=bool)


def is_device_plane(name: str) -> bool:
    return bool(planes.DEVICE_PLANE.match(name))


def _rows(events: pd.DataFrame, mask: np.ndarray) -> pd.DataFrame:
    """`events[mask]`; a slice (sharing the table's memory) when the rows are one run, as a plane's
    events are: the host table of a CPU trace is most of the trace and is not copied."""
    where = np.flatnonzero(mask)
    if where.size and where[-1] - where[0] + 1 == where.size:
        return events.iloc[int(where[0]) : int(where[-1]) + 1]
    return events[mask]


def device_parts(device: pd.DataFrame) -> dict[str, iv.Intervals]:
    """A set of device events cut into `input` (host-to-device copies), `copy` (other copies),
    `collective` and `compute` (all other kernels), each a union of intervals (they may overlap)."""
    is_input = matches(device["name"], producers.pattern("device_input"), search=True)
    is_copy = matches(device["name"], producers.pattern("device_copy"), search=True) & ~is_input
    is_collective = matches(device["name"], producers.pattern("collective"), search=True) & ~is_input & ~is_copy
    is_compute = ~(is_input | is_copy | is_collective)
    return {
        "input": intervals(device[is_input]),
        "copy": intervals(device[is_copy]),
        "collective": intervals(device[is_collective]),
        "compute": intervals(device[is_compute]),
    }


class TraceView:
    """One trace's events as the tables the analysis asks for, each selected once."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self._queries: dict[Callable, object] = {}

    def query(self, compute: Callable[[TraceView], T]) -> T:
        """`compute(self)`, worked out once per view and kept: a stage's work that needs no steps (the
        tf.data stages' self times, TensorFlow's eager shares), which a helper process can begin before
        the steps are found."""
        if compute not in self._queries:
            self._queries[compute] = compute(self)
        return cast(T, self._queries[compute])

    @property
    def events(self) -> pd.DataFrame:
        """Every event of the trace (host, devices and the planes that are neither)."""
        return self.trace.events

    @property
    def planes(self) -> pd.DataFrame:
        return self.trace.planes

    @property
    def hostnames(self) -> list[str]:
        return self.trace.hostnames

    @functools.cached_property
    def device_specs(self) -> dict[str, DeviceSpecs]:
        """What each device plane states about its device (memory bandwidth, clock, cores), by
        plane name; read from the file's metadata when first asked, empty for a trace made in memory."""
        if self.trace.location is None:
            return {}
        return device_specs(self.trace)

    @functools.cached_property
    def host(self) -> pd.DataFrame:
        """Events on host planes (`/host:CPU`): threads, Python, TensorFlow's executor."""
        return _rows(self.events, matches(self.events["plane_name"], planes.HOST_PLANE).to_numpy())

    @functools.cached_property
    def on_device(self) -> pd.DataFrame:
        """Every event on a GPU or TPU plane, derived lines included."""
        return _rows(self.events, matches(self.events["plane_name"], planes.DEVICE_PLANE).to_numpy())

    @functools.cached_property
    def device(self) -> pd.DataFrame:
        """The devices' own activity: on GPU planes the stream lines (else every line not derived
        from them), on TPU planes (no streams) the `XLA Ops` line."""
        on_device = self.on_device
        if on_device.empty:
            return on_device
        is_tpu = matches(on_device["plane_name"], TPU_PLANE, search=True).to_numpy()  # once per plane name
        stream = matches(on_device["line_name"], planes.STREAM_LINE).to_numpy()
        derived = (
            (on_device["line_id"].astype("int64") >= planes.DERIVED_LINE_MIN_ID)
            | on_device["line_name"].isin(planes.DERIVED_LINE_NAMES)
        ).to_numpy()
        planes_with_streams = set(on_device.loc[stream, "plane"])
        has_streams = on_device["plane"].isin(planes_with_streams).to_numpy()
        tpu_activity = is_tpu & (on_device["line_name"] == tpu_producer.ACTIVITY_LINE).to_numpy()
        keep = np.where(is_tpu, tpu_activity, np.where(has_streams, stream, ~derived))
        return on_device[keep]

    @functools.cached_property
    def kind(self) -> str:
        """`cpu`, or `gpu`/`tpu` (with a count) when device planes hold events; from the trace's planes
        when they hold none: a GPU whose activity was not recorded is still a GPU."""
        if self.device.empty:
            names = [n for n in self.planes["plane_name"].astype(str) if is_device_plane(n)]
            if not names:
                return "cpu"
        else:
            names = list(self.device["plane_name"].unique())
        found = planes.DEVICE_PLANE.match(str(names[0]))
        assert found is not None  # every name here matched DEVICE_PLANE
        kind = found.group(1).lower()
        return kind if len(names) == 1 else f"{kind} x{len(names)}"

    @functools.cached_property
    def producer(self) -> str:
        """Which kind of program wrote the trace (`producers.program_of`)."""
        return producers.program_of(self.host)

    def host_named(self, meaning: str, *, search: bool = False) -> pd.DataFrame:
        """Host events whose name has a producer `meaning` (`producers.pattern`)."""
        return self.host[matches(self.host["name"], producers.pattern(meaning), search=search)]

    @functools.cached_property
    def input_waits(self) -> pd.DataFrame:
        """Host events of the loop blocked on its iterator (`IteratorGetNext*`, infeed)."""
        return self.host_named("host_input", search=True)

    @functools.cached_property
    def input_copies(self) -> pd.DataFrame:
        """Host-to-device input copies on the devices."""
        return self.device[matches(self.device["name"], producers.pattern("device_input"), search=True)]

    @functools.cached_property
    def input_intervals(self) -> iv.Intervals:
        """Host time blocked on the iterator, plus host-to-device input copies on devices."""
        return iv.union_of(intervals(self.input_waits), intervals(self.input_copies))

    @functools.cached_property
    def device_parts(self) -> dict[str, iv.Intervals]:
        """The devices' activity cut into input copies, other copies, collectives and compute."""
        return device_parts(self.device)

    @functools.cached_property
    def launches(self) -> pd.DataFrame:
        """Host API calls that launch device work (CUDA, HIP)."""
        return self.host_named("launch")

    @functools.cached_property
    def stages(self) -> pd.DataFrame:
        """tf.data's `Iterator::` events other than the bare root, with a `depth` column."""
        events = self.events
        stages = events.loc[
            matches(events["name"], STAGE_RE), ["name", "plane", "line", "start_ns", "end_ns", "duration_ns"]
        ]
        names = (
            stages["name"].astype(str).astype("category")
            if not isinstance(stages["name"].dtype, pd.CategoricalDtype)
            else stages["name"].cat.remove_unused_categories()
        )
        root = (names != tf_producer.INPUT_ROOT).to_numpy()
        stages = stages[root]
        names = names[root].cat.remove_unused_categories()
        # Per distinct stage name, not per event: a stage repeats once per batch.
        categories = names.cat.categories.astype(str)
        codes = names.cat.codes.to_numpy()
        depth = np.array([name.count("::") for name in categories], dtype=np.int64)[codes]
        return stages.assign(name=np.asarray(categories, dtype=object)[codes], depth=depth)

    def named(self, pattern: re.Pattern, *, search: bool = False) -> pd.DataFrame:
        """Events of any plane whose name matches `pattern`."""
        return self.events[matches(self.events["name"], pattern, search=search)]

    def device_line(self, plane: int, line_name: str) -> pd.DataFrame:
        """One device plane's line of that name (its `Steps`, its `XLA Modules`), in time order."""
        on_device = self.on_device
        own = on_device[(on_device["plane"] == plane) & (on_device["line_name"] == line_name)]
        return own.sort_values("start_ns", kind="stable")

    @functools.cached_property
    def memory(self) -> pd.DataFrame:
        """The allocators' events on host planes (TensorFlow's `MemoryAllocation`/`MemoryDeallocation`),
        one row each in time order (file order within a nanosecond), as `MEMORY_COLUMNS` say; empty
        where the trace recorded none (not recorded, never no memory)."""
        stats = self.trace.memory
        if stats is None or stats.empty:
            return pd.DataFrame({name: pd.Series(dtype=kind) for name, kind in MEMORY_COLUMNS.items()})
        events = self.events.iloc[stats["event"].to_numpy()]
        names = events["name"].astype(str).to_numpy()
        allocation = names == tf_producer.MEMORY_ALLOCATION
        keep = (allocation | (names == tf_producer.MEMORY_DEALLOCATION)) & matches(
            events["plane_name"], planes.HOST_PLANE
        ).to_numpy()
        events, stats, allocation = events[keep], stats[keep], allocation[keep]
        in_use = stats["bytes_allocated"].to_numpy() + np.nan_to_num(stats["bytes_reserved"].to_numpy())
        dtype = stats["data_type"].map(
            lambda number: tf_producer.DATA_TYPES.get(int(number), "") if number == number else ""
        )
        frame = pd.DataFrame(
            {
                "allocator": self._allocator_names(stats),
                "start_ns": events["start_ns"].to_numpy(dtype=np.int64),
                "allocation": allocation,
                "bytes_in_use": in_use,
                "bytes_reserved": stats["bytes_reserved"].to_numpy(),
                "bytes_available": stats["bytes_available"].to_numpy(),
                "peak_bytes_in_use": stats["peak_bytes_in_use"].to_numpy(),
                "requested_bytes": stats["requested_bytes"].to_numpy(),
                "allocation_bytes": stats["allocation_bytes"].to_numpy(),
                "fragmentation": stats["fragmentation"].to_numpy(),
                "address": stats["addr"].to_numpy(),
                "op": events["tf_op"].astype(object).where(events["tf_op"].notna(), "").to_numpy(dtype=object),
                "region": stats["region_type"].to_numpy(),
                "dtype": dtype.to_numpy(dtype=object),
                "shape": stats["shape"].to_numpy(),
                "group_id": events["group_id"].to_numpy(dtype=np.float64, na_value=np.nan),
            }
        )
        return frame.sort_values("start_ns", kind="stable").reset_index(drop=True)

    def _allocator_names(self, stats: pd.DataFrame) -> np.ndarray:
        """Each allocator event's allocator: its `allocator_name`; PJRT's (JAX on TPUs) name none but the
        device, by `index_on_host` (else `device_ordinal`), named here as its device plane is (`TPU_0`)."""
        names = stats["allocator_name"].to_numpy(dtype=object)
        unnamed = names == ""
        if not unnamed.any():
            return names
        index = stats["index_on_host"].where(stats["index_on_host"].notna(), stats["device_ordinal"]).to_numpy()
        kinds = {
            int(found.group(2)): found.group(1)
            for name in self.trace.planes["plane_name"].astype(str)
            if (found := DEVICE_PLANE_INDEX.match(name))
        }
        names = names.copy()
        for i in np.flatnonzero(unnamed & ~np.isnan(index)):
            names[i] = f"{kinds.get(int(index[i]), 'device')}_{int(index[i])}"
        return names

    def timeline_events(self, which: str = "ops") -> pd.DataFrame:
        """The trace's own events to show beside the analysis, in file order (`TIMELINE_COLUMNS`):
        `ops`, the devices' own activity (`device`) and the host's op events (XProf's op time:
        TensorFlow ops, tf.data stages, host memcpy); `all`, every event of every plane and line."""
        if which == "all":
            return self.events[TIMELINE_COLUMNS]
        if which != "ops":
            raise ValueError(f"events to show are 'ops' or 'all', not {which!r}")
        host_ops = self.host[matches(self.host["name"], HOST_OP_RE)]
        index = self.events.index
        if isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1:
            keep = np.zeros(len(index), dtype=bool)
            keep[host_ops.index.to_numpy()] = True
            keep[self.device.index.to_numpy()] = True
            return self.events.loc[keep, TIMELINE_COLUMNS]
        return pd.concat([host_ops, self.device])[TIMELINE_COLUMNS].sort_index(kind="stable")

    @functools.cached_property
    def window(self) -> tuple[int, int]:
        """The traced window: the first event's start and the last event's end, in ns."""
        return int(self.events["start_ns"].min()), int(self.events["end_ns"].max())
