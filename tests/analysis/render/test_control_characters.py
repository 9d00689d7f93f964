"""A trace's names never act on a terminal, a CSV reader or a browser: every output shows their control
characters as visible escapes, and a console that cannot show a character loses nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import analysis
from compare_fixtures import _traced_run
from marker_traces import assert_inert, hostile_trace
from profiler import cli
from repo_paths import REPO


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
        result = anyio.run(server.call_tool, tool, {"path": str(trace)})
        text = "".join(getattr(part, "text", "") for part in result.content)
        assert_inert(text, f"mcp {tool}")


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_a_console_that_cannot_show_a_character_still_gets_the_whole_report(trace, tmp_path, encoding):
    env = {**os.environ, "PYTHONIOENCODING": encoding, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "profiler.cli", "analyze", str(trace), "--out", str(tmp_path / "o")],
        capture_output=True,
        env=env,
        timeout=300,
    )
    out, err = proc.stdout.decode(encoding), proc.stderr.decode(encoding)
    assert proc.returncode == 0, err
    assert "UnicodeEncodeError" not in err and "verdict:" in out and "top ops" in out
    assert_inert(out, "stdout")


# ---------------------------------------------------------------- names in run files and folders


@pytest.mark.slow
def test_run_files_and_folder_names_reach_the_console_and_files_inert(tmp_path):
    run = _traced_run(tmp_path, "run\x1b[31mRED")
    meta = json.loads((run / "run.json").read_text())
    meta.update(status="failed", error="boom \x1b]0;pwned\x07 \u202e")
    meta["device"]["name"] = "CPU\x1b[31m\x9b"
    (run / "run.json").write_text(json.dumps(meta))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "profiler.cli", "analyze", str(run), "--out", str(out)],
        capture_output=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert_inert(proc.stdout.decode(), "stdout")
    assert_inert(proc.stderr.decode(), "stderr")
    assert "boom \\u001b]0;pwned\\u0007" in proc.stdout.decode()
    for path in out.iterdir():
        if path.suffix in (".md", ".html", ".csv", ".json"):
            assert_inert(path.read_text(encoding="utf-8"), path.name)
    document = json.loads((out / "analysis.json").read_text()) if (out / "analysis.json").exists() else None
    assert document is None or isinstance(document, dict)  # still JSON
