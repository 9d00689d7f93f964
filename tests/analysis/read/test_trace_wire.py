"""The trace reader decodes `.xplane.pb` from the wire format itself: checked field by field
against protobuf's own parse of the same bytes, on odd values, long lines split into blocks,
cut-short files, and with TensorFlow, Keras and protobuf made unimportable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest

import trace_fixtures as fx
from analysis import parallel
from analysis.parallel import child as parallel_child
from analysis.read import trace
from analysis.read import xplane_wire as wire
from repo_paths import REPO


def _reference(space) -> tuple[list[tuple], list[tuple]]:
    """Events (plane, line, name, start_ns, end_ns) and every stat (event, name, value) as protobuf reads them."""
    events: list[tuple] = []
    stats: list[tuple] = []
    for plane_index, plane in enumerate(space.planes):
        names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        for line_index, line in enumerate(plane.lines):
            for event in line.events:
                start = line.timestamp_ns + event.offset_ps // 1000
                name = plane.event_metadata[event.metadata_id].name if event.metadata_id in plane.event_metadata else ""
                for stat in event.stats:
                    kind = stat.WhichOneof("value")
                    value: Any = None if kind is None else getattr(stat, kind)
                    if kind == "ref_value":
                        value = names.get(value, "")
                    elif kind == "bytes_value":
                        value = value.hex()
                    elif kind == "str_value":  # shown, never obeyed: control characters as visible escapes
                        value = wire.visible(value)
                    stats.append((len(events), names.get(stat.metadata_id, str(stat.metadata_id)), value))
                events.append((plane_index, line_index, name, start, start + event.duration_ps // 1000))
    return events, stats


def _assert_matches(path: Path, space) -> trace.Trace:
    read = trace.read_trace(path)
    events, stats = _reference(space)
    got = list(
        zip(
            read.events["plane"],
            read.events["line"],
            read.events["name"].astype(object),
            read.events["start_ns"],
            read.events["end_ns"],
        )
    )
    assert got == events
    every = trace.event_stats(path)
    assert list(zip(every["event"], every["stat"].astype(object), every["value"])) == stats
    assert [type(value) for value in every["value"]] == [type(value) for _, _, value in stats]
    keyed = [row for row in stats if row[1] in trace.EVENT_STAT_COLUMNS]
    assert list(zip(read.stats["event"], read.stats["stat"].astype(object), read.stats["value"])) == keyed
    assert read.hostnames == list(space.hostnames)
    return read


def _odd_space():
    """An XSpace with the values a reader gets wrong: negative and 64-bit numbers, every stat
    kind, a stat repeated, an event without metadata, `num_occurrences`, long strings."""
    space = fx._xspace_class()()
    space.hostnames.extend(["worker-a", "hôte-b"])
    space.errors.append("not read")
    plane = space.planes.add(id=-5, name="/host:CPU")
    plane.event_metadata[1].name = "train"
    plane.event_metadata[7].name = "Ünïcode op"
    plane.event_metadata[7].metadata = b"\x00\xff"
    for key, name in enumerate(trace.EVENT_STAT_COLUMNS + ("other",), start=1):
        plane.stat_metadata[key].id = key
        plane.stat_metadata[key].name = name
    plane.stats.add(metadata_id=1, int64_value=3)  # a plane stat: not an event's
    plane.lines.add(id=3, name="empty", timestamp_ns=-7)
    line = plane.lines.add(id=2**40, display_id=5, name="python", display_name="py", timestamp_ns=123456789012345678)
    event = line.events.add(metadata_id=1, offset_ps=1500, duration_ps=2999)
    event.stats.add(metadata_id=1, int64_value=-4)
    event.stats.add(metadata_id=1, uint64_value=2**64 - 1)  # the last one is the column's
    event.stats.add(metadata_id=5, uint64_value=2**63 + 5)
    event.stats.add(metadata_id=6, double_value=1.5)
    event.stats.add(metadata_id=10, str_value="Conv2D:" + "x" * 300)  # an event longer than 127 bytes
    event.stats.add(metadata_id=11, bytes_value=b"\x01\xab")
    event.stats.add(metadata_id=7, ref_value=len(trace.EVENT_STAT_COLUMNS) + 1)  # "other"
    event.stats.add(metadata_id=9, ref_value=99)  # a reference to no metadata
    event.stats.add(metadata_id=55, int64_value=1)  # a stat without metadata
    event.stats.add(metadata_id=2)  # a stat without a value
    event.stats.add(metadata_id=4, str_value="17")
    event.stats.add(metadata_id=3, str_value="abc")
    line.events.add(metadata_id=7, num_occurrences=4, duration_ps=10**15)
    line.events.add(metadata_id=12345, offset_ps=-2000, duration_ps=0).stats.add(metadata_id=1, int64_value=0)
    gpu = space.planes.add(id=2, name="/device:GPU:0")
    gpu.stat_metadata[1].name = "tf_op"
    gpu.event_metadata[1].name = "kernel"
    stream = gpu.lines.add(id=1, name="Stream #1", timestamp_ns=5)
    for i in range(300):
        kernel = stream.events.add(metadata_id=1, offset_ps=i * 1000, duration_ps=500)
        if i % 3 == 0:
            kernel.stats.add(metadata_id=1, str_value=f"op{i % 7}:Conv2D")
    space.planes.add(id=3, name="/device:CUSTOM:empty")
    return space


def test_every_field_reads_as_protobuf_reads_it(tmp_path):
    space = _odd_space()
    path = tmp_path / "odd.xplane.pb"
    path.write_bytes(space.SerializeToString())
    read = _assert_matches(path, space)
    first = read.events.iloc[0]
    assert first["step_num"] == float(2**64 - 1) and first["_p"] == 2**63 + 5 and first["_c"] == 1.5
    assert first["tf_op"].startswith("Conv2D:") and first["hlo_op"] == "01ab" and first["tf_function_call"] == "other"
    assert first["correlation_id"] == "" and first["group_id"] == 17 and pd.isna(first["steps"])
    assert read.events["start_ns"].iloc[1] == 123456789012345678  # num_occurrences: no offset
    assert read.events["name"].iloc[2] == ""  # no metadata
    assert read.planes["plane_id"].tolist() == [-5, 2, 3] and read.planes["events"].tolist() == [3, 300, 0]
    assert read.lines["timestamp_ns"].tolist() == [-7, 123456789012345678, 5]
    assert read.lines["line_id"].tolist() == [3, 2**40, 1] and read.lines["display_name"].tolist() == ["", "py", ""]


def test_long_lines_are_split_into_blocks_and_joined(tmp_path, monkeypatch):
    """Lines walked block by block: guesses that land on a stat, inside a string that looks
    like events, or inside an event longer than a block, all join into the one true chain."""
    for name, value in (("SERIAL_BYTES", 64), ("WINDOW_BYTES", 5000), ("BLOCK_BYTES", 96), ("CHUNK_EVENTS", 70)):
        monkeypatch.setattr(wire, name, value)
    space = _long_space()
    path = tmp_path / "long.xplane.pb"
    path.write_bytes(space.SerializeToString())
    _assert_matches(path, space)


def _long_space():
    """Three long lines of random events and stats, with strings that look like events."""
    rng = np.random.default_rng(7)
    space = fx._xspace_class()()
    plane = space.planes.add(id=1, name="/host:CPU")
    for key, name in enumerate(trace.EVENT_STAT_COLUMNS, start=1):
        plane.stat_metadata[key].name = name
    for key in range(1, 40):
        plane.event_metadata[key].name = f"op{key}"
    decoy = bytes([0x22, 0x05, 0x08, 0x01, 0x10, 0x02, 0x18]) * 8  # looks like events from any byte
    leaping = bytes([0x22, 0x7E, 0x08]) * 60  # a chain that starts here leaps past the next events
    for line_id in range(3):
        line = plane.lines.add(id=line_id, name=f"thread {line_id}", timestamp_ns=10**9 * line_id)
        for i in range(int(rng.integers(300, 900))):
            event = line.events.add(
                metadata_id=int(rng.integers(1, 40)),
                offset_ps=int(rng.integers(0, 2**45)),
                duration_ps=int(rng.integers(0, 2**30)),
            )
            for _ in range(int(rng.integers(0, 4))):
                stat = event.stats.add(metadata_id=int(rng.integers(1, len(trace.EVENT_STAT_COLUMNS) + 1)))
                choice = rng.integers(0, 4)
                if choice == 0:
                    stat.uint64_value = int(rng.integers(0, 2**63)) * 2 + 1
                elif choice == 1:
                    stat.int64_value = int(rng.integers(-(2**40), 2**40))
                elif choice == 2:
                    stat.str_value = decoy.decode("latin-1") if rng.random() < 0.3 else "a" * int(rng.integers(0, 400))
                else:
                    stat.bytes_value = (decoy, leaping)[int(rng.integers(0, 2))] * int(rng.integers(1, 4))
    return space


def _decoded_fields(space) -> dict:
    return {
        **{name: value for name, value in vars(space.events).items()},
        "stat_values": list(space.stat_values),
        "stat_name_code": space.stat_name_code,
        "stat_names": space.stat_names,
        "lines": [vars(line) for line in space.lines],
    }


def _assert_same_decoding(one, other) -> None:
    first, second = _decoded_fields(one), _decoded_fields(other)
    assert first.keys() == second.keys()
    for name, value in first.items():
        if isinstance(value, np.ndarray):
            assert value.dtype == second[name].dtype and np.array_equal(value, second[name]), name
        else:
            assert value == second[name], name


@pytest.fixture
def halves_of_small_traces(monkeypatch):
    """Chunks of 70 events, halved from any size, a fork allowed (`FORK`); records what each forked child answered."""
    monkeypatch.setattr(wire, "CHUNK_EVENTS", 70)
    monkeypatch.setattr(wire, "HALVES_MIN_EVENTS", 0)
    monkeypatch.setattr(parallel, "os_threads", lambda: 1)  # a pytest process has numpy's threads
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.delenv(parallel.ENV_VAR, raising=False)
    answers: list[dict | None] = []
    result = parallel_child.Child.result

    def recorded(self, *args, **kwargs):
        answer = result(self, *args, **kwargs)
        parts = None if answer is None else cast(list, answer[0])  # the decode's parts
        answers.append(None if parts is None else {"stat_event": sum(len(part["stat_event"]) for part in parts)})
        return answer

    monkeypatch.setattr(parallel_child.Child, "result", recorded)
    return answers


FORK = parallel.Helpers().child  # a forked child for a decode's last part (where `can_fork()` says yes)


def _no_children_left() -> bool:
    """No child process, not even one ended and never reaped."""
    import psutil

    return not psutil.Process().children()


@pytest.mark.parametrize("names", [trace.EVENT_STAT_COLUMNS, None], ids=["kept stats", "every stat"])
def test_the_second_half_decoded_by_a_forked_child_is_the_same(halves_of_small_traces, names):
    data = _long_space().SerializeToString()
    alone = wire.decode_xspace(data, names)
    halved = wire.decode_xspace(data, names, fork=FORK)
    assert len(halves_of_small_traces) == 1 and isinstance(halves_of_small_traces[0], dict)  # the child answered
    assert 0 < halves_of_small_traces[0]["stat_event"] < halved.events.stat_event.size
    _assert_same_decoding(alone, halved)
    assert _no_children_left()


def test_a_child_that_fails_leaves_its_half_to_this_process(halves_of_small_traces, monkeypatch):
    parent = os.getpid()
    decode = wire._EventBatches._decode_chunk

    def failing_in_the_child(self, *chunk):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer would
        return decode(self, *chunk)

    monkeypatch.setattr(wire._EventBatches, "_decode_chunk", failing_in_the_child)
    data = _long_space().SerializeToString()
    halved = wire.decode_xspace(data, trace.EVENT_STAT_COLUMNS, fork=FORK)
    assert halves_of_small_traces == [None]
    _assert_same_decoding(wire.decode_xspace(data, trace.EVENT_STAT_COLUMNS), halved)
    assert _no_children_left()


def _two_planes_with_trailing_line_fields():
    """The long lines, a second plane after them, and lines whose fields after their events (duration,
    display id and name: after the events in field-number order) only the one who reads them on knows."""
    space = _long_space()
    for line in space.planes[0].lines:
        line.duration_ps, line.display_id, line.display_name = 10**12, 7, f"shown {line.name}"
    device = space.planes.add(id=2, name="/device:GPU:0")
    device.stat_metadata[1].name = "correlation_id"
    device.event_metadata[1].name = "kernel"
    for line_id in range(2):
        line = device.lines.add(id=line_id, name=f"stream {line_id}", timestamp_ns=5, display_name="after")
        for i in range(150):
            line.events.add(metadata_id=1, offset_ps=1000 * i, duration_ps=500).stats.add(metadata_id=1, uint64_value=i)
    device.lines.add(id=9, name="no events", display_name="empty")
    space.hostnames.append("host")
    return space


@pytest.mark.parametrize("share", [0.02, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9, 0.97, 0.999])
@pytest.mark.parametrize("child", ["answers", "is killed"])
def test_the_childs_share_from_any_byte_is_decoded_the_same(halves_of_small_traces, monkeypatch, share, child):
    """A decode begun early gives the child the events of the last `share` of the bytes: the same events
    and lines wherever that byte falls (in events, in a line's fields after them, in another plane), and
    the same where the child is killed and the work is done here."""
    parent = os.getpid()
    decode = wire._EventBatches._decode_chunk

    def killed_in_the_child(self, *chunk):
        if child == "is killed" and os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return decode(self, *chunk)

    monkeypatch.setattr(wire._EventBatches, "_decode_chunk", killed_in_the_child)
    data = _two_planes_with_trailing_line_fields().SerializeToString()
    alone = wire.decode_xspace(data, trace.READ_STATS, trace.READ_NUMBERS)
    located = wire.locate(data, trace.READ_STATS)
    located.start(FORK, share)
    begun = located.finish(trace.READ_NUMBERS)
    _assert_same_decoding(alone, begun)
    assert [line.display_name for line in begun.lines][-3:] == ["after", "after", "empty"]
    assert halves_of_small_traces == ([None] if child == "is killed" else [halves_of_small_traces[0]])
    if child == "answers":
        assert halves_of_small_traces[0] is not None
    assert _no_children_left()


def test_a_corrupt_second_half_is_the_same_error_with_a_child(halves_of_small_traces):
    data = bytearray(_long_space().SerializeToString())
    spans = wire.decode_xspace(bytes(data), None).events
    short_texts = (spans.stat_kind == wire.STAT_STR) & (spans.stat_stop - spans.stat_start < 128)
    late = int(np.flatnonzero(short_texts)[-1])
    tag = int(spans.stat_start[late]) - 2  # before its one-byte length
    assert data[tag] == 0x2A
    data[tag] = 0x2F  # field 5 with wire type 7, which XSpace never uses: found only when the stat is decoded
    errors = []
    for fork in (None, FORK):
        with pytest.raises(wire.WireError) as raised:
            wire.decode_xspace(bytes(data), None, fork=fork)
        errors.append(str(raised.value))
    assert errors[0] == errors[1] and halves_of_small_traces == [None]
    assert _no_children_left()


def test_ctrl_c_while_this_process_decodes_its_half_ends_the_child(halves_of_small_traces, monkeypatch):
    parent = os.getpid()
    decode = wire._EventBatches._decode_chunk

    def interrupted_here(self, *chunk):
        if os.getpid() == parent:
            raise KeyboardInterrupt
        return decode(self, *chunk)

    monkeypatch.setattr(wire._EventBatches, "_decode_chunk", interrupted_here)
    with pytest.raises(KeyboardInterrupt):
        wire.decode_xspace(_long_space().SerializeToString(), None, fork=FORK)
    assert _no_children_left()


def test_a_cut_file_is_unreadable_wherever_protobuf_says_so(tmp_path):
    space = _odd_space()
    data = space.SerializeToString()
    parser = fx._xspace_class()
    for cut in range(1, len(data), 5):
        path = tmp_path / f"cut{cut}.xplane.pb"
        path.write_bytes(data[:cut])
        try:
            parser().ParseFromString(data[:cut])
        except Exception:
            with pytest.raises(trace.TraceUnreadable, match="truncated or corrupt"):
                trace.read_trace(path)
        path.unlink()
    for junk in (b"not a trace at all", bytes(range(256)) * 3):
        path = tmp_path / "junk.xplane.pb"
        path.write_bytes(junk)
        with pytest.raises(trace.TraceUnreadable):
            trace.read_trace(path)


_WITHOUT_TENSORFLOW = textwrap.dedent("""
    import importlib, json, sys

    blocked = {"tensorflow", "keras", "tf_keras", "google"}

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in blocked:
                raise ImportError(f"{name} is not installed here")
            return None

    sys.meta_path.insert(0, Blocker())
    from analysis.read.trace import read_trace

    events = len(read_trace(sys.argv[1]).events)  # reading needs no protobuf library either
    blocked.discard("google")
    import analysis

    analyze = getattr(analysis, "analyze", None) or importlib.import_module("analysis.report").analyze
    result = analyze(sys.argv[1])
    steps = result.steps if hasattr(result, "steps") else result.source.steps
    loaded = sorted({name.split(".")[0] for name in sys.modules} & {"tensorflow", "keras", "tf_keras"})
    print(json.dumps({"events": events, "steps": len(steps), "loaded": loaded}))
""")


@pytest.mark.slow
def test_analysis_runs_without_tensorflow_or_keras(tmp_path):
    synthetic = fx.write_synthetic_device_trace(tmp_path / "log" / "plugins" / "profile" / "s1" / "host.xplane.pb")
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TENSORFLOW, str(tmp_path / "log")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["loaded"] == []
    assert result["events"] > 0 and result["steps"] == synthetic.steps


def test_the_events_table_is_narrow_where_stats_are_rare_or_repeated(tmp_path):
    """Millions of events: ids as uint64, texts as categoricals, numbers on few events stored for
    those events only; the values are the same as the wide table's (`_assert_matches` above)."""
    space = fx._xspace_class()()
    plane = space.planes.add(id=1, name="/host:CPU")
    for key, name in enumerate(trace.EVENT_STAT_COLUMNS, start=1):
        plane.stat_metadata[key].name = name
    plane.event_metadata[1].name = "train"
    plane.event_metadata[2].name = "op"
    line = plane.lines.add(id=2**40, name="python", timestamp_ns=0)
    column = {name: key for key, name in enumerate(trace.EVENT_STAT_COLUMNS, start=1)}
    for i in range(20_000):
        event = line.events.add(metadata_id=2 if i % 100 else 1, offset_ps=i * 1000, duration_ps=500)
        event.stats.add(metadata_id=column["_p"], uint64_value=2**63 + i)
        event.stats.add(metadata_id=column["tf_op"], str_value=f"op{i % 5}:Conv2D")
        if i % 100 == 0:
            event.stats.add(metadata_id=column["step_num"], int64_value=i // 100)
    path = tmp_path / "narrow.xplane.pb"
    path.write_bytes(space.SerializeToString())
    events = trace.read_trace(path).events
    assert str(events["_p"].dtype) == "UInt64" and events["_p"].iloc[7] == 2**63 + 7
    assert isinstance(events["tf_op"].dtype, pd.CategoricalDtype) and events["tf_op"].iloc[6] == "op1:Conv2D"
    assert isinstance(events["step_num"].dtype, pd.SparseDtype) and events["step_num"].iloc[300] == 3
    assert events["step_num"].notna().sum() == 200 and pd.isna(events["step_num"].iloc[301])
    assert events["group_id"].isna().all() and events["tf_function_call"].isna().all()
    per_event = events.memory_usage(deep=True).sum() / len(events)
    assert per_event < 75, events.memory_usage(deep=True) / len(events)  # the wide table took 154 bytes


@pytest.mark.parametrize("how", ["cycle", "kept"])
def test_a_view_of_the_map_left_behind_does_not_fail_the_read(tmp_path, monkeypatch, how):
    """A numpy view of the mapped file that outlives the decoder (in a reference cycle the garbage
    collector has not reached, or kept) made closing the map raise BufferError: 'analyze failed'."""
    import gc

    path = tmp_path / "odd.xplane.pb"
    path.write_bytes(_odd_space().SerializeToString())
    expected = trace.read_trace(path).events
    real_decode, maps, kept = wire.decode_xspace, [], []

    def decode_leaving_a_view(buf, *args, **kwargs):
        maps.append(buf)
        holder: dict = {"view": np.frombuffer(buf, dtype=np.uint8)}
        holder["self"] = holder  # only the cycle collector frees it
        if how == "kept":
            kept.append(holder)
        return real_decode(buf, *args, **kwargs)

    monkeypatch.setattr(wire, "decode_xspace", decode_leaving_a_view)
    gc.disable()  # as a busy Dask worker's tuned collector would be, late
    try:
        read = trace.read_trace(path)
    finally:
        gc.enable()
    pd.testing.assert_frame_equal(read.events, expected)
    assert maps[0].closed == (how == "cycle")  # collected and unmapped at once, or left to close with its view


@pytest.fixture
def early(halves_of_small_traces, tmp_path):
    """A trace file of the long lines and the helpers that may begin its decode; every begun decode ended after."""
    path = tmp_path / "long.xplane.pb"
    path.write_bytes(_long_space().SerializeToString())
    with parallel.Helpers() as helpers:
        yield path, helpers
    assert _no_children_left()


def test_a_decode_begun_early_is_finished_by_the_read_with_the_same_tables(early, halves_of_small_traces):
    path, helpers = early
    alone = trace.read_trace(path)
    helpers.begin_reading(path)
    assert helpers._begun is not None
    begun = trace.read_trace(path, helpers)
    assert halves_of_small_traces[-1] is not None  # the early child answered
    assert helpers._begun is None  # taken
    pd.testing.assert_frame_equal(begun.events, alone.events)
    pd.testing.assert_frame_equal(begun.memory, alone.memory)
    assert begun.hostnames == alone.hostnames


def test_a_decode_begun_for_a_file_that_changed_since_is_not_used(early, halves_of_small_traces):
    path, helpers = early
    helpers.begin_reading(path)
    space = _long_space()
    space.hostnames.append("changed")
    # Replaced whole, as a writer that never truncates a file another process maps
    replacement = path.with_name("replacement.xplane.pb")
    replacement.write_bytes(space.SerializeToString())
    os.replace(replacement, path)
    read = trace.read_trace(path, helpers)
    assert read.hostnames[-1] == "changed" and helpers._begun is not None  # read afresh; the begun one left over
    helpers.close()
    assert helpers._begun is None and _no_children_left()


def test_nothing_is_begun_for_what_the_read_would_refuse(tmp_path, monkeypatch, early):
    path, helpers = early
    junk = tmp_path / "junk.xplane.pb"
    junk.write_bytes(b"\x00" * (wire.HALVES_MIN_EVENTS * 16 + 10))
    fifo = tmp_path / "fifo.xplane.pb"
    os.mkfifo(fifo)
    for refused in (junk, fifo, tmp_path / "missing.xplane.pb"):
        helpers.begin_reading(refused)
        assert helpers._begun is None
    assert _no_children_left()
    with pytest.raises(trace.TraceUnreadable, match="not a readable XSpace"):
        trace.read_trace(junk, helpers)
    monkeypatch.setattr(parallel, "os_threads", lambda: 2)  # another thread: no fork is safe
    helpers.begin_reading(path)
    assert helpers._begun is None
