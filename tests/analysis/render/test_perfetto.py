"""The Perfetto export (`devprof analyze --perfetto FILE`, `Analysis.to_perfetto`), read back with the
`perfetto` package's own protos as Perfetto takes them (tests/support/perfetto_readback.py): one process per
worker or host, a slice per step with its parts as arguments and child slices that sum to it, each
device's busy and idle spans, the findings as instants, a counter per sampler column and allocator,
and the trace's own events per `--perfetto-events`; the packets encoded in bulk parse as the ones
the package's builder makes. In-process, without TensorFlow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import analysis
from analysis import intervals as iv
from analysis import timeline
from analysis.read.trace import read_trace
from analysis.read.view import TraceView
from analysis.render import perfetto, perfetto_packets
from analysis.steps.host import steady_steps
from cli_checks import one_usage_error
from job_fixtures import write_job
from marker_traces import MS, marker_trace
from perfetto_readback import read_back
from profiler import cli
from repo_paths import REPO
from run_fixtures import make_run, step_line
from trace_fixtures import write_synthetic_device_trace

VAE = REPO.parent / "shared/traces/tf-gpu-keras-vae-gtx1060"
PARTS = ("input", "compute", "collective", "host")


SAMPLER_COLUMNS = ["time_s", "cpu_pct", "cpu0_pct", "cpu1_pct", "proc_cpu_pct", "proc_rss_bytes"]


def sampled_run(path: Path, input_ms: float = 1.0) -> Path:
    """8 steps 10 ms apart (steps.csv) and host.csv: two cores at 90 %, the process using 1.5 of them
    during the steps (20 ms samples), then idle for 6 s."""
    run = make_run(path, [step_line(i, input_ms=input_ms) for i in range(8)])
    rows = [[1_700_000_000 + 0.02 * i, 90.0, 90.0, 90.0, 150.0, 1e9 + i] for i in range(5)]
    rows += [[1_700_000_000 + 0.1 + i, 90.0, 85.0, 95.0, 1.0, 1e9] for i in range(1, 7)]
    (run / "utilization").mkdir()
    pd.DataFrame(rows, columns=SAMPLER_COLUMNS).to_csv(run / "utilization" / "host.csv", index=False)
    return run


@pytest.fixture(scope="module")
def gpu_trace(tmp_path_factory):
    return write_synthetic_device_trace(tmp_path_factory.mktemp("gpu") / "gpu.xplane.pb", gpus=2, empty_gpus=1)


# ---------------------------------------------------------------- the packets and their order


def test_bulk_packets_parse_as_the_builders_packets():
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder

    fields = perfetto_packets.Fields()
    times = np.array([1_800_000_000_128_456_789, 5, 0, 2**63 - 1, 127, 128], dtype=np.int64)
    kinds = np.array(
        [fields.SLICE_BEGIN, fields.SLICE_END, fields.INSTANT, fields.SLICE_BEGIN, fields.SLICE_END, fields.SLICE_BEGIN]
    )
    uuids = np.array([2**40 + 3, 1, 127, 128, 2**63, 16383])
    iids = np.array([7, 0, 300, 1, 0, 2**34])
    values = np.array([1.5, np.pi, -0.0, 1e300, np.inf, -2.0])
    ours = Trace()
    ours.ParseFromString(
        perfetto_packets.track_events(fields, times, kinds, uuids, iids, 3)
        + perfetto_packets.counters(fields, times, 99, values, 4)
    )
    builder = TraceProtoBuilder()
    for t, kind, uuid, iid in zip(times, kinds, uuids, iids):
        packet = builder.add_packet()
        packet.timestamp, packet.trusted_packet_sequence_id, packet.sequence_flags = int(t), 3, 2
        packet.track_event.type, packet.track_event.track_uuid = int(kind), int(uuid)
        if iid:
            packet.track_event.name_iid = int(iid)
    for t, value in zip(times, values):
        packet = builder.add_packet()
        packet.timestamp, packet.trusted_packet_sequence_id = int(t), 4
        packet.track_event.type, packet.track_event.track_uuid = fields.COUNTER, 99
        packet.track_event.double_counter_value = float(value)
    theirs = Trace()
    theirs.ParseFromString(builder.serialize())
    assert list(ours.packet) == list(theirs.packet)


def _replay(layout) -> dict:
    """Each event's (start, end) as a Perfetto track closes them: the latest open slice of its track."""
    stacks: dict[int, list[int]] = {}
    got: dict[int, tuple[int, int]] = {}
    for index, is_end in zip(layout.events, layout.is_end):
        key = layout.lane[index]
        if layout.starts[index] == layout.ends[index]:
            got[index] = (layout.starts[index],) * 2
        elif is_end:
            opened = stacks[key].pop()
            got[opened] = (layout.starts[opened], layout.ends[index])
        else:
            stacks.setdefault(key, []).append(index)
    return got


@pytest.mark.parametrize("seed", range(6))
def test_every_slice_closes_itself_and_crossing_ones_get_their_own_lane(seed):
    rng = np.random.default_rng(seed)
    count = 400
    starts = rng.integers(0, 60, count)
    ends = starts + rng.choice([0, 1, 3, 10, 40], count)
    if seed % 2:  # a nesting family only: one lane
        starts, ends = np.sort(rng.integers(0, 1000, count)) * 10, None
        ends = starts + 5
        starts = np.concatenate([starts, [0, 0, 10, 10]])
        ends = np.concatenate([ends, [20_000, 20_000, 10, 15]])
    layout = perfetto._Layout(np.zeros(len(starts), dtype=np.int64), starts, ends)
    got = _replay(layout)
    assert len(got) == len(starts)
    assert all(got[i] == (starts[i], ends[i]) for i in range(len(starts)))
    if seed % 2:
        assert layout.lanes == 1
    else:
        assert layout.lanes > 1


# ---------------------------------------------------------------- one CPU trace


def test_a_cpu_trace_has_one_process_a_slice_per_step_and_parts_that_sum_to_it(tmp_path):
    trace = marker_trace(tmp_path / "host.xplane.pb")
    result = analysis.analyze(trace)
    assert result.to_perfetto(tmp_path / "t.pftrace", events="none") == tmp_path / "t.pftrace"
    back = read_back(tmp_path / "t.pftrace")
    assert back.processes == ["host"]
    assert back.children("host") == ["steps"]
    steps = back.on("host", "steps")
    assert steps["ts"].tolist() == result.steps["start_ns"].tolist()
    assert steps["dur"].tolist() == [10 * MS] * 6
    assert steps["name"].tolist() == [f"step {i}" for i in range(6)]
    args = steps["args"].iloc[0]
    assert (
        args["step"],
        args["step_ms"],
        args["input_ms"],
        args["compute_ms"],
        args["host_ms"],
        args["collective_ms"],
    ) == (0, 10.0, 2.0, 5.0, 3.0, 0.0)
    assert "outlier_cause" not in args
    parts = {part: back.on("host", part, "steps") for part in PARTS}
    assert parts["collective"].empty  # 0 ms: no slice
    # end to end: input from the step's start, then compute, then host to the step's end
    assert parts["input"]["ts"].tolist() == steps["ts"].tolist()
    assert parts["compute"]["ts"].tolist() == (steps["ts"] + 2 * MS).tolist()
    assert (parts["host"]["ts"] + parts["host"]["dur"]).tolist() == (steps["ts"] + steps["dur"]).tolist()
    total = sum(frame["dur"].to_numpy() for name, frame in parts.items() if not frame.empty)
    assert total.tolist() == steps["dur"].tolist()
    assert [parts[p]["dur"].iloc[0] for p in ("input", "compute", "host")] == [2 * MS, 5 * MS, 3 * MS]


def test_the_trace_own_events_per_perfetto_events(tmp_path, gpu_trace):
    result = analysis.analyze(gpu_trace.path)
    view = TraceView(read_trace(gpu_trace.path))
    counts = {}
    for events in ("ops", "all", "none"):
        path = result.to_perfetto(tmp_path / f"{events}.pftrace", events=events)
        back = read_back(path)
        assert back.slices is not None
        raw = back.slices[
            [len(back.path_of(u)) == 2 and back.path_of(u)[0] not in PARTS for u in back.slices["track_uuid"]]
        ]
        counts[events] = len(raw)
        if events == "none":
            continue
        expected = view.timeline_events(events)
        assert len(raw) == len(expected)
        # each line's events, their names and times to the nanosecond
        for (plane, line), mine in expected.groupby(
            [expected["plane_name"].astype(str), expected["line_name"].astype(str)]
        ):
            shown = raw[[back.path_of(u) == [line, plane] for u in raw["track_uuid"]]]
            assert sorted(zip(shown["ts"], shown["ts"] + shown["dur"], shown["name"])) == sorted(
                zip(mine["start_ns"], mine["end_ns"], mine["name"].astype(str))
            ), (plane, line)
    assert counts["none"] == 0 < counts["ops"] < counts["all"] == len(view.events)
    kernels = view.device
    assert counts["ops"] >= len(kernels)  # every kernel and copy of the devices' streams, and the host's ops


def test_each_device_has_its_busy_and_idle_spans(tmp_path, gpu_trace):
    result = analysis.analyze(gpu_trace.path)
    back = read_back(result.to_perfetto(tmp_path / "t.pftrace", events="none"))
    process = back.processes[0]
    view = TraceView(read_trace(gpu_trace.path))
    recorded = sorted(view.device["plane_name"].astype(str).unique())
    assert [c for c in back.children(process) if c.startswith("/device")] == recorded  # none for the empty GPU
    for device in recorded:
        spans = back.on(process, device)
        own = view.device[view.device["plane_name"].astype(str) == device]
        starts, ends = iv.union(own["start_ns"].to_numpy(), own["end_ns"].to_numpy())
        busy = spans[spans["name"] == "busy"]
        assert list(zip(busy["ts"], busy["ts"] + busy["dur"])) == list(zip(starts, ends))
        idle = spans[spans["name"] == "idle"]
        assert list(zip(idle["ts"], idle["ts"] + idle["dur"])) == list(zip(ends[:-1], starts[1:]))
        assert spans["name"].tolist()[:2] == ["busy", "idle"] and spans["depth"].eq(0).all()


# ---------------------------------------------------------------- samplers, findings, a real trace


def test_sampler_columns_are_counters_and_findings_are_instants(tmp_path):
    result = analysis.analyze(sampled_run(tmp_path / "run"))
    rules = {f["rule"] for f in result.findings}
    assert {"idle_stretch", "cpu_contention"} <= rules
    back = read_back(result.to_perfetto(tmp_path / "t.pftrace"))
    process = back.processes[0]
    assert back.children(process) == ["steps", "findings", *(f"host {c}" for c in SAMPLER_COLUMNS[1:])]
    samples = result.samplers["host"]
    for column in SAMPLER_COLUMNS[1:]:
        counter = back.counter(process, f"host {column}")
        assert counter["value"].tolist() == samples[column].tolist()  # every row
        assert counter["ts"].tolist() == timeline.wall_ns(samples["time_s"]).tolist()
    units = {t["name"]: (t["unit"], t["unit_name"]) for t in back.tracks.values() if t["counter"]}
    assert units["host proc_rss_bytes"][0] == 3 and units["host cpu_pct"][1] == "%"  # UNIT_SIZE_BYTES
    steps = back.on(process, "steps")  # steps.csv's own times
    assert steps["ts"].tolist() == timeline.wall_ns(1_700_000_000 + 0.01 * np.arange(8)).tolist()
    found = back.on(process, "findings")
    assert set(found["name"]) == rules and found["dur"].eq(0).all()
    by_rule = found.set_index("name")
    assert by_rule.loc["idle_stretch", "ts"] == timeline.wall_ns(result.facts.idle_stretch.start_s)
    first_steady = int(steady_steps(result.steps)["step"].iloc[0])
    assert by_rule.loc["cpu_contention", "ts"] == steps["ts"].iloc[first_steady]
    assert by_rule.loc["cpu_contention", "args"]["severity"] == "warning"
    assert "Other processes" in by_rule.loc["cpu_contention", "args"]["evidence"]


def test_a_traced_run_puts_its_samples_on_the_trace_clock(tmp_path):
    # steps.csv's wall clock is 3 s ahead of the trace's: the samples move back by the steps both hold
    run = make_run(
        tmp_path / "run", [f"1,{k},1,{1_700_000_003.010 + 0.01 * k:.6f},2.0,5.0,3.0,10.0,100" for k in range(6)]
    )
    (run / "utilization").mkdir()
    times = 1_700_000_003.0 + 0.005 * np.arange(20)
    pd.DataFrame({"time_s": times, "cpu_pct": np.linspace(10, 60, 20)}).to_csv(
        run / "utilization" / "host.csv", index=False
    )
    marker_trace(run / "plugins" / "profile" / "s" / "host.xplane.pb")
    result = analysis.analyze(run)
    assert result.step_source == "markers"
    back = read_back(result.to_perfetto(tmp_path / "t.pftrace"))
    process = back.processes[0]
    assert back.on(process, "steps")["ts"].tolist() == result.steps["start_ns"].tolist()
    counter = back.counter(process, "host cpu_pct")
    assert counter["value"].tolist() == result.samplers["host"]["cpu_pct"].tolist()
    shifted = counter["ts"].to_numpy() - timeline.wall_ns(times)
    assert np.all(np.abs(shifted + 3 * 10**9) < 1000) and len(set(shifted)) == 1  # one shift, 3 s to the us


@pytest.mark.skipif(not VAE.is_dir(), reason="the real traces folder beside the repository is not here")
def test_a_real_gpu_trace_reads_back_with_its_steps_and_allocators_to_the_nanosecond(tmp_path):
    result = analysis.analyze(VAE)
    back = read_back(result.to_perfetto(tmp_path / "t.pftrace"))
    process = back.processes[0]
    steps = back.on(process, "steps")
    assert steps["ts"].tolist() == result.steps["start_ns"].tolist()
    assert steps["dur"].tolist() == (result.steps["end_ns"] - result.steps["start_ns"]).tolist()
    assert [a["step_ms"] for a in steps["args"]] == result.steps["step_ms"].tolist()
    memory = TraceView(read_trace(VAE)).memory
    for allocator, events in memory.groupby("allocator"):
        counter = back.counter(process, f"{allocator} bytes in use")
        assert counter["ts"].tolist() == events["start_ns"].tolist()
        assert counter["value"].tolist() == events["bytes_in_use"].tolist()
    assert {f["rule"] for f in result.findings} == set(back.on(process, "findings")["name"])


# ---------------------------------------------------------------- several workers, compare


def test_a_job_is_one_process_per_worker_with_its_own_steps(tmp_path):
    job = write_job(tmp_path)
    result = analysis.analyze(job.path)
    back = read_back(result.to_perfetto(tmp_path / "t.pftrace", events="none"))
    assert back.processes == ["worker-0 (vm)", "worker-1 (vm)"]
    for worker, process in enumerate(back.processes):
        steps = back.on(process, "steps")
        assert steps["dur"].tolist() == [job.step_ms * MS] * 5
        collective = back.on(process, "collective", "steps")
        assert collective["dur"].tolist() == [round(job.collective_ms[worker] * MS)] * 5
        assert [a["collective_ms"] for a in steps["args"]] == [job.collective_ms[worker]] * 5
        assert "/device:GPU:0" in back.children(process)


def test_compare_writes_each_run_as_its_processes(tmp_path, capsys):
    runs = [sampled_run(tmp_path / name, input_ms=x) for name, x in (("a", 1.0), ("b", 0.5))]
    code = cli.main(["compare", *map(str, runs), "--perfetto", str(tmp_path / "c.pftrace")])
    assert code == 0, capsys.readouterr().err
    assert "wrote" in capsys.readouterr().err
    back = read_back(tmp_path / "c.pftrace")
    assert back.processes == ["a", "b"]
    assert [len(back.on(p, "steps")) for p in back.processes] == [8, 8]


# ---------------------------------------------------------------- the command


def test_analyze_writes_the_trace_and_names_it(tmp_path, capsys):
    trace = marker_trace(tmp_path / "host.xplane.pb")
    assert (
        cli.main(["analyze", str(trace), "--perfetto", str(tmp_path / "out" / "t.pftrace"), "--perfetto-events", "all"])
        == 0
    )
    err = capsys.readouterr().err
    assert f"wrote {tmp_path / 'out' / 't.pftrace'}: 1 process" in err
    back = read_back(tmp_path / "out" / "t.pftrace")
    python = back.on("host", "python", "/host:CPU")
    assert python["name"].value_counts().to_dict() == {"train": 6, "IteratorGetNext": 6}


def test_the_command_draws_from_the_analysis_read_as_the_api_does_reading_again(tmp_path, gpu_trace, capsys):
    assert cli.main(["analyze", str(gpu_trace.path), "--perfetto", str(tmp_path / "cli.pftrace")]) == 0
    analysis.analyze(gpu_trace.path).to_perfetto(tmp_path / "api.pftrace")
    assert (tmp_path / "cli.pftrace").read_bytes() == (tmp_path / "api.pftrace").read_bytes()


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--perfetto", "{tmp}"], "is a folder"),
        (["--perfetto", "{tmp}/t.pftrace", "--perfetto-events", "kernels"], "invalid choice: 'kernels'"),
        (["--perfetto-events", "all"], "needs --perfetto FILE"),
        (["--perfetto", "{tmp}/no/such/t.pftrace"], "no folder"),
    ],
)
def test_perfetto_usage_errors_are_one_line_and_exit_2(tmp_path, capsys, argv, says):
    trace = marker_trace(tmp_path / "host.xplane.pb")
    code = cli.main(["analyze", str(trace), *(a.replace("{tmp}", str(tmp_path)) for a in argv)])
    assert says in one_usage_error(code, capsys)
    assert not list(tmp_path.glob("**/*.pftrace"))


def test_unknown_events_are_a_value_error_in_python(tmp_path):
    result = analysis.analyze(marker_trace(tmp_path / "host.xplane.pb"))
    with pytest.raises(ValueError, match="ops, all, none"):
        result.to_perfetto(tmp_path / "t.pftrace", events="kernels")


@pytest.mark.slow
def test_the_package_is_imported_only_by_the_export(tmp_path):
    trace = marker_trace(tmp_path / "host.xplane.pb")
    code = (
        "import sys; from profiler import cli; "
        f"assert cli.main(['analyze', {str(trace)!r}, '--format', 'json']) == 0; "
        "assert 'perfetto' not in sys.modules, 'imported without --perfetto'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_table_of_timelines_alone_writes_without_any_file_read(tmp_path):
    steps = pd.DataFrame(
        {
            "step": [0, 1],
            "start_ns": [0, 10],
            "end_ns": [10, 25],
            "step_ms": [1e-5, 1.5e-5],
            "input_ms": [2e-6, 0.0],
            "compute_ms": [5e-6, 1.5e-5],
            "collective_ms": [0.0, 0.0],
            "host_ms": [3e-6, 0.0],
            "compile_ms": [0.0, 0.0],
            "cause": [None, "device"],
            "excess_ms": [np.nan, 5e-6],
        }
    )
    devices = pd.DataFrame(
        {"device": ["/device:GPU:0"] * 2, "start_ns": [0, 4], "end_ns": [4, 9], "busy": [True, False]}
    )
    written = perfetto.write([perfetto.ProcessTimeline("p", steps, devices)], tmp_path / "t.pftrace")
    assert (written.processes, written.slices) == (1, 2 + 3 + 1 + 2)
    back = read_back(tmp_path / "t.pftrace")
    assert back.on("p", "steps")["args"].iloc[1]["outlier_cause"] == "device"


def test_a_jobs_perfetto_trace_lists_the_machine_findings_its_json_does(tmp_path):
    # Two workers on one 2-core machine, each using one core: alone, each sees the other as "other processes";
    # the job counts both as the job, and its Perfetto trace says the same as its JSON.
    job = write_job(tmp_path)
    alone = analysis.analyze(job.path / "worker-1")
    assert "cpu_contention" in {f["rule"] for f in alone.findings}
    result = analysis.analyze(job.path)
    assert "cpu_contention" not in {f["rule"] for f in result.findings}
    back = read_back(result.to_perfetto(tmp_path / "t.pftrace", events="none"))
    for process in back.processes:
        names = set(back.on(process, "findings")["name"]) if "findings" in back.children(process) else set()
        assert "cpu_contention" not in names, (process, names)
