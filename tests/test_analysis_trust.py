"""analyze and compare on hostile or odd input: formula text in CSVs, `|` in Markdown, a folder that
cannot be written, duplicated steps, bad run.json fields, long steps.csv and kernel names, a
run still training, hosts that share no collective, a run given twice, one worker, runs of
different sizes, a busy machine, and bfloat16 without matrix units. Fast: hand-written run
directories and synthetic traces, no TensorFlow."""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import math
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

import trace_fixtures as fx
from analysis import comparison as compare
from analysis import pipeline, workers
from analysis.render import markdown
from profiler import cli
from test_compare import make_run as make_compare_run
from test_run_files import HEADER, step_line
from test_run_files import make_run as make_small_run


def run_cli(argv, capsys):
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def lines_starting(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


@pytest.fixture(scope="module")
def device_trace(tmp_path_factory):
    return fx.write_synthetic_device_trace(tmp_path_factory.mktemp("gpu") / "plugins/profile/s/h.xplane.pb",
                                           gpus=2, empty_gpus=0)


# ---------------------------------------------------------------- 2. formula text in every CSV


FORMULA = '=HYPERLINK("evil.example","click")'


def test_analyze_output_csvs_quote_formula_text(device_trace, tmp_path):
    result = pipeline.analyze(device_trace.path)
    ops = result.ops.copy()
    ops.loc[0, "op"] = FORMULA
    ops.loc[1, "type"] = "@SUM(A1)"
    rec = pd.DataFrame({"step": [1], "note": ["-cmd"], "step_ms": [-1.5]})
    epochs = pd.DataFrame({"epoch": [1], "label": ["+x"], "seconds": [1.0]})
    steps = result.steps.copy()
    steps["name"] = "=1+2"
    hostile = dataclasses.replace(result, ops=ops, reconciliation=rec, epochs=epochs, steps=steps)
    out = tmp_path / "out"
    written = pipeline.Analysis.write(hostile, out)
    for name in ("ops.csv", "trace_vs_steps.csv", "epoch_breakdown.csv", "step_breakdown.csv"):
        assert out / name in written
    assert pd.read_csv(out / "ops.csv")["op"][0] == "'" + FORMULA
    assert pd.read_csv(out / "ops.csv")["type"][1] == "'@SUM(A1)"
    reconciled = pd.read_csv(out / "trace_vs_steps.csv")
    assert reconciled["note"][0] == "'-cmd" and reconciled["step_ms"][0] == -1.5  # numbers stay numbers
    assert pd.read_csv(out / "epoch_breakdown.csv")["label"][0] == "'+x"
    assert set(pd.read_csv(out / "step_breakdown.csv")["name"]) == {"'=1+2"}
    assert set(pd.read_csv(io.StringIO(hostile.render("csv")))["name"]) == {"'=1+2"}


def test_compare_csv_quotes_run_path_label_why_and_external_notes(tmp_path, capsys):
    evil = make_compare_run(tmp_path, FORMULA, device="-cmd")
    make_compare_run(tmp_path, "base", device="Test CPU", epoch_seconds=(3.0, 1.0, 1.0))
    external = tmp_path / "ext.csv"
    external.write_text("device,seconds_per_epoch,notes\n@dev,2.0,=1+2\n")
    code, out, err = run_cli(["compare", evil, tmp_path / "base", "--external", external, "--format", "csv"], capsys)
    assert code == 0, err
    table = pd.read_csv(io.StringIO(out))
    row = table[table["run"].str.contains("HYPERLINK")].iloc[0]
    assert row["run"] == "'" + FORMULA
    assert row["label"] == "'-cmd" and row["device"] == "'-cmd" and row["why"].startswith("'-cmd")
    ext = table[table["external"]].iloc[0]
    assert ext["notes"] == "'=1+2" and ext["run"] == "'@dev"
    for cell in map(str, table.select_dtypes(exclude="number").stack()):
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), cell
    assert table["seconds_per_epoch"].dtype.kind == "f"


def test_compare_csv_quotes_a_path_that_starts_like_a_formula(tmp_path, capsys, monkeypatch):
    make_compare_run(tmp_path, "-run")
    make_compare_run(tmp_path, "b", epoch_seconds=(3.0, 1.0, 1.0))
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["compare", "--format", "csv", "--", "-run", "b"], capsys)
    assert code == 0, err
    table = pd.read_csv(io.StringIO(out))
    assert "'-run" in set(table["path"]) and "'-run" in set(table["run"])


# ---------------------------------------------------------------- 3. Markdown tables


def test_markdown_cells_escape_pipes_and_newlines():
    frame = pd.DataFrame({"op": ["a|b", "line1\nline2", "c\\|d"], "ms": [1.0, 2.0, 3.0]})
    lines = markdown.markdown_table(frame).splitlines()
    assert len(lines) == 2 + 3  # header, rule, one line per row
    assert lines[2] == "| a\\|b | 1.0 |"
    assert lines[3] == "| line1<br>line2 | 2.0 |"
    assert lines[4] == "| c\\\\\\|d | 3.0 |"
    for line in lines[2:]:
        assert line.replace("\\\\", "").replace("\\|", "").count("|") == 3, line


# ---------------------------------------------------------------- 4. a folder that cannot be written


def test_analyze_prints_the_analysis_when_the_folder_cannot_be_written(tmp_path, capsys):
    run = make_small_run(tmp_path / "run", [step_line(i) for i in range(8)])
    code, out, err = run_cli(["analyze", run, "--format", "json", "--out", "/proc/devprof-analysis"], capsys)
    assert code == 1
    assert json.loads(out)["steps_used"] >= 3  # the whole analysis, before the error
    errors = lines_starting(err, "error:")
    assert len(errors) == 1 and "--out DIR" in errors[0] and "/proc/devprof-analysis" in errors[0], err
    assert "Traceback" not in err


def test_analyze_on_a_full_disk_leaves_no_cut_file(tmp_path, capsys, monkeypatch):
    run = make_small_run(tmp_path / "run", [step_line(i) for i in range(8)])
    out_dir = run / "analysis"
    real = Path.write_text
    calls = []

    def fill_the_disk(self, text, *args, **kwargs):
        calls.append(self.name)
        if len(calls) >= 2:  # the first file fits; the second is cut short and the disk is full
            with open(self, "w") as handle:
                handle.write(text[: len(text) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", fill_the_disk)
    code, out, err = run_cli(["analyze", run], capsys)
    assert code == 1
    assert "verdict:" in out  # the text analysis is on stdout
    errors = lines_starting(err, "error:")
    assert len(errors) == 1 and "No space left on device" in errors[0] and "--out DIR" in errors[0], err
    monkeypatch.setattr(Path, "write_text", real)
    left = sorted(p.name for p in out_dir.iterdir())
    assert not [name for name in left if ".tmp" in name], left  # no temporary file left behind
    assert "epoch_breakdown.csv" not in left  # the file that did not fit is not there, cut or empty
    for csv in out_dir.glob("*.csv"):
        assert pd.read_csv(csv).shape[0] >= 1


# ---------------------------------------------------------------- 13, 16, 20: workers and the straggler


def independent_session(folder: Path) -> Path:
    """Two host traces in one session that share nothing: no collective, one host twice as slow."""
    session = folder / "plugins" / "profile" / "2030_01_01_00_00_00"
    base = dict(gpus=1, steps=6, h2d_ms=1.5, d2d_ms=0.5, collective_ms=0.0, gap_ms=2.0, skew_ms=0.0, empty_gpus=0,
                custom_plane=False)
    fx.write_synthetic_device_trace(session / "hostA.xplane.pb", kernel_ms=6.0, hostname="hostA", **base)
    fx.write_synthetic_device_trace(session / "hostB.xplane.pb", kernel_ms=14.0, hostname="hostB", **base)
    return folder


def test_hosts_without_a_shared_collective_have_no_straggler(tmp_path, capsys):
    logdir = independent_session(tmp_path / "logs")
    result = pipeline.analyze(logdir)
    assert len(result.workers) == 2
    assert result.straggler is None
    assert "independent" in result.straggler_reason
    code, out, _ = run_cli(["analyze", logdir], capsys)
    assert code == 0
    line = lines_starting(out, "straggler:")
    assert line == [f"straggler: none ({result.straggler_reason})"], out
    assert "wait for it in the collective" not in out
    document = json.loads(result.render("json"))
    assert document["straggler"] is None and "independent" in document["straggler_reason"]


def one_worker_job(tmp_path: Path, trace: Path) -> Path:
    job = tmp_path / "job"
    worker = job / "worker-0"
    (worker / "plugins" / "profile" / "s").mkdir(parents=True)
    (job / "run.json").write_text(json.dumps({"status": "complete", "workers": ["worker-0"], "num_workers": 1}))
    (worker / "run.json").write_text(json.dumps({"status": "complete", "device": {"kind": "gpu", "host": "node-0"}}))
    shutil.copy(trace, worker / "plugins" / "profile" / "s" / "host.xplane.pb")
    return job


def test_a_one_worker_job_has_no_worker_note_and_no_straggler_line(tmp_path, capsys, device_trace):
    job = one_worker_job(tmp_path, device_trace.path)
    code, out, err = run_cli(["analyze", job], capsys)
    assert code == 0, err
    assert "1 workers" not in out and "straggler" not in out, out
    report = (job / "analysis" / "report.md").read_text()
    assert "1 workers" not in report and "Straggler" not in report
    document = json.loads(pipeline.analyze(job).render("json"))
    assert document["straggler"] is None and document["straggler_reason"] is None


def row(worker, own_ms, collective_ms=2.0, part="compute", noise=1.0, steps=10, cpu=math.nan):
    mean = {"step_ms": own_ms + collective_ms, "input_ms": 1.0, "compute_ms": own_ms - 2.0, "host_ms": 1.0,
            "collective_ms": collective_ms}
    if part != "compute":
        mean["compute_ms"] = 10.0
        mean[f"{part}_ms"] = own_ms - 11.0
    result = workers.worker_row(worker, f"node-{worker}", mean, None, cpu)
    result.update(steps_used=steps, own_noise_ms=noise)
    return result


def test_a_straggler_must_stand_out_of_the_step_to_step_noise():
    quiet = [row(0, 100.0, 20.0), row(1, 115.0)]
    straggler, reason = workers.find_straggler(quiet)
    assert straggler["worker"] == 1 and reason is None
    noisy = [row(0, 100.0, 20.0, noise=30.0), row(1, 115.0, noise=30.0)]  # 15 % above, noise 30 ms
    straggler, reason = workers.find_straggler(noisy)
    assert straggler is None
    assert "no worker stands out" in reason and "noise (30.0 ms)" in reason and "15 %" in reason
    injected = [row(0, 100.0, 42.0, noise=30.0), row(1, 140.0, part="host", noise=30.0)]  # 40 ms of host work
    straggler, _ = workers.find_straggler(injected)
    assert straggler["worker"] == 1 and straggler["cause"] == "host"


def test_a_worker_slowed_by_other_processes_is_a_contention_straggler():
    busy = [row(0, 100.0, 40.0, cpu=160.0), row(1, 140.0, cpu=110.0)]
    straggler, _ = workers.find_straggler(busy, other_cpu_pct=45.0)
    assert straggler["worker"] == 1 and straggler["cause"] == "contention"
    assert "45 %" in straggler["evidence"] and "110 % CPU" in straggler["evidence"]
    # Host work that keeps its process busy is its own cause, also on a busy machine.
    host_work = [row(0, 100.0, 40.0, cpu=110.0), row(1, 140.0, part="host", cpu=160.0)]
    straggler, _ = workers.find_straggler(host_work, other_cpu_pct=45.0)
    assert straggler["cause"] == "host"
    # A quiet machine: less CPU is not contention.
    straggler, _ = workers.find_straggler(busy, other_cpu_pct=2.0)
    assert straggler["cause"] == "compute"


def test_too_few_steps_to_tell_is_said_plainly():
    straggler, reason = workers.find_straggler([row(0, 100.0, 40.0, steps=2), row(1, 140.0, steps=2)])
    assert straggler is None and "too few steps to tell" in reason and "--profile-steps" in reason


def test_a_session_with_few_steps_says_so(tmp_path):
    session = fx.write_synthetic_session(tmp_path / "s", workers=2, slow_worker=1, slow_part="host", steps=2)
    result = pipeline.analyze(session.logdir)
    assert result.straggler is None and "too few steps" in result.straggler_reason
    assert "straggler: none (too few steps" in result.render("text")
