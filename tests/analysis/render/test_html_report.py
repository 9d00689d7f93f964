"""The HTML report: one self-contained page for `analyze` and `compare`.

Fast tests read the HTML as text (no network reference, no script, escaping, charts drawn,
size bounded on long runs, the CLI's -o). Slow tests open it in a real headless Chromium
(tests/support/browser.py): no console error, no request, and the step chart drawn near the top.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import analysis
import trace_fixtures as fx
from analysis.read.run_files import RunRecord
from analysis.render import format_for_path, formats_for, html
from compare_fixtures import make_run
from html_checks import EVIL, _pixels_drawn, assert_self_contained
from profiler import cli


@pytest.fixture(scope="module")
def gpu_trace(tmp_path_factory):
    return fx.write_synthetic_device_trace(
        tmp_path_factory.mktemp("gpu") / "logs" / "plugins" / "profile" / "s" / "host.xplane.pb"
    )


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """A two-worker session: worker 1 waits 6 ms longer for input, worker 0 waits for it in the all-reduce."""
    return fx.write_synthetic_session(tmp_path_factory.mktemp("session"), workers=2)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return make_run(root, "fast", device="Test CPU"), make_run(
        root, "slow", device="Other CPU", input_ms=41.0, epoch_seconds=(3.0, 1.0, 1.0)
    )


# ---------------------------------------------------------------- fast: the page as text


def test_registry_lists_html_for_both_and_by_extension():
    assert "html" in formats_for("analysis") and "html" in formats_for("comparison")
    assert format_for_path("r.html", "analysis") == format_for_path("R.HTM", "comparison") == "html"


def test_gpu_trace_page_is_self_contained_and_escapes_run_text(gpu_trace):
    result = analysis.analyze(gpu_trace.path)
    record = RunRecord(
        Path("run.json"),
        {"config": {"run_name": EVIL, "batch_size": 32}, "device": {"kind": "gpu", "name": f"GPU {EVIL}"}},
    )
    hostile = dataclasses.replace(result, record=record, notes=(*result.notes, f"note {EVIL}"))
    page = html.render_analysis(hostile)
    assert_self_contained(page)
    assert EVIL not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert page.index('id="steps"') < page.index('id="utilization"') < page.index('id="devices"')
    assert "/device:GPU:3" in page and "volta_sgemm_128x64_nn" in page  # the device table and the top ops
    assert "not recorded" in page  # a trace on its own has no samplers
    assert page.count("<title>step ") == gpu_trace.steps  # one hoverable bar per step


def test_every_step_part_is_drawn_in_its_color(gpu_trace):
    page = html.render_analysis(analysis.analyze(gpu_trace.path))
    steps_svg = page[page.index('id="steps"') : page.index('id="utilization"')]
    for color in ("#d62728", "#2ca02c", "#9467bd", "#1f77b4"):  # input, compute, collective, host
        assert f'fill="{color}"' in steps_svg


def test_session_page_names_the_straggler(session):
    page = html.render_analysis(analysis.analyze(session.logdir))
    assert_self_contained(page)
    assert 'class="straggler"' in page and "worker1" in page and "straggler: worker1" in page


def test_long_runs_are_binned_and_stay_small(gpu_trace):
    result = analysis.analyze(gpu_trace.path)
    n = 20_000
    rng = np.random.default_rng(0)
    parts = {f"{p}_ms": rng.uniform(0, 5, n) for p in ("input", "compute", "collective", "host")}
    steps = pd.DataFrame({"step": np.arange(n), "steps": 1, **parts, "compile_ms": 0.0, "partial": False})
    steps["step_ms"] = sum(parts.values())
    page = html.render_analysis(dataclasses.replace(result, steps=steps))
    assert len(page) < 600_000
    per_bar = math.ceil(n / html.MAX_BARS)
    assert page.count("<title>steps ") == math.ceil(n / per_bar) <= html.MAX_BARS
    assert f"mean of {per_bar} consecutive steps" in page


def test_per_step_utilization_columns_are_drawn_on_the_step_axis(gpu_trace):
    result = analysis.analyze(gpu_trace.path)
    steps = result.steps.assign(cpu_pct=50.0, proc_cpu_pct=80.0, gpu_util_pct=90.0, mem_used_bytes=2.0 * 2**30)
    page = html.render_analysis(dataclasses.replace(result, steps=steps))
    section = page[page.index('id="utilization"') : page.index('id="advice"')]
    assert "Per step" in section and "<polyline" in section and "GPU utilization %" in section


def test_samplers_are_drawn_per_step_and_over_the_run(tmp_path):
    run = make_run(tmp_path, "sampled")
    (run / "utilization").mkdir()
    times = 1_700_000_000.0 + np.arange(0, 3.0, 0.1)
    pd.DataFrame(
        {
            "time_s": times,
            "cpu_pct": 60.0,
            "cpu0_pct": 50.0,
            "cpu1_pct": 70.0,
            "proc_cpu_pct": 90.0,
            "proc_rss_bytes": 2**30,
            "mem_used_bytes": 4 * 2**30,
        }
    ).to_csv(run / "utilization" / "host.csv", index=False)
    result = analysis.analyze(run)
    page = html.render_analysis(result)
    section = page[page.index('id="utilization"') : page.index('id="advice"')]
    assert "machine CPU %" in section and "training process memory" in section and "epoch 1" in section
    assert "GPU: not recorded" in section
    if "cpu_pct" in result.steps:  # the steps' own utilization, and the whole run below it
        assert "Per step" in section and "Over the whole run" in section


def test_compare_page(two_runs):
    comparison = analysis.compare([*two_runs])
    page = html.render_comparison(comparison)
    assert_self_contained(page)
    for run in ("fast", "slow"):
        assert f"<title>{run}" in page  # one bar per run
    assert all(why.split(":")[0] in page for why in comparison.table["why"])


# Default run names (profiler/record/rundir.py): a date stamp, then the device and host. Runs started in the same
# second get -2, -3; what tells these four apart is the time or the number at the end.
STAMPED = {
    "20250101-093015-gpu-gpu-1060-workstation": ("093015",),
    "20250101-093015-gpu-gpu-1060-workstation-2": ("093015", "-2"),
    "20250101-093015-gpu-gpu-1060-workstation-3": ("093015", "-3"),
    "20250101-154500-gpu-gpu-1060-workstation": ("154500",),
}


@pytest.fixture
def stamped_runs(tmp_path):
    return [
        make_run(
            tmp_path / "runs",
            name,
            kind="gpu",
            device="NVIDIA GeForce GTX 1060",
            input_ms=1.0 + 5 * i,
            epoch_seconds=(2.0, 0.6 + 0.1 * i),
        )
        for i, name in enumerate(STAMPED)
    ]


def _bar_labels(page: str) -> dict[str, str]:
    """The compare chart's run name (its tooltip's start) -> the label drawn beside its bar."""
    import html as html_lib

    chart = page[page.index('id="chart"') : page.index('id="runs"')]
    rows = re.findall(r"<g><title>([^<]*)</title><text[^>]*>([^<]*)</text>", chart)
    return {
        html_lib.unescape(title).split(" (")[0].removesuffix(" *"): html_lib.unescape(label) for title, label in rows
    }


def test_compare_chart_labels_keep_what_tells_default_run_names_apart(stamped_runs):
    """The names share their first 30 characters: cut at their end they read the same. The labels lose the
    shared start instead, stay unique, keep each run's time and number, and the tooltip has the whole name."""
    page = html.render_comparison(analysis.compare(stamped_runs))
    labels = _bar_labels(page)
    assert sorted(labels) == sorted(STAMPED), labels
    assert len(set(labels.values())) == len(labels), f"two runs have the same label: {labels}"
    for name, parts in STAMPED.items():
        label = labels[name].removesuffix(" *")
        assert len(label) <= 32 and all(part in label for part in parts), (name, label)
        assert label.endswith(parts[-1]) or len(parts) == 1, (name, label)
    from analysis.render.html_charts import text_width  # the label column is as wide as its longest label

    chart = page[page.index('id="chart"') : page.index('id="runs"')]
    for x, label in re.findall(r'<text class="label" x="([\d.]+)"[^>]*text-anchor="end"[^>]*>([^<]*)</text>', chart):
        assert float(x) - text_width(label) >= 0, f"{label!r} would start left of the chart"


def test_cli_output_file_takes_its_format_from_the_extension(gpu_trace, tmp_path, capsys):
    report = tmp_path / "out" / "report.html"
    assert cli.main(["analyze", str(gpu_trace.path), "-o", str(report)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and f"wrote {report}" in captured.err
    assert_self_contained(report.read_text())
    assert [p.name for p in report.parent.iterdir()] == ["report.html"]  # no temporary file left
    markdown = tmp_path / "report.md"
    assert cli.main(["analyze", str(gpu_trace.path), "-o", str(markdown)]) == 0
    assert markdown.read_text().startswith("# devprof analysis")
    forced = tmp_path / "report.txt"
    assert cli.main(["analyze", str(gpu_trace.path), "--format", "html", "-o", str(forced)]) == 0
    assert forced.read_text().startswith("<!DOCTYPE html>")


def test_cli_output_file_in_a_missing_folder_it_cannot_make(gpu_trace, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli.main(["analyze", str(gpu_trace.path), "-o", str(blocker / "report.html")]) == 1
    assert capsys.readouterr().err.startswith("error: cannot write")


def test_compare_cli_writes_html(two_runs, tmp_path, capsys):
    out = tmp_path / "compare.html"
    assert cli.main(["compare", *map(str, two_runs), "-o", str(out)]) == 0
    assert_self_contained(out.read_text())


def test_to_html_and_the_run_folder_report(two_runs, tmp_path):
    result = analysis.analyze(two_runs[0])
    path = result.to_html(tmp_path / "a.html")
    assert path == tmp_path / "a.html" and sorted(p.name for p in tmp_path.iterdir()) == ["a.html"]
    assert_self_contained(path.read_text())
    written = result.write(tmp_path / "analysis")
    assert tmp_path / "analysis" / "report.html" in written
    comparison = analysis.compare([*two_runs])
    assert_self_contained(comparison.to_html(tmp_path / "c.html").read_text())


# ---------------------------------------------------------------- slow: a real browser


def _open(path, chart="#steps svg"):
    import browser

    loaded = browser.load(path, boxes=(chart,))
    assert loaded.errors == [], loaded.errors
    assert loaded.requests == [], f"the page asked the network for {loaded.requests}"
    box = loaded.boxes[chart]
    assert box is not None, f"no {chart} in the page"
    return loaded, box


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """A real two-epoch CPU run (TensorFlow, profiler window, samplers), made once."""
    out = tmp_path_factory.mktemp("cpu-run")
    argv = [
        "run",
        "--device",
        "cpu",
        "--data",
        "synthetic",
        "--epochs",
        "2",
        "--limit-images",
        "600",
        "--limit-test-images",
        "100",
        "--sample-interval",
        "0.2",
        "--out",
        str(out),
        "--run-name",
        "cpu",
        "--quiet",
    ]
    assert cli.main(argv) == 0
    return out / "cpu"


@pytest.mark.slow
def test_cpu_run_report_loads_in_chromium_with_its_charts_drawn(cpu_run, tmp_path):
    assert cli.main(["analyze", str(cpu_run)]) == 0
    report = cpu_run / "analysis" / "report.html"
    loaded, box = _open(report)
    assert box["y"] < 500, f"the step chart starts {box['y']:.0f} px down the page"
    assert _pixels_drawn(loaded.screenshot, box) > 0.05
    page = report.read_text()
    assert "Utilization and memory" in page and "machine CPU %" in page and 'id="epochs"' in page
    import browser

    util = browser.load(report, boxes=("#utilization svg",))
    assert _pixels_drawn(util.screenshot, util.boxes["#utilization svg"]) > 0.01


@pytest.mark.slow
def test_two_worker_report_loads_in_chromium(session, tmp_path):
    path = analysis.analyze(session.logdir).to_html(tmp_path / "workers.html")
    loaded, box = _open(path)
    assert box["y"] < 500 and _pixels_drawn(loaded.screenshot, box) > 0.05


@pytest.mark.slow
def test_gpu_trace_report_loads_in_chromium(gpu_trace, tmp_path):
    path = analysis.analyze(gpu_trace.path).to_html(tmp_path / "gpu.html")
    loaded, box = _open(path)
    assert box["y"] < 500 and _pixels_drawn(loaded.screenshot, box) > 0.05


@pytest.mark.slow
def test_compare_report_loads_in_chromium(two_runs, tmp_path):
    path = analysis.compare([*two_runs]).to_html(tmp_path / "compare.html")
    loaded, box = _open(path, "#chart svg")
    assert box["y"] < 400 and _pixels_drawn(loaded.screenshot, box) > 0.02


@pytest.mark.slow
def test_a_wide_compare_table_is_not_cut_at_1400_px(tmp_path):
    """Five runs with every column (samplers, memory, FLOP/s, MFU): the table uses the window's width
    beyond the text column instead of scrolling inside it with the page's sides empty."""
    import browser

    summaries = {
        "host": {"metrics": {"cpu_pct": {"mean": 40.0, "p95": 90.0}, "proc_rss_bytes": {"max": 1e9}}},
        "gpu0": {"metrics": {"gpu_util_pct": {"mean": 30.0, "p95": 70.0}, "tf_mem_peak_bytes": {"max": 2e9}}},
    }
    runs = [
        make_run(
            tmp_path,
            f"20250101-120000-gpu-{name}-workstation",
            kind="gpu",
            device=f"NVIDIA {name} PCIe",
            input_ms=1.0 + 5 * i,
            epoch_seconds=(2.0, 0.6 + 0.1 * i),
            summaries=summaries,
            flops_per_image=1e9,
            peak={"matmul_flops_per_second": {"float32": 8e12}},
        )
        for i, name in enumerate(("GTX-1060", "GTX-1080-Ti", "MX150", "RTX-3090", "A100-SXM4-80GB"))
    ]
    path = analysis.compare(runs).to_html(tmp_path / "compare.html")
    box = (
        "(() => { const s = document.querySelector('#runs .scroll'); const r = s.getBoundingClientRect(); "
        "return [s.scrollWidth, s.clientWidth, r.right, innerWidth]; })()"
    )
    loaded = browser.load(path, width=1400, evaluate=(box,))
    assert loaded.errors == [], loaded.errors
    scroll_width, client_width, right, window = loaded.values[box]
    assert scroll_width <= client_width, f"the table is cut: {scroll_width} px wide in a box of {client_width} px"
    assert right <= window


LABEL_BOXES = """(() => {
  const out = [];
  for (const svg of document.querySelectorAll('#chart svg')) {
    const s = svg.getBoundingClientRect();
    const bars = Math.min(...[...svg.querySelectorAll('rect')].map(r => r.getBoundingClientRect().left));
    for (const text of svg.querySelectorAll('g > text:first-of-type')) {
      const r = text.getBoundingClientRect();
      out.push({label: text.textContent, left: r.left - s.left, right: s.right - r.right,
                gap: bars - r.right, top: r.top - s.top, bottom: s.bottom - r.bottom});
    }
  }
  return out;
})()"""


@pytest.mark.slow
def test_compare_chart_labels_lie_inside_the_chart_in_chromium(stamped_runs, tmp_path):
    """Each run's label, as the browser lays it out, lies within its SVG and ends before the bars begin."""
    import browser

    path = analysis.compare(stamped_runs).to_html(tmp_path / "compare.html")
    loaded = browser.load(path, width=1000, evaluate=(LABEL_BOXES,))
    assert loaded.errors == [], loaded.errors
    boxes = loaded.values[LABEL_BOXES]
    assert len(boxes) == len(STAMPED), boxes
    outside = [b for b in boxes if min(b["left"], b["right"], b["top"], b["bottom"]) < 0 or b["gap"] < 0]
    assert not outside, f"labels past the chart's edge or over the bars: {outside}"


def _fake_browser(tmp_path: Path, body: str) -> str:
    script = tmp_path / "chromium"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.slow
def test_a_browser_that_dies_at_start_is_started_once_more_then_the_failure_says_what_it_printed(tmp_path, monkeypatch):
    import browser

    real = browser.chromium_binary()
    # dies the first time (as Chromium did beside two CPU hogs), then starts: the page still loads
    once = _fake_browser(
        tmp_path,
        f"if [ ! -e {tmp_path}/died ]; then touch {tmp_path}/died; "
        f'echo "crashpad: unrecognized option" >&2; exit 1; fi; exec {real} "$@"',
    )
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
