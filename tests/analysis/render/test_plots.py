"""Plots: written as valid PNGs at a handful and at thousands of steps, epochs and samples, with a
number of drawn artists that does not grow with the run's length."""

from __future__ import annotations

import struct

import numpy as np
import pandas as pd
import pytest

from analysis.render import plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
    """(width, height) of a PNG, after checking that the file is one and decodes."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    import matplotlib.image

    pixels = matplotlib.image.imread(path)  # decodes every chunk: a truncated file fails here
    assert pixels.shape[:2] == (height, width)
    return width, height


@pytest.fixture
def drawn(monkeypatch):
    """Records, per saved figure, its axes' artists (patches, collections, lines), the points of each line
    and the most vertices one artist has."""
    figures = []
    original = plots.save

    def save(fig, path):
        ax = fig.axes[0]
        figures.append(
            {
                "patches": len(ax.patches),
                "collections": len(ax.collections),
                "lines": len(ax.lines),
                "line_points": [len(line.get_xdata()) for line in ax.lines],
                "vertices": max(
                    [len(patch.get_path().vertices) for patch in ax.patches]
                    + [sum(len(p.vertices) for p in c.get_paths()) for c in ax.collections],
                    default=0,
                ),
                "title": ax.get_title(),
                "labels": [text.get_text() for text in ax.get_legend().get_texts()] if ax.get_legend() else [],
                "ylim": ax.get_ylim(),
            }
        )
        return original(fig, path)

    monkeypatch.setattr(plots, "save", save)
    return figures


def step_frame(n: int, first_step: int = 10, collective: bool = False) -> pd.DataFrame:
    rng = np.random.default_rng(n)
    steps = pd.DataFrame(
        {
            "step": np.arange(first_step, first_step + n),
            "input_ms": rng.random(n) * 5,
            "compute_ms": 30 + rng.random(n) * 5,
            "collective_ms": rng.random(n) * 2 if collective else 0.0,
            "host_ms": rng.random(n) * 3,
            "compile_ms": 0.0,
        }
    )
    steps.loc[0, "compile_ms"] = 100.0
    steps.loc[0, "host_ms"] += 100.0
    steps["step_ms"] = steps[["input_ms", "compute_ms", "collective_ms", "host_ms"]].sum(axis=1)
    return steps


def epoch_frame(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(n)
    return pd.DataFrame(
        {
            "epoch": np.arange(1, n + 1),
            "input_s": rng.random(n),
            "call_s": 10 + rng.random(n),
            "other_host_s": rng.random(n),
            "epoch_level_s": 2 + rng.random(n),
        }
    )


def host_samples(rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(rows)
    return pd.DataFrame(
        {
            "time_s": 1.7e9 + 0.1 * np.arange(rows),
            "cpu_pct": rng.random(rows) * 100,
            "cpu0_pct": rng.random(rows) * 100,
            "cpu1_pct": rng.random(rows) * 100,
            "proc_cpu_pct": rng.random(rows) * 200,
        }
    )


def test_step_breakdown_small_keeps_one_bar_per_step(tmp_path, drawn):
    path = plots.plot_step_breakdown(step_frame(5), tmp_path / "step_breakdown.png")
    assert path == tmp_path / "step_breakdown.png"
    png_size(path)
    (figure,) = drawn
    assert figure["patches"] == 5 * 3 + 5  # input, compute, host bars, and the compile outlines
    assert figure["labels"] == ["input (ms)", "compute (ms)", "host (ms)", "compile (ms)"]
    assert figure["title"] == "Step time breakdown"


def test_step_breakdown_at_thousands_of_steps_draws_a_bounded_number_of_artists(tmp_path, drawn):
    sizes = {}
    for n in (200, 3000, 20000):
        path = plots.plot_step_breakdown(step_frame(n), tmp_path / f"steps_{n}.png")
        sizes[n] = png_size(path)
    small, large, huge = drawn
    for figure in (small, large, huge):
        assert figure["collections"] == 4  # input, compute, host areas and the compile hatch
        assert figure["lines"] == 0
    assert small["patches"] == 0
    assert large["patches"] == huge["patches"] == 1  # the slowest step of each point, once points average steps
    assert large["vertices"] <= huge["vertices"] <= 4 * plots.MAX_POINTS + 8  # one polygon of flat steps each
    assert sizes[200] == sizes[3000] == sizes[20000]  # the figure no longer widens with the steps
    assert sizes[3000][0] <= 1600
    assert "3,000 steps, each point the mean of 3" in large["title"]
    assert "slowest step of the point (ms)" in large["labels"]
    assert large["ylim"][0] == 0 and large["ylim"][1] >= 100  # the compile step's spike stays in view


def test_step_breakdown_shows_collective_wait_when_there_is_some(tmp_path, drawn):
    plots.plot_step_breakdown(step_frame(5, collective=True), tmp_path / "small.png")
    plots.plot_step_breakdown(step_frame(500, collective=True), tmp_path / "large.png")
    small, large = drawn
    assert "collective (ms)" in small["labels"] and "collective (ms)" in large["labels"]
    assert small["patches"] == 5 * 4 + 5


def test_step_breakdown_with_steps_out_of_order_uses_positions(tmp_path, drawn):
    steps = step_frame(400)
    steps["step"] = np.tile(np.arange(200), 2)  # two epochs numbered from 0
    png_size(plots.plot_step_breakdown(steps, tmp_path / "steps.png"))
    assert drawn[0]["collections"] == 4


def test_epoch_breakdown_small_and_large(tmp_path, drawn):
    png_size(plots.plot_epoch_breakdown(epoch_frame(3), tmp_path / "epoch_breakdown.png"))
    png_size(plots.plot_epoch_breakdown(epoch_frame(3000), tmp_path / "epochs_3000.png"))
    small, large = drawn
    assert small["patches"] == 3 * 4
    assert large["patches"] == 0 and large["collections"] == 4
    assert large["labels"] == ["input (s)", "call (s)", "other_host (s)", "epoch_level (s)"]


def test_utilization_with_tens_of_thousands_of_rows_draws_at_most_max_line_points(tmp_path, drawn):
    for rows, epochs in ((100, 2), (50_000, 3), (50_000, 500)):
        host = host_samples(rows)
        starts = list(host["time_s"].iloc[:: rows // epochs][:epochs])
        png_size(plots.plot_utilization({"host": host}, starts, tmp_path / f"utilization_{rows}_{epochs}.png"))
    few, many_rows, many_epochs = drawn
    assert few["line_points"] == [100, 100]  # cpu_pct and the training process's share, every sample
    assert many_rows["lines"] == 2 and max(many_rows["line_points"]) <= plots.MAX_LINE_POINTS
    assert few["collections"] == many_rows["collections"] == many_epochs["collections"] == 1  # epoch starts
    assert many_epochs["title"].startswith("Utilization (ticks at the bottom: 500 epoch starts")


def test_min_max_points_keeps_each_bins_extremes_in_time_order_and_gaps():
    x = np.arange(10_000, dtype=float)
    y = np.sin(x / 50.0)
    y[5000:5100] = np.nan
    y[1234] = 7.0
    xs, ys = plots.min_max_points(x, y, max_points=1000)
    assert len(xs) <= 1000
    assert np.all(np.diff(xs) >= 0)
    assert np.nanmax(ys) == 7.0 and np.nanmin(ys) == np.nanmin(y)
    assert np.isnan(ys).any()  # the missing run is still a gap
    assert np.array_equal(ys[~np.isnan(ys)], y[xs[~np.isnan(ys)].astype(int)])  # real samples, not averages
    short_x, short_y = plots.min_max_points(x[:50], y[:50], max_points=1000)
    assert np.array_equal(short_x, x[:50]) and np.array_equal(short_y, y[:50], equal_nan=True)
