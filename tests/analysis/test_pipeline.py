"""The analysis as one pipeline and one result: the Python API, the render registry, a job
assembled from its workers' results without analysing any of them twice, and the layering
that keeps rendering free of analysis."""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest

import analysis
import trace_fixtures as fx
from analysis import job, pipeline, render
from profiler.cli import main
from run_fixtures import make_run as make_small_run
from run_fixtures import small_run, step_line

ANALYSIS_DIR = Path(analysis.__file__).resolve().parent


@pytest.fixture(scope="module")
def device_trace(tmp_path_factory):
    return fx.write_synthetic_device_trace(
        tmp_path_factory.mktemp("gpu") / "plugins/profile/s/h.xplane.pb", gpus=2, empty_gpus=0
    )


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return fx.write_synthetic_session(tmp_path_factory.mktemp("session"), workers=3, slow_worker=1, slow_part="input")


def test_the_python_api_gives_one_typed_result(device_trace):
    from analysis import Analysis, analyze, compare  # noqa: F401 - the documented imports

    result = analysis.analyze(device_trace.path)
    assert isinstance(result, Analysis)
    for table in (result.steps, result.devices, result.ops, result.workers, result.input_stages):
        assert isinstance(table, pd.DataFrame)
    parts = result.steps[["input_ms", "compute_ms", "collective_ms", "host_ms"]].sum(axis=1)
    assert (parts - result.steps["step_ms"]).abs().max() < 1e-9
    assert len(result.devices) == 2 and set(result.devices["device"]) == set(device_trace.devices)
    document = result.to_json()
    assert document["step_source"] == result.step_source and len(document["steps"]) == len(result.steps)
    assert json.loads(result.render("json")) == json.loads(json.dumps(document))
    assert result.producer == "jax" and result.facts.producer == "jax"


def test_every_registered_format_renders_what_it_says(device_trace):
    result = analysis.analyze(device_trace.path)
    for entry in render.REGISTRY:
        for kind in entry.renders:
            assert callable(render.renderer(entry.name, kind)), (entry.name, kind)
        for suffix in entry.suffixes[:1]:  # a format without its own extension (summary) is asked for by name
            assert render.format_for_path(f"out{suffix}", entry.renders[-1]) == entry.name
    with pytest.raises(ValueError, match="unknown format"):
        render.render(result, "yaml")
    steps = pd.read_csv(io.StringIO(result.render("csv")))
    assert steps["step_ms"].tolist() == pytest.approx(result.steps["step_ms"].tolist())


def test_analyze_lists_its_formats_from_the_registry(capsys, device_trace):
    assert main(["analyze", str(device_trace.path), "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("step,steps,")
    assert main(["analyze", "--help"]) == 0
    assert "{" + ",".join(render.formats_for("analysis")) + "}" in capsys.readouterr().out


def test_a_session_is_assembled_from_one_analysis_per_host_file(session, monkeypatch):
    calls = []
    real = job.analyze_worker

    def counting(path, step_name=None, peak=None):
        calls.append(Path(path))
        return real(path, step_name, peak)

    monkeypatch.setattr(job, "analyze_worker", counting)
    result = pipeline.analyze(session.logdir)
    assert len(calls) == len(session.files), calls  # the chief once, each other host once
    per_host = {Path(p).name: real(p).mean["step_ms"] for p in session.files}
    assert dict(zip(result.workers["worker"] + ".xplane.pb", result.workers["step_ms"])) == pytest.approx(per_host)
    assert result.straggler is not None
    assert result.straggler["worker"] == f"worker{session.slow_worker}"
    assert result.straggler["cause"] == "input"


def _calls_in_package(name: str, folder: Path = ANALYSIS_DIR) -> list[str]:
    """`path:line` of every call of a function or method named `name` under `folder`."""
    found = []
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == name:
                found.append(f"{path.relative_to(ANALYSIS_DIR)}:{node.lineno}")
    return found


def _files(sites: list[str]) -> set[str]:
    return {site.split(":")[0] for site in sites}


def test_facts_are_built_in_one_place_from_typed_arguments():
    assert _files(_calls_in_package("Facts")) == {"rules/facts.py"}
    # No rule takes a record dict: every function of rules/ names its inputs.
    for path in (ANALYSIS_DIR / "rules").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                names = [a.arg for a in (*node.args.args, *node.args.kwonlyargs)]
                assert "record" not in names and node.args.kwarg is None or node.name == "make_facts", (
                    f"{path.name}:{node.lineno} {node.name}({', '.join(names)})"
                )
    assert not _calls_in_package("facts_from")
    job_assembly = [site for site in _calls_in_package("analyze") if site.startswith(("pipeline.py", "job.py"))]
    assert job_assembly == [], "a job is assembled from its workers' results, never analysed again"


def test_each_run_file_is_read_only_by_the_reader():
    for reader in (
        "read_run_json",
        "read_steps_csv",
        "read_utilization",
        "read_sampler_csv",
        "read_trace",
        "locate_trace",
    ):
        outside = {site for site in _files(_calls_in_package(reader)) if not site.startswith("read/")}
        # where a path holds several hosts' traces; where `devprof analyze` begins reading one before its imports
        allowed = {"pipeline.py", "parallel/__init__.py"} if reader == "locate_trace" else set()
        assert outside <= allowed, (reader, outside)
    assert _files(_calls_in_package("section")) == {"read/run_files.py"}
    # compare reads each run once, through the reader and the pipeline, never a file of its own
    comparison = ANALYSIS_DIR / "comparison"
    calls = {
        name: _calls_in_package(name, comparison)
        for name in ("read_inputs", "read_run_files", "analyze_inputs", "analyze", "analyze_worker", "RunRecord")
    }
    assert calls["read_inputs"] and calls["analyze_inputs"] and not calls["analyze"] and not calls["analyze_worker"]


def test_events_are_selected_by_plane_only_in_the_trace_view():
    selectors = ("HOST_PLANE", "DEVICE_PLANE", "host_events", "device_events", "on_device_planes")
    for path in [*ANALYSIS_DIR.rglob("*.py"), *(ANALYSIS_DIR.parent / "bench").glob("*.py")]:
        if path.name in ("view.py", "planes.py"):
            continue
        text = path.read_text()
        assert not any(name in text for name in selectors), f"{path} selects events by plane"


def test_one_worker_is_a_straight_line():
    source = (ANALYSIS_DIR / "worker.py").read_text()
    tree = ast.parse(source)
    # Statements, not lines: the formatter lays a long call out one argument a line.
    statements = {
        node.name: sum(isinstance(inner, ast.stmt) for inner in ast.walk(node)) - 1
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
    }
    assert statements["analyze_worker"] + statements["analyze_inputs"] <= 25, statements


MAX_MODULE_LINES = 700  # a module longer than this is split along its seams (docs/architecture.md)
MAX_PIPELINE_LINES = 400  # the line only dispatches: the work is in worker.py and job.py
LONG_MODULES = ("read/xplane_wire.py",)  # one wire-format decoder, read as a whole


def test_no_module_of_the_analysis_is_too_long():
    lengths = {
        path.relative_to(ANALYSIS_DIR).as_posix(): len(path.read_text().splitlines())
        for path in ANALYSIS_DIR.rglob("*.py")
        if not path.name.endswith("_pb2.py")
    }
    long = {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES and name not in LONG_MODULES}
    assert not long, long
    assert lengths["pipeline.py"] < MAX_PIPELINE_LINES, lengths["pipeline.py"]


def _imports_of(path: Path, packages: set[str], known: set[str]) -> set[str]:
    """The project modules a file imports anywhere, functions included (a lazy import that closes a
    circle still ties the two modules together), but not under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for child in node.body
        for n in ast.walk(child)
    }
    edges: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] in packages
        ):
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & known
            edges |= submodules if len(submodules) == len(node.names) else submodules | {node.module}
        elif isinstance(node, ast.Import):
            edges |= {alias.name for alias in node.names if alias.name.split(".")[0] in packages}
    return edges


def import_circle(root: Path, packages: set[str]) -> list[str] | None:
    files = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {
        module: {edge for edge in _imports_of(path, packages, set(files)) if edge in files and edge != module}
        for module, path in files.items()
    }
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> list[str] | None:
        state[module] = 1
        for edge in sorted(graph[module]):
            if state.get(edge) == 1:
                return [*trail, module, edge]
            if edge not in state and (circle := visit(edge, [*trail, module])):
                return circle
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (circle := visit(module, [])):
            return circle
    return None


def test_no_import_circle_in_the_project():
    assert import_circle(ANALYSIS_DIR.parent, {"analysis", "profiler", "models"}) is None


def test_the_circle_check_finds_a_lazy_circle(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    from pkg import b\n")
    (tmp_path / "pkg" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.c\n")
    (tmp_path / "pkg" / "c.py").write_text("import pkg.a\n")
    assert import_circle(tmp_path, {"pkg"}) is None  # b -> c only for the type checker
    (tmp_path / "pkg" / "b.py").write_text("import pkg.c\n")
    assert import_circle(tmp_path, {"pkg"}) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]


def test_render_modules_import_no_analysis_module():
    allowed = {"analysis.render", "analysis.read.run_files", "analysis.render.plots", "analysis.render.csv_safety"}
    for path in (ANALYSIS_DIR / "render").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("analysis"):
                modules = {node.module} if node.module != "analysis" else {f"analysis.{a.name}" for a in node.names}
                assert modules <= allowed | {f"analysis.render.{p.stem}" for p in path.parent.glob("*.py")}, (
                    f"{path.name} imports {modules}"
                )


@pytest.mark.tool
def test_ruff_keeps_the_layers():
    """ruff over analysis/, profiler/, models/, tests/ and bench/ as pyproject.toml configures it: lint, import order,
    and the banned imports (no TensorFlow, Keras or profiler in analysis/, no analysis stage in render/)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "analysis", "profiler", "models", "tests", "bench"],
        cwd=ANALYSIS_DIR.parent,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No Python files found" not in done.stderr, done.stderr  # a folder left out of ruff's include


@pytest.mark.tool
def test_ruff_format_leaves_every_file_as_it_is():
    """One layout everywhere, ruff's: `ruff format --check .` would change no file (pyproject's `include`:
    analysis/, profiler/, models/, tests/ and bench/)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."],
        cwd=ANALYSIS_DIR.parent,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No Python files found" not in done.stderr, done.stderr


def test_mypy_is_clean(monkeypatch):
    """mypy over the folders pyproject.toml lists (analysis/, profiler/, models/, tests/ and bench/), in one run:
    all but analysis/ with their untyped functions too; tests/' modules named from the repository root, the
    helpers in tests/support and bench/'s scripts by the plain names they are imported by."""
    from mypy import api

    root = ANALYSIS_DIR.parent
    monkeypatch.chdir(root)  # `files` and the test modules' names are the root's
    out, err, status = api.run(["--config-file", str(root / "pyproject.toml")])
    assert status == 0, out + err
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mypy"]
    assert {"analysis", "profiler", "models", "tests", "bench"} <= set(config["files"]) and config["check_untyped_defs"]


# ---------------------------------------------------------------- the Python API's arguments


@pytest.mark.parametrize(
    "call, error, says",
    [
        (lambda run: analysis.analyze(run, processes=0), ValueError, "processes must be a whole number"),
        (lambda run: analysis.analyze(run, processes="2"), TypeError, "processes must be a whole number"),
        (lambda run: analysis.analyze(None), TypeError, "path must be a path (str or pathlib.Path), got NoneType"),
        (lambda run: analysis.analyze_worker(str(run).encode()), TypeError, "path must be a path"),
        (lambda run: analysis.analyze(run, step_name=5), TypeError, "step_name must be a regular expression"),
        (lambda run: analysis.compare([run], baseline=5), TypeError, "baseline must be a run name"),
        (lambda run: analysis.compare([run, None]), TypeError, "each of runs must be a path"),
        (lambda run: analysis.compare(5), TypeError, "runs must be paths"),
    ],
    ids=[
        "processes-0",
        "processes-str",
        "path-none",
        "path-bytes",
        "step-name-int",
        "baseline-int",
        "runs-none",
        "runs-int",
    ],
)
def test_the_python_api_names_its_argument_of_the_wrong_kind(tmp_path, call, error, says):
    run = small_run(tmp_path / "run")
    with pytest.raises(error, match=re.escape(says)):
        call(run)


# ---------------------------------------------------------------- renderers check what they are given


def test_renderers_refuse_a_negative_time_or_a_share_over_100(tmp_path):
    run = make_small_run(tmp_path / "run", [step_line(i) for i in range(6)])
    result = pipeline.analyze(run)
    steps = result.steps.copy()
    steps.loc[2, "host_ms"] = -3.0
    broken = dataclasses.replace(result, steps=steps)
    for fmt in ("text", "markdown", "json"):
        with pytest.raises(ValueError, match="negative"):
            broken.render(fmt)
    shares = result.steps.copy()
    shares.loc[1, "input_pct"] = 178.0
    with pytest.raises(ValueError, match="over 100"):
        dataclasses.replace(result, steps=shares).render("text")
