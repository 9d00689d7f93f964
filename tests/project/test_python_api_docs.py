"""docs/python-api.md: its notebook example runs as written, and the names it lists exist."""

from __future__ import annotations

import re

import pytest

import analysis
import trace_fixtures as fx
from compare_fixtures import make_run
from repo_paths import REPO

DOC = REPO / "docs" / "python-api.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)


@pytest.fixture
def notebook_folder(tmp_path, monkeypatch):
    """What the example names: a TensorBoard log folder `logs/` and two runs `runs/cpu-a`, `runs/cpu-b`."""
    fx.write_synthetic_device_trace(tmp_path / "logs" / "plugins" / "profile" / "s" / "host.xplane.pb")
    make_run(tmp_path / "runs", "cpu-a", device="Test CPU")
    make_run(tmp_path / "runs", "cpu-b", device="Other CPU", input_ms=41.0, epoch_seconds=(3.0, 1.0, 1.0))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_worked_example_runs(notebook_folder, capsys):
    blocks = python_blocks()
    assert len(blocks) >= 8
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)  # one notebook: the cells share their names
    assert isinstance(namespace["a"], analysis.Analysis) and isinstance(namespace["c"], analysis.Comparison)
    assert (notebook_folder / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert (notebook_folder / "compare.html").read_text().startswith("<!DOCTYPE html>")
    assert "baseline:" in capsys.readouterr().out


def _listed(frame: str) -> list[str]:
    row = next(line for line in DOC.read_text().splitlines() if line.startswith(f"| `{frame}` |"))
    cells = row.split("|")[2]
    return re.findall(r"`(\w+)`", cells.split("; from a trace")[0])


def test_listed_columns_and_fields_exist(notebook_folder):
    trace = analysis.analyze("logs")
    run = analysis.analyze("runs/cpu-a")
    session = analysis.analyze(fx.write_synthetic_session(notebook_folder / "session", workers=2).logdir)
    for frame, table in (
        ("steps", run.steps),
        ("devices", trace.devices),
        ("workers", session.workers),
        ("ops", trace.ops),
        ("input_stages", trace.input_stages),
        ("epochs", run.epochs),
    ):
        missing = set(_listed(frame)) - set(table.columns)
        assert not missing, f"docs/python-api.md lists {frame} columns that are not there: {missing}"
    fields = re.findall(
        r"^\| `(\w+)`(?:, `(\w+)`)? \|", DOC.read_text().split("### `Analysis`")[1].split("Methods")[0], re.MULTILINE
    )
    for names in fields:
        for name in filter(None, names):
            assert hasattr(trace, name), f"Analysis has no {name}"
