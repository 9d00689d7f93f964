"""`devprof analyze` on any TensorFlow or XLA trace: steps found without markers, device rows, several hosts.

Ground truth everywhere: a real TensorFlow loop traced without step markers with a known
input or host cost (the loop's own timing of it, less a clean control traced the same
way, so that machine load moves the expectation with the trace), and synthetic
XSpace traces (CUDA, ROCm, TPU, several hosts, grouped, unrepeated) whose every part is
an exact number of nanoseconds at absolute, epoch-like timestamps.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

import analysis
import trace_fixtures as fx
from analysis import analyze
from analysis.read.trace import TraceError
from cli_checks import one_usage_error
from marker_traces import BASE_NS, MS, hostile_trace
from profiler import cli
from profiler.cli import main
from run_fixtures import small_run

EXACT_MS = 1e-6  # what exact integer-nanosecond arithmetic gives
DEVICE_MS = 1e-3
HOST_PARTS = ("input_ms", "compute_ms", "collective_ms", "host_ms")
DEVICE_PARTS = ("compute_ms", "input_ms", "copy_ms", "collective_ms", "idle_ms")
DEVICE_ROW_KEYS = ("device", "host", "step_count", "step_ms", *DEVICE_PARTS)
STEP_SOURCES = {"markers", "trace_groups", "program_executions", "window", "steps_csv"}


@functools.cache
def _result(path: str) -> dict:
    """`to_json(analyze(path))`, once per path (the traces are read-only)."""
    return analyze(path).to_json()


def result(path) -> dict:
    return _result(str(path))


def cli_json(capsys, path, *options) -> dict:
    """`devprof analyze PATH --format json [options]` through the real CLI entry point."""
    capsys.readouterr()
    code = main(["analyze", str(path), "--format", "json", *options])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def assert_host_steps_add_up(data: dict) -> None:
    assert data["steps"], "no steps"
    for step in data["steps"]:
        parts = sum(step[part] for part in HOST_PARTS)
        assert step["step_ms"] == pytest.approx(parts, abs=EXACT_MS), step
        assert all(step[part] >= -EXACT_MS for part in HOST_PARTS + ("compile_ms",)), step
    mean = data["mean"]
    assert mean["step_ms"] == pytest.approx(sum(mean[part] for part in HOST_PARTS), abs=EXACT_MS), mean


def device_rows(data: dict) -> dict:
    rows = {row["device"]: row for row in data["devices"]}
    assert len(rows) == len(data["devices"]), f"a device listed twice: {[r['device'] for r in data['devices']]}"
    return rows


# ----------------------------------------------------------------------------------------
# A real TensorFlow loop traced without step markers
# ----------------------------------------------------------------------------------------

UNMARKED = ("nomarker_clean", "nomarker_input40", "nomarker_host30")


@pytest.fixture(scope="module")
def unmarked():
    return {kind: fx.trace_logdir(kind) for kind in UNMARKED}


@pytest.mark.slow
@pytest.mark.parametrize("kind", UNMARKED)
def test_unmarked_loop_steps_are_the_train_step_calls(unmarked, kind):
    data = result(unmarked[kind])
    assert data["step_source"] == "program_executions", (data["step_source"], data.get("notes"))
    assert "train_step" in data["step_name"], data["step_name"]
    assert "Dataset" not in data["step_name"] and "map" not in data["step_name"].lower(), data["step_name"]
    # One step per traced call (the last may be cut short by the end of the trace).
    assert abs(len(data["steps"]) - fx.UNMARKED_STEPS) <= 1, len(data["steps"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", UNMARKED)
def test_unmarked_loop_parts_add_up(unmarked, kind):
    data = result(unmarked[kind])
    assert_host_steps_add_up(data)
    # One host, no devices: nothing to wait for in a collective.
    assert all(step["collective_ms"] == 0 for step in data["steps"])
    assert data["mean"]["collective_ms"] == 0


@pytest.mark.slow
def test_unmarked_cpu_trace_has_no_devices_workers_or_launches(unmarked):
    data = result(unmarked["nomarker_clean"])
    assert data["step_source"] in STEP_SOURCES
    assert data["devices"] == []
    assert data["workers"] == []
    assert data["straggler"] is None
    assert "kernel_launch" in data
    launch = data["kernel_launch"] or {}
    assert launch.get("calls", 0) == 0 and launch.get("ms_per_step", 0) == 0, launch


@pytest.mark.slow
def test_unmarked_control_carries_no_injected_cost(unmarked):
    clean = result(unmarked["nomarker_clean"])["mean"]
    assert clean["input_ms"] < 0.25 * fx.UNMARKED_INPUT_DELAY_MS, clean
    assert clean["host_ms"] < 0.75 * fx.UNMARKED_HOST_DELAY_MS, clean


def measured(logdir, key: str, steps: slice) -> float:
    """The loop's own per-iteration timing (ms), averaged over the iterations inside full steps."""
    values = fx.loop_timings(logdir)[key][steps]
    return sum(values) / len(values)


# A step runs from one train_step call to the next: it holds its call, the host sleep after
# it and the next iteration's wait for a batch. So the first wait and the last sleep fall
# outside every full step.
WAITS_IN_STEPS = slice(1, None)
SLEEPS_IN_STEPS = slice(None, -1)


@pytest.mark.slow
def test_unmarked_input_delay_is_input_and_input_bound(unmarked):
    clean, slow = result(unmarked["nomarker_clean"]), result(unmarked["nomarker_input40"])
    waited = measured(unmarked["nomarker_input40"], "input_wait_ms", WAITS_IN_STEPS) - measured(
        unmarked["nomarker_clean"], "input_wait_ms", WAITS_IN_STEPS
    )
    assert waited >= 0.9 * fx.UNMARKED_INPUT_DELAY_MS  # the loop did wait (a sleep is never shorter)
    added = slow["mean"]["input_ms"] - clean["mean"]["input_ms"]
    assert 0.75 * waited <= added <= 1.25 * waited, (waited, slow["mean"], clean["mean"])
    assert abs(slow["mean"]["host_ms"] - clean["mean"]["host_ms"]) < 0.25 * waited, (slow["mean"], clean["mean"])
    assert slow["verdict"]["bound"] == "input", slow["verdict"]
    assert slow["verdict"]["level"] == "high", slow["verdict"]


@pytest.mark.slow
def test_unmarked_host_delay_is_host_and_host_bound(unmarked):
    clean, slow = result(unmarked["nomarker_clean"]), result(unmarked["nomarker_host30"])
    slept = measured(unmarked["nomarker_host30"], "host_sleep_ms", SLEEPS_IN_STEPS) - measured(
        unmarked["nomarker_clean"], "host_sleep_ms", SLEEPS_IN_STEPS
    )
    assert slept >= 0.9 * fx.UNMARKED_HOST_DELAY_MS
    added = slow["mean"]["host_ms"] - clean["mean"]["host_ms"]
    assert 0.75 * slept <= added <= 1.25 * slept, (slept, slow["mean"], clean["mean"])
    assert abs(slow["mean"]["input_ms"] - clean["mean"]["input_ms"]) < 0.25 * slept, (slow["mean"], clean["mean"])
    assert slow["verdict"]["bound"] == "host", slow["verdict"]


# ----------------------------------------------------------------------------------------
# Synthetic multi-device traces: CUDA, ROCm, TPU
# ----------------------------------------------------------------------------------------

DEVICE_CASES: dict[str, dict[str, Any]] = {
    # 4 GPUs + 1 empty plane; streams Compute/Compute/MemcpyH2D, derived XLA Ops, XLA Modules, TensorFlow Ops.
    "cuda": dict(producer="cuda"),
    # 3 GPUs + 2 empty planes; Kernel/plain/MemcpyOther streams, copies as kernels, threads 30 us apart.
    "rocm": dict(producer="rocm", gpus=3, empty_gpus=2, stagger_ns=30_000),
    # 4 TPUs + 1 empty plane; XLA Ops is the activity, XLA Modules the programs, no Steps line.
    "tpu": dict(producer="tpu"),
}
GPU_CASES = ("cuda", "rocm")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    folder = tmp_path_factory.mktemp("any-trace-devices")
    return {
        name: fx.write_synthetic_device_trace(folder / name / "synth-host.xplane.pb", **kwargs)
        for name, kwargs in DEVICE_CASES.items()
    }


@pytest.mark.parametrize("case", DEVICE_CASES)
def test_device_rows_match_the_injected_parts(synthetic, case):
    made = synthetic[case]
    rows = device_rows(result(made.path))
    for name, expected in made.devices.items():
        row = rows[name]
        assert set(DEVICE_ROW_KEYS) <= set(row), row
        assert row["step_count"] == expected["step_count"], row
        for key in ("step_ms", *DEVICE_PARTS):
            assert row[key] == pytest.approx(expected[key], abs=DEVICE_MS), (name, key, row, expected)
        assert not row.get("idle", False), row


@pytest.mark.parametrize("case", DEVICE_CASES)
def test_one_row_per_device_plane_and_none_for_custom_planes(synthetic, case):
    made = synthetic[case]
    rows = device_rows(result(made.path))
    assert set(rows) == set(made.devices) | set(made.idle_devices), sorted(rows)
    assert not any("CUSTOM" in name for name in rows)


@pytest.mark.parametrize("case", DEVICE_CASES)
def test_device_planes_without_events_are_not_recorded_never_idle(synthetic, case):
    made = synthetic[case]
    data = result(made.path)
    rows = device_rows(data)
    assert made.idle_devices
    for name in made.idle_devices:
        row = rows[name]
        assert row["recorded"] is False and row["idle"] is None, row
        assert row["step_count"] == 0, row
        assert all(row[key] is None for key in ("step_ms", *DEVICE_PARTS)), row  # unknown, not 0
    assert any("not recorded" in note for note in data["notes"]), data["notes"]
    assert all(rows[name]["recorded"] is True for name in made.devices)


@pytest.mark.parametrize("case", DEVICE_CASES)
def test_device_parts_add_up_to_the_device_step(synthetic, case):
    for row in [row for row in result(synthetic[case].path)["devices"] if row["recorded"]]:
        assert row["step_ms"] == pytest.approx(sum(row[key] for key in DEVICE_PARTS), abs=EXACT_MS), row
        assert all(row[key] >= -EXACT_MS for key in DEVICE_PARTS), row


@pytest.mark.parametrize("case", DEVICE_CASES)
def test_device_rows_name_their_host(synthetic, case):
    made = synthetic[case]
    rows = result(made.path)["devices"]
    assert rows and all(row["host"] == made.hostname for row in rows), rows


@pytest.mark.parametrize("case", GPU_CASES)
def test_derived_xla_ops_line_is_not_counted_again(synthetic, case):
    made = synthetic[case]
    rows = device_rows(result(made.path))
    for name, expected in made.devices.items():
        compute = rows[name]["compute_ms"]
        assert compute != pytest.approx(made.double_counted_compute_ms[name], abs=0.1), (
            f"{name}: the derived XLA Ops line was counted as device activity"
        )
        assert compute == pytest.approx(expected["compute_ms"], abs=DEVICE_MS), rows[name]


@pytest.mark.parametrize("case", DEVICE_CASES)
def test_kth_execution_on_each_thread_is_step_k(synthetic, case):
    made = synthetic[case]
    data = result(made.path)
    assert data["step_source"] == "program_executions", (data["step_source"], data.get("notes"))
    # On TPUs the device's own record names the program; the GPUs' launches carry no name here.
    assert (
        data["step_name"] == "jit_train_step(7)" if case == "tpu" else data["step_name"].startswith(fx.PJRT_EXECUTE)
    ), data["step_name"]
    # One step per execution round, not one per device thread.
    assert len(data["steps"]) == made.steps, [s["step_ms"] for s in data["steps"]]
    for step in data["steps"][:-1]:
        assert step["step_ms"] == pytest.approx(made.step_ms, abs=DEVICE_MS), step
    # The last one ends with its executions.
    assert data["steps"][-1]["step_ms"] == pytest.approx(made.step_ms, abs=DEVICE_MS), data["steps"][-1]


@pytest.mark.parametrize("case", DEVICE_CASES)
def test_host_parts_add_up_on_device_traces(synthetic, case):
    data = result(synthetic[case].path)
    assert_host_steps_add_up(data)
    assert data["mean"]["input_pct"] + data["mean"]["compute_pct"] + data["mean"]["host_pct"] <= 100.0 + 1e-6


@pytest.mark.parametrize("case", DEVICE_CASES)
def test_kernel_launch_calls_are_counted(synthetic, case):
    made = synthetic[case]
    launch = result(made.path)["kernel_launch"] or {}
    assert launch.get("calls", 0) == made.launch_calls, launch
    assert launch.get("ms_per_step", 0) == pytest.approx(made.launch_ms_per_step, abs=EXACT_MS), launch


def test_single_host_file_has_no_workers(synthetic):
    data = result(synthetic["cuda"].path)
    assert data["workers"] == []
    assert data["straggler"] is None


def test_absolute_timestamps_are_exact(tmp_path):
    """Durations with odd nanoseconds at ~1.8e18 ns: a float64 there holds only every 256th ns."""
    made = fx.write_synthetic_device_trace(
        tmp_path / "odd.xplane.pb",
        producer="cuda",
        kernel_ms=6.000123,
        h2d_ms=1.234567,
        d2d_ms=0.500001,
        collective_ms=2.000003,
        gap_ms=2.000011,
        skew_ms=0.250007,
    )
    data = result(made.path)
    rows = device_rows(data)
    for name, expected in made.devices.items():
        for key in ("step_ms", *DEVICE_PARTS):
            assert rows[name][key] == pytest.approx(expected[key], abs=EXACT_MS), (name, key, rows[name])
    for step in data["steps"]:
        assert step["step_ms"] == pytest.approx(made.step_ms, abs=EXACT_MS), step
    assert_host_steps_add_up(data)


def test_cli_json_matches_the_in_process_analysis(synthetic, capsys):
    made = synthetic["cuda"]
    printed = cli_json(capsys, made.path)
    data = result(made.path)
    assert printed["step_source"] == data["step_source"] == "program_executions"
    assert printed["devices"] == data["devices"]
    assert len(printed["steps"]) == made.steps


# ----------------------------------------------------------------------------------------
# Grouping stored in the trace: group_id stats, a device Steps line
# ----------------------------------------------------------------------------------------


def test_group_ids_on_host_events_give_trace_groups(tmp_path):
    path = fx.write_grouped_host_trace(
        tmp_path / "grouped.xplane.pb", steps=6, input_ms=3.0, compute_ms=5.0, host_ms=2.0
    )
    data = result(path)
    assert data["step_source"] == "trace_groups", (data["step_source"], data.get("notes"))
    assert len(data["steps"]) == 6
    for step in data["steps"]:
        assert step["step_ms"] == pytest.approx(10.0, abs=EXACT_MS), step
        assert step["input_ms"] == pytest.approx(3.0, abs=EXACT_MS), step
    assert_host_steps_add_up(data)
    assert data["devices"] == []


@pytest.mark.parametrize("producer", ["tpu", "cuda"])
def test_device_steps_line_gives_trace_groups(tmp_path, producer):
    made = fx.write_synthetic_device_trace(tmp_path / f"{producer}.xplane.pb", producer=producer, steps_line=True)
    data = result(made.path)
    assert data["step_source"] == "trace_groups", (data["step_source"], data.get("notes"))
    assert len(data["steps"]) == made.steps
    for step in data["steps"]:
        assert step["step_ms"] == pytest.approx(made.step_ms, abs=DEVICE_MS), step
    rows = device_rows(data)
    for name, expected in made.devices.items():
        for key in ("step_count", "step_ms", *DEVICE_PARTS):
            assert rows[name][key] == pytest.approx(expected[key], abs=DEVICE_MS), (name, key, rows[name])
    assert_host_steps_add_up(data)


# ----------------------------------------------------------------------------------------
# Nothing repeats: the whole trace as one step
# ----------------------------------------------------------------------------------------


def test_nothing_repeating_is_one_window(tmp_path):
    data = result(fx.write_unrepeated_trace(tmp_path / "once.xplane.pb"))
    assert data["step_source"] == "window", (data["step_source"], data.get("notes"))
    assert len(data["steps"]) == 1
    step = data["steps"][0]
    assert step["step_ms"] == pytest.approx(fx.UNREPEATED_TRACE_MS, abs=EXACT_MS), step
    assert step["input_ms"] == pytest.approx(fx.UNREPEATED_INPUT_MS, abs=EXACT_MS), step
    assert_host_steps_add_up(data)
    assert any("repeat" in note.lower() for note in data["notes"]), data["notes"]


# ----------------------------------------------------------------------------------------
# --step-name REGEX chooses the program taken as the step
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, calls, period_ms", [("train_step", 5, 10.0), ("eval_step", 8, 5.0)])
def test_step_name_picks_the_named_function(tmp_path, capsys, name, calls, period_ms):
    path = fx.write_two_function_trace(tmp_path / "two.xplane.pb", train_calls=5, eval_calls=8)
    data = cli_json(capsys, path, "--step-name", name)
    assert data["step_source"] == "program_executions", data["step_source"]
    assert name in data["step_name"], data["step_name"]
    assert len(data["steps"]) == calls
    for step in data["steps"][:-1]:
        assert step["step_ms"] == pytest.approx(period_ms, abs=EXACT_MS), step
    assert_host_steps_add_up(data)


def test_step_name_picks_an_xla_program(synthetic, capsys):
    made = synthetic["cuda"]
    data = cli_json(capsys, made.path, "--step-name", r"LoadedExecutable::Execute$")
    assert data["step_source"] == "program_executions"
    assert data["step_name"].startswith(fx.PJRT_EXECUTE), data["step_name"]
    assert len(data["steps"]) == made.steps


# ----------------------------------------------------------------------------------------
# Several hosts in one session: one row per worker, the straggler
# ----------------------------------------------------------------------------------------

SESSIONS: dict[str, dict[str, Any]] = {
    "slow_input": dict(slow_worker=1, slow_part="input"),
    "slow_host": dict(slow_worker=1, slow_part="host"),
    "equal": dict(slow_worker=None),
}


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    folder = tmp_path_factory.mktemp("any-trace-sessions")
    return {name: fx.write_synthetic_session(folder / name, **kwargs) for name, kwargs in SESSIONS.items()}


def worker_rows(data: dict, session) -> dict:
    rows = {row["host"]: row for row in data["workers"]}
    assert sorted(rows) == sorted(session.hostnames), data["workers"]
    assert len({str(row["worker"]) for row in data["workers"]}) == len(session.files)
    return rows


@pytest.mark.parametrize("name", SESSIONS)
def test_one_worker_row_per_host_file(sessions, name):
    session = sessions[name]
    data = result(session.logdir)
    assert len(data["workers"]) == len(session.files)
    for row in worker_rows(data, session).values():
        assert row["step_ms"] == pytest.approx(session.step_ms, abs=DEVICE_MS), row
        assert row["step_ms"] == pytest.approx(sum(row[part] for part in HOST_PARTS), abs=EXACT_MS), row


@pytest.mark.parametrize("name", ["slow_input", "slow_host", "equal"])
def test_worker_rows_show_input_and_collective_wait(sessions, name):
    session = sessions[name]
    rows = worker_rows(result(session.logdir), session)
    for host, input_ms, collective_ms in zip(session.hostnames, session.input_ms, session.collective_ms):
        assert rows[host]["input_ms"] == pytest.approx(input_ms, abs=DEVICE_MS), rows[host]
        assert rows[host]["collective_ms"] == pytest.approx(collective_ms, abs=DEVICE_MS), rows[host]


@pytest.mark.parametrize("name", ["slow_input", "slow_host"])
def test_slow_worker_is_the_straggler_with_its_cause(sessions, name):
    session = sessions[name]
    data = result(session.logdir)
    rows = worker_rows(data, session)
    straggler = data["straggler"]
    assert straggler is not None, data["workers"]
    slow_host = session.hostnames[session.slow_worker]
    assert straggler["worker"] == rows[slow_host]["worker"], (straggler, data["workers"])
    assert straggler["cause"] == session.slow_part, straggler
    assert straggler["evidence"], straggler


def test_equal_workers_have_no_straggler(sessions):
    session = sessions["equal"]
    data = result(session.logdir)
    assert len(data["workers"]) == len(session.files)
    assert data["straggler"] is None, data["straggler"]


def test_staggered_executions_partition_the_time_without_overlap():
    """Round k on a late thread can outlast the start of round k+1 on an early one: the steps
    still tile the time, so nothing is counted in two steps."""
    import pandas as pd

    from analysis.steps.detection import detect_steps
    from views import view_of

    ms = 1_000_000
    rows = []
    for k in range(3):
        rows.append(("PjRtStreamExecutorLoadedExecutable::Execute", 0, 0, k * 10 * ms, k * 10 * ms + 9 * ms))
        rows.append(("PjRtStreamExecutorLoadedExecutable::Execute", 0, 1, k * 10 * ms + 2 * ms, k * 10 * ms + 11 * ms))
    events = pd.DataFrame(rows, columns=["name", "plane", "line", "start_ns", "end_ns"])
    events["duration_ns"] = events["end_ns"] - events["start_ns"]
    events["plane_name"] = pd.Categorical(["/host:CPU"] * len(events))
    events["line_name"] = pd.Categorical(
        ["py_xla_execute/1" if line == 0 else "py_xla_execute/2" for line in events["line"]]
    )
    events["name"] = events["name"].astype("category")
    for column in ("step_num", "_r", "steps", "group_id", "tf_function_call"):
        events[column] = pd.Series([None] * len(events), dtype=object)
    found = detect_steps(view_of(events))
    assert found.method == "program_executions" and len(found.steps) == 3
    starts, ends = found.steps["start_ns"].tolist(), found.steps["end_ns"].tolist()
    assert ends[:-1] == starts[1:]  # no overlap, no gap
    assert ends[-1] == 31 * ms  # the last round ends with its last execution


# ---------------------------------------------------------------- a --step-name that finds no step; XLA's instructions as the ops of a CPU step


@pytest.mark.parametrize("call", [analysis.analyze, analysis.analyze_worker])
def test_a_bad_step_name_is_a_value_error_naming_it_before_anything_is_read(tmp_path, call):
    with pytest.raises(ValueError, match=r"step_name '\(' is not a regular expression: missing \)"):
        call(tmp_path / "not-there", step_name="(")


def test_a_bad_step_name_is_one_usage_error(tmp_path, capsys):
    line = one_usage_error(cli.main(["analyze", str(small_run(tmp_path / "run")), "--step-name", "(["]), capsys)
    assert "--step-name '([' is not a regular expression" in line, line


def _marked_trace(tmp_path, second_line: str, step, steps: int = 6):
    """A CPU trace of `steps` 10 ms steps with `train` markers; `step(host, python, other, t)` adds each
    step's events on the Python thread and on a second thread named `second_line`."""
    from trace_fixtures import _Plane, _write_space, _xspace_class

    space = _xspace_class()()
    space.hostnames.append("host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", BASE_NS)
    other = host.line(101, second_line, BASE_NS)
    for k in range(steps):
        t = BASE_NS + 10 * MS + k * 10 * MS
        host.event(python, "train", t, t + 10 * MS, step_num=k, _r=1)
        step(host, python, other, t)
    host.finish()
    return _write_space(space, tmp_path / "t.xplane.pb")


def test_a_step_name_that_matches_an_op_is_refused_naming_the_markers(tmp_path):
    def step(host, python, worker, t):
        host.event(python, "IteratorGetNext", t, t + 2 * MS)
        host.event(worker, "model/conv2d/Relu:_MklNativeFusedConv2D", t + 2 * MS, t + 7 * MS)

    trace = _marked_trace(tmp_path, "tf_Compute/1", step)
    # one execution of one op is no step (every other op would read as host overhead): refused, the
    # trace's own steps named
    with pytest.raises(
        TraceError,
        match=r"--step-name 'Conv2D' matches a TensorFlow op "
        r"\(model/conv2d/Relu:_MklNativeFusedConv2D\), not a step; .*train",
    ):
        analysis.analyze(trace, step_name="Conv2D")
    from profiler.cli import main

    assert main(["analyze", str(trace), "--step-name", "Conv2D"]) != 0


def test_an_xla_compiled_step_on_a_cpu_shows_its_programs_instructions_as_ops(tmp_path):
    """`--jit-compile` on a CPU: the op table was the function call alone (or two trivial ops);
    XLA's CPU runtime records each instruction inside `ThunkExecutor::Execute`."""

    def step(host, python, pool, t):
        host.event(python, "IteratorGetNext", t, t + 1 * MS)
        host.event(python, "__inference_step_9:__inference_step_9", t + 1 * MS, t + 9 * MS)
        host.event(python, "ThunkExecutor::Execute", t + 1 * MS, t + 9 * MS)
        host.event(python, "convolution.1", t + 1 * MS, t + 5 * MS)
        host.event(python, "end: convolution.1", t + 5 * MS, t + 5 * MS)
        host.event(python, "transpose_copy_fusion", t + 5 * MS, t + 6 * MS)
        host.event(pool, "ThunkExecutor::Execute", t + 6 * MS, t + 9 * MS)
        host.event(pool, "MatMul.4", t + 6 * MS, t + 8 * MS)

    result = analysis.analyze(_marked_trace(tmp_path, "tf_numa_-1_Eigen/1", step))
    ops = result.ops.set_index("op")
    assert list(ops.index[:3]) == ["convolution.1", "MatMul.4", "transpose_copy_fusion"], result.ops
    assert ops.loc["convolution.1", "ms_per_step"] == pytest.approx(4.0) and set(ops["type"]) == {"XLA"}
    assert not any(op.startswith(("__inference", "end: ", "ThunkExecutor")) for op in ops.index)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return hostile_trace(tmp_path_factory.mktemp("hostile") / "plugins" / "profile" / "s" / "host.xplane.pb")


# ---------------------------------------------------------------- a --step-name that cannot be matched in reasonable time


@pytest.mark.parametrize(
    "pattern, said",
    [
        ("(a+)+b", "repeats a repetition"),
        ("(b|b)*c", "repeats a repetition"),
        ("a{99999999999}", "is not a regular expression"),
    ],
)
def test_a_step_name_that_cannot_be_matched_in_reasonable_time_is_a_usage_error(trace, capsys, pattern, said):
    from cli_checks import one_usage_error

    assert said in one_usage_error(cli.main(["analyze", str(trace), "--step-name", pattern]), capsys)
    with pytest.raises(ValueError, match=said):
        analysis.analyze(trace, step_name=pattern)
