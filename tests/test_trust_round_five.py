"""Trust round five: a trace's names never act on a terminal, a CSV reader or a browser (every output shows
their control characters as visible escapes), and a console that cannot show a character loses nothing else."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from trace_fixtures import _Plane, _write_space, _xspace_class

import analysis
from profiler import cli
from repo_paths import REPO
from marker_traces import BASE_NS, MS, assert_inert, hostile_trace, steps_trace
from compare_fixtures import _traced_run


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return hostile_trace(tmp_path_factory.mktemp("hostile") / "plugins" / "profile" / "s" / "host.xplane.pb")


def test_the_analysis_holds_the_names_as_visible_escapes(trace):
    result = analysis.analyze(trace)
    ops = result.ops["op"].astype(str).tolist()
    assert any("\\x1b]0;pwned\\x07conv" in op and "\\u202e" in op and "\\x9b" in op for op in ops), ops
    for op in ops:
        assert_inert(op, "ops table")


@pytest.mark.parametrize("fmt", ["text", "markdown", "json", "csv", "html", "summary"])
def test_every_format_on_stdout_is_inert(trace, capsys, tmp_path, fmt):
    assert cli.main(["analyze", str(trace), "--format", fmt, "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert_inert(captured.out, f"--format {fmt} stdout")
    assert_inert(captured.err, f"--format {fmt} stderr")
    if fmt in ("json", "html"):
        assert "pwned" in captured.out  # shown, not dropped


def test_every_written_file_is_inert(trace, capsys, tmp_path):
    out = tmp_path / "out"
    assert cli.main(["analyze", str(trace), "--out", str(out), "--perfetto", str(tmp_path / "t.pftrace")]) == 0
    capsys.readouterr()
    written = [p for p in out.rglob("*") if p.is_file() and p.suffix in (".csv", ".md", ".html", ".json", ".txt")]
    assert {p.name for p in written} >= {"ops.csv", "report.md", "report.html"}
    for path in written:
        assert_inert(path.read_text(encoding="utf-8"), path.name)
    assert "pwned" in (out / "ops.csv").read_text()


def test_mcp_answers_are_inert(trace):
    pytest.importorskip("mcp")
    import anyio

    from profiler.cli import mcp_server

    server = mcp_server.build_server(mcp_server.Roots([trace.parents[3]]))
    for tool in ("analyze", "ops", "findings", "steps"):
        result = anyio.run(lambda tool=tool: server.call_tool(tool, {"path": str(trace)}))
        text = "".join(getattr(part, "text", "") for part in result.content)
        assert_inert(text, f"mcp {tool}")


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_a_console_that_cannot_show_a_character_still_gets_the_whole_report(trace, tmp_path, encoding):
    env = {**os.environ, "PYTHONIOENCODING": encoding, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "profiler.cli", "analyze", str(trace), "--out", str(tmp_path / "o")],
                          capture_output=True, env=env, timeout=300)
    out, err = proc.stdout.decode(encoding), proc.stderr.decode(encoding)
    assert proc.returncode == 0, err
    assert "UnicodeEncodeError" not in err and "verdict:" in out and "top ops" in out
    assert_inert(out, "stdout")


def _memory_run(root: Path, images: list[int]) -> Path:
    from memory_fixtures import write_memory_trace

    run = root / "run"
    write_memory_trace(run / "plugins" / "profile" / "s" / "h.xplane.pb")
    (run / "run.json").write_text(json.dumps({"status": "complete", "config": {}}))  # profile(): no batch size
    rows = [f"1,{k},1,{1_700_000_000 + k:.6f},1.0,8.0,1.0,10.0,{n}" for k, n in enumerate(images)]
    (run / "steps.csv").write_text("epoch,step,steps,start_time_s,input_ms,call_ms,other_host_ms,step_ms,images\n"
                                   + "\n".join(rows) + "\n")
    return run


def test_the_images_every_step_recorded_are_the_batch_size_for_headroom(tmp_path):
    from memory_fixtures import GPU

    memory = analysis.analyze(_memory_run(tmp_path / "same", [8, 8, 8])).to_json()["memory"]
    gpu = next(a for a in memory["allocators"] if a["name"] == GPU)
    assert memory["batch_size"] == 8 and gpu["max_batch"] == 15  # as where run.json states batch 8
    # steps of different sizes (a last, partial batch) state no one batch size
    uneven = analysis.analyze(_memory_run(tmp_path / "uneven", [8, 8, 3])).to_json()["memory"]
    assert uneven["batch_size"] is None
    assert "steps.csv's images per step are not one number" in uneven["allocators"][0]["headroom_reason"]


def test_a_ceiling_the_peak_search_could_not_measure_is_unknown_not_a_number():
    import math

    from analysis.breakdown.roofline import ceilings_from_peak

    peak = {"device": "cpu", "ceilings": {"bfloat16": {"matrix_flops_per_second": 4e12, "vector_flops_per_second": 1.3e9,
                                                       "memory_bytes_per_second": 5e10},
                                          "float32": {"matrix_flops_per_second": 4e11, "vector_flops_per_second": 2e11,
                                                      "memory_bytes_per_second": 5e10}},
            "vector": {"bfloat16": {"k": 1, "stopped": "time", "sizes": [{"size": 1, "per_second": 1.3e9}]},
                       "float32": {"k": 16, "stopped": "time", "sizes": [{"size": 1}, {"size": 4}, {"size": 16}]}}}
    ceilings = ceilings_from_peak(peak, "cache")
    assert math.isnan(ceilings.of("bfloat16")["vector_flops_per_second"])  # K 1-1: it gave up
    assert ceilings.of("float32")["vector_flops_per_second"] == 2e11  # it grew, then stopped: measured
    assert ceilings.of("bfloat16")["matrix_flops_per_second"] == 4e12


@pytest.mark.parametrize("odd, said", [
    ("zero", r"run\.json: a character device, not a regular file: not read"),
    ("fifo", r"steps\.csv: a FIFO, not a regular file: not read"),
    ("truncated", r"run\.json: not valid JSON .*: the run's settings are not read; its trace is analysed without them"),
])
def test_a_run_file_that_cannot_be_read_is_named_once_and_the_trace_still_analysed(tmp_path, odd, said):
    from analysis.read.run_files import RunFileWarning

    run = _traced_run(tmp_path, odd)
    if odd == "zero":
        (run / "run.json").unlink()
        (run / "run.json").symlink_to("/dev/zero")
    elif odd == "fifo":
        (run / "steps.csv").unlink()
        os.mkfifo(run / "steps.csv")
    else:
        text = (run / "run.json").read_text()
        (run / "run.json").write_text(text[: len(text) // 2])
    with pytest.warns(RunFileWarning, match=said) as caught:
        result = analysis.analyze(run)
    assert sum(bool(re.search(said, str(w.message))) for w in caught) == 1
    assert result.step_source == "markers" and len(result.steps) == 6


@pytest.fixture
def mcp_root(tmp_path):
    pytest.importorskip("mcp")
    from marker_traces import marker_trace

    root = tmp_path / "runs"
    marker_trace(root / "trace" / "plugins" / "profile" / "s" / "host.xplane.pb")
    deep = root.joinpath(*[f"d{i}" for i in range(8)])
    marker_trace(deep / "plugins" / "profile" / "s" / "host.xplane.pb")
    return root


def _mcp_call(root, tool, **arguments):
    import anyio

    from profiler.cli import mcp_server

    server = mcp_server.build_server(mcp_server.Roots([root]))
    try:
        result = anyio.run(lambda: server.call_tool(tool, arguments))
    except Exception as exc:  # noqa: BLE001 - the SDK's tool error: a refusal
        return None, str(exc)
    return json.loads(result.content[0].text), None


@pytest.mark.parametrize("limit", [True, "5", 2.0])
def test_mcp_refuses_a_limit_that_is_no_whole_number_instead_of_coercing_it(mcp_root, limit):
    answer, refusal = _mcp_call(mcp_root, "ops", path="trace", limit=limit)
    assert answer is None and refusal, answer


def test_mcp_says_which_folders_list_runs_did_not_search(mcp_root):
    answer, _ = _mcp_call(mcp_root, "list_runs")
    assert [run["path"] for run in answer["runs"]] == ["trace"] or len(answer["runs"]) == 1
    assert answer["not_searched"] and "more than 6 deep, not searched" in answer["not_searched"]


def test_mcp_refusals_leave_stderr_quiet(mcp_root, caplog):
    import logging

    caplog.set_level(logging.DEBUG)
    _, refusal = _mcp_call(mcp_root, "ops", path="/etc")
    assert refusal and "outside" in refusal
    assert not [r for r in caplog.records if r.name.startswith("mcp") and r.levelno < logging.WARNING]


def _fake_browser(tmp_path: Path, body: str) -> str:
    script = tmp_path / "chromium"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.slow
def test_a_browser_that_dies_at_start_is_started_once_more_then_the_failure_says_what_it_printed(tmp_path,
                                                                                                monkeypatch):
    import browser

    real = browser.chromium_binary()
    # dies the first time (as Chromium did beside two CPU hogs), then starts: the page still loads
    once = _fake_browser(tmp_path, f'if [ ! -e {tmp_path}/died ]; then touch {tmp_path}/died; '
                                   f'echo "crashpad: unrecognized option" >&2; exit 1; fi; exec {real} "$@"')
    monkeypatch.setattr(browser, "chromium_binary", lambda: once)
    page = tmp_path / "p.html"
    page.write_text("<!doctype html><title>t</title><p>ok</p>")
    assert browser.load(page).errors == [] and (tmp_path / "died").exists()
    # dies every time: the test fails once, with what it printed both times
    (tmp_path / "always").mkdir()
    always = _fake_browser(tmp_path / "always", 'echo "zygote pipe broken" >&2; exit 1')
    monkeypatch.setattr(browser, "chromium_binary", lambda: always)
    with pytest.raises(pytest.fail.Exception, match=r"(?s)exited at start twice.*zygote pipe broken.*zygote pipe"):
        browser.load(page)


@pytest.mark.slow
def test_a_program_that_calls_os_exit_leaves_a_failed_run_with_its_steps(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(f"""
import os
import profiler

with profiler.profile({str(tmp_path / 'runs')!r}, run_name="exits", profile=False, sample=False, quiet=True) as s:
    for step in range(3):
        with s.step(images=8):
            pass
    os._exit(3)
""")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 3, proc.stderr.decode()
    run = tmp_path / "runs" / "exits"
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "failed" and "os._exit(3)" in meta["error"], meta.get("status")
    assert len((run / "steps.csv").read_text().strip().splitlines()) == 1 + 3


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
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, (proc.returncode, proc.stderr.decode()[-500:])  # -7: SIGBUS
    assert proc.stdout.decode().split()[1:] == ["True", "True"]


# ---------------------------------------------------------------- the hostile round's findings


@pytest.mark.parametrize("outputs, said", [
    (lambda run, tmp: ["-o", str(run / "run.json")], "that is a file devprof reads for this analysis"),
    (lambda run, tmp: ["-o", str(run / "steps.csv")], "that is a file devprof reads for this analysis"),
    (lambda run, tmp: ["--perfetto", str(run / "plugins/profile/s/host.xplane.pb")], "a file devprof reads"),
    (lambda run, tmp: ["-o", str(tmp / "x.json"), "--perfetto", str(tmp / "x.json")],
     "-o and --perfetto both name"),
    (lambda run, tmp: ["--out", str(tmp / "d"), "-o", str(tmp / "d" / "ops.csv")], "gets its own ops.csv"),
])
def test_an_output_that_would_replace_an_input_or_another_output_is_refused(tmp_path, capsys, outputs, said):
    from cli_checks import one_usage_error

    run = _traced_run(tmp_path, "run")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    code = cli.main(["analyze", str(run), *outputs(run, tmp_path)])
    assert said in one_usage_error(code, capsys)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # nothing replaced


def test_a_run_json_above_the_log_layout_is_not_adopted(tmp_path):
    from compare_fixtures import make_run
    from marker_traces import marker_trace

    unrelated = make_run(tmp_path, "unrelated", status="failed")
    logs = unrelated / "some" / "logs"
    marker_trace(logs / "plugins" / "profile" / "s" / "host.xplane.pb")
    result = analysis.analyze(logs)
    assert result.run_dir is None and result.record is None
    assert not any("failed" in note for note in result.notes)


def test_a_dangling_link_elsewhere_in_the_folder_does_not_stop_the_analysis(tmp_path):
    from marker_traces import marker_trace

    logs = tmp_path / "logs"
    for host in ("h1", "h2"):
        marker_trace(logs / "plugins" / "profile" / "s" / f"{host}.xplane.pb")
    (logs / "old").mkdir()
    (logs / "old" / "stale.xplane.pb").symlink_to(tmp_path / "nowhere")
    assert len(analysis.analyze(logs).steps) == 6


@pytest.mark.parametrize("pattern, said", [("(a+)+b", "repeats a repetition"), ("(b|b)*c", "repeats a repetition"),
                                           ("a{99999999999}", "is not a regular expression")])
def test_a_step_name_that_cannot_be_matched_in_reasonable_time_is_a_usage_error(trace, capsys, pattern, said):
    from cli_checks import one_usage_error

    assert said in one_usage_error(cli.main(["analyze", str(trace), "--step-name", pattern]), capsys)
    with pytest.raises(ValueError, match=said):
        analysis.analyze(trace, step_name=pattern)


@pytest.mark.slow
def test_run_files_and_folder_names_reach_the_console_and_files_inert(tmp_path):
    run = _traced_run(tmp_path, "run\x1b[31mRED")
    meta = json.loads((run / "run.json").read_text())
    meta.update(status="failed", error="boom \x1b]0;pwned\x07 \u202e")
    meta["device"]["name"] = "CPU\x1b[31m\x9b"
    (run / "run.json").write_text(json.dumps(meta))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "profiler.cli", "analyze", str(run), "--out", str(out)],
                          capture_output=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr.decode()
    assert_inert(proc.stdout.decode(), "stdout")
    assert_inert(proc.stderr.decode(), "stderr")
    assert "boom \\u001b]0;pwned\\u0007" in proc.stdout.decode()
    for path in out.iterdir():
        if path.suffix in (".md", ".html", ".csv", ".json"):
            assert_inert(path.read_text(encoding="utf-8"), path.name)
    document = json.loads((out / "analysis.json").read_text()) if (out / "analysis.json").exists() else None
    assert document is None or isinstance(document, dict)  # still JSON


@pytest.mark.slow
def test_a_closed_stdout_is_one_error_line_not_a_traceback(trace):
    proc = subprocess.run(f"{sys.executable} -m profiler.cli analyze {trace} >&-", shell=True, capture_output=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "Traceback" not in proc.stderr.decode(), proc.stderr.decode()[-800:]


def test_a_job_folder_left_out_is_named(tmp_path):
    import shutil

    from analysis.read.run_files import RunFileWarning
    from job_fixtures import write_job

    job = write_job(tmp_path)
    shutil.copytree(job.path / "worker-1", job.path / "worker-1 (copy)")
    shutil.copytree(job.path / "worker-1", job.path / "worker-2")
    (job.path / "worker-2" / "run.json").unlink()
    with pytest.warns(RunFileWarning, match=r"worker-1 \(copy\) is no worker-<i> name; worker-2 has no run\.json: "
                                            r"left out of the job"):
        result = analysis.analyze(job.path)
    assert sorted(result.workers["worker"].tolist()) == [0, 1]


@pytest.mark.parametrize("base_ns", [-10**9, 2**63 - 10**12])
def test_a_trace_on_a_clock_before_1970_or_past_2100_is_refused_not_misread(tmp_path, base_ns):
    from analysis.read.trace import TraceError

    path = steps_trace(tmp_path / "t.xplane.pb", steps=4, base_ns=base_ns)
    with pytest.raises(TraceError, match="impossible times"):
        analysis.analyze(path)


def test_mcp_gives_the_analysis_warnings_to_the_client(tmp_path):
    pytest.importorskip("mcp")
    root = tmp_path / "runs"
    run = _traced_run(root, "odd")
    meta = json.loads((run / "run.json").read_text())
    meta["config"] = ["not", "an", "object"]
    (run / "run.json").write_text(json.dumps(meta))
    for tool in ("analyze", "findings"):
        answer, refusal = _mcp_call(root, tool, path="odd")
        assert refusal is None
        assert any("'config' must be an object" in note for note in answer["notes"]), (tool, answer["notes"])


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
