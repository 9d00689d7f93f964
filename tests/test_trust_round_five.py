"""Trust round five: a trace's names never act on a terminal, a CSV reader or a browser (every output shows
their control characters as visible escapes), and a console that cannot show a character loses nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from trace_fixtures import _Plane, _write_space, _xspace_class

import analysis
from profiler import cli

REPO = Path(__file__).resolve().parents[1]
MS = 1_000_000
BASE_NS = 1_700_000_000 * 10**9
# OSC 0 retitles the terminal, OSC 52 writes its clipboard, CSI 31m recolours it, a bidi override reorders it
HOSTILE_OP = "net/\x1b]0;pwned\x07conv\x1b]52;c;cm0gLXJmIH4=\x07/\x1b[31mConv2D\u202e\x9b:Conv2D"
ACTIVE = ("\x1b", "\x07", "\u202e", "\x9b")


def hostile_trace(path: Path) -> Path:
    """Steps of 10 ms with `train` markers; the one op of each step (5 ms) has `HOSTILE_OP` for a name,
    and the host's own name a newline."""
    space = _xspace_class()()
    space.hostnames.append("host\nfake line")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", BASE_NS)
    worker = host.line(101, "tf_Compute/1", BASE_NS)
    for k in range(6):
        t = BASE_NS + 10 * MS + k * 10 * MS
        host.event(python, "train", t, t + 10 * MS, step_num=k, _r=1)
        host.event(python, "IteratorGetNext", t, t + 2 * MS)
        host.event(worker, HOSTILE_OP, t + 2 * MS, t + 7 * MS)
    host.finish()
    return _write_space(space, path)


def assert_inert(text: str, where: str) -> None:
    found = [repr(c) for c in ACTIVE if c in text]
    assert not found, f"{where} carries {', '.join(found)}"


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

    from profiler import mcp_server

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
