"""Trace files that are not what they claim: zeros, no XSpace at the top, impossible times, clocks before
1970, names that are not UTF-8, a plane given twice, and a file cut short while it is read."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import analysis
from analysis.read.run_files import RunFileWarning
from analysis.read.trace import TraceError
from cli_checks import devprof, error_line
from marker_traces import BASE_NS, MS, hostile_trace, marker_trace, steps_trace
from repo_paths import REPO
from trace_fixtures import _Plane, _write_space, _xspace_class


def _markers(space):
    python = space.planes[0].lines[0]
    train = next(key for key, meta in space.planes[0].event_metadata.items() if meta.name == "train")
    return [event for event in python.events if event.metadata_id == train]


def _one_negative_marker(space):
    marker = _markers(space)[-1]
    marker.duration_ps = -marker.duration_ps


def _every_event_negative(space):
    for line in space.planes[0].lines:
        for event in line.events:
            event.duration_ps = -event.duration_ps


def _marker_2_62_ps_later(space):
    _markers(space)[4].offset_ps += 2**62


def _marker_1000_s_earlier(space):
    _markers(space)[0].offset_ps -= 1000 * 10**12


# ---------------------------------------------------------------- impossible times in a trace


@pytest.mark.parametrize("edit", [_one_negative_marker, _marker_2_62_ps_later, _marker_1000_s_earlier])
def test_a_marker_with_impossible_times_is_dropped_with_a_warning(tmp_path, capsys, edit):
    trace = marker_trace(tmp_path / "t.xplane.pb", edit)
    with pytest.warns(RunFileWarning, match=r"dropped 1 of 18 events with impossible times .*'train'"):
        result = analysis.analyze(trace)
    assert result.step_source == "markers" and len(result.steps) == 5
    mean = result.mean
    assert (mean["step_ms"], mean["input_ms"], mean["compute_ms"], mean["host_ms"]) == (10.0, 2.0, 5.0, 3.0)
    # compute holds half the step; 3 ms of host overhead and 2 ms of input are within 1 ms: a tie, and the
    # input's wait goes first, as in the trace without the bad marker
    assert (result.verdict["bound"], result.verdict["bound_pct"]) == ("compute", 50.0)
    assert [fix["rule"] for fix in result.verdict["fixes"]][:2] == ["input_wait", "host_bound"]
    code, out, err = devprof(capsys, "analyze", trace)
    assert code == 0 and f"warning: {trace}: dropped 1 of 18 events" in err, err


def test_a_trace_with_mostly_impossible_times_is_an_error_naming_it(tmp_path, capsys):
    trace = marker_trace(tmp_path / "t.xplane.pb", _every_event_negative)
    with pytest.raises(TraceError, match=f"{trace} is corrupt: 18 of 18 events with impossible times"):
        analysis.analyze(trace)
    code, _, err = devprof(capsys, "analyze", trace)
    assert code == 1 and str(trace) in error_line(err) and "AssertionError" not in err


def test_stats_of_a_trace_with_dropped_events_stay_with_their_events(tmp_path):
    from analysis.read.trace import read_trace

    trace = marker_trace(tmp_path / "t.xplane.pb", _marker_2_62_ps_later)
    with pytest.warns(RunFileWarning):
        read = read_trace(trace)
    stats = read.stats
    step_nums = stats[stats["stat"] == "step_num"]
    assert (read.events.loc[step_nums["event"], "name"].astype(str) == "train").all()
    assert sorted(step_nums["value"].astype(int)) == [0, 1, 2, 3, 5]


def _sparse(path, size: int) -> None:
    with open(path, "wb") as handle:
        handle.truncate(size)  # no data written: a file of zeros that takes no disk


# ---------------------------------------------------------------- files of zeros, no XSpace at the top, cut short while read


@pytest.mark.parametrize("size", [4096, 3 * 2**30])
def test_a_file_of_zeros_of_any_size_is_refused_at_its_first_byte(tmp_path, size, monkeypatch):
    trace = tmp_path / "z.xplane.pb"
    _sparse(trace, size)
    reads = []
    real_readv = os.readv

    def counted_readv(fd, buffers):
        reads.append(fd)
        return real_readv(fd, buffers)

    monkeypatch.setattr(os, "readv", counted_readv)
    with pytest.raises(TraceError, match=r"field number 0 at byte 0: not a protobuf message"):
        analysis.analyze(trace)
    assert reads == []  # refused from its header, before the whole file is read


def test_a_file_whose_top_level_is_no_xspace_is_refused_before_it_is_decoded(tmp_path):
    trace = tmp_path / "t.xplane.pb"
    # A well-formed first field (planes, empty), then field 9: no XSpace has it. Then 64 MiB of zeros
    # that the decoder would otherwise walk.
    with open(trace, "wb") as handle:
        handle.write(bytes([0x0A, 0x00, (9 << 3) | 2, 0x01, 0x41]))
        handle.truncate(64 * 2**20)
    with pytest.raises(TraceError, match=r"field 9 \(wire type 2\) at the top level: not an XSpace trace"):
        analysis.analyze(trace)
    assert os.path.getsize(trace) == 64 * 2**20


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return hostile_trace(tmp_path_factory.mktemp("hostile") / "plugins" / "profile" / "s" / "host.xplane.pb")


@pytest.mark.slow
def test_a_trace_cut_short_while_devprof_holds_it_does_not_kill_the_process(trace, tmp_path):
    copy = tmp_path / "host.xplane.pb"
    copy.write_bytes(trace.read_bytes())
    script = f"""
import os
from pathlib import Path
from analysis.read import trace
size, buffer = trace._open_trace(Path({str(copy)!r}))
os.truncate({str(copy)!r}, 0)  # another program rewrites the file while devprof holds its bytes
print(size, sum(buffer[i] for i in range(0, size, 512)) >= 0, len(buffer[:]) == size)
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr.decode()[-500:])  # -7: SIGBUS
    assert proc.stdout.decode().split()[1:] == ["True", "True"]


# ---------------------------------------------------------------- clocks out of range, names not UTF-8, a plane given twice


@pytest.mark.parametrize("base_ns", [-(10**9), 2**63 - 10**12])
def test_a_trace_on_a_clock_before_1970_or_past_2100_is_refused_not_misread(tmp_path, base_ns):
    from analysis.read.trace import TraceError

    path = steps_trace(tmp_path / "t.xplane.pb", steps=4, base_ns=base_ns)
    with pytest.raises(TraceError, match="impossible times"):
        analysis.analyze(path)


def test_a_name_that_is_not_utf8_is_shown_with_its_bytes_not_a_refused_trace(tmp_path):
    raw = steps_trace(tmp_path / "t.xplane.pb", steps=4).read_bytes()
    odd = tmp_path / "odd.xplane.pb"
    odd.write_bytes(raw.replace(b"model/conv:Conv2D", b"model/c\xffnv:Conv2D"))  # same length: a valid message
    result = analysis.analyze(odd)
    assert len(result.steps) == 4
    assert any("model/c\\xffnv" in str(op) for op in result.ops["op"]), result.ops["op"].tolist()


def test_a_plane_repeated_in_the_trace_is_said(tmp_path):
    from analysis.read.run_files import RunFileWarning

    space = _xspace_class()()
    space.hostnames.append("host")
    for plane_id in (0, 1):  # the host plane twice
        host = _Plane(space, plane_id, "/host:CPU")
        python = host.line(100, "python", BASE_NS)
        for k in range(3):
            t = BASE_NS + 10 * MS + k * 10 * MS
            host.event(python, "train", t, t + 10 * MS, step_num=k, _r=1)
        host.finish()
    path = _write_space(space, tmp_path / "t.xplane.pb")
    with pytest.warns(RunFileWarning, match=r"'/host:CPU' appear as several planes"):
        analysis.analyze(path)
