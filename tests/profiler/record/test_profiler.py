"""The TF profiler window, step markers, tracer options, profiler failures and on-demand capture,
checked against XProf's own converter (the code behind TensorBoard's Profile tab)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from analysis.rules import table as rules
from child_signals import default_sigint
from profiler import cli
from profiler.record import tracing
from profiler.record.console import Console
from profiler.record.session import Session
from repo_paths import REPO

# XProf's per-step table: these parts add up to stepTimeMs.
BREAKDOWN_COLUMNS = [
    "deviceComputeTimeMs",
    "deviceToDeviceTimeMs",
    "deviceCollectivesTimeMs",
    "hostComputeTimeMs",
    "kernelLaunchTimeMs",
    "infeedTimeMs",
    "outfeedTimeMs",
    "compileTimeMs",
    "otherTimeMs",
]


def run_devprof(out, *extra, name="r", images="1500"):
    argv = [
        "run",
        "--device",
        "cpu",
        "--data",
        "synthetic",
        "--limit-images",
        images,
        "--epochs",
        "1",
        "--no-sample",
        "--quiet",
        "--out",
        str(out),
        "--run-name",
        name,
        *extra,
    ]
    return cli.main(argv), Path(out) / name


def profiler_meta(path: Path) -> dict:
    meta = json.loads((path / "run.json").read_text())
    assert meta["status"] == "complete", meta.get("error")
    return meta["profiler"]


def xprof_step_table(xplane: Path) -> tuple[list[str], list[dict]]:
    """XProf's input_pipeline_analyzer step table: column ids and one {column: value} per step."""
    from xprof.convert import raw_to_tool_data

    data = raw_to_tool_data.xspace_to_tool_data([str(xplane)], "input_pipeline_analyzer", {"use_saved_result": False})
    assert isinstance(data, tuple) and isinstance(data[0], (bytes, str))
    tables = json.loads(data[0])
    assert isinstance(tables, list) and len(tables) >= 2
    ids = [c["id"] for c in tables[1]["cols"]]
    rows = [dict(zip(ids, (cell.get("v") if cell else None for cell in row["c"]))) for row in tables[1].get("rows", [])]
    return ids, rows


def xprof_steps(xplane: Path) -> list[int]:
    _, rows = xprof_step_table(xplane)
    numbers = []
    for row in rows:
        name, number = row["stepnum"].split()
        assert name == "train"
        numbers.append(int(number))
    return numbers


def train_markers(xplane: Path) -> list[int]:
    """step_num of every `train` event in the raw trace (one per tf.function call)."""
    from xplane_proto import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(xplane.read_bytes())
    found = []
    for plane in space.planes:
        train_ids = {k for k, m in plane.event_metadata.items() if m.name == "train"}
        for line in plane.lines:
            for event in line.events:
                if event.metadata_id in train_ids:
                    stats = {plane.stat_metadata[s.metadata_id].name: s for s in event.stats}
                    if "step_num" in stats:
                        found.append(stats["step_num"].int64_value or stats["step_num"].uint64_value)
    return sorted(found)


@pytest.fixture(scope="module", autouse=True)
def small_test_set():
    """In-process runs evaluate 1,000 synthetic test images instead of 10,000: the end-of-run test
    pass is outside the profiled window and would triple each run's time."""
    import models.data as data_mod

    full = data_mod.synthetic
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(data_mod, "synthetic", lambda n, test_images=1000, seed=0: full(n, min(test_images, 1000), seed))
        yield


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


# ---------------------------------------------------------------- the default window


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    rc, path = run_devprof(tmp_path_factory.mktemp("default"))
    assert rc == 0
    return path


@pytest.mark.slow
def test_default_window_is_traced_and_described(default_run):
    prof = profiler_meta(default_run)
    start, stop = prof["window"]
    assert 0 < start < stop <= 15  # after warm-up, inside the 15-step epoch
    assert prof["first_step"] == start and prof["last_step"] == stop - 1
    trace = default_run / prof["trace"]
    assert trace.name.endswith(".xplane.pb") and trace.parent.parent == default_run / "plugins" / "profile"
    assert trace.stat().st_size == prof["trace_bytes"] > 0
    assert prof["trace_events"] > 100 * (stop - start)
    assert prof["python_events"] == 0  # no Python tracer asked for
    assert "warnings" not in prof
    assert train_markers(trace) == list(range(start, stop))


@pytest.mark.slow
def test_xprof_finds_the_window_steps_with_a_breakdown(default_run):
    prof = profiler_meta(default_run)
    start, stop = prof["window"]
    ids, rows = xprof_step_table(default_run / prof["trace"])
    assert {"stepTimeMs", "hostComputeTimeMs", "infeedTimeMs"} <= set(ids)
    steps = [int(row["stepnum"].split()[1]) for row in rows]
    assert all(row["stepnum"].startswith("train ") for row in rows)
    assert len(steps) >= (stop - start) - 2, steps
    assert all(start <= s < stop for s in steps), (steps, prof["window"])
    for row in rows:
        parts = sum(row[c] for c in BREAKDOWN_COLUMNS if c in row)
        assert row["stepTimeMs"] > 0
        assert parts == pytest.approx(row["stepTimeMs"], rel=1e-3, abs=0.01), row["stepnum"]
        assert row["hostComputeTimeMs"] > 0.5 * row["stepTimeMs"]  # a CPU run computes on the host


# ---------------------------------------------------------------- window options


@pytest.mark.slow
def test_explicit_window(tmp_path):
    rc, path = run_devprof(tmp_path, "--profile-steps", "2:6", images="1000")
    assert rc == 0
    prof = profiler_meta(path)
    assert prof["window"] == [2, 6]
    assert prof["first_step"] == 2 and prof["last_step"] == 5
    trace = path / prof["trace"]
    assert train_markers(trace) == [2, 3, 4, 5]
    steps = xprof_steps(trace)
    assert steps and all(2 <= s <= 5 for s in steps), steps


@pytest.mark.parametrize("bad", ["5:2", "abc", "3:3", "-1:4", "1:2:3"])
def test_bad_window_is_a_usage_error(tmp_path, capsys, bad):
    rc, path = run_devprof(tmp_path, f"--profile-steps={bad}")
    assert rc == 2
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and "--profile-steps" in error_lines(err)[0], err
    assert "Traceback" not in err
    assert not path.exists()


@pytest.mark.slow
def test_steps_per_execution_gives_one_marker_per_call(tmp_path):
    rc, path = run_devprof(tmp_path, "--steps-per-execution", "4", "--profile-steps", "0:8", images="1000")
    assert rc == 0
    prof = profiler_meta(path)
    assert prof["first_step"] == 0 and prof["last_step"] == 7
    assert train_markers(path / prof["trace"]) == [0, 4]  # two calls of four steps, one marker each


@pytest.mark.slow
def test_window_past_the_end_is_a_warning(tmp_path, capsys):
    rc, path = run_devprof(tmp_path, "--profile-steps", "40:50", images="500")
    assert rc == 0
    prof = profiler_meta(path)
    assert "trace" not in prof
    assert any("never reached" in w for w in prof["warnings"]), prof
    assert any(
        line.startswith("warning: ") and "never reached" in line for line in capsys.readouterr().err.splitlines()
    )


# ---------------------------------------------------------------- tracer options and trace size


@pytest.mark.slow
def test_python_tracer_is_honoured_or_reported(tmp_path, capsys):
    """`--python-tracer` reaches the profiler. TensorFlow 2.16-2.21 drop in-process tracer options
    (the remote capture below honours them); then the run must say so rather than stay silent."""
    rc, path = run_devprof(tmp_path, "--python-tracer", "--profile-steps", "2:4", images="500")
    assert rc == 0
    prof = profiler_meta(path)
    assert prof["trace"] and prof["trace_events"] > 0
    reported = [w for w in prof.get("warnings", []) if "Python tracer" in w]
    if prof["python_events"] > 0:
        assert not reported
        assert prof["python_events"] > 100
    else:
        assert len(reported) == 1 and "devprof capture" in reported[0]
        assert any(
            line.startswith("warning: ") and "Python tracer" in line for line in capsys.readouterr().err.splitlines()
        )


@pytest.mark.slow
def test_estimate_uses_the_clipped_window_and_warns_before_tracing(tmp_path, monkeypatch, capsys):
    per_step = tracing.EVENTS_PER_STEP["host"] + tracing.EVENTS_PER_STEP["python"]
    # 5 steps in the run: the estimate is for those, not for the 2000 asked for.
    monkeypatch.setattr(tracing, "VIEWER_EVENT_LIMIT", 4 * per_step)
    seen_at_start = []
    original = tracing.ProfileWindow.maybe_start

    def spy(self, next_step):
        if not self.active and not self.done and next_step >= self.start:
            seen_at_start.append(list(self.notes.get("warnings", [])))
        return original(self, next_step)

    monkeypatch.setattr(tracing.ProfileWindow, "maybe_start", spy)
    rc, path = run_devprof(tmp_path, "--python-tracer", "--profile-steps", "0:2000", images="500")
    assert rc == 0
    prof = profiler_meta(path)
    assert prof["window"] == [0, 5]
    assert prof["estimated_events"] == 5 * per_step
    size_warnings = [w for w in prof["warnings"] if "events" in w and "--profile-steps" in w]
    assert len(size_warnings) == 1 and f"{5 * per_step:,}" in size_warnings[0]
    assert seen_at_start and size_warnings[0] in seen_at_start[0], "the size warning must come before tracing"
    assert any(line.startswith("warning: profile window") for line in capsys.readouterr().err.splitlines())


@pytest.mark.slow
def test_small_windows_do_not_warn_about_size(default_run):
    prof = profiler_meta(default_run)
    start, stop = prof["window"]
    assert prof["estimated_events"] == (stop - start) * tracing.EVENTS_PER_STEP["host"]
    assert prof["estimated_events"] < tracing.VIEWER_EVENT_LIMIT
    # The estimate is meant to be the right size: within a factor of 2 of the real count (the
    # thread-pool regions some TensorFlow builds add on some CPUs are counted apart).
    counted = prof["trace_events"] - prof.get("threadpool_events", 0)
    assert 0.5 < counted / prof["estimated_events"] < 2.0, prof


# ---------------------------------------------------------------- profiler failures are not fatal


@pytest.mark.slow
def test_another_profiler_running_is_a_warning(tmp_path, capsys):
    import tensorflow as tf

    tf.profiler.experimental.start(str(tmp_path / "other"))
    try:
        rc, path = run_devprof(tmp_path, "--profile-steps", "1:3", images="500")
    finally:
        tf.profiler.experimental.stop(save=False)
    assert rc == 0
    meta = json.loads((path / "run.json").read_text())
    assert meta["status"] == "complete" and meta["epochs"][0]["images"] == 500
    prof = meta["profiler"]
    assert "trace" not in prof
    assert any("did not start" in w and "AlreadyExists" in w for w in prof["warnings"]), prof
    err = capsys.readouterr().err
    assert any(line.startswith("warning: profiler did not start") for line in err.splitlines()), err
    assert not error_lines(err)


@pytest.mark.slow
def test_unwritable_log_folder_is_a_warning(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    original = tracing.ProfileWindow.maybe_start

    def under_a_file(self, next_step):
        self.logdir = blocker / "logs"  # root can write anywhere, but not under a regular file
        return original(self, next_step)

    monkeypatch.setattr(tracing.ProfileWindow, "maybe_start", under_a_file)
    rc, path = run_devprof(tmp_path, "--profile-steps", "1:3", images="500")
    assert rc == 0
    meta = json.loads((path / "run.json").read_text())
    assert meta["status"] == "complete" and meta["test"]["images"] > 0
    warnings = meta["profiler"]["warnings"]
    assert len(warnings) == 1 and "failed to write its trace" in warnings[0], warnings
    assert meta["profiler"]["trace_complete"] is False  # not a disk-full: the run goes on, without a trace
    err = capsys.readouterr().err
    assert any(line.startswith("warning: ") and "trace" in line for line in err.splitlines()), err
    assert not list(path.glob("plugins/profile/*/*.xplane.pb"))


# ---------------------------------------------------------------- capture on demand


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The captured job must still run when the capture is done, however slowly the capture (a process
# that imports TensorFlow) starts beside other CPU-bound work: it trains until it is stopped.
ENDLESS_EPOCHS = 100_000
STEPS_PER_EPOCH = 10  # 1,000 images in batches of 100


@pytest.mark.slow
def test_capture_from_a_running_job(tmp_path):
    port = free_port()
    run_path = tmp_path / "job"
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "profiler",
            "run",
            "--device",
            "cpu",
            "--data",
            "synthetic",
            "--epochs",
            str(ENDLESS_EPOCHS),
            "--limit-test-images",
            "100",
            "--limit-images",
            "1000",
            "--no-profile",
            "--no-sample",
            "--quiet",
            "--out",
            str(tmp_path),
            "--run-name",
            "job",
            "--profiler-port",
            str(port),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    try:
        deadline = time.monotonic() + 600  # a limit on waiting, not a timing
        steps_file = run_path / "steps.csv"
        while not (steps_file.exists() and len(steps_file.read_text().splitlines()) > 3):
            assert job.poll() is None, job.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the job never started training"
            time.sleep(0.2)
        cap = tmp_path / "cap"
        # A step can take over a second on a loaded machine: 4 s hold several whole steps.
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "profiler",
                "capture",
                f"grpc://localhost:{port}",
                "--duration-ms",
                "4000",
                "--out",
                str(cap),
                "--python-tracer",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "trace written:" in done.stdout
        assert job.poll() is None, "the job ended before Ctrl-C"
        job.send_signal(signal.SIGINT)
        job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    traces = list(cap.glob("plugins/profile/*/*.xplane.pb"))
    assert len(traces) == 1, list(cap.rglob("*"))
    steps = xprof_steps(traces[0])
    assert steps, "XProf should find the job's train steps in the capture"
    assert all(0 <= s < ENDLESS_EPOCHS * STEPS_PER_EPOCH for s in steps)
    facts = tracing.describe_trace(cap)
    assert facts["python_events"] > 100, "--python-tracer must reach the job's profiler"
    assert job.returncode == 130  # the job stopped cleanly on Ctrl-C
    assert json.loads((run_path / "run.json").read_text())["profiler"]["server_port"] == port


def test_capture_with_nothing_listening_fails_fast(tmp_path, capsys):
    rc = cli.main(["capture", f"grpc://localhost:{free_port()}", "--duration-ms", "100", "--out", str(tmp_path)])
    assert rc == 1
    err = capsys.readouterr().err
    lines = error_lines(err)
    assert len(lines) == 1 and "capture from grpc://localhost:" in lines[0] and "--profiler-port" in lines[0], err
    assert not list(tmp_path.glob("plugins/profile/*/*.xplane.pb"))


def test_capture_wants_a_grpc_address(tmp_path, capsys):
    assert cli.main(["capture", "localhost:1234", "--out", str(tmp_path)]) == 2
    assert len(error_lines(capsys.readouterr().err)) == 1


@pytest.mark.slow
def test_a_call_reaching_into_the_window_is_traced(tmp_path):
    # Calls of 20 steps jump from step 20 to 40, over the end of the window 20:30: the window widens
    # to the call that covers it.
    rc = cli.main(
        [
            "run",
            "--device",
            "cpu",
            "--data",
            "synthetic",
            "--limit-images",
            "6000",
            "--epochs",
            "1",
            "--steps-per-execution",
            "20",
            "--profile-steps",
            "20:30",
            "--no-sample",
            "--quiet",
            "--out",
            str(tmp_path),
            "--run-name",
            "r",
        ]
    )
    assert rc == 0
    prof = json.loads((tmp_path / "r" / "run.json").read_text())["profiler"]
    assert prof["window"] == [20, 30]
    assert prof["first_step"] == 20 and prof["last_step"] == 39
    assert (tmp_path / "r" / prof["trace"]).is_file()
    assert not prof.get("warnings")


@pytest.mark.parametrize(
    "steps_per_epoch, steps_per_call, total, window",
    [
        (100, 1, 100, (5, 15)),  # ten calls of one step after warm-up
        (8, 1, 8, (2, 8)),
        (100, 20, 100, (20, 100)),  # five calls after the compiling one, clipped to the run's four
        (10, 20, 40, (10, 40)),  # a call never crosses an epoch: calls of 10, the second in epoch 2
        (100, 4, 100, (4, 24)),  # five calls: ten steps would be three
        (100, 5, 100, (5, 30)),  # ten steps would be two calls, too few steady ones for a verdict
        (100, 10, 1000, (10, 60)),  # ten steps would be one call
        (22, 5, 44, (5, 27)),  # the epoch's last call runs 2 steps; the fifth call starts epoch 2
        (20, 20, 20, (5, 15)),  # one call in the whole run: nothing after it to trace
    ],
)
def test_the_default_window_is_whole_calls_after_the_compiling_one(steps_per_epoch, steps_per_call, total, window):
    start, stop = tracing.default_window(steps_per_epoch, steps_per_call, total)
    assert (start, stop) == window
    per_call = min(steps_per_call, steps_per_epoch)
    assert (tracing.compile_only_window(start, stop, per_call) is None) == (per_call < total)


@pytest.mark.slow
def test_the_default_window_of_several_steps_per_call_gives_a_verdict(tmp_path):
    """With 5 steps per call, ten steps were two steady calls and no verdict; the default window
    counts calls, so the verdict has the steady calls it needs."""
    import analysis

    rc = cli.main(
        [
            "run",
            "--device",
            "cpu",
            "--data",
            "synthetic",
            "--limit-images",
            "300",
            "--limit-test-images",
            "100",
            "--batch-size",
            "10",
            "--epochs",
            "1",
            "--steps-per-execution",
            "5",
            "--no-sample",
            "--quiet",
            "--out",
            str(tmp_path),
            "--run-name",
            "r",
        ]
    )
    assert rc == 0
    prof = profiler_meta(tmp_path / "r")
    assert prof["window"] == [5, 30] and prof["first_step"] == 5 and prof["last_step"] == 29
    assert not prof.get("warnings")
    result = analysis.analyze(tmp_path / "r")
    assert result.step_source == "markers" and result.steps_per_call == 5
    assert result.steps_used >= rules.MIN_STEADY_STEPS and result.verdict["bound"] is not None, result.verdict
    assert not result.verdict.get("single_step")


def _session(tmp_path, option_owner=Session):
    config = SimpleNamespace(tracer=tracing.TracerOptions(), quiet=True)
    session = option_owner(config, Console(True))
    session.path, session.meta = tmp_path, {"profiler": {}}
    return session


# ---------------------------------------------------------------- a window of the compile step only


@pytest.mark.parametrize(
    "start, stop, steps_per_call, warned",
    [
        (0, 1, 1, True),
        (0, 4, 4, True),
        (2, 3, 4, True),
        (0, 2, 1, False),
        (1, 2, 1, False),
        (0, 8, 4, False),
        (5, 15, 1, False),
    ],
)
def test_a_window_of_only_the_compile_step_is_warned_about(tmp_path, capsys, start, stop, steps_per_call, warned):
    session = _session(tmp_path)
    session._open_window(start, stop, "cpu", steps_per_call)
    warnings = [w for w in session.meta["profiler"].get("warnings", []) if "compiles" in w]
    err = capsys.readouterr().err
    if not warned:
        assert warnings == [] and "compiles" not in err
        return
    assert len(warnings) == 1 and f"profile window {start}:{stop} traces only" in warnings[0], warnings
    assert "--profile-steps " in warnings[0]  # devprof run's option
    assert f"warning: {warnings[0]}" in err


def test_the_compile_step_warning_names_profile_steps_in_api_terms(tmp_path):
    from profiler.api import ProfileSession

    session = _session(tmp_path, ProfileSession)
    session._open_window(0, 1, "cpu")
    (warning,) = session.meta["profiler"]["warnings"]
    assert 'profile_steps="1:11"' in warning and "--" not in warning, warning
