"""`devprof analyze` end to end: run directories, output files, JSON contract, bad input."""

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest

import trace_fixtures as fx
from cli_checks import devprof, error_line
from profiler import cli
from run_fixtures import make_run, small_run, step_line

TRACED_STEPS = list(range(3, 11))


def analyze(argv) -> int:
    """`devprof analyze ARGV...` through the devprof parser."""
    return cli.main(["analyze", *argv])


def _fake_steps_csv(start_time_s=1_700_000_000.0):
    """Epoch 1: steps 0-5, epoch 2: steps 6-11, with round numbers per step."""
    rows = []
    t = start_time_s
    for step in range(12):
        epoch = 1 if step < 6 else 2
        input_ms, call_ms, other_ms = 1.0 + step, 10.0, 0.5
        rows.append(
            dict(
                epoch=epoch,
                step=step,
                steps=1,
                start_time_s=t,
                input_ms=input_ms,
                call_ms=call_ms,
                other_host_ms=other_ms,
                step_ms=input_ms + call_ms + other_ms,
                images=32,
            )
        )
        t += (input_ms + call_ms + other_ms) / 1000.0
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "20260101-000000-cpu-test"
    shutil.copytree(fx.trace_logdir("clean") / "plugins", run / "plugins")
    steps = _fake_steps_csv()
    steps.to_csv(run / "steps.csv", index=False)
    epochs = [
        {"epoch": 1, "seconds": 0.5, "train_seconds": 0.1, "images": 192},
        {"epoch": 2, "seconds": 0.75, "train_seconds": 0.1, "images": 192},
    ]
    (run / "run.json").write_text(json.dumps({"status": "complete", "device": {"kind": "cpu"}, "epochs": epochs}))
    (run / "utilization").mkdir()
    times = steps["start_time_s"].to_numpy()
    pd.DataFrame({"time_s": times, "cpu_pct": 50.0, "cpu0_pct": 40.0, "cpu1_pct": 60.0}).to_csv(
        run / "utilization" / "host.csv", index=False
    )
    return run


@pytest.mark.slow
def test_run_directory_writes_csvs_report_and_plots(run_dir, capsys):
    assert analyze([str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "verdict:" in out
    written = run_dir / "analysis"
    for name in (
        "step_breakdown.csv",
        "epoch_breakdown.csv",
        "trace_vs_steps.csv",
        "report.md",
        "step_breakdown.png",
        "epoch_breakdown.png",
        "utilization.png",
        "analysis.json",
    ):
        assert (written / name).is_file(), name
        assert (written / name).stat().st_size > 0
    assert (written / "step_breakdown.png").read_bytes()[:4] == b"\x89PNG"
    assert "## Epochs" in (written / "report.md").read_text()
    steps = pd.read_csv(written / "step_breakdown.csv")
    assert steps["step"].tolist() == TRACED_STEPS


@pytest.mark.slow
def test_epoch_breakdown_equals_steps_csv(run_dir, capsys):
    assert analyze([str(run_dir), "--format", "json", "--out", str(run_dir / "elsewhere")]) == 0
    result = json.loads(capsys.readouterr().out)
    expected = _fake_steps_csv().groupby("epoch")[["input_ms", "call_ms", "other_host_ms", "step_ms"]].sum() / 1000
    epochs = {e["epoch"]: e for e in result["epochs"]}
    assert set(epochs) == {1, 2}
    for epoch, seconds in ((1, 0.5), (2, 0.75)):
        row = epochs[epoch]
        assert row["seconds"] == pytest.approx(seconds)
        assert row["input_s"] == pytest.approx(expected.loc[epoch, "input_ms"])
        assert row["call_s"] == pytest.approx(expected.loc[epoch, "call_ms"])
        assert row["other_host_s"] == pytest.approx(expected.loc[epoch, "other_host_ms"])
        assert row["epoch_level_s"] == pytest.approx(seconds - expected.loc[epoch, "step_ms"])
        assert row["calls"] == 6
    reconciled = pd.read_csv(run_dir / "elsewhere" / "trace_vs_steps.csv")
    assert reconciled["step"].tolist() == TRACED_STEPS


@pytest.mark.slow
def test_json_contract(capsys):
    assert analyze([str(fx.trace_logdir("clean")), "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {
        "schema_version",
        "source",
        "step_source",
        "step_name",
        "device",
        "notes",
        "steps",
        "mean",
        "steps_used",
        "verdict",
        "utilization",
        "findings",
        "devices",
        "kernel_launch",
        "workers",
        "straggler",
        "straggler_reason",
        "ops",
        "input_stages",
        "input_bottleneck",
        "eager",
        "slowest_workers",
        "worker_distribution",
        "roofline",
        "spread",
        "memory",
    }
    # the allocators' events of the CPU run (mklcpu): the keys docs/json.md names
    assert set(result["memory"]) == {"allocators", "workers", "batch_size", "samplers", "oom"}
    for allocator in result["memory"]["allocators"]:
        assert {
            "name",
            "peak_bytes",
            "peak_step",
            "peak_op",
            "capacity_bytes",
            "fragmentation",
            "batch_bytes",
            "fixed_bytes",
            "max_batch",
            "top_at_peak",
        } <= set(allocator)
        assert all(
            set(live) == {"op", "shape", "dtype", "region", "bytes", "count"} for live in allocator["top_at_peak"]
        )
    assert result["eager"] is None and result["slowest_workers"] == [] and result["worker_distribution"] is None
    assert {
        "op",
        "type",
        "device",
        "count_per_step",
        "ms_per_step",
        "compute_pct",
        "program_id",
        "executions_per_step",
        "kernel",
        "program",
        "dtype",
        "kind",
        "flops_per_step",
        "bytes_per_step",
        "flops_per_second",
        "bytes_per_second",
        "intensity",
        "bound",
        "ceiling_pct",
    } == set(result["ops"][0])
    # a trace on its own, without the run's op_costs.csv: no op's cost is known, and it says so
    assert all(op["flops_per_step"] is None for op in result["ops"])
    assert any("no op costs" in note for note in result["roofline"]["notes"])
    assert sum(op["compute_pct"] for op in result["ops"]) == pytest.approx(100)
    assert result["devices"] == [] and result["workers"] == [] and result["straggler"] is None
    assert result["schema_version"] == 1 and result["step_source"] == "markers"
    assert result["device"] == "cpu"
    assert result["source"].endswith(".xplane.pb")
    assert [s["step"] for s in result["steps"]] == TRACED_STEPS
    for step in result["steps"]:
        # The contract's keys, plus how many steps the call ran (1 here: one step per call).
        per_step_utilization = {"cpu_pct", "proc_cpu_pct", "proc_rss_bytes", "mem_used_bytes"}
        assert set(step) - per_step_utilization == {
            "step",
            "steps",
            "step_ms",
            "input_ms",
            "compute_ms",
            "collective_ms",
            "host_ms",
            "compile_ms",
            "partial",
            "input_wait_ms",
            "input_copy_ms",
            "between_steps_ms",
        }
        assert step["partial"] is False and step["between_steps_ms"] == 0.0  # markers follow one another
        assert step["input_wait_ms"] + step["input_copy_ms"] == pytest.approx(step["input_ms"])
        assert step["input_copy_ms"] == 0.0  # a CPU run: no copy to a device
        assert isinstance(step["step"], int) and step["steps"] == 1
        assert step["input_ms"] + step["compute_ms"] + step["collective_ms"] + step["host_ms"] == pytest.approx(
            step["step_ms"]
        )
    assert set(result["mean"]) == {
        "step_ms",
        "input_ms",
        "compute_ms",
        "collective_ms",
        "host_ms",
        "input_pct",
        "compute_pct",
        "collective_pct",
        "host_pct",
        "input_overlapped_ms",
        "device_step_ms",
        "input_wait_ms",
        "input_copy_ms",
    }
    assert result["mean"]["device_step_ms"] is None and result["mean"]["input_overlapped_ms"] == 0.0  # a CPU run
    assert result["mean"]["input_pct"] + result["mean"]["compute_pct"] + result["mean"]["host_pct"] == pytest.approx(
        100
    )
    assert {"bound", "evidence", "advice", "cause", "saving_ms", "saving_pct", "saving_basis", "xprof_reading"} <= set(
        result["verdict"]
    )
    assert all({"saving_ms", "saving_pct", "saving_basis"} <= set(f) for f in result["findings"])
    assert result["verdict"]["bound"] in {"input", "host", "compute"}


@pytest.mark.slow
def test_markdown_and_session_folder_and_file_paths(capsys):
    xplane = fx.find_xplane(fx.trace_logdir("clean"))
    for path in (xplane, xplane.parent):
        assert analyze([str(path), "--format", "markdown"]) == 0
        assert capsys.readouterr().out.startswith("# devprof analysis")


@pytest.mark.slow
def test_newest_of_several_sessions_is_used_and_named(tmp_path, capsys):
    logdir = tmp_path / "logs"
    shutil.copytree(fx.trace_logdir("clean") / "plugins", logdir / "plugins")
    newest = fx.find_xplane(fx.trace_logdir("host_delay"))
    target = logdir / "plugins" / "profile" / "9999_12_31_23_59_59"
    target.mkdir()
    shutil.copy(newest, target / newest.name)
    assert analyze([str(logdir)]) == 0
    out = capsys.readouterr().out
    assert "2 profile sessions found; using the newest, 9999_12_31_23_59_59" in out
    assert "host-bound" in out


def _expect_error(argv, code, capsys, *fragments):
    assert analyze(argv) == code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert lines[0].startswith("error: ")
    assert "Traceback" not in captured.err
    for fragment in fragments:
        assert fragment in captured.err


def test_missing_path(tmp_path, capsys):
    _expect_error([str(tmp_path / "nope")], 2, capsys, "no such file or directory")


def test_empty_folder(tmp_path, capsys):
    _expect_error([str(tmp_path)], 1, capsys, "no profiler trace", "plugins/profile", "empty folder")


@pytest.mark.slow
def test_truncated_trace(tmp_path, capsys):
    data = fx.find_xplane(fx.trace_logdir("clean")).read_bytes()
    broken = tmp_path / "host.xplane.pb"
    broken.write_bytes(data[: len(data) // 3])
    _expect_error([str(broken)], 1, capsys, "truncated or corrupt")
    empty = tmp_path / "empty.xplane.pb"
    empty.write_bytes(b"")
    _expect_error([str(empty)], 1, capsys, "empty")


def test_trace_without_markers(tmp_path, capsys):
    path = fx.write_trace_without_markers(tmp_path / "plugins" / "profile" / "s1" / "host.xplane.pb")
    assert analyze([str(tmp_path), "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    # Three eager ops and nothing that repeats as a program: the whole window is one step, and says so.
    assert result["step_source"] == "window" and len(result["steps"]) == 1
    assert any("nothing repeats" in note for note in result["notes"])
    assert path.exists()


def test_usage_error_exit_code(capsys):
    assert analyze(["--format", "yaml", "x"]) == 2
    assert analyze([]) == 2
    capsys.readouterr()


@pytest.mark.slow
def test_cli_subprocess_has_no_traceback_and_no_tensorflow(tmp_path):
    code = (
        "import sys; from profiler import cli; from analysis import pipeline; from analysis.read import inputs, trace, view; from analysis.rules import table; from analysis.breakdown import epochs; from analysis.render import plots; from analysis import comparison; "
        "rc = cli.main(['analyze', *sys.argv[1:]]); "
        "assert 'tensorflow' not in sys.modules, 'analysis imported TensorFlow'; sys.exit(rc)"
    )
    ok = subprocess.run(
        [sys.executable, "-c", code, str(fx.trace_logdir("clean"))],
        capture_output=True,
        text=True,
        cwd=fx.REPO_ROOT,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    from analysis import analyze  # the same trace in this process: the same verdict

    assert f"verdict: {analyze(fx.trace_logdir('clean')).verdict['bound']}-bound" in ok.stdout, ok.stdout
    bad = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=fx.REPO_ROOT, timeout=120
    )
    assert bad.returncode == 1
    assert bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr


# ---------------------------------------------------------------- --fail-on limits and --peak-file entries that cannot work


@pytest.mark.parametrize(
    "spec, says",
    [
        ("input>0.001,input>99", "input is given twice"),
        ("input>101", "'input>101': a share of step time is at most 100 %"),
    ],
)
def test_a_fail_on_limit_that_could_not_mean_what_it_says_is_a_usage_error(tmp_path, capsys, spec, says):
    """Two limits for one part left the last silently in force; a limit above 100 % never trips."""
    run = small_run(tmp_path / "run")
    code, _, err = devprof(capsys, "analyze", run, "--fail-on", spec)
    assert code == 2 and error_line(err).startswith("error: --fail-on: ") and says in error_line(err)
    code, _, _ = devprof(capsys, "analyze", run, "--fail-on", "input>0.001")  # the same run trips one limit
    assert code == 3


def test_a_peak_file_entry_that_is_skipped_is_a_warning_line(tmp_path, capsys):
    """Was Python's own warning format: 'analysis/read/run_files.py:191: RunFileWarning: ...' and its source line."""
    run = make_run(tmp_path / "run", [step_line(i) for i in range(6)])
    peak = tmp_path / "peak.json"
    peak.write_text(json.dumps({"peak_flops_per_second": {"float32": 2e11, "bfloat16": "fast"}}))
    code = cli.main(["analyze", str(run), "--format", "summary", "--peak-file", str(peak)])
    err = capsys.readouterr().err
    assert code == 0
    assert [line for line in err.splitlines() if "bfloat16" in line] == [
        f"warning: {peak}: peak rates must be positive numbers (FLOP/s up to 1e+18, B/s up to 1e+16); ignored "
        "peak_flops_per_second.bfloat16 'fast'"
    ]
    assert "RunFileWarning" not in err
