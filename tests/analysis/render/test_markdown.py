"""The Markdown report: long runs cut like the terminal's, cells that escape `|` and newlines, HTML in
run names shown not run, and no column a CPU trace does not record."""

from __future__ import annotations

import pandas as pd

import analysis
from analysis.render import markdown
from run_fixtures import small_run

# ---------------------------------------------------------------- long runs, HTML in run names, columns a CPU trace does not record


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


def test_markdown_shows_html_in_run_names_instead_of_running_it(tmp_path):
    run = small_run(tmp_path / "b<img src=x onerror=alert(1)>")
    for text in (
        analysis.analyze(run).render("markdown"),
        analysis.compare([str(run), str(small_run(tmp_path / "a<script>"))]).render("markdown"),
    ):
        assert "<img" not in text and "<script" not in text, text
        assert "&lt;img src=x onerror=alert(1)>" in text


def test_markdown_leaves_out_what_a_cpu_trace_does_not_record(tmp_path):
    from marker_traces import marker_trace

    result = analysis.analyze(marker_trace(tmp_path / "t.xplane.pb"))
    assert result.mean["device_step_ms"] != result.mean["device_step_ms"]  # NaN: no device on this CPU trace
    text = result.render("markdown")
    assert "device_step_ms" not in text and "| nan" not in text and "nan |" not in text


# ---------------------------------------------------------------- Markdown tables


def test_markdown_cells_escape_pipes_and_newlines():
    frame = pd.DataFrame({"op": ["a|b", "line1\nline2", "c\\|d"], "ms": [1.0, 2.0, 3.0]})
    lines = markdown.markdown_table(frame).splitlines()
    assert len(lines) == 2 + 3  # header, rule, one line per row
    assert lines[2] == "| a\\|b | 1.0 |"
    assert lines[3] == "| line1<br>line2 | 2.0 |"
    assert lines[4] == "| c\\\\\\|d | 3.0 |"
    for line in lines[2:]:
        assert line.replace("\\\\", "").replace("\\|", "").count("|") == 3, line
