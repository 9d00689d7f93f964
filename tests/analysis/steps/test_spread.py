"""The spread of the steady steps: median, p90 and each step over 1.5x the median with its cause."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pandas as pd
import pytest

import analysis
import trace_fixtures as fx
from analysis.breakdown.devices import device_table
from analysis.breakdown.input_parts import split_input
from analysis.breakdown.spread import outliers, spread
from analysis.read.inputs import read_inputs
from analysis.read.run_files import STEPS_COLUMNS
from analysis.render import html, markdown, text
from analysis.steps.host import choose_steps
from analysis.steps.sources import find_steps

# 20 steps of 7.7 ms (input 1.0 + compute 6.0 + host 0.7); step 12 computes 7.1 ms more, step 5 waits
# 7.0 ms more for its batch, step 17 stalls 6.0 ms on the host.
SLOW = {12: ("compute_ms", 7.1), 5: ("input_ms", 7.0), 17: ("host_ms", 6.0)}
BASE = {"input_ms": 1.0, "compute_ms": 6.0, "collective_ms": 0.0, "host_ms": 0.7}


def steps_table(n: int = 20, slow: dict = SLOW) -> pd.DataFrame:
    rows = []
    for i in range(n):
        row = {"step": i, **BASE}
        if i in slow:
            row[slow[i][0]] += slow[i][1]
        rows.append(row)
    frame = pd.DataFrame(rows, columns=["step", *BASE])
    frame["step_ms"] = frame[list(BASE)].sum(axis=1)
    return frame


def test_median_p90_and_each_slow_step_with_its_cause():
    result = spread(steps_table())
    assert result is not None
    assert result["median_ms"] == pytest.approx(7.7)
    # p90 of 20 steps: 0.1 of the way from the 18th smallest (13.7 ms) to the 19th (14.7 ms)
    assert result["p90_ms"] == pytest.approx(13.8)
    slow = result["outliers"]
    assert [o["step"] for o in slow] == [12, 5, 17]  # slowest first
    assert [o["cause"] for o in slow] == ["device", "input", "host"]
    assert [o["excess_ms"] for o in slow] == pytest.approx([7.1, 7.0, 6.0])
    assert [o["step_ms"] for o in slow] == pytest.approx([14.8, 14.7, 13.7])
    assert set(slow[0]) == {"step", "step_ms", "cause", "excess_ms"}


def test_a_collective_wait_is_named_and_a_step_at_the_cut_is_not_an_outlier():
    steps = steps_table(slow={3: ("collective_ms", 5.0), 8: ("host_ms", 3.85)})  # 7.7 + 3.85 = 1.5 x 7.7
    result = spread(steps)
    assert result is not None
    assert [(o["step"], o["cause"]) for o in result["outliers"]] == [(3, "collective")]
    assert result["outliers"][0]["excess_ms"] == pytest.approx(5.0)


def test_no_spread_below_two_steps_and_no_outlier_over_a_zero_median():
    assert spread(steps_table(n=1, slow={})) is None
    assert spread(steps_table(n=0, slow={})) is None
    two = spread(steps_table(n=2, slow={1: ("host_ms", 5.0)}))
    assert two is not None
    assert two["median_ms"] == pytest.approx((7.7 + 12.7) / 2) and two["outliers"] == []
    idle = pd.DataFrame({"step": range(5), "step_ms": [0.0, 0.0, 0.0, 1.0, 2.0], **{k: 0.0 for k in BASE}})
    idle_spread = spread(idle)
    assert idle_spread is not None
    assert idle_spread["outliers"] == []


def test_device_work_from_the_devices_own_steps_wins_over_the_host_window():
    steps = steps_table(slow={12: ("host_ms", 7.1)})  # the host window puts the time in host
    device = pd.Series(6.0, index=steps.index)
    device[12] = 13.5  # the device's own step 12 computed 7.5 ms more
    result = spread(steps, device)
    assert result is not None
    (slow,) = result["outliers"]
    assert (slow["step"], slow["cause"]) == (12, "device") and slow["excess_ms"] == pytest.approx(7.5)
    partly = device.copy()
    partly[3] = np.nan  # not every step has its device work: the steps' own compute for all
    assert outliers(steps, partly)["cause"].tolist() == ["host"]


def test_device_table_gives_each_steps_work_from_the_devices_own_steps(tmp_path):
    made = fx.write_synthetic_device_trace(tmp_path / "logs" / "plugins" / "profile" / "s" / "host.xplane.pb")
    inputs = read_inputs(made.path)
    source = split_input(inputs.trace, find_steps(inputs, None))
    table = device_table(inputs.trace, source.steps, choose_steps(source.steps).used, source.step_name)
    slowest_device = max(d["compute_ms"] for d in made.devices.values())  # the step waits for it
    assert table.work is not None
    assert table.work.index.equals(source.steps.index)
    assert table.work.to_numpy() == pytest.approx([slowest_device] * made.steps)


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory):
    """A run directory whose steps.csv holds `SLOW`'s three slow steps among 20."""
    path = tmp_path_factory.mktemp("spread") / "run"
    path.mkdir()
    rows = []
    for row in steps_table().to_dict(orient="records"):
        rows.append(
            {
                "epoch": 1,
                "step": row["step"],
                "steps": 1,
                "start_time_s": 1.7e9 + row["step"] / 10,
                "input_ms": row["input_ms"],
                "call_ms": row["compute_ms"],
                "other_host_ms": row["host_ms"],
                "step_ms": row["step_ms"],
                "images": 100,
            }
        )
    pd.DataFrame(rows, columns=STEPS_COLUMNS).to_csv(path / "steps.csv", index=False)
    (path / "run.json").write_text(
        json.dumps(
            {
                "status": "complete",
                "config": {"batch_size": 100},
                "device": {"kind": "gpu", "name": "Test GPU"},
                "epochs": [
                    {"epoch": 1, "seconds": 1.0, "train_seconds": 0.9, "images": 2000, "images_per_second": 2222.0}
                ],
            }
        )
    )
    return analysis.analyze(path)


LINE = (
    "spread over 20 steps: median 7.70 ms, p90 13.8 ms; 3 steps over 1.5x the median: step 12 14.8 ms "
    "(device +7.1 ms), step 5 14.7 ms (input +7.0 ms), step 17 13.7 ms (host +6.0 ms)"
)


def test_the_analysis_json_text_and_markdown_carry_the_spread(slow_run):
    assert slow_run.spread is not None and slow_run.spread["median_ms"] == pytest.approx(7.7)
    document = json.loads(slow_run.render("json"))
    assert set(document["spread"]) >= {"median_ms", "p90_ms", "outliers"}
    assert [(o["step"], o["cause"]) for o in document["spread"]["outliers"]] == [
        (12, "device"),
        (5, "input"),
        (17, "host"),
    ]
    lines = text.render_analysis(slow_run).splitlines()
    mean = next(i for i, line in enumerate(lines) if line.startswith("mean over 20 steps"))
    assert lines[mean + 1] == LINE
    assert LINE[0].upper() + LINE[1:] + "." in markdown.render_analysis(slow_run)


def test_no_spread_is_null_in_json_and_no_line_in_text(slow_run):
    without = dataclasses.replace(slow_run, spread=None)
    assert json.loads(without.render("json"))["spread"] is None
    assert "spread over" not in text.render_analysis(without) and "pread over" not in markdown.render_analysis(without)


def test_a_long_list_of_slow_steps_is_cut_in_text(slow_run):
    steps = steps_table(n=100, slow={i: ("host_ms", 10.0 + i / 10) for i in range(25)})
    line = " ".join(text.render_analysis(dataclasses.replace(slow_run, spread=spread(steps), steps_used=100)).split())
    assert "25 steps over 1.5x the median: step 24 " in line and ", and 15 more in the JSON" in line
    assert "step 15 " in line and "step 14 " not in line  # the ten slowest are named


def test_the_html_step_chart_marks_the_slow_steps_and_the_median(slow_run):
    page = html.render_analysis(slow_run)
    chart = page[page.index('id="steps"') : page.index('id="utilization"')]
    marks = re.findall(r'<g class="outlier"><title>([^<]*)</title>', chart)
    assert len(marks) == 3
    assert any("step 12: 14.8 ms (1.9x the median), device work +7.1 ms" in m for m in marks)
    assert any("step 17: 13.7 ms (1.8x the median), host overhead +6.0 ms" in m for m in marks)
    assert any("step 5:" in m and "input wait +7.0 ms" in m for m in marks)
    assert chart.count('class="median"') == 1 and "median 7.7 ms" in chart
    assert "over 1.5x the median" in chart and LINE in chart  # the legend and the caption


def test_binned_steps_mark_the_bar_that_holds_a_slow_step(slow_run):
    steps = steps_table(n=2000, slow={700: ("compute_ms", 20.0), 1999: ("input_ms", 30.0)})
    steps = steps.assign(steps=1, compile_ms=0.0, partial=False)
    page = html.render_analysis(dataclasses.replace(slow_run, steps=steps, spread=spread(steps), steps_used=2000))
    chart = page[page.index('id="steps"') : page.index('id="utilization"')]
    marks = re.findall(r'<g class="outlier"><title>([^<]*)</title>', chart)
    assert len(marks) == 2 and "step 700:" in marks[0] and "step 1999:" in marks[1]
    bars = re.findall(r'<title>steps? [^<]*</title><rect x="([\d.]+)"', chart)
    outlined = re.findall(r'<g class="outlier"><title>[^<]*</title><rect x="([\d.]+)"', chart)
    per_bar = int(np.ceil(2000 / html.MAX_BARS))
    assert outlined == [bars[700 // per_bar], bars[-1]]
