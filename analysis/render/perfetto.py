"""The analysis as a Perfetto trace (`devprof analyze --perfetto FILE`, `Analysis.to_perfetto`).

One process per worker or host, each with:

- `steps`: a slice per step (its parts in ms and, for a slow step, its cause as arguments) with one
  child track per part (`input`, `compute`, `collective`, `host`): the step's parts laid end to end in
  that order, so each step's part slices sum to the step (their lengths, not when they happened);
- `findings`: an instant per finding, at the time it is about (else the first steady step's start);
- one track per device with its `busy` and `idle` spans, the trace's own lines of that device beneath;
- a counter track per sampler column (CPU, process CPU, RSS, GPU utilization and memory) and per
  allocator (bytes in use);
- the trace's own events (ops or all), one track per line of the trace.

Written with the `perfetto` package's `StreamingTraceProtoBuilder` as Perfetto's documentation describes
synthetic TrackEvent traces (a process track, named child tracks, counter tracks, names interned on one
sequence); the many op, span and counter packets go to the same stream a chunk at a time
(`perfetto_packets`), so memory is bounded by a chunk, never by the trace. A pure function of the
`ProcessTimeline`s it is given (analysis/timeline.py makes them): nothing here computes a figure.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.render import perfetto_packets as packets
from analysis.render.files import is_stream, open_stream, temporary_path

EVENT_CHOICES = ("ops", "all", "none")
PARTS = (("input", "input_ms"), ("compute", "compute_ms"), ("collective", "collective_ms"), ("host", "host_ms"))
STEP_ARGUMENTS = ("step_ms", "input_ms", "compute_ms", "collective_ms", "host_ms", "compile_ms")
FINDING_ARGUMENTS = ("severity", "evidence", "advice", "saving_ms", "saving_pct", "saving_basis")
SEQUENCE_ID = 1
CHUNK = 1 << 16  # packets encoded at once: a few MB of buffers
NS_PER_MS = 1_000_000


@dataclass(frozen=True)
class Counter:
    """One counter track: a value at each time (ns on the trace's clock)."""

    name: str
    unit: str  # "bytes", "%" or ""
    times_ns: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class ProcessTimeline:
    """What one worker's (or host's) process shows."""

    name: str
    # step, start_ns, end_ns and STEP_ARGUMENTS; `cause` and `excess_ms` where the step is an outlier
    steps: pd.DataFrame
    devices: pd.DataFrame  # device, start_ns, end_ns, busy: each device's busy and idle spans
    findings: list[dict] = field(default_factory=list)  # the findings' fields and `at_ns`
    counters: list[Counter] = field(default_factory=list)
    # plane, line, plane_name, line_name, name, start_ns, end_ns; None: not asked for
    events: pd.DataFrame | None = None


@dataclass
class Written:
    """What a trace holds: the numbers `devprof analyze` says and the bench divides by its time."""

    path: Path
    processes: int = 0
    tracks: int = 0
    slices: int = 0
    instants: int = 0
    counter_values: int = 0

    @property
    def events(self) -> int:
        return self.slices + self.instants + self.counter_values


def write(processes: Iterable[ProcessTimeline], path: str | Path) -> Written:
    """The trace of `processes` in `path`, complete or not at all (written beside it, then renamed); a
    stream (/dev/null, a pipe) is written into. `processes` is read one at a time."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder")
    if is_stream(path):
        with open_stream(path) as stream:
            return _write_all(processes, stream, path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as stream:
            written = _write_all(processes, stream, path)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return written


def _write_all(processes: Iterable[ProcessTimeline], stream, path: Path) -> Written:
    writer = _Writer(stream, Written(path))
    for pid, process in enumerate(processes, start=1):
        writer.process(pid, process)
    return writer.written


class _Writer:
    def __init__(self, stream, written: Written):
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as protos
        from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

        self.protos = protos
        self.builder = StreamingTraceProtoBuilder(stream)
        self.stream = stream  # the builder's own: the chunks of packets go after its packets
        self.fields = packets.Fields()
        self.written = written
        self.next_uuid = 1
        self.next_iid = 1
        self.cleared = False

    # -- packets made with the builder

    def packet(self):
        packet = self.builder.create_packet()
        packet.trusted_packet_sequence_id = SEQUENCE_ID
        if not self.cleared:  # the first packet starts the sequence's interned names
            packet.sequence_flags = self.protos.TracePacket.SequenceFlags.Value("SEQ_INCREMENTAL_STATE_CLEARED")
            packet.first_packet_on_sequence = True
            self.cleared = True
        else:
            packet.sequence_flags = self.protos.TracePacket.SequenceFlags.Value("SEQ_NEEDS_INCREMENTAL_STATE")
        return packet

    def track(
        self,
        name: str | None,
        parent: int | None = None,
        rank: int | None = None,
        *,
        pid: int | None = None,
        unit: str | None = None,
        ordered: bool = False,
    ) -> int:
        """A new track's uuid, its descriptor written; `unit`: a counter track."""
        uuid = self.next_uuid
        self.next_uuid += 1
        packet = self.packet()
        track = packet.track_descriptor
        track.uuid = uuid
        if pid is not None:
            track.process.pid = pid
            track.process.process_name = name or f"process {pid}"
        elif name is not None:
            track.name = name
        if parent is not None:
            track.parent_uuid = parent
        if rank is not None:
            track.sibling_order_rank = rank
        if ordered:
            track.child_ordering = self.protos.TrackDescriptor.ChildTracksOrdering.Value("EXPLICIT")
        # tracks of one name under one parent stay apart (two lines called "Stream #1")
        track.sibling_merge_behavior = self.protos.TrackDescriptor.SiblingMergeBehavior.Value(
            "SIBLING_MERGE_BEHAVIOR_NONE"
        )
        if unit is not None:
            if unit == "bytes":
                track.counter.unit = self.protos.CounterDescriptor.Unit.Value("UNIT_SIZE_BYTES")
            elif unit:
                track.counter.unit_name = unit
            else:
                track.counter.SetInParent()
        self.builder.write_packet(packet)
        self.written.tracks += 1
        return uuid

    def intern(self, names) -> int:
        """The iid of the first of `names` (the others follow it), written as the sequence's interned names."""
        first = self.next_iid
        if not len(names):
            return first
        packet = self.packet()
        for offset, name in enumerate(names):
            entry = packet.interned_data.event_names.add()
            entry.iid = first + offset
            entry.name = str(name)
        self.next_iid = first + len(names)
        self.builder.write_packet(packet)
        return first

    def annotated(self, timestamp: int, kind: str, uuid: int, name: str | None = None, arguments: dict | None = None):
        packet = self.packet()
        packet.timestamp = int(timestamp)
        event = packet.track_event
        event.type = self.protos.TrackEvent.Type.Value(kind)
        event.track_uuid = uuid
        if name is not None:
            event.name = name
        for key, value in (arguments or {}).items():
            if value is None or (isinstance(value, float) and value != value):
                continue  # absent, not zero
            annotation = event.debug_annotations.add()
            annotation.name = key
            if isinstance(value, (bool, np.bool_)):
                annotation.bool_value = bool(value)
            elif isinstance(value, (int, np.integer)):
                annotation.int_value = int(value)
            elif isinstance(value, (float, np.floating)):
                annotation.double_value = float(value)
            else:
                annotation.string_value = str(value)
        self.builder.write_packet(packet)

    # -- one process

    def process(self, pid: int, process: ProcessTimeline) -> None:
        root = self.track(process.name, pid=pid, ordered=True)
        self.written.processes += 1
        rank = iter(range(1 << 30))
        self.steps(root, next(rank), process.steps)
        if process.findings:
            self.findings(self.track("findings", root, next(rank)), process.findings)
        device_tracks = self.devices(root, rank, process.devices)
        for counter in process.counters:
            self.counter(self.track(counter.name, root, next(rank), unit=counter.unit), counter)
        if process.events is not None and not process.events.empty:
            self.events(root, rank, process.events, device_tracks)

    def steps(self, root: int, rank: int, steps: pd.DataFrame) -> None:
        if steps.empty:
            return
        starts = steps["start_ns"].to_numpy(dtype=np.int64)
        ends = steps["end_ns"].to_numpy(dtype=np.int64)
        layout = _Layout(np.zeros(len(steps), dtype=np.int64), starts, ends)
        track = self.track("steps", root, rank, ordered=True)
        lanes = [track] + [self.track(f"steps ({lane + 1})", root, rank) for lane in range(1, layout.lanes)]
        parts = [self.track(name, track, i) for i, (name, _) in enumerate(PARTS)]
        records = steps.to_dict("records")
        for index, is_end in zip(layout.events, layout.is_end):
            step = records[index]
            uuid = lanes[layout.lane[index]]
            if is_end:
                self.annotated(ends[index], "TYPE_SLICE_END", uuid)
                continue
            arguments = {"step": int(step["step"]), **{key: step.get(key) for key in STEP_ARGUMENTS}}
            if isinstance(step.get("cause"), str):
                arguments.update(outlier_cause=step["cause"], outlier_excess_ms=step.get("excess_ms"))
            kind = "TYPE_INSTANT" if starts[index] == ends[index] else "TYPE_SLICE_BEGIN"
            self.annotated(starts[index], kind, uuid, f"step {int(step['step'])}", arguments)
        self.written.slices += int((starts != ends).sum())
        self.written.instants += int((starts == ends).sum())
        # parts end to end: input, compute, collective, then host to the step's end (exact in ns)
        bounds = [starts]
        for _, column in PARTS[:-1]:
            width = np.round(steps[column].to_numpy(dtype=float) * NS_PER_MS)
            bounds.append(np.minimum(bounds[-1] + np.nan_to_num(np.maximum(width, 0)).astype(np.int64), ends))
        bounds.append(np.maximum(ends, bounds[-1]))
        iids = self.intern([name for name, _ in PARTS])
        for i, (name, _) in enumerate(PARTS):
            keep = bounds[i + 1] > bounds[i]
            self.slices(
                parts[i],
                (name, track, i),
                bounds[i][keep],
                bounds[i + 1][keep],
                np.full(int(keep.sum()), iids + i, dtype=np.int64),
            )

    def findings(self, uuid: int, findings: list[dict]) -> None:
        for finding in sorted(findings, key=lambda f: f["at_ns"]):
            self.annotated(
                finding["at_ns"],
                "TYPE_INSTANT",
                uuid,
                str(finding.get("rule")),
                {key: finding.get(key) for key in FINDING_ARGUMENTS},
            )
            self.written.instants += 1

    def devices(self, root: int, rank, devices: pd.DataFrame) -> dict[str, int]:
        tracks: dict[str, int] = {}
        if devices.empty:
            return tracks
        iids = self.intern(["idle", "busy"])
        for name, spans in devices.groupby("device", sort=True, observed=True):
            order = next(rank)
            uuid = tracks[str(name)] = self.track(str(name), root, order, ordered=True)
            busy = spans["busy"].to_numpy(dtype=bool)
            self.slices(
                uuid,
                (str(name), root, order),
                spans["start_ns"].to_numpy(dtype=np.int64),
                spans["end_ns"].to_numpy(dtype=np.int64),
                iids + busy.astype(np.int64),
            )
        return tracks

    def counter(self, uuid: int, counter: Counter) -> None:
        times = np.asarray(counter.times_ns, dtype=np.int64)
        values = np.asarray(counter.values, dtype=float)
        for at in range(0, len(times), CHUNK):
            self.stream.write(
                packets.counters(self.fields, times[at : at + CHUNK], uuid, values[at : at + CHUNK], SEQUENCE_ID)
            )
        self.written.counter_values += len(times)

    def events(self, root: int, rank, events: pd.DataFrame, device_tracks: dict[str, int]) -> None:
        """The trace's events, one track per line (beneath its device's track on a device plane)."""
        names = events["name"]
        if not isinstance(names.dtype, pd.CategoricalDtype):
            names = names.astype(str).astype("category")
        codes = names.cat.codes.to_numpy().astype(np.int64)
        used = np.bincount(codes[codes >= 0], minlength=len(names.cat.categories)) > 0
        base = self.intern(list(names.cat.categories[used]))
        iid_of = np.zeros(len(used), dtype=np.int64)
        iid_of[used] = base + np.arange(int(used.sum()))
        iids = iid_of[np.clip(codes, 0, None)]
        if (codes < 0).any():  # an event without a name
            iids = np.where(codes >= 0, iids, self.intern(["?"]))
        plane = events["plane"].to_numpy(dtype=np.int64)
        line = events["line"].to_numpy(dtype=np.int64)
        keys = (plane << 32) | line
        layout = _Layout(keys, events["start_ns"].to_numpy(dtype=np.int64), events["end_ns"].to_numpy(dtype=np.int64))
        # one track per line (and lane, where a line's events cross), in plane and line order
        track_keys, first, of_event = np.unique(keys * 1024 + layout.lane, return_index=True, return_inverse=True)
        plane_names = events["plane_name"].to_numpy()[first]
        line_names = events["line_name"].to_numpy()[first]
        groups: dict[str, int] = {}
        uuids = np.empty(track_keys.size, dtype=np.int64)
        for i, (track_key, plane_name, line_name) in enumerate(zip(track_keys.tolist(), plane_names, line_names)):
            plane_name, line_name, lane = str(plane_name), str(line_name), track_key % 1024
            parent = device_tracks.get(plane_name) or groups.get(plane_name)
            if parent is None:
                parent = groups[plane_name] = self.track(plane_name, root, next(rank), ordered=True)
            label = line_name if lane == 0 else f"{line_name} ({lane + 1})"
            uuids[i] = self.track(label, parent, ((track_key // 1024) & 0xFFFFFFFF) * 64 + min(lane, 63))
        self.emit(layout, uuids[of_event.reshape(-1)], iids)

    def slices(
        self, uuid: int, place: tuple[str, int, int], starts: np.ndarray, ends: np.ndarray, iids: np.ndarray
    ) -> None:
        """Slices (instants where one lasts no time) on the track `uuid`; where they cross (steps that
        overlap), those that do not fit go on tracks beside it (`place`: its name, parent and rank)."""
        layout = _Layout(np.zeros(len(starts), dtype=np.int64), starts, ends)
        name, parent, rank = place
        lanes = [uuid] + [self.track(f"{name} ({lane + 1})", parent, rank) for lane in range(1, layout.lanes)]
        self.emit(layout, np.asarray(lanes, dtype=np.int64)[layout.lane], iids)

    def emit(self, layout: _Layout, uuids: np.ndarray, iids: np.ndarray) -> None:
        f = self.fields
        for at in range(0, len(layout.events), CHUNK):
            index = layout.events[at : at + CHUNK]
            is_end = layout.is_end[at : at + CHUNK]
            instant = layout.starts[index] == layout.ends[index]
            types = np.where(is_end, f.SLICE_END, np.where(instant, f.INSTANT, f.SLICE_BEGIN))
            times = np.where(is_end, layout.ends[index], layout.starts[index])
            self.stream.write(
                packets.track_events(f, times, types, uuids[index], np.where(is_end, 0, iids[index]), SEQUENCE_ID)
            )
        zero = int((layout.starts == layout.ends).sum())
        self.written.instants += zero
        self.written.slices += len(layout.starts) - zero


class _Layout:
    """Slices on tracks (`keys`) in the order a Perfetto track takes them: per track, every begin and
    end in time order, an end before a begin at the same time, the inner slice's end first; an
    event of no length is an instant. Perfetto ends the latest open slice of a track, so the slices of
    a track must nest; where a track's events cross (a line of the trace whose events overlap without
    nesting), they are spread over lanes (`lane`, 0 for the rest), each lane nesting.

    `events` and `is_end` give the packets in order: the event each one is of, and whether it is its end.
    """

    def __init__(self, keys: np.ndarray, starts: np.ndarray, ends: np.ndarray):
        self.starts = np.asarray(starts, dtype=np.int64)
        self.ends = np.maximum(np.asarray(ends, dtype=np.int64), self.starts)
        keys = np.asarray(keys, dtype=np.int64)
        self.lane = np.zeros(len(keys), dtype=np.int64)
        self.events, self.is_end, crossing = self._order(_dense(keys))
        self.lanes = 1
        if crossing.size:
            self.lane = _lanes(keys, self.starts, self.ends, crossing)
            self.lanes = int(self.lane.max()) + 1
            self.events, self.is_end, crossing = self._order(_dense(keys * 1024 + self.lane))
            assert not crossing.size

    def _order(self, track: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(the packets' events, whether each is an end, the keys whose slices cross), `track` dense ids."""
        starts, ends = self.starts, self.ends
        rank = _ranked(track, starts, ends)
        length = ends[rank] != starts[rank]
        ordered_track = track[rank]
        if not ((ordered_track[1:] == ordered_track[:-1]) & (ends[rank[:-1]] > starts[rank[1:]])).any():
            # no two events of a track overlap (spans, kernels on a stream): each begin, then its end
            events = np.repeat(rank, 1 + length)
            is_end = np.zeros(events.size, dtype=bool)
            is_end[np.cumsum(1 + length)[length] - 1] = True
            return events, is_end, np.array([], dtype=np.int64)
        slices = rank[length]
        # ends in reverse rank, then begins in rank: a stable sort by (track, time) keeps that order at ties
        events = np.concatenate([slices[::-1], rank])
        is_end = np.zeros(events.size, dtype=bool)
        is_end[: slices.size] = True
        times = np.where(is_end, ends[events], starts[events])
        order = _by_track_and_time(track[events], times)
        events, is_end = events[order], is_end[order]
        # a track's slices nest when each one's end comes at the depth its begin left
        opens = starts[events] != ends[events]
        depth = np.cumsum(np.where(is_end, -1, opens.astype(np.int64)))
        at_begin = np.zeros(len(track), dtype=np.int64)
        at_end = np.zeros(len(track), dtype=np.int64)
        at_begin[events[~is_end]] = depth[~is_end]
        at_end[events[is_end]] = depth[is_end] + 1
        bad = (at_begin != at_end) & (starts != ends)
        return events, is_end, np.unique(track[bad]) if bad.any() else np.array([], dtype=np.int64)


def _dense(keys: np.ndarray) -> np.ndarray:
    """`keys` as 0, 1, 2, ... in their order (a trace's lines come one after another: no sort then)."""
    if keys.size and (keys[1:] >= keys[:-1]).all():
        return np.concatenate([[0], np.cumsum(keys[1:] != keys[:-1])]).astype(np.int64)
    return np.unique(keys, return_inverse=True)[1].astype(np.int64).reshape(-1)


def _ranked(track: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The events by track, start, and the longest first (an enclosing event before what it holds)."""
    if track.size < 2:
        return np.arange(track.size)
    same_track = track[1:] == track[:-1]
    same_start = same_track & (starts[1:] == starts[:-1])
    ordered = (
        (track[1:] > track[:-1]) | (same_track & (starts[1:] > starts[:-1])) | (same_start & (ends[1:] <= ends[:-1]))
    ).all()
    return np.arange(track.size) if ordered else np.lexsort((-ends, starts, track))


def _by_track_and_time(track: np.ndarray, times: np.ndarray) -> np.ndarray:
    """A stable order by (track, time); one argsort where both fit one int64."""
    if track.size == 0:
        return np.array([], dtype=np.int64)
    low = int(times.min())
    span = int(times.max()) - low + 1
    if span < (1 << 62) // (int(track.max()) + 1):
        return np.argsort(track * span + (times - low), kind="stable")
    return np.lexsort((times, track))


def _lanes(keys: np.ndarray, starts: np.ndarray, ends: np.ndarray, crossing: np.ndarray) -> np.ndarray:
    """For the tracks in `crossing` (dense ids of `keys`), each slice's lane: the first whose open slices
    it nests in."""
    lane = np.zeros(len(keys), dtype=np.int64)
    dense = _dense(keys)
    for track in crossing:
        mine = np.flatnonzero(dense == track)
        mine = mine[np.lexsort((-ends[mine], starts[mine]))]
        stacks: list[list[int]] = []
        for index in mine:
            start, end = int(starts[index]), int(ends[index])
            if start == end:
                continue  # an instant nests anywhere
            for number, stack in enumerate(stacks):
                while stack and stack[-1] <= start:
                    stack.pop()
                if not stack or stack[-1] >= end:
                    break
            else:
                number = len(stacks)
                stacks.append([])
            stacks[number].append(end)
            lane[index] = number
    return lane
