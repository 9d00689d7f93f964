"""Hostile files in and around a run: links out of the run, /dev/zero and FIFOs where files belong,
traces with impossible times, very long tables, names that are HTML, extensions no format writes.
In-process (`cli.main`), without TensorFlow; a call that could hang runs in a thread with a limit."""

from __future__ import annotations

import json
import os
import re
import threading
import warnings
from pathlib import Path

import pandas as pd
import pytest

import analysis
from analysis.read import run_files
from analysis.read.run_files import RunFileError, RunFileWarning
from analysis.read.trace import TraceError
from cli_checks import one_usage_error
from profiler import cli
from run_fixtures import make_run, step_line
from trace_fixtures import _Plane, _write_space, _xspace_class
from marker_traces import marker_trace
from cli_checks import HANG_LIMIT_S, devprof, error_line, finishes
from run_fixtures import small_run
from odd_files import _fifo, _link_to_dev_zero


# ---------------------------------------------------------------- 2. writing never follows a link out of the run


def test_an_analysis_folder_linked_out_of_the_run_is_not_written(tmp_path, capsys):
    run = small_run(tmp_path / "run")
    elsewhere = tmp_path / "someone-elses-report"
    elsewhere.mkdir()
    (elsewhere / "report.md").write_text("keep me")
    (elsewhere / "analysis.json").write_text("{}")
    (run / "analysis").symlink_to(elsewhere, target_is_directory=True)
    code, out, err = devprof(capsys, "analyze", run)
    assert code == 1
    line = error_line(err)
    assert "outside the run folder" in line and str(elsewhere) in line, line
    assert "verdict:" in out  # the analysis is still printed
    assert (elsewhere / "report.md").read_text() == "keep me"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["analysis.json", "report.md"]


def test_an_analysis_folder_linked_inside_the_run_is_written(tmp_path, capsys):
    run = small_run(tmp_path / "run")
    (run / "reports").mkdir()
    (run / "analysis").symlink_to(run / "reports", target_is_directory=True)
    code, _, err = devprof(capsys, "analyze", run)
    assert code == 0, err
    assert (run / "reports" / "report.md").is_file()


def test_outputs_get_the_permissions_any_new_file_gets(tmp_path, capsys):
    """Written under a private temporary name, then given the mode open() would have given them."""
    run = small_run(tmp_path / "run")
    mask = os.umask(0o022)
    try:
        code, _, err = devprof(capsys, "analyze", run)
    finally:
        os.umask(mask)
    assert code == 0, err
    written = list((run / "analysis").iterdir())
    assert written and {path.stat().st_mode & 0o777 for path in written} == {0o644}, written


def test_output_is_never_written_through_a_link_at_its_temporary_name(tmp_path, capsys):
    """The temporary file is made new: a link planted where the old fixed name would be is left alone."""
    run = small_run(tmp_path / "run")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / f".report.{os.getpid()}.tmp.md").symlink_to(victim)
    code, _, err = devprof(capsys, "analyze", run, "-o", out_dir / "report.md")
    assert code == 0, err
    assert victim.read_text() == "keep me"
    assert (out_dir / "report.md").read_text().startswith("# devprof analysis")


def test_output_named_by_a_link_replaces_the_link_not_its_target(tmp_path, capsys):
    run = small_run(tmp_path / "run")
    victim = tmp_path / "victim.md"
    victim.write_text("keep me")
    (tmp_path / "report.md").symlink_to(victim)
    code, _, err = devprof(capsys, "analyze", run, "-o", tmp_path / "report.md")
    assert code == 0, err
    assert victim.read_text() == "keep me" and not (tmp_path / "report.md").is_symlink()


def _read_fifo_in_a_thread(fifo: Path) -> dict:
    """A reader at the other end of `fifo`, as a shell's `>(...)` or `| cat` would be."""
    got: dict = {}

    def read():
        with open(fifo, "rb") as stream:
            got["bytes"] = stream.read()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    got["thread"] = thread
    return got


@pytest.mark.parametrize("argv, starts", [
    (["analyze", "RUN", "--format", "json", "-o", "OUT"], b"{"),
    (["compare", "RUN", "--format", "markdown", "-o", "OUT"], b"#"),
    (["compare", "RUN", "--plot", "OUT"], b"\x89PNG"),
], ids=["analyze-o", "compare-o", "compare-plot"])
def test_an_output_named_as_a_fifo_or_device_is_written_into_not_replaced(tmp_path, capsys, argv, starts):
    """-o /dev/null, -o /dev/stdout or -o >(gzip > f) name a stream: renaming a file over it (the
    atomic write regular files get) would replace /dev/null itself for every program on the machine."""
    run = small_run(tmp_path / "run")
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    reader = _read_fifo_in_a_thread(fifo)
    code, _, err = devprof(capsys, *[run if a == "RUN" else fifo if a == "OUT" else a for a in argv])
    reader["thread"].join(HANG_LIMIT_S)
    assert code == 0, err
    assert fifo.is_fifo(), "the FIFO was replaced by a file"
    assert reader["bytes"].startswith(starts)
    assert not list(tmp_path.glob("out.png")) and not list(tmp_path.glob(".out*")), "nothing is written beside it"


def test_an_output_linked_to_a_fifo_is_written_into_and_a_block_device_never(tmp_path, capsys):
    run = small_run(tmp_path / "run")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "stdout").symlink_to(fifo)  # as /dev/stdout links to the process's pipe
    reader = _read_fifo_in_a_thread(fifo)
    code, _, err = devprof(capsys, "analyze", run, "--format", "json", "-o", tmp_path / "stdout")
    reader["thread"].join(HANG_LIMIT_S)
    assert code == 0, err
    assert json.loads(reader["bytes"])["step_source"] and (tmp_path / "stdout").is_symlink()
    block = next((p for p in Path("/dev").glob("loop*") if p.is_block_device()), None)
    if block is not None:  # where the machine has one: the check runs before anything is opened
        code, _, err = devprof(capsys, "compare", run, "--plot", block)
        assert code == 2 and error_line(err).endswith("a block device, not written")


@pytest.mark.parametrize("name", ["dev-fd", "link-to-proc-fd"])
def test_an_output_naming_one_of_the_processs_open_files_is_written_into_it(tmp_path, capsys, name):
    """-o /dev/stdout > report.json: /dev/stdout is a link to /proc/self/fd/1 and that one to the
    shell's regular file. Renaming a file over the path replaced /dev/stdout itself for the machine;
    the output belongs in the file the descriptor has open, after what it already holds (`>>`)."""
    run = small_run(tmp_path / "run")
    target = tmp_path / "report.json"
    target.write_bytes(b"kept\n")
    with open(target, "ab") as held:
        fd_path = f"/dev/fd/{held.fileno()}"
        if name == "link-to-proc-fd":
            (tmp_path / "stdout").symlink_to(f"/proc/self/fd/{held.fileno()}")
            fd_path = str(tmp_path / "stdout")
        code, _, err = devprof(capsys, "analyze", run, "--format", "json", "-o", fd_path)
        assert code == 0, err
    text = target.read_text()
    assert text.startswith("kept\n") and json.loads(text[len("kept\n"):])["schema_version"] == 1
    if name == "link-to-proc-fd":
        assert (tmp_path / "stdout").is_symlink()


def test_a_plot_named_with_another_extension_is_refused(tmp_path, capsys):
    run = small_run(tmp_path / "run")
    code, _, err = devprof(capsys, "compare", run, "--plot", tmp_path / "chart.txt")
    assert code == 2 and "the chart is a PNG; name it" in error_line(err)
    assert not (tmp_path / "chart.txt").exists()


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder"])
def test_files_named_on_the_command_line_that_are_no_regular_files_are_errors_not_hangs(tmp_path, capsys, kind):
    """--external and --peak-file are read like the run's own files: regular files only, never a
    device read without end nor a FIFO waited on."""
    path = tmp_path / "given"
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    run = small_run(tmp_path / "run")
    for argv in (["compare", "--external", path], ["analyze", run, "--peak-file", path]):
        code, _, err = devprof(capsys, *argv)
        assert code == 2, err
        line = error_line(err)
        assert str(path) in line and ("not a regular file" in line or "a folder" in line), line


@pytest.mark.parametrize("spec, says", [
    ("input>0.001,input>99", "input is given twice"),
    ("input>101", "'input>101': a share of step time is at most 100 %"),
])
def test_a_fail_on_limit_that_could_not_mean_what_it_says_is_a_usage_error(tmp_path, capsys, spec, says):
    """Two limits for one part left the last silently in force; a limit above 100 % never trips."""
    run = small_run(tmp_path / "run")
    code, _, err = devprof(capsys, "analyze", run, "--fail-on", spec)
    assert code == 2 and error_line(err).startswith("error: --fail-on: ") and says in error_line(err)
    code, _, _ = devprof(capsys, "analyze", run, "--fail-on", "input>0.001")  # the same run trips one limit
    assert code == 3


@pytest.mark.parametrize("call, error, says", [
    (lambda run: analysis.analyze(run, processes=0), ValueError, "processes must be a whole number"),
    (lambda run: analysis.analyze(run, processes="2"), TypeError, "processes must be a whole number"),
    (lambda run: analysis.analyze(None), TypeError, "path must be a path (str or pathlib.Path), got NoneType"),
    (lambda run: analysis.analyze_worker(str(run).encode()), TypeError, "path must be a path"),
    (lambda run: analysis.analyze(run, step_name=5), TypeError, "step_name must be a regular expression"),
    (lambda run: analysis.compare([run], baseline=5), TypeError, "baseline must be a run name"),
    (lambda run: analysis.compare([run, None]), TypeError, "each of runs must be a path"),
    (lambda run: analysis.compare(5), TypeError, "runs must be paths"),
], ids=["processes-0", "processes-str", "path-none", "path-bytes", "step-name-int", "baseline-int", "runs-none",
        "runs-int"])
def test_the_python_api_names_its_argument_of_the_wrong_kind(tmp_path, call, error, says):
    run = small_run(tmp_path / "run")
    with pytest.raises(error, match=re.escape(says)):
        call(run)


def test_compare_takes_one_run_path_as_one_run_not_as_its_letters(tmp_path):
    run = small_run(tmp_path / "run")
    for given in (str(run), run):
        assert list(analysis.compare(given).table["run"]) == ["run"]


# ---------------------------------------------------------------- 3. only regular files are read, within a bound


@pytest.mark.parametrize("make", [_link_to_dev_zero, _fifo], ids=["dev-zero", "fifo"])
@pytest.mark.parametrize("name", ["host.csv", "gpu0.csv"])
def test_a_sampler_file_that_is_no_regular_file_is_skipped_in_analyze_and_compare(tmp_path, capsys, make, name):
    run = small_run(tmp_path / "run")
    make(run / "utilization" / name)
    other = small_run(tmp_path / "other")
    code, out, err = devprof(capsys, "analyze", run)
    assert code == 0, err
    assert f"warning: {run / 'utilization' / name}:" in err and "sampler skipped" in err, err
    code, out, err = devprof(capsys, "compare", run, other)
    assert code == 0, err
    assert "sampler skipped" in err


@pytest.mark.parametrize("make", [_link_to_dev_zero, _fifo], ids=["dev-zero", "fifo"])
@pytest.mark.parametrize("name", ["run.json", "steps.csv"])
def test_run_json_or_steps_csv_that_is_no_regular_file_is_an_error_not_a_hang(tmp_path, capsys, make, name):
    run = small_run(tmp_path / "run")
    (run / name).unlink()
    make(run / name)
    with pytest.raises(RunFileError, match="not a regular file|outside"):
        reader = run_files.read_run_json if name == "run.json" else run_files.read_steps_csv
        finishes(reader, run / name)
    code, _, err = devprof(capsys, "analyze", run)
    assert code in (1, 2), err
    error_line(err)
    code, _, err = devprof(capsys, "compare", run, small_run(tmp_path / "other"))
    if code == 0 and name == "run.json":  # compare leaves out a folder without a readable run.json, and says so
        assert "warning: skipped 1 folder" in err and str(run) in err, err
    elif code == 0:  # compare's figures come from run.json's epochs: it never opens steps.csv
        assert "sampler" not in err
    else:
        assert code in (1, 2) and str(run / name) in error_line(err), err


@pytest.mark.parametrize("make", [_link_to_dev_zero, _fifo], ids=["dev-zero", "fifo"])
def test_a_trace_that_is_no_regular_file_is_an_error_not_a_hang(tmp_path, capsys, make):
    session = tmp_path / "logs" / "plugins" / "profile" / "2030_01_01_00_00_00"
    make(session / "host.xplane.pb")
    code, _, err = devprof(capsys, "analyze", tmp_path / "logs")
    assert code == 1
    assert "not a trace file" in error_line(err) or "not a profiler trace" in error_line(err)
    code, _, err = devprof(capsys, "analyze", session / "host.xplane.pb")
    assert code == 1 and "host.xplane.pb" in error_line(err)


def test_files_above_their_bound_are_refused_before_they_are_read(tmp_path, monkeypatch):
    run = small_run(tmp_path / "run")
    monkeypatch.setattr(run_files, "RUN_JSON_MAX_BYTES", 100)
    monkeypatch.setattr(run_files, "CSV_MAX_BYTES", 100)
    size = (run / "run.json").stat().st_size
    with pytest.raises(RunFileError, match=f"{size:,} bytes, above the 0 MiB"):
        run_files.read_run_json(run / "run.json")
    with pytest.raises(RunFileError, match="bytes, above the"):
        run_files.read_steps_csv(run / "steps.csv")


def test_a_run_file_linked_out_of_the_run_is_not_read(tmp_path, capsys):
    run = small_run(tmp_path / "run")
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"status": "complete", "epochs": [{"epoch": 1, "seconds": 9.0}]}))
    (run / "run.json").unlink()
    (run / "run.json").symlink_to(secret)
    code, _, err = devprof(capsys, "analyze", run)
    assert code == 1 and "outside" in error_line(err) and "not read" in error_line(err)


# ---------------------------------------------------------------- 11. impossible times in a trace


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


# ---------------------------------------------------------------- 16. long runs, wrong words, shuffled samples


def test_markdown_report_of_many_steps_is_cut_like_the_terminals(tmp_path):
    from analysis.render.markdown import MAX_MARKDOWN_STEPS

    run = small_run(tmp_path / "run", steps=3000, epochs=[{"epoch": 1, "seconds": 40.0, "images": 300_000}])
    result = analysis.analyze(run)
    text = result.render("markdown")
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    assert len(result.steps) == 3000
    assert len(text.splitlines()) < MAX_MARKDOWN_STEPS + 100, len(text.splitlines())
    assert f"The {MAX_MARKDOWN_STEPS} slowest of 3000 steps" in text
    assert len(rows) <= MAX_MARKDOWN_STEPS + 10


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


def test_one_entry_is_one_entry(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    code, _, err = devprof(capsys, "analyze", tmp_path)
    assert code == 1 and "found 1 entry (notes.txt)" in error_line(err)


def test_a_session_of_only_gzipped_traces_says_to_unzip_them(tmp_path, capsys):
    session = tmp_path / "logs" / "plugins" / "profile" / "2030_01_01_00_00_00"
    session.mkdir(parents=True)
    (session / "host.xplane.pb.gz").write_bytes(b"\x1f\x8b\x08\x00")
    code, _, err = devprof(capsys, "analyze", tmp_path / "logs")
    line = error_line(err)
    assert code == 1 and "host.xplane.pb.gz is gzipped: unzip it first" in line, line
    code, _, err = devprof(capsys, "analyze", session / "host.xplane.pb.gz")
    assert code == 1 and "is gzipped: unzip it first" in error_line(err)


def test_shuffled_sampler_rows_are_sorted_by_time_with_a_warning(tmp_path):
    start = 1_700_000_000.0
    rows = [[start - 0.05 + i * 0.02, 10.0 + i, 50.0, 1e8] for i in range(8)]  # samples over the 6 steps
    run = small_run(tmp_path / "run", host_rows=rows[::-1])  # newest first
    with pytest.warns(RunFileWarning, match="host.csv: rows are not in time order: sorted by time_s"):
        result = analysis.analyze(run)
    per_step = [c for c in result.steps.columns if c.startswith("cpu")]
    assert per_step and result.steps[per_step].notna().all().all(), result.steps
    ordered = small_run(tmp_path / "ordered", host_rows=rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunFileWarning)
        expected = analysis.analyze(ordered)
    pd.testing.assert_frame_equal(result.steps[per_step], expected.steps[per_step])


@pytest.mark.parametrize("column, value", [("cpu_pct", 1e9), ("cpu_pct", -50.0), ("proc_cpu_pct", float("inf")),
                                           ("proc_rss_bytes", -1.0), ("proc_rss_bytes", 1e30)])
def test_sampler_values_no_sampler_writes_read_as_empty_with_a_warning(tmp_path, capsys, column, value):
    """A share over 100 % failed the report's own check ("internal error"); an infinite one printed
    "inf %". Such cells read as empty, named once; the other cells and rows stand."""
    start = 1_700_000_000.0
    rows = [[start - 0.05 + i * 0.02, 10.0 + i, 50.0, 1e8] for i in range(8)]
    good = small_run(tmp_path / "good", host_rows=rows)
    bad = small_run(tmp_path / "bad", host_rows=rows)
    host = bad / "utilization" / "host.csv"
    frame = pd.read_csv(host)
    frame.loc[2:4, column] = value
    frame.to_csv(host, index=False)
    with pytest.warns(RunFileWarning) as caught:
        samples = run_files.read_sampler_csv(host)
    assert [str(w.message) for w in caught] == [
        f"{host}: values no sampler writes (a share outside 0-100 %, a negative, infinite or impossibly large amount) "
        "read as empty: "
        f"{column} (3)"]
    assert samples[column].isna().tolist() == [False, False, True, True, True, False, False, False]
    assert samples.drop(columns=column).equals(pd.read_csv(good / "utilization" / "host.csv").drop(columns=column))
    for command in (["analyze", bad], ["analyze", bad, "--format", "json"], ["compare", bad, good]):
        code, out, err = devprof(capsys, *command)
        assert code == 0 and "internal error" not in err and "inf %" not in out, err
        assert err.count("values no sampler writes") == 1, err


@pytest.mark.parametrize("command", ["analyze", "compare"])
def test_an_output_extension_no_format_writes_is_refused(tmp_path, capsys, command):
    run = small_run(tmp_path / "run")
    runs = [run] if command == "analyze" else [run, small_run(tmp_path / "other")]
    line = one_usage_error(cli.main([command, *map(str, runs), "-o", str(tmp_path / "report.pdf")]), capsys)
    assert "no format writes .pdf files" in line and ".html" in line, line
    assert not (tmp_path / "report.pdf").exists() and not (run / "analysis").exists()
    assert cli.main([command, *map(str, runs), "-o", str(tmp_path / "report.pdf"), "--format", "html"]) == 0


def test_markdown_shows_html_in_run_names_instead_of_running_it(tmp_path):
    run = small_run(tmp_path / "b<img src=x onerror=alert(1)>")
    for text in (analysis.analyze(run).render("markdown"),
                 analysis.compare([str(run), str(small_run(tmp_path / "a<script>"))]).render("markdown")):
        assert "<img" not in text and "<script" not in text, text
        assert "&lt;img src=x onerror=alert(1)>" in text


# ---------------------------------------------------------------- hostile inputs of every kind


@pytest.mark.parametrize("content, expect", [
    (b"", "not valid JSON"),
    (b"\x00\xff\xfe binary junk \x89PNG", "not valid JSON"),
    (b"[" * 100_000, "not valid JSON"),
])
def test_run_json_that_is_no_json_is_one_error_line(tmp_path, capsys, content, expect):
    run = small_run(tmp_path / "run")
    (run / "run.json").write_bytes(content)
    for argv in (["analyze", run], ["compare", run, small_run(tmp_path / "other")]):
        code, _, err = devprof(capsys, *argv)
        assert code in (1, 2) and expect in error_line(err), err


def test_a_folder_named_like_a_run_file_is_one_error_line(tmp_path, capsys):
    run = small_run(tmp_path / "run")
    (run / "steps.csv").unlink()
    (run / "steps.csv").mkdir()
    (run / "utilization" / "host.csv").mkdir(parents=True)
    code, _, err = devprof(capsys, "analyze", run)
    assert code == 1, err
    error_line(err)


def test_a_trace_path_with_odd_characters_is_read(tmp_path, capsys):
    folder = tmp_path / "odd name; $(x) \u00e9\u6f22 'q\"" / "plugins" / "profile" / "2030_01_01_00_00_00"
    marker_trace(folder / "h\u00f6st name.xplane.pb")
    code, out, err = devprof(capsys, "analyze", tmp_path / "odd name; $(x) \u00e9\u6f22 'q\"")
    assert code == 0, err
    assert "10 steps" not in out and "6 steps found by markers" in out, out


# ---------------------------------------------------------------- 17. a step name that is not a regular expression


@pytest.mark.parametrize("call", [analysis.analyze, analysis.analyze_worker])
def test_a_bad_step_name_is_a_value_error_naming_it_before_anything_is_read(tmp_path, call):
    with pytest.raises(ValueError, match=r"step_name '\(' is not a regular expression: missing \)"):
        call(tmp_path / "not-there", step_name="(")


def test_a_bad_step_name_is_one_usage_error(tmp_path, capsys):
    line = one_usage_error(cli.main(["analyze", str(small_run(tmp_path / "run")), "--step-name", "(["]), capsys)
    assert "--step-name '([' is not a regular expression" in line, line
