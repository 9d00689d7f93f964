"""Find TensorFlow profiler traces on disk and read them into pandas tables.

A trace is an XSpace protobuf (`*.xplane.pb`) written by `tf.profiler`. This module
knows where the profiler puts them (`<logdir>/plugins/profile/<session>/`) and turns
planes, lines, events and their stats into DataFrames, so the analyses never touch
protobuf objects. TensorFlow itself is never imported: the XSpace message class is
loaded straight from TensorFlow's generated `xplane_pb2.py` (a pure protobuf module),
which keeps `devprof analyze` fast and usable where TensorFlow cannot start.
"""

from __future__ import annotations

import gc
import importlib.util
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

TRACE_SUFFIX = ".xplane.pb"
PROFILE_SUBDIR = Path("plugins") / "profile"

# Stats copied into columns of the events table because the analyses key on them.
EVENT_STAT_COLUMNS = (
    "step_num",
    "_r",
    "steps",
    "group_id",
    "_p",
    "_c",
    "tf_function_call",
    "iter_num",
    "correlation_id",
    "tf_op",  # on device kernels: the framework op that launched them ("name:Type", "XlaModule:" for JAX)
    "hlo_op",
)
# Of those, the ones read as numbers (nullable floats); the others keep their values.
NUMERIC_STAT_COLUMNS = ("step_num", "_r", "steps", "group_id", "iter_num")


class TraceError(Exception):
    """A trace could not be found, read, or has nothing to analyse."""


class TraceNotFound(TraceError):
    """No `.xplane.pb` where the path points."""


class TraceUnreadable(TraceError):
    """A trace file is there but cannot be parsed: truncated (e.g. a full disk) or not a trace."""


@dataclass(frozen=True)
class TraceLocation:
    """Where a trace came from: the path asked for, the file read and which session."""

    requested: Path
    xplane: Path
    session: str
    run_dir: Path | None
    note: str = ""
    host_files: tuple[Path, ...] = ()  # every host's trace in the session (several workers), `xplane` first


@dataclass
class Trace:
    """An XSpace as tables; times are integer nanoseconds on the trace's clock."""

    location: TraceLocation | None
    planes: pd.DataFrame
    lines: pd.DataFrame
    events: pd.DataFrame
    stats: pd.DataFrame
    hostnames: list[str] = field(default_factory=list)

    @property
    def source(self) -> str:
        return str(self.location.xplane) if self.location else "<memory>"


def _xplane_module():
    """TensorFlow's generated XSpace module, without importing TensorFlow."""
    loaded = sys.modules.get("tensorflow.tsl.profiler.protobuf.xplane_pb2")
    if loaded is not None:
        return loaded
    cached = sys.modules.get("_devprof_xplane_pb2")
    if cached is not None:
        return cached
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise TraceError("reading traces needs the XSpace protobuf shipped with TensorFlow; TensorFlow is not installed")
    module_path = Path(list(spec.submodule_search_locations)[0]) / "tsl" / "profiler" / "protobuf" / "xplane_pb2.py"
    module_spec = importlib.util.spec_from_file_location("_devprof_xplane_pb2", module_path)
    if module_spec is None or not module_path.exists():
        raise TraceError(f"TensorFlow's XSpace protobuf module is missing: looked for {module_path}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    sys.modules["_devprof_xplane_pb2"] = module
    return module


def _sessions_under(profile_dir: Path) -> list[Path]:
    return sorted(
        (d for d in profile_dir.iterdir() if d.is_dir() and any(d.glob("*" + TRACE_SUFFIX))),
        key=lambda d: (d.name, d.stat().st_mtime),
    )


def locate_trace(path: str | Path) -> TraceLocation:
    """Resolve a user path to one `.xplane.pb`.

    Accepts a devprof run directory, a TensorBoard log folder holding
    `plugins/profile` (at any depth, as Keras writes `<logdir>/train/plugins/...`),
    one profile session folder, or the file itself. With several sessions the newest
    (session names are timestamps) is used and the note says so.
    """
    requested = Path(path)
    if not requested.exists():
        raise TraceNotFound(f"no such file or directory: {requested}")
    if requested.is_file():
        if not requested.name.endswith(TRACE_SUFFIX):
            raise TraceError(f"{requested} is not a profiler trace: expected a file named *{TRACE_SUFFIX}")
        return TraceLocation(requested, requested, requested.parent.name, _run_dir_of(requested), "", (requested,))

    direct = sorted(requested.glob("*" + TRACE_SUFFIX))
    if direct:
        note = _several_hosts_note(direct)
        return TraceLocation(requested, direct[0], requested.name, _run_dir_of(direct[0]), note, tuple(direct))

    sessions: list[Path] = []
    profile_dirs = [p for p in requested.glob("**/" + str(PROFILE_SUBDIR)) if p.is_dir()]
    if requested.resolve().match(str(PROFILE_SUBDIR)):  # the profile folder itself was given
        profile_dirs.append(requested)
    for profile_dir in sorted(profile_dirs):
        sessions.extend(_sessions_under(profile_dir))
    if not sessions:
        raise TraceNotFound(
            f"no profiler trace in {requested}: looked for */{PROFILE_SUBDIR}/<session>/*{TRACE_SUFFIX}"
            f" and *{TRACE_SUFFIX}; found {_describe_contents(requested)}"
        )
    sessions.sort(key=lambda d: (d.name, d.stat().st_mtime))
    newest = sessions[-1]
    files = sorted(newest.glob("*" + TRACE_SUFFIX))
    note = ""
    if len(sessions) > 1:
        note = f"{len(sessions)} profile sessions found; using the newest, {newest.name}"
    more = _several_hosts_note(files)
    note = "; ".join(n for n in (note, more) if n)
    return TraceLocation(requested, files[0], newest.name, _run_dir_of(files[0]), note, tuple(files))


def _several_hosts_note(files: list[Path]) -> str:
    if len(files) > 1:
        return f"{len(files)} host traces in the session: the breakdown is {files[0].name}'s, one row per worker below"
    return ""


def _run_dir_of(xplane: Path) -> Path | None:
    """The devprof run directory holding this trace, if it is one (has run.json)."""
    for parent in xplane.parents:
        if (parent / "run.json").is_file():
            return parent
        if parent == parent.parent:
            break
    return None


def _describe_contents(folder: Path) -> str:
    entries = sorted(p.name for p in folder.iterdir())
    if not entries:
        return "an empty folder"
    shown = ", ".join(entries[:8]) + (", ..." if len(entries) > 8 else "")
    return f"{len(entries)} entries ({shown})"


def load_xspace(xplane: str | Path):
    """Parse one `.xplane.pb`; a truncated or foreign file raises `TraceUnreadable`."""
    xplane = Path(xplane)
    data = xplane.read_bytes()
    if not data:
        raise TraceUnreadable(f"{xplane} is empty (0 bytes): the profiler did not finish writing it")
    space = _xplane_module().XSpace()
    try:
        space.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError or RuntimeWarning-like errors
        raise TraceUnreadable(f"{xplane} is not a readable XSpace trace ({len(data)} bytes, truncated or corrupt): {exc}") from None
    if not space.planes:
        raise TraceUnreadable(f"{xplane} holds no profiler planes ({len(data)} bytes): truncated or not an XSpace trace")
    return space


def _stat_value(stat, stat_names: dict[int, str]):
    kind = stat.WhichOneof("value")
    if kind == "ref_value":
        return stat_names.get(stat.ref_value, "")
    if kind is None:
        return None
    value = getattr(stat, kind)
    if kind == "bytes_value":
        return value.hex()
    return value


@contextmanager
def _gc_paused():
    """Pause the cyclic garbage collector while building tables from many small objects.

    Reading a trace creates millions of short-lived tuples and protobuf wrappers; the
    collector would scan them again and again (a third of the read time) to find no cycles.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _plane_and_line_tables(space) -> tuple[pd.DataFrame, pd.DataFrame]:
    plane_rows, line_rows = [], []
    for plane_index, plane in enumerate(space.planes):
        plane_rows.append(
            {"plane": plane_index, "plane_id": plane.id, "plane_name": plane.name, "lines": len(plane.lines),
             "events": sum(len(line.events) for line in plane.lines)}
        )
        for line_index, line in enumerate(plane.lines):
            line_rows.append(
                {"plane": plane_index, "line": line_index, "line_id": line.id, "line_name": line.name,
                 "display_name": line.display_name, "timestamp_ns": line.timestamp_ns, "events": len(line.events)}
            )
    planes = pd.DataFrame(plane_rows, columns=["plane", "plane_id", "plane_name", "lines", "events"])
    lines = pd.DataFrame(
        line_rows, columns=["plane", "line", "line_id", "line_name", "display_name", "timestamp_ns", "events"]
    )
    return planes, lines


def _event_name_codes(space) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Every event name in the space, sorted, and per plane its metadata ids with their codes.

    Event names live in each plane's small metadata table; events only carry the id. The
    names become the categories of the events' `name` column (sorted, so that sorting by
    name sorts as strings do); "" stands for an id that has no metadata.
    """
    per_plane = [(np.fromiter(plane.event_metadata.keys(), dtype=np.int64),
                  [meta.name for meta in plane.event_metadata.values()]) for plane in space.planes]
    categories = np.unique(np.array([""] + [name for _, names in per_plane for name in names], dtype=object))
    lookups = []
    for ids, names in per_plane:
        codes = np.searchsorted(categories, np.array(names, dtype=object)).astype(np.int64)
        order = np.argsort(ids, kind="stable")
        lookups.append((ids[order], codes[order]))
    return categories, lookups


def _codes_of(metadata_ids: np.ndarray, lookup: tuple[np.ndarray, np.ndarray], missing: int) -> np.ndarray:
    """Map event metadata ids to name codes through one plane's sorted (ids, codes)."""
    ids, codes = lookup
    if ids.size == 0:
        return np.full(metadata_ids.size, missing, dtype=np.int64)
    position = np.minimum(np.searchsorted(ids, metadata_ids), ids.size - 1)
    return np.where(ids[position] == metadata_ids, codes[position], missing)


def _event_fields(space) -> dict:
    """Per event, in plane/line/event order: plane, line, name (categorical), start and end ns.

    Times are the line's `timestamp_ns` + `offset_ps`/1000 (+ `duration_ps`/1000).
    """
    categories, lookups = _event_name_codes(space)
    missing = int(np.searchsorted(categories, ""))
    chunks: dict[str, list[np.ndarray]] = {"plane": [], "line": [], "name_code": [], "start_ns": [], "end_ns": []}
    for plane_index, plane in enumerate(space.planes):
        for line_index, line in enumerate(plane.lines):
            events = line.events
            count = len(events)
            if not count:
                continue
            metadata_ids = np.array([e.metadata_id for e in events], dtype=np.int64)
            start_ns = line.timestamp_ns + np.array([e.offset_ps for e in events], dtype=np.int64) // 1000
            chunks["plane"].append(np.full(count, plane_index, dtype=np.int32))
            chunks["line"].append(np.full(count, line_index, dtype=np.int32))
            chunks["name_code"].append(_codes_of(metadata_ids, lookups[plane_index], missing))
            chunks["start_ns"].append(start_ns)
            chunks["end_ns"].append(start_ns + np.array([e.duration_ps for e in events], dtype=np.int64) // 1000)
    dtypes = {"plane": np.int32, "line": np.int32, "name_code": np.int64, "start_ns": np.int64, "end_ns": np.int64}
    fields = {key: np.concatenate(parts) if parts else np.array([], dtype=dtypes[key]) for key, parts in chunks.items()}
    fields["name"] = pd.Categorical.from_codes(fields.pop("name_code"), categories=categories)
    return fields


def event_stats(space, names=None) -> pd.DataFrame:
    """The long table of event stats: `event` (row in the events table), `stat`, `value`.

    With `names`, only stats of those names are read (reading every stat of a large
    trace costs more than the rest of its parsing together). `stat` is categorical.
    """
    event_index, stat_name, stat_value = [], [], []
    first_event = 0
    for plane in space.planes:
        stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        wanted = {key for key, name in stat_names.items() if name in names} if names is not None else None
        for line in plane.lines:
            events = line.events
            # One pass, values read at once: holding stat messages for later costs more.
            if wanted is None:
                found = [(position, stat.metadata_id, _stat_value(stat, stat_names))
                         for position, event in enumerate(events) for stat in event.stats]
            else:
                found = [(position, stat_id, _stat_value(stat, stat_names))
                         for position, event in enumerate(events) for stat in event.stats
                         if (stat_id := stat.metadata_id) in wanted]
            event_index += [first_event + position for position, _, _ in found]
            stat_name += [stat_names[stat_id] if stat_id in stat_names else str(stat_id) for _, stat_id, _ in found]
            stat_value += [value for _, _, value in found]
            first_event += len(events)
    return pd.DataFrame({
        "event": np.asarray(event_index, dtype=np.int64),
        "stat": pd.Categorical(stat_name),
        "value": pd.Series(stat_value, dtype=object),
    })


def _stat_column(stats: pd.DataFrame, column: str, events: int) -> pd.Series:
    """One stat as an object column over all events (the event's last such stat; NA if none)."""
    values = np.full(events, pd.NA, dtype=object)
    chosen = stats[stats["stat"] == column].drop_duplicates("event", keep="last")
    values[chosen["event"].to_numpy()] = chosen["value"].to_numpy()
    return pd.Series(values, dtype=object)


def _numeric_stat_column(stats: pd.DataFrame, column: str, events: int) -> pd.Series:
    """One stat as a nullable float column; values that are not numbers become NA."""
    chosen = stats[stats["stat"] == column].drop_duplicates("event", keep="last")
    numbers = pd.to_numeric(pd.Series(chosen["value"].to_numpy(), dtype=object), errors="coerce").astype("Float64")
    values = pd.Series(pd.NA, index=pd.RangeIndex(events), dtype="Float64")
    values.iloc[chosen["event"].to_numpy()] = numbers.to_numpy()
    return values


def xspace_to_tables(space) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Planes, lines, events and the events' keyed stats of an XSpace as DataFrames.

    `events` has one row per event with its name, `start_ns`/`end_ns` (line
    `timestamp_ns` + `offset_ps`/1000) and the stats in `EVENT_STAT_COLUMNS` as
    columns; names (`name`, `plane_name`, `line_name`) are categorical, so matching
    them costs one test per distinct name. `stats` is the long table of those stats;
    `event_stats(space)` gives every stat.
    """
    planes, lines, fields, stats = _read_space(space)
    events = _events_table(planes, lines, fields)
    _add_stat_columns(events, stats)
    return planes, lines, events, stats


def _read_space(space) -> tuple[pd.DataFrame, pd.DataFrame, dict, pd.DataFrame]:
    """Everything the tables take from the XSpace: planes, lines, event fields and the keyed stats."""
    with _gc_paused():
        planes, lines = _plane_and_line_tables(space)
        fields = _event_fields(space)
        stats = event_stats(space, EVENT_STAT_COLUMNS)
    return planes, lines, fields, stats


def _add_stat_columns(events: pd.DataFrame, stats: pd.DataFrame) -> None:
    for column in EVENT_STAT_COLUMNS:
        to_column = _numeric_stat_column if column in NUMERIC_STAT_COLUMNS else _stat_column
        events[column] = to_column(stats, column, len(events))


def _events_table(planes: pd.DataFrame, lines: pd.DataFrame, fields: dict) -> pd.DataFrame:
    """Event fields joined with their plane's name and their line's name and id."""
    plane_of, line_of = fields["plane"], fields["line"]
    line_row = np.zeros((len(planes), int(lines["line"].max()) + 1 if len(lines) else 0), dtype=np.int64)
    line_row[lines["plane"].to_numpy(dtype=np.int64), lines["line"].to_numpy(dtype=np.int64)] = np.arange(len(lines))
    row = line_row[plane_of, line_of]
    events = pd.DataFrame(
        {
            "plane": plane_of,
            "line": line_of,
            "name": fields["name"],
            "start_ns": fields["start_ns"],
            "end_ns": fields["end_ns"],
            "plane_name": _categorical_of(planes["plane_name"].to_numpy(dtype=object), plane_of),
            "line_name": _categorical_of(lines["line_name"].to_numpy(dtype=object), row),
            "line_id": lines["line_id"].to_numpy(dtype=np.int64)[row],
        }
    )
    events["duration_ns"] = events["end_ns"] - events["start_ns"]
    return events


def _categorical_of(names: np.ndarray, rows: np.ndarray) -> pd.Categorical:
    """`names[rows]` as a categorical with sorted distinct categories, without touching each row's string."""
    if names.size == 0:
        return pd.Categorical.from_codes(np.zeros(0, dtype=np.int64), categories=[])
    categories, codes = np.unique(names, return_inverse=True)
    return pd.Categorical.from_codes(np.asarray(codes, dtype=np.int64)[rows], categories=categories)


def read_trace(path: str | Path) -> Trace:
    """Locate and parse a trace; see `locate_trace` for the accepted paths."""
    location = locate_trace(path)
    space = load_xspace(location.xplane)
    hostnames = list(space.hostnames)
    planes, lines, fields, stats = _read_space(space)
    # The parsed protobuf is the largest thing in memory (about 140 bytes per event): freed before
    # the events table is built, and the event fields once they are in it, a quarter less at the peak.
    del space
    events = _events_table(planes, lines, fields)
    del fields
    _add_stat_columns(events, stats)
    if events.empty:
        raise TraceError(f"{location.xplane} has {len(planes)} planes but no events: nothing was profiled")
    return Trace(location, planes, lines, events, stats, hostnames)
