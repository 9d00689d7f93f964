"""A Perfetto trace read back with the `perfetto` package's own protos, as Perfetto's trace processor
takes it: packets ordered by timestamp (file order at a tie), a track's SLICE_END closing the latest
open slice of that track, interned names resolved on their sequence (and refused where the sequence
was not started), tracks grouped under the process their parents lead to.

(The trace processor itself is a binary the package downloads on first use: this machine has no
network, so its semantics for the few messages devprof writes are re-done here.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass
class Readback:
    tracks: dict[int, dict] = field(default_factory=dict)  # uuid -> name, parent, pid, process_name, counter
    slices: pd.DataFrame | None = None  # process, track, track_uuid, name, ts, dur, depth, args
    counters: pd.DataFrame | None = None  # process, track, ts, value
    packets: int = 0

    def process_of(self, uuid: int | None) -> str | None:
        while uuid is not None:
            track = self.tracks[uuid]
            if track.get("pid") is not None:
                return track["process_name"]
            uuid = track.get("parent")
        return None

    def path_of(self, uuid: int | None) -> list[str]:
        """The track's name and its parents' up to (not with) the process."""
        names = []
        while uuid is not None and self.tracks[uuid].get("pid") is None:
            names.append(self.tracks[uuid]["name"])
            uuid = self.tracks[uuid].get("parent")
        return names

    @property
    def processes(self) -> list[str]:
        return [t["process_name"] for t in self.tracks.values() if t.get("pid") is not None]

    def children(self, process: str) -> list[str]:
        """The names of the process' direct child tracks, in their rank order."""
        root = next(u for u, t in self.tracks.items() if t.get("process_name") == process)
        kids = [(t.get("rank", 0), u, t["name"]) for u, t in self.tracks.items() if t.get("parent") == root]
        return [name for _, _, name in sorted(kids)]

    def on(self, process: str, *path: str) -> pd.DataFrame:
        """The slices on the track at `path` (its name, then its parents' names upwards) of `process`."""
        assert self.slices is not None, "no slices read back"
        frame = self.slices[self.slices["process"] == process]
        keep = [
            self.path_of(u)[: len(path)] == list(path) and len(self.path_of(u)) == len(path)
            for u in frame["track_uuid"]
        ]
        return frame[keep].sort_values(["ts", "depth"], kind="stable").reset_index(drop=True)

    def counter(self, process: str, name: str) -> pd.DataFrame:
        assert self.counters is not None, "no counters read back"
        frame = self.counters[(self.counters["process"] == process) & (self.counters["track"] == name)]
        return frame.sort_values("ts", kind="stable").reset_index(drop=True)


def _value(annotation):
    kind = annotation.WhichOneof("value")
    return getattr(annotation, kind) if kind else None


def read_back(path: str | Path) -> Readback:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    trace = Trace()
    trace.ParseFromString(Path(path).read_bytes())
    out = Readback(packets=len(trace.packet))
    names: dict[int, dict[int, str]] = {}
    events = []
    for index, packet in enumerate(trace.packet):
        sequence = packet.trusted_packet_sequence_id
        if packet.sequence_flags & 1:  # SEQ_INCREMENTAL_STATE_CLEARED
            names[sequence] = {}
        if packet.HasField("interned_data"):
            assert sequence in names, "interned names on a sequence never cleared"
            for entry in packet.interned_data.event_names:
                names[sequence][entry.iid] = entry.name
        if packet.HasField("track_descriptor"):
            d = packet.track_descriptor
            out.tracks[d.uuid] = {
                "name": d.name,
                "parent": d.parent_uuid if d.HasField("parent_uuid") else None,
                "pid": d.process.pid if d.HasField("process") else None,
                "process_name": d.process.process_name if d.HasField("process") else None,
                "counter": d.HasField("counter"),
                "rank": d.sibling_order_rank,
                "unit": d.counter.unit if d.HasField("counter") else None,
                "unit_name": d.counter.unit_name if d.HasField("counter") else None,
            }
        if packet.HasField("track_event"):
            e = packet.track_event
            assert e.track_uuid in out.tracks, "an event before its track's descriptor"
            if e.HasField("name_iid"):
                assert packet.sequence_flags & 2, "an interned name without SEQ_NEEDS_INCREMENTAL_STATE"
                name = names[sequence][e.name_iid]
            else:
                name = e.name
            args = {a.name: _value(a) for a in e.debug_annotations}
            value = e.double_counter_value if e.HasField("double_counter_value") else e.counter_value
            events.append((packet.timestamp, index, e.type, e.track_uuid, name, args, value))
    events.sort(key=lambda item: (item[0], item[1]))
    open_slices: dict[int, list] = {}
    slices, counters = [], []
    for ts, _, kind, uuid, name, args, value in events:
        stack = open_slices.setdefault(uuid, [])
        if kind == TrackEvent.TYPE_SLICE_BEGIN:
            row = {"track_uuid": uuid, "name": name, "ts": ts, "dur": None, "depth": len(stack), "args": args}
            stack.append(row)
            slices.append(row)
        elif kind == TrackEvent.TYPE_SLICE_END:
            assert stack, f"an end with no open slice on track {out.tracks[uuid]['name']} at {ts}"
            row = stack.pop()
            row["dur"] = ts - row["ts"]
        elif kind == TrackEvent.TYPE_INSTANT:
            slices.append({"track_uuid": uuid, "name": name, "ts": ts, "dur": 0, "depth": len(stack), "args": args})
        elif kind == TrackEvent.TYPE_COUNTER:
            counters.append({"track_uuid": uuid, "ts": ts, "value": value})
    assert all(not stack for stack in open_slices.values()), "slices left open"
    frame = pd.DataFrame(slices, columns=["track_uuid", "name", "ts", "dur", "depth", "args"])
    frame["process"] = [out.process_of(u) for u in frame["track_uuid"]]
    frame["track"] = [out.tracks[u]["name"] for u in frame["track_uuid"]]
    out.slices = frame
    counter_frame = pd.DataFrame(counters, columns=["track_uuid", "ts", "value"])
    counter_frame["process"] = [out.process_of(u) for u in counter_frame["track_uuid"]]
    counter_frame["track"] = [out.tracks[u]["name"] for u in counter_frame["track_uuid"]]
    out.counters = counter_frame
    return out
