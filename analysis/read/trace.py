"""Find TensorFlow profiler traces on disk and read them into pandas tables.

A trace is an XSpace protobuf (`*.xplane.pb`) written by `tf.profiler`, JAX or any XLA
program. This module knows where the profiler puts them (`<logdir>/plugins/profile/<session>/`)
and turns planes, lines, events and their stats into DataFrames, so the analyses never touch
protobuf objects. `analysis.xplane_wire` decodes the file straight into columns: reading a
trace needs neither TensorFlow nor a protobuf library.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.read import run_files
from analysis.read import xplane_wire as wire
from analysis.read.locate import (  # noqa: F401 - where a trace lies, and the errors of reading one, are also trace's
    GZIP_SUFFIX,
    PROFILE_SUBDIR,
    TRACE_SUFFIX,
    TraceError,
    TraceLocation,
    TraceNotFound,
    TraceUnreadable,
    file_kind,
    locate_trace,
)
from analysis.read.run_files import warn
from analysis.read.stat_names import (  # also trace's own names: the stats read_trace decodes
    EVENT_STAT_COLUMNS,
    ID_STAT_COLUMNS,
    MEMORY_KEY_STATS,
    MEMORY_STAT_COLUMNS,
    MEMORY_TEXT_STATS,
    NUMERIC_STAT_COLUMNS,
    READ_NUMBERS,
    READ_STATS,
)

if TYPE_CHECKING:
    from analysis.parallel import Helpers

TRACE_MAX_BYTES = wire.TRACE_MAX_BYTES
# Event times no profiler writes: a negative duration, a start more than a second before its
# line's start, a line's start before 1970 or past 2100, or a start or end more than a day from the middle of its plane (a profile
# session lasts seconds to minutes). Such events are dropped with one warning naming the trace.
EARLIEST_OFFSET_PS = -(10**12)
# A line's clock before 1970 or past 2100: no profiler's (and past it, a start plus its offset and
# duration overflows 64 bits): its events' times are impossible too.
LATEST_LINE_START_NS = 4_102_444_800 * 10**9
FARTHEST_FROM_TRACE_NS = 24 * 3600 * 10**9
# More of the events than this with impossible times: the trace is refused rather than analysed without them.
MOST_IMPOSSIBLE_SHARE = 0.1


@dataclass
class Trace:
    """An XSpace as tables; times are integer nanoseconds on the trace's clock."""

    location: TraceLocation | None
    planes: pd.DataFrame
    lines: pd.DataFrame
    events: pd.DataFrame
    known_stats: pd.DataFrame | None = None
    hostnames: list[str] = field(default_factory=list)
    kept_events: np.ndarray | None = None  # the file's event numbers of `events`' rows, where some were dropped
    memory: pd.DataFrame | None = None  # `event` (row of `events`) and its `MEMORY_STAT_COLUMNS`; None: not read

    @property
    def source(self) -> str:
        return str(self.location.xplane) if self.location else "<memory>"

    @property
    def stats(self) -> pd.DataFrame:
        """The long table of the events' `EVENT_STAT_COLUMNS` stats (`event`, `stat`, `value`),
        read again from the file when asked for: the analysis needs only the events' columns."""
        if self.known_stats is None:
            if self.location is None:
                raise TraceError("a trace made in memory has no file to read its stats from")
            stats = event_stats(self.location.xplane, EVENT_STAT_COLUMNS)
            if self.kept_events is not None:  # events with impossible times were dropped: renumber
                number = stats["event"].to_numpy()
                keep = np.isin(number, self.kept_events)
                stats = stats[keep].reset_index(drop=True)
                stats["event"] = np.searchsorted(self.kept_events, number[keep])
            self.known_stats = stats
        return self.known_stats


def _open_trace(xplane: Path):
    """The trace's bytes in memory (`wire.read_into_memory`), after checking it is a regular file within
    `TRACE_MAX_BYTES` (a FIFO is opened without waiting for a writer, a device is never read)."""
    try:
        fd = os.open(xplane, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise TraceUnreadable(f"{xplane}: cannot read it ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TraceUnreadable(f"{xplane} is {file_kind(info.st_mode)}, not a trace file: not read")
        if not info.st_size:
            raise TraceUnreadable(f"{xplane} is empty (0 bytes): the profiler did not finish writing it")
        if info.st_size > TRACE_MAX_BYTES:
            raise TraceUnreadable(
                f"{xplane}: {info.st_size:,} bytes, above the {TRACE_MAX_BYTES // 2**30} GiB devprof reads from a trace"
            )
        return info.st_size, wire.read_into_memory(fd, info.st_size)
    except wire.WireError as exc:
        raise _unreadable(xplane, info.st_size, str(exc)) from None
    except OSError as exc:
        raise TraceUnreadable(f"{xplane}: cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _unreadable(xplane: Path, size: int, why: str) -> TraceUnreadable:
    return TraceUnreadable(f"{xplane} is not a readable XSpace trace ({size} bytes, truncated or corrupt): {why}")


def _decode_file(xplane: Path, names, number_names=(), helpers: Helpers | None = None) -> wire.DecodedSpace:
    """Decode one `.xplane.pb`; a truncated or foreign file raises `TraceUnreadable`. `helpers`: a decode
    they began for this file is finished, and a large trace's events are decoded on two cores."""
    begun = helpers.take_begun(xplane, names, number_names) if helpers is not None else None
    if begun is not None:
        size = len(begun.buf)
        try:
            space = begun.located.finish(number_names)
        except wire.WireError as exc:
            raise _unreadable(xplane, size, str(exc)) from None
        finally:
            begun.close()
            del begun
    else:
        size, buffer = _open_trace(xplane)
        try:
            space = _decode(
                buffer,
                names,
                lambda why: _unreadable(xplane, size, why),
                number_names,
                helpers.child if helpers is not None else None,
            )
        finally:
            wire.close_map(buffer)
    if not space.planes:
        raise TraceUnreadable(f"{xplane} holds no profiler planes ({size} bytes): truncated or not an XSpace trace")
    return space


def _decode(buf, names, error, number_names=(), fork: wire.ForkChild | None = None) -> wire.DecodedSpace:
    try:
        return wire.decode_xspace(buf, names, number_names, fork)
    except wire.WireError as exc:
        raise error(str(exc)) from None


def _space_bytes(source):
    """Bytes of an XSpace given as bytes, as a protobuf message, or as a file path."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if hasattr(source, "SerializeToString"):
        return source.SerializeToString()
    return None


def _decoded(source, names) -> wire.DecodedSpace:
    data = _space_bytes(source)
    if data is None:
        return _decode_file(Path(source), names)
    return _decode(data, names, lambda why: TraceUnreadable(f"not a readable XSpace ({len(data)} bytes): {why}"))


def event_stats(source, names=None) -> pd.DataFrame:
    """The long table of event stats of a trace (a path, XSpace bytes or message): `event`, `stat`, `value`.

    `event` is the row in the events table, `stat` the stat's name (categorical), `value` what
    protobuf gives (a number or a string; bytes as hex; a reference as the name it refers to).
    With `names`, only stats of those names are read.
    """
    return _stats_table(_decoded(source, names))


def _stats_table(space: wire.DecodedSpace) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "event": space.events.stat_event,
            "stat": pd.Categorical.from_codes(space.stat_name_code, categories=space.stat_names),
            "value": pd.Series(space.stat_values, dtype=object),
        }
    )


def plane_metadata(source, wanted_plane=None, event_stat_names=()) -> list[wire.PlaneMetadata]:
    """Each plane's own stats and its event metadata's stats named in `event_stat_names`, from a
    trace (a `Trace` read from a file, a path, XSpace bytes or message). A scan of the metadata
    alone, made only when asked: reading a trace's events never decodes them.
    `wanted_plane(name) -> bool` picks planes (None: all)."""
    if isinstance(source, Trace):
        if source.location is None:
            raise TraceError("a trace made in memory has no file to read its metadata from")
        source = source.location.xplane
    data = _space_bytes(source)
    if data is not None:
        try:
            return wire.decode_metadata(data, wanted_plane, event_stat_names)
        except wire.WireError as exc:
            raise TraceUnreadable(f"not a readable XSpace ({len(data)} bytes): {exc}") from None
    xplane = Path(source)
    size, buffer = _open_trace(xplane)
    try:
        return wire.decode_metadata(buffer, wanted_plane, event_stat_names)
    except wire.WireError as exc:
        raise _unreadable(xplane, size, str(exc)) from None
    finally:
        wire.close_map(buffer)


# A device plane's stated capabilities, as the profiler writes them (XProf's `kDevCap*` stats):
# `peak_teraflops_per_second` and `peak_hbm_bw_gigabytes_per_second` where the plane states its peaks.
DEVICE_SPEC_STATS = (
    "memory_bandwidth",
    "clock_rate",
    "core_count",
    "memory_size",
    "compute_cap_major",
    "compute_cap_minor",
    "device_vendor",
    "peak_teraflops_per_second",
    "peak_hbm_bw_gigabytes_per_second",
)


@dataclass(frozen=True)
class DeviceSpecs:
    """What a device plane states about its device (not measured); NaN or "" where it does not say."""

    plane: str
    vendor: str = ""
    memory_bandwidth_bytes_per_second: float = float("nan")
    clock_rate_hz: float = float("nan")  # written in kHz
    core_count: float = float("nan")  # SMs (NVIDIA) or compute units (AMD)
    memory_bytes: float = float("nan")
    compute_capability: str = ""  # "major.minor"
    peak_flops_per_second: float = float("nan")  # written in TFLOP/s


def _stated(stats: dict, name: str, scale: float = 1.0) -> float:
    value = stats.get(name)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value) * scale
    return float("nan")


def device_specs(source) -> dict[str, DeviceSpecs]:
    """Per plane name, the specs a plane states (GPU planes carry them; planes stating none are
    left out), from a `Trace` read from a file, a path, XSpace bytes or message."""
    specs = {}
    for plane in plane_metadata(source):
        stats = plane.stats
        if not any(name in stats for name in DEVICE_SPEC_STATS):
            continue
        major, minor = stats.get("compute_cap_major"), stats.get("compute_cap_minor")
        capability = f"{major}.{minor}" if isinstance(major, int) and isinstance(minor, int) else ""
        vendor = stats.get("device_vendor")
        bandwidth = _stated(stats, "memory_bandwidth")
        if bandwidth != bandwidth:  # a TPU plane states its HBM's instead
            bandwidth = _stated(stats, "peak_hbm_bw_gigabytes_per_second", 1e9)
        specs[plane.name] = DeviceSpecs(
            plane.name,
            vendor if isinstance(vendor, str) else "",
            bandwidth,
            _stated(stats, "clock_rate", 1e3),
            _stated(stats, "core_count"),
            _stated(stats, "memory_size"),
            capability,
            _stated(stats, "peak_teraflops_per_second", 1e12),
        )
    return specs


def _plane_and_line_tables(space: wire.DecodedSpace) -> tuple[pd.DataFrame, pd.DataFrame]:
    events_of_plane = np.zeros(len(space.planes), dtype=np.int64)
    lines_of_plane = np.zeros(len(space.planes), dtype=np.int64)
    for line in space.lines:
        events_of_plane[line.plane] += line.events
        lines_of_plane[line.plane] += 1
    planes = pd.DataFrame(
        {
            "plane": range(len(space.planes)),
            "plane_id": [plane.plane_id for plane in space.planes],
            "plane_name": [plane.name for plane in space.planes],
            "lines": lines_of_plane.tolist(),
            "events": events_of_plane.tolist(),
        },
        columns=["plane", "plane_id", "plane_name", "lines", "events"],
    )
    lines = pd.DataFrame(
        [
            (line.plane, line.line, line.line_id, line.name, line.display_name, line.timestamp_ns, line.events)
            for line in space.lines
        ],
        columns=["plane", "line", "line_id", "line_name", "display_name", "timestamp_ns", "events"],
    )
    return planes, lines


def _event_name_codes(space: wire.DecodedSpace, plane_of: np.ndarray) -> pd.Categorical:
    """Each event's name, resolved once per (plane, metadata id), as a categorical.

    The categories are every event name of the space, sorted (so that sorting by name sorts
    as strings do); "" stands for an id that has no metadata.
    """
    names = [""] + [name for plane in space.planes for name in plane.event_names.values()]
    categories = np.unique(np.array(names, dtype=object))
    missing = int(np.searchsorted(categories, ""))
    metadata_id = space.events.metadata_id
    codes = np.full(metadata_id.size, missing, dtype=np.int64)
    bounds = np.searchsorted(plane_of, np.arange(len(space.planes) + 1))  # events are in plane order
    for index, plane in enumerate(space.planes):
        first, last = bounds[index], bounds[index + 1]
        if first == last or not plane.event_names:
            continue
        ids = np.fromiter(plane.event_names.keys(), dtype=np.int64, count=len(plane.event_names))
        plane_codes = np.searchsorted(categories, np.array(list(plane.event_names.values()), dtype=object))
        order = np.argsort(ids, kind="stable")
        ids, plane_codes = ids[order], np.append(plane_codes[order], missing)
        codes[first:last] = plane_codes[wire.positions(ids, metadata_id[first:last])]  # -1: the appended `missing`
    return pd.Categorical.from_codes(codes, categories=categories)


def _events_table(
    space: wire.DecodedSpace, planes: pd.DataFrame, lines: pd.DataFrame, consume: bool = False
) -> tuple[pd.DataFrame, np.ndarray]:
    """Events with their names, times, plane and line; times are the line's `timestamp_ns` +
    `offset_ps`/1000 (+ `duration_ps`/1000). `consume`: drop each decoded column once used.
    Also returns which events have impossible times (`_impossible_times`)."""
    decoded = space.events
    row = decoded.line_row
    plane_of = lines["plane"].to_numpy(dtype=np.int32)[row]
    names = _event_name_codes(space, plane_of)
    line_start = lines["timestamp_ns"].to_numpy(dtype=np.int64)[row]
    start_ns = line_start + decoded.offset_ps // 1000
    duration_ns = decoded.duration_ps // 1000
    impossible = (
        (decoded.duration_ps < 0)
        | (decoded.offset_ps < EARLIEST_OFFSET_PS)
        | (line_start < 0)
        | (line_start > LATEST_LINE_START_NS)
    )
    if consume:
        decoded.release("metadata_id", "offset_ps", "duration_ps")
    end_ns = start_ns + duration_ns
    impossible |= _far_from_their_plane(start_ns, end_ns, plane_of, len(planes))
    line_ids = lines["line_id"].to_numpy(dtype=np.int64)
    events = pd.DataFrame(
        {
            "plane": plane_of.astype(_smallest_int(len(planes))),
            "line": lines["line"].to_numpy(dtype=np.int32)[row],
            "name": names,
            "start_ns": start_ns,
            "end_ns": end_ns,
            "plane_name": _categorical_of(planes["plane_name"].to_numpy(dtype=object), plane_of),
            "line_name": _categorical_of(lines["line_name"].to_numpy(dtype=object), row),
            # thread ids: 64 bits in the format, almost always fewer in fact
            "line_id": line_ids.astype(_smallest_int(*line_ids.tolist()))[row],
            "duration_ns": duration_ns,
        },
        copy=False,
    )
    if consume:
        decoded.release("line_row")
        wire.release_freed_memory()
    return events, impossible


def _far_from_their_plane(start_ns: np.ndarray, end_ns: np.ndarray, plane_of: np.ndarray, planes: int) -> np.ndarray:
    """Events starting or ending more than `FARTHEST_FROM_TRACE_NS` from the median event start of
    their plane (each plane on its own: a device may keep its own clock)."""
    far = np.zeros(start_ns.size, dtype=bool)
    bounds = np.searchsorted(plane_of, np.arange(planes + 1))  # events are in plane order
    for first, last in zip(bounds[:-1], bounds[1:]):
        if first == last:
            continue
        middle = int(np.median(start_ns[first:last]))
        far[first:last] = (start_ns[first:last] < middle - FARTHEST_FROM_TRACE_NS) | (
            end_ns[first:last] > middle + FARTHEST_FROM_TRACE_NS
        )
    return far


def _drop_impossible(
    events: pd.DataFrame, impossible: np.ndarray, source: str
) -> tuple[pd.DataFrame, np.ndarray | None]:
    """`events` without those with impossible times, and the file's numbers of the rows kept (None:
    none dropped); one warning names the trace, how many and which names."""
    if not impossible.any():
        return events, None
    names = [str(name) for name in pd.unique(events["name"].to_numpy()[impossible])]
    shown = ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
    what = (
        f"{int(impossible.sum())} of {len(events)} events with impossible times (a negative duration, a start "
        f"before its timeline's, or more than a day from the rest of its plane: {shown})"
    )
    if impossible.sum() > len(events) * MOST_IMPOSSIBLE_SHARE:
        raise TraceUnreadable(f"{source} is corrupt: {what}")
    warn(f"{source}: dropped {what}; the trace is corrupt there")
    kept = np.flatnonzero(~impossible)
    return events.iloc[kept].reset_index(drop=True), kept


def _smallest_int(*values: int) -> type:
    """int16, int32 or int64: the narrowest that holds every value (and -1)."""
    low, high = min(values, default=0), max(values, default=0)
    for kind in (np.int16, np.int32):
        if np.iinfo(kind).min <= min(low, -1) and high <= np.iinfo(kind).max:
            return kind
    return np.int64


def _categorical_of(names: np.ndarray, rows: np.ndarray) -> pd.Categorical:
    """`names[rows]` as a categorical with sorted distinct categories, without touching each row's string."""
    if names.size == 0:
        return pd.Categorical.from_codes(np.zeros(0, dtype=np.int64), categories=[])
    categories, codes = np.unique(names, return_inverse=True)
    return pd.Categorical.from_codes(np.asarray(codes, dtype=np.int64)[rows], categories=categories)


def _add_stat_columns(events: pd.DataFrame, space: wire.DecodedSpace) -> None:
    """One column per stat of `EVENT_STAT_COLUMNS`: the event's last such stat, NA where it has none.

    Narrow by kind, since a trace has millions of events and most stats are on few of them:
    numbers as nullable floats, ids as nullable unsigned integers, texts as categoricals."""
    count = len(events)
    stat_event = space.events.stat_event
    for column in EVENT_STAT_COLUMNS:
        if column in space.stat_names:
            rows = np.flatnonzero(space.stat_name_code == space.stat_names.index(column))
        else:
            rows = np.zeros(0, dtype=np.int64)
        of_event = stat_event[rows]
        last = np.append(of_event[1:] != of_event[:-1], True) if rows.size else np.zeros(0, dtype=bool)
        rows, of_event = rows[last], of_event[last]  # stats are in event order: keep each event's last
        if column in NUMERIC_STAT_COLUMNS:
            events[column] = _numeric_column(space, rows, of_event, count)
        elif column in ID_STAT_COLUMNS:
            events[column] = _id_column(space, rows, of_event, count)
        else:
            events[column] = _text_column(space.stat_values[rows], of_event, count)


def _id_column(space: wire.DecodedSpace, rows: np.ndarray, of_event: np.ndarray, count: int):
    """An id stat as nullable uint64 (its 64 bits as written); as Python objects where some
    value is not an integer."""
    kind, number = space.events.stat_kind[rows], space.events.stat_number[rows]
    integer = (kind == wire.STAT_UINT64) | (kind == wire.STAT_INT64)
    if integer.all():
        values = np.zeros(count, dtype=np.uint64)
        values[of_event] = number
        missing = np.ones(count, dtype=bool)
        missing[of_event] = False
        return pd.arrays.IntegerArray(values, missing)
    boxed = space.stat_values[rows].copy()
    for stat_kind, as_type in (
        (wire.STAT_UINT64, np.uint64),
        (wire.STAT_INT64, np.int64),
        (wire.STAT_DOUBLE, np.float64),
    ):
        chosen = np.flatnonzero(kind == stat_kind)
        boxed[chosen] = number[chosen].view(as_type).astype(object)
    values = np.full(count, pd.NA, dtype=object)
    values[of_event] = boxed
    return pd.Series(values, dtype=object, copy=False)


def _text_column(found: np.ndarray, of_event: np.ndarray, count: int):
    """A text stat as a categorical (a few distinct names over millions of events); as Python
    objects where the values are not all strings."""
    first_codes, distinct = pd.factorize(found, use_na_sentinel=False)  # a missing value is one too: not a string
    if not all(isinstance(value, str) for value in distinct):
        values = np.full(count, pd.NA, dtype=object)
        values[of_event] = found
        return pd.Series(values, dtype=object, copy=False)
    order = np.argsort(distinct.astype(object), kind="stable")  # sorted categories sort as the strings do
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    codes = np.full(count, -1, dtype=np.int32)
    codes[of_event] = rank[first_codes]
    return pd.Categorical.from_codes(codes, categories=pd.Index(distinct.astype(object)[order], dtype=object))


def _numeric_column(
    space: wire.DecodedSpace, rows: np.ndarray, of_event: np.ndarray, count: int
) -> pd.arrays.FloatingArray:
    """A stat as nullable floats: numbers as they are, strings parsed as numbers (NA if they are not)."""
    kind, number = space.events.stat_kind[rows], space.events.stat_number[rows]
    numbers = np.full(rows.size, np.nan)
    for stat_kind, as_type in (
        (wire.STAT_UINT64, np.uint64),
        (wire.STAT_INT64, np.int64),
        (wire.STAT_DOUBLE, np.float64),
    ):
        chosen = kind == stat_kind
        numbers[chosen] = number[chosen].view(as_type).astype(np.float64)
    other = np.flatnonzero((kind != wire.STAT_UINT64) & (kind != wire.STAT_INT64) & (kind != wire.STAT_DOUBLE))
    if other.size:  # strings, references and stats without a value
        parsed = pd.to_numeric(pd.Series(space.stat_values[rows[other]], dtype=object), errors="coerce")
        numbers[other] = parsed.astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)
    values = np.full(count, np.nan)
    values[of_event] = numbers
    if of_event.size * 4 < count:  # on few events (markers, groups): only those are stored
        return pd.arrays.SparseArray(values, fill_value=np.nan)
    return pd.arrays.FloatingArray(values, np.isnan(values))


def _last_stats(space: wire.DecodedSpace, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(rows of the decoded stats, their events) of each event's last `name` stat, in event order."""
    if name not in space.stat_names:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    rows = np.flatnonzero(space.stat_name_code == space.stat_names.index(name))
    of_event = space.events.stat_event[rows]
    last = np.append(of_event[1:] != of_event[:-1], True) if rows.size else np.zeros(0, dtype=bool)
    return rows[last], of_event[last]


def _stat_numbers(space: wire.DecodedSpace, rows: np.ndarray) -> np.ndarray:
    """The decoded stats' values as float64 (NaN where a value is no number)."""
    kind, number = space.events.stat_kind[rows], space.events.stat_number[rows]
    numbers = np.full(rows.size, np.nan)
    for stat_kind, as_type in (
        (wire.STAT_UINT64, np.uint64),
        (wire.STAT_INT64, np.int64),
        (wire.STAT_DOUBLE, np.float64),
    ):
        chosen = kind == stat_kind
        numbers[chosen] = number[chosen].view(as_type).astype(np.float64)
    other = np.flatnonzero(~np.isin(kind, (wire.STAT_UINT64, wire.STAT_INT64, wire.STAT_DOUBLE)))
    if other.size:
        parsed = pd.to_numeric(pd.Series(space.stat_values[rows[other]], dtype=object), errors="coerce")
        numbers[other] = parsed.astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)
    return numbers


def memory_stats(space: wire.DecodedSpace, kept: np.ndarray | None = None) -> pd.DataFrame:
    """The `MEMORY_STAT_COLUMNS` of each event that names its allocator (or its device): `event` (its row in the
    events table, renumbered where `kept` says which events the table kept), numbers as float64 (NaN:
    not stated, never 0), texts as str ("" where not stated)."""
    events = np.unique(np.concatenate([_last_stats(space, key)[1] for key in MEMORY_KEY_STATS]))
    table: dict[str, np.ndarray] = {"event": events}
    for column in MEMORY_STAT_COLUMNS:
        rows, of_event = _last_stats(space, column)
        at = np.searchsorted(events, of_event)
        mine = at < events.size
        mine[mine] = events[at[mine]] == of_event[mine]
        rows, at = rows[mine], at[mine]
        if column in MEMORY_TEXT_STATS:
            values = np.full(events.size, "", dtype=object)
            values[at] = [str(value) if value is not None else "" for value in space.stat_values[rows]]
        else:
            values = np.full(events.size, np.nan)
            values[at] = _stat_numbers(space, rows)
        table[column] = values
    frame = pd.DataFrame(table)
    if kept is not None:
        frame = frame[np.isin(events, kept)].reset_index(drop=True)
        frame["event"] = np.searchsorted(kept, frame["event"].to_numpy())
    return frame


def _tables(space: wire.DecodedSpace) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    planes, lines = _plane_and_line_tables(space)
    events, impossible = _events_table(space, planes, lines)
    _add_stat_columns(events, space)
    stats = _stats_table(space)
    events, kept = _drop_impossible(events, impossible, "the trace")
    if kept is not None:
        keep = np.isin(stats["event"].to_numpy(), kept)
        stats = stats[keep].reset_index(drop=True)
        stats["event"] = np.searchsorted(kept, stats["event"].to_numpy())
    return planes, lines, events, stats


def _event_tables(
    space: wire.DecodedSpace, source: str
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, np.ndarray | None]:
    """Planes, lines, events (without those with impossible times) and the file's numbers of the
    events kept (None: all); the decoded columns are let go as the table takes them, so that the
    decoder's arrays and the table are not both held whole."""
    planes, lines = _plane_and_line_tables(space)
    events, impossible = _events_table(space, planes, lines, consume=True)
    _add_stat_columns(events, space)
    events, kept = _drop_impossible(events, impossible, source)
    return planes, lines, events, kept


def xspace_to_tables(source) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Planes, lines, events and the events' keyed stats of an XSpace (a path, bytes or message).

    `events` has one row per event with its name, `start_ns`/`end_ns` (line
    `timestamp_ns` + `offset_ps`/1000) and the stats in `EVENT_STAT_COLUMNS` as
    columns; names (`name`, `plane_name`, `line_name`) are categorical, so matching
    them costs one test per distinct name. `stats` is the long table of those stats;
    `event_stats(source)` gives every stat.
    """
    return _tables(_decoded(source, EVENT_STAT_COLUMNS))


def read_trace(path: str | Path, helpers: Helpers | None = None) -> Trace:
    """Locate and parse a trace; see `locate_trace` for the accepted paths. `helpers`: lend the decode
    another core (`analysis.parallel`)."""
    location = locate_trace(path)
    space = _decode_file(location.xplane, READ_STATS, READ_NUMBERS, helpers)
    planes, lines, events, kept = _event_tables(space, str(location.xplane))
    memory = memory_stats(space, kept)
    hostnames = space.hostnames
    del space
    wire.release_freed_memory()
    if events.empty:
        raise TraceError(f"{location.xplane} has {len(planes)} planes but no events: nothing was profiled")
    _warn_repeated_planes(planes, location.xplane)
    return Trace(location, planes, lines, events, hostnames=hostnames, kept_events=kept, memory=memory)


def _warn_repeated_planes(planes: pd.DataFrame, xplane: Path) -> None:
    """One warning where two planes with events share a name (a trace copied into itself): their events
    are read as one plane's, so its steps and time may count twice; said, never in silence."""
    busy = planes[planes["events"] > 0]
    repeated = busy["plane_name"][busy["plane_name"].duplicated()].astype(str).unique().tolist()
    if repeated:
        run_files.warn(
            f"{xplane}: {', '.join(repr(name) for name in repeated[:3])} appear as several planes: their "
            "events are read together, and steps found on them may count twice"
        )
