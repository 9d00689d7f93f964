"""A run directory without a trace is analysed from steps.csv, with known numbers."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis.read.run_files import STEPS_COLUMNS as STEP_COLUMNS
from cli_checks import devprof, error_line
from profiler import cli
from run_fixtures import small_run


def make_run(tmp_path, input_ms, call_ms, other_ms, calls=10, first_call_extra_ms=500.0, stalls=None):
    rows = []
    t = 1_700_000_000.0
    for step in range(calls):
        call = call_ms + (first_call_extra_ms if step == 0 else 0.0)
        other = other_ms + (stalls or {}).get(step, 0.0)
        total = input_ms + call + other
        rows.append([1, step, 1, t, input_ms, call, other, total, 100])
        t += total / 1e3
    run = tmp_path / "run"
    (run / "utilization").mkdir(parents=True)
    pd.DataFrame(rows, columns=STEP_COLUMNS).to_csv(run / "steps.csv", index=False)
    seconds = (t - 1_700_000_000.0) + 0.25  # 0.25 s of validation
    (run / "run.json").write_text(
        json.dumps(
            {
                "status": "complete",
                "device": {"kind": "cpu"},
                "epochs": [{"epoch": 1, "seconds": seconds, "train_seconds": seconds - 0.25, "images": calls * 100}],
            }
        )
    )
    return run


def analyze_json(run, capsys):
    capsys.readouterr()
    assert cli.main(["analyze", str(run), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_input_heavy_steps_csv_is_input_bound(tmp_path, capsys):
    report = analyze_json(make_run(tmp_path, input_ms=60.0, call_ms=30.0, other_ms=10.0), capsys)
    assert report["source"].endswith("steps.csv")
    assert report["verdict"]["bound"] == "input" and report["verdict"]["bound_pct"] == pytest.approx(60.0)
    mean = report["mean"]
    assert mean["input_ms"] == pytest.approx(60.0) and mean["compute_ms"] == pytest.approx(30.0)
    assert mean["host_ms"] == pytest.approx(10.0) and mean["input_pct"] == pytest.approx(60.0)
    first = report["steps"][0]
    # The first call's tracing is reported as compile, inside host overhead, and left out of the mean.
    assert first["compile_ms"] == pytest.approx(500.0) and first["host_ms"] == pytest.approx(510.0)
    assert first["compute_ms"] == pytest.approx(30.0) and first["between_steps_ms"] == 0.0
    assert report["epochs"][0]["epoch_level_s"] == pytest.approx(0.25, abs=1e-4)


def test_host_heavy_steps_csv_is_host_bound(tmp_path, capsys):
    report = analyze_json(make_run(tmp_path, input_ms=0.5, call_ms=25.0, other_ms=50.0), capsys)
    assert report["verdict"]["bound"] == "host"
    assert report["mean"]["host_pct"] == pytest.approx(100 * 50.0 / 75.5)


@pytest.mark.parametrize(
    "stalls, host_fix",
    [
        ({6: 80.0}, False),  # one call in 11 stalled
        ({1: 40.0, 6: 40.0}, False),  # two: the first traced call (the profiler starting) and a GC pause
        ({step: 80.0 / 11 for step in range(1, 12)}, True),  # every call pays it
        ({2: 80.0 / 3, 5: 80.0 / 3, 8: 80.0 / 3}, True),  # every fourth call: it recurs
    ],
)
def test_one_stalled_call_is_no_per_call_overhead(tmp_path, capsys, stalls, host_fix):
    """Several steps per call remove what the calls pay, not one call's stall (preempted, a GC
    pause): the same mean host overhead is a fix worth listing only where the calls keep paying it."""
    report = analyze_json(make_run(tmp_path, input_ms=0.5, call_ms=50.0, other_ms=0.5, calls=12, stalls=stalls), capsys)
    assert report["mean"]["host_ms"] == pytest.approx(0.5 + 80.0 / 11)
    assert report["verdict"]["bound"] == "compute", report["verdict"]  # the calls hold the step either way
    assert ("host_bound" in [fix["rule"] for fix in report["verdict"]["fixes"]]) == host_fix, report["verdict"]


def test_run_without_steps_is_a_clear_error(tmp_path, capsys):
    run = make_run(tmp_path, 1.0, 50.0, 1.0)
    pd.DataFrame(columns=STEP_COLUMNS).to_csv(run / "steps.csv", index=False)
    assert cli.main(["analyze", str(run)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "no steps" in err[0]


@pytest.mark.parametrize(
    "recorded, wanted, foreign",
    [
        ({}, "--steps-per-execution", "tf.range"),  # devprof run: its flags
        ({"recorded_by": "profile"}, "tf.range(", "--steps-per-execution"),  # profile() around a custom loop
        (
            {"recorded_by": "profile", "config": {"program": "keras_fit"}},
            "model.compile(..., steps_per_execution=",
            "--steps-per-execution",
        ),  # KerasCallback in fit
    ],
)
def test_advice_speaks_the_language_of_the_program_that_recorded_the_run(tmp_path, recorded, wanted, foreign):
    run = make_run(tmp_path, input_ms=1.0, call_ms=10.0, other_ms=30.0)
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, **recorded}))
    import analysis

    result = analysis.analyze(run)
    assert result.verdict["bound"] == "host", result.verdict
    text = " ".join(result.verdict["advice"])
    assert wanted in result.verdict["advice"][0] and foreign not in text, text


@pytest.mark.parametrize(
    "status, profiler, said, unsaid",
    [
        # The trace could not be written (a full disk): the reason, and how the run ended; no hint to trace it.
        (
            {"status": "failed", "error": "WriteError: cannot write run/steps.csv: [Errno 28] No space left on device"},
            {
                "enabled": True,
                "window": [1, 6],
                "trace_complete": False,
                "trace_error": "ResourceExhaustedError: run/vm.xplane.pb; No space left on device",
            },
            [
                "the profiler window ran but its trace could not be written (ResourceExhaustedError: run/vm.xplane.pb; "
                "No space left on device)",
                "the run failed (run.json status 'failed'): WriteError: cannot write run/steps.csv: [Errno 28] No space",
            ],
            "run with the profiler window",
        ),
        # A run recorded before `trace_error`: its warning says why, and the part set aside is named.
        (
            {"status": "complete"},
            {
                "enabled": True,
                "trace_complete": False,
                "partial_trace": "plugins/profile/s/vm.xplane.pb.partial",
                "warnings": ["profiler failed to write its trace (OSError: File too large)"],
            },
            [
                "the profiler window ran but left no readable trace (profiler failed to write its trace (OSError: File too "
                "large)); the part written is set aside as plugins/profile/s/vm.xplane.pb.partial"
            ],
            "run with the profiler window",
        ),
        (
            {"status": "interrupted", "interrupted_by": "SIGTERM"},
            {"enabled": False},
            ["run with the profiler window", "the run was interrupted by SIGTERM (run.json status 'interrupted')"],
            "could not be written",
        ),
    ],
)
def test_a_run_without_a_trace_says_why_and_how_it_ended(tmp_path, status, profiler, said, unsaid):
    import analysis

    run = make_run(tmp_path, input_ms=1.0, call_ms=10.0, other_ms=1.0)
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, **status, "profiler": profiler}))
    notes = " ".join(analysis.analyze(run).notes)
    assert all(part in notes for part in said) and unsaid not in notes, notes


# ---------------------------------------------------------------- a steps.csv of no rows


def test_an_empty_steps_csv_of_a_complete_run_is_not_said_to_be_in_progress(tmp_path, capsys):
    run = small_run(tmp_path / "run")
    (run / "steps.csv").write_text((run / "steps.csv").read_text().splitlines()[0] + "\n")
    code, _, err = devprof(capsys, "analyze", run)
    line = error_line(err)
    assert code == 1 and "yet" not in line and "no steps (no usable rows; run.json status 'complete')" in line, line
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "status": "running"}))
    code, _, err = devprof(capsys, "analyze", run)
    assert "no steps yet (the run is still running)" in error_line(err)
