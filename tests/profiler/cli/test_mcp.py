"""`devprof mcp`: the MCP server's tools, called in-process through the SDK's server (`call_tool`) and
once over stdio through the SDK's own client; paths outside the roots refused with the reason, and
nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from cli_checks import one_usage_error
from compare_fixtures import make_run
from job_fixtures import write_job
from marker_traces import marker_trace
from summary_checks import check

pytest.importorskip("mcp")

try:
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:  # the SDK before 2.0
    from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef]  # the same name, older place

import analysis  # noqa: E402
from compare_fixtures import _traced_run
from profiler import cli  # noqa: E402
from profiler.cli import mcp_server
from repo_paths import REPO
from run_fixtures import make_run as make_small_run
from run_fixtures import step_line

TOOLS = ("list_runs", "analyze", "findings", "ops", "steps", "compare", "explain_rule")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A root holding a log folder (a CPU trace), two run directories and a two-worker job; beside it,
    outside, a run that must never be read."""
    base = tmp_path_factory.mktemp("mcp")
    root = base / "runs"
    marker_trace(root / "trace" / "plugins" / "profile" / "s" / "host.xplane.pb")
    make_run(root, "cpu-slow", epoch_seconds=(2.0, 0.6, 0.6))
    make_run(root, "cpu-fast", epoch_seconds=(1.0, 0.3, 0.3), call_ms=20.0)
    write_job(root, "job")
    make_run(base, "outside")
    return root


def call(server, name: str, **arguments):
    """The tool's answer as JSON (a text answer as it is)."""

    async def run():
        return await server.call_tool(name, arguments)

    result = anyio.run(run)
    assert not result.is_error, result
    text = result.content[0].text
    return json.loads(text)


def refused(server, name: str, **arguments) -> str:
    with pytest.raises(ToolError) as caught:
        anyio.run(lambda: server.call_tool(name, arguments))
    return str(caught.value)


@pytest.fixture
def server(root):
    return mcp_server.build_server(mcp_server.Roots([root]))


def files_of(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_every_tool_answers_on_runs_under_the_root(server, root):
    assert sorted(tool.name for tool in anyio.run(server.list_tools)) == sorted(TOOLS)
    assert all(tool.annotations.read_only_hint for tool in anyio.run(server.list_tools))
    before = files_of(root)
    listed = call(server, "list_runs")
    kinds = {Path(run["path"]).name: run["kind"] for run in listed["runs"]}
    assert kinds == {"trace": "log folder", "cpu-slow": "run", "cpu-fast": "run", "job": "job"}
    assert listed["runs_total"] == 4 and "outside" not in json.dumps(listed)
    summary = call(server, "analyze", path="trace")
    check(summary)
    trace = analysis.analyze(root / "trace")
    assert summary == json.loads(trace.render("summary"))
    findings = call(server, "findings", path=str(root / "trace"))
    assert findings["verdict"]["bound"] == trace.verdict["bound"] and findings["findings"] == trace.findings
    ops = call(server, "ops", path="trace", limit=1)
    assert ops["ops_total"] == len(trace.ops) and [op["op"] for op in ops["ops"]] == trace.ops["op"].head(1).tolist()
    steps = call(server, "steps", path="trace", limit=2, offset=1)
    assert [step["step"] for step in steps["steps"]] == trace.steps["step"].iloc[1:3].tolist()
    assert steps["steps_total"] == len(trace.steps) and steps["mean"]["step_ms"] == pytest.approx(10.0)
    compared = call(server, "compare", paths=["cpu-slow", "cpu-fast"])
    assert compared["fastest"] == "cpu-fast" and len(compared["rows"]) == 2
    job = call(server, "analyze", path="job")
    check(job)
    assert job["workers"]["count"] == 2
    rule = call(server, "explain_rule", rule="no_prefetch")
    assert rule["description"] and rule["fix"] == "end the tf.data pipeline with .prefetch(tf.data.AUTOTUNE)"
    assert rule["applies"] is None
    verdict_rule = trace.verdict["rule"]
    here = call(server, "explain_rule", rule=verdict_rule, path="trace")
    assert here["applies"] is True and here["fix"] == trace.verdict["advice"][0]
    assert "no rule 'nope'" in refused(server, "explain_rule", rule="nope")
    assert files_of(root) == before  # read-only: no analysis/ folder, no file touched


def test_paths_outside_the_roots_are_refused_with_the_reason(server, root, tmp_path):
    outside = root.parent / "outside"
    assert "outside the roots" in refused(server, "analyze", path=str(outside))
    assert "'..' are refused" in refused(server, "analyze", path="../outside")
    assert "'..' are refused" in refused(server, "findings", path=str(root / "cpu-slow" / ".." / "cpu-fast"))
    link = root / "link-out"
    link.symlink_to(outside)
    try:
        message = refused(server, "ops", path="link-out")
        assert "a link to" in message and "outside the roots" in message
        inner = root / "cpu-fast" / "steps-elsewhere.csv"
        inner.symlink_to(outside / "steps.csv")  # a link inside a run, that the analysis could follow out
        try:
            assert "is a link to" in refused(server, "steps", path="cpu-fast")
            assert "outside the roots" in refused(server, "compare", paths=["cpu-slow", "cpu-fast"])
        finally:
            inner.unlink()
        listed = call(server, "list_runs")
        assert "link-out" not in json.dumps(listed)
    finally:
        link.unlink()
    assert "no such file" in refused(server, "analyze", path="missing")
    assert "outside the roots" in refused(server, "list_runs", root="/")
    assert "limit must be" in refused(server, "ops", path="trace", limit=0)


def test_an_analysis_is_kept_while_its_files_are_unchanged(root, monkeypatch, tmp_path):
    run = make_run(tmp_path, "run")
    server = mcp_server.build_server(mcp_server.Roots([tmp_path]))
    calls = []
    real = analysis.analyze

    def analyze(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(analysis, "analyze", analyze)
    call(server, "analyze", path="run")
    call(server, "findings", path="run")
    call(server, "steps", path="run")
    assert len(calls) == 1
    os.utime(run / "steps.csv", ns=(1, 1))  # the same bytes, written again: read again
    call(server, "ops", path="run")
    assert len(calls) == 2


def test_devprof_mcp_refuses_a_root_that_is_no_folder_and_says_when_the_sdk_is_missing(tmp_path, capsys, monkeypatch):
    line = one_usage_error(cli.main(["mcp", "--root", str(tmp_path / "missing")]), capsys)
    assert "--root" in line and "no such folder" in line
    (tmp_path / "file").write_text("")
    assert "not a folder" in one_usage_error(cli.main(["mcp", "--root", str(tmp_path / "file")]), capsys)
    from profiler.cli.commands import mcp as command

    monkeypatch.setattr(command.importlib.util, "find_spec", lambda name: None)
    assert "pip install" in one_usage_error(cli.main(["mcp", "--root", str(tmp_path)]), capsys)


@pytest.mark.slow
def test_a_stdio_session_through_the_sdk_client(root):
    """The server as a client starts it: `devprof mcp` in a subprocess, over stdio."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.types import TextContent

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "profiler", "mcp", "--root", str(root)],
        cwd=str(REPO),
        env={"PYTHONPATH": str(REPO)},
    )

    async def session_run():
        answers = {}
        with anyio.fail_after(60):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                assert sorted(tool.name for tool in (await session.list_tools()).tools) == sorted(TOOLS)
                asked: list[tuple[str, dict[str, Any]]] = [
                    ("list_runs", {}),
                    ("analyze", {"path": "trace"}),
                    ("findings", {"path": "trace"}),
                    ("ops", {"path": "trace"}),
                    ("steps", {"path": "trace"}),
                    ("compare", {"paths": ["cpu-slow", "cpu-fast"]}),
                    ("explain_rule", {"rule": "host_bound", "path": "trace"}),
                    ("outside", {"path": str(root.parent / "outside")}),
                ]
                for name, arguments in asked:
                    result = await session.call_tool("analyze" if name == "outside" else name, arguments)
                    content = result.content[0]
                    assert isinstance(content, TextContent), content
                    answers[name] = (result.is_error, content.text)
        return answers

    answers = anyio.run(session_run)
    # The CLI loads the SDK only for `devprof mcp`: every other command starts without it.
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, profiler.cli; print('mcp' in sys.modules, 'profiler.cli.mcp_server' in sys.modules)",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert loaded.stdout.split() == ["False", "False"], loaded.stderr
    assert all(not is_error for name, (is_error, _) in answers.items() if name != "outside")
    check(json.loads(answers["analyze"][1]))
    assert json.loads(answers["compare"][1])["fastest"] == "cpu-fast"
    is_error, text = answers["outside"]
    assert is_error and "outside the roots" in text


# ---------------------------------------------------------------- list_runs, limits, refusals and the analysis' warnings


def test_mcp_list_runs_of_a_file_is_refused_not_an_empty_list(tmp_path):
    from profiler.cli.mcp_server import Refused, Roots, Tools

    make_small_run(tmp_path / "run", [step_line(i) for i in range(6)])
    tools = Tools(Roots([tmp_path]))
    with pytest.raises(Refused, match="a file, not a folder"):
        tools.list_runs(root="run/run.json")
    assert json.loads(tools.list_runs(root="run"))["runs_total"] == 1


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
