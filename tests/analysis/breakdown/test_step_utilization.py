"""Utilization per step: each step gets the samplers' time-weighted means over its own span,
checked against samples whose values and times the test chose."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis import analyze
from analysis.breakdown.utilization import window_means
from analysis.read.run_files import STEPS_COLUMNS

T0 = 1_700_000_000.0


def test_a_window_mean_weighs_each_sample_by_the_time_it_held():
    # Sample i holds its value over (t[i-1], t[i]]: 10 over (0, 1], 30 over (1, 2], 50 over (2, 4].
    frame = pd.DataFrame({"time_s": [0.0, 1.0, 2.0, 4.0], "cpu_pct": [99.0, 10.0, 30.0, 50.0]})
    means = window_means(frame, "cpu_pct", np.array([0.0, 0.5, 1.5, 3.0, 5.0]), np.array([2.0, 1.5, 3.0, 3.5, 6.0]))
    assert means[0] == pytest.approx(20.0)  # half 10, half 30
    assert means[1] == pytest.approx(20.0)  # 0.5 s of 10, 0.5 s of 30
    assert means[2] == pytest.approx((0.5 * 30 + 1.0 * 50) / 1.5)
    assert means[3] == pytest.approx(50.0)  # shorter than the sample: the sample around it
    assert np.isnan(means[4])  # after the last sample: unknown, not 0


def _run(tmp_path, steps=6, step_s=1.0, period_s=0.25):
    run = tmp_path / "run"
    (run / "utilization").mkdir(parents=True)
    rows = [[1, k, 1, T0 + k * step_s, 1.0, step_s * 1000 - 2.0, 1.0, step_s * 1000, 32] for k in range(steps)]
    pd.DataFrame(rows, columns=STEPS_COLUMNS).to_csv(run / "steps.csv", index=False)
    times = np.arange(T0 - period_s, T0 + steps * step_s + period_s, period_s)
    # CPU % is 10 * (the step the sample falls in + 1): every step has its own known level.
    step_of = np.clip(np.floor((times - T0 - 1e-9) / step_s), -1, 9)  # levels stay within 0-100 %
    pd.DataFrame(
        {"time_s": times, "cpu_pct": 10.0 * (step_of + 1), "proc_cpu_pct": 150.0, "mem_used_bytes": 2e9}
    ).to_csv(run / "utilization" / "host.csv", index=False)
    gpu = pd.DataFrame({"time_s": times, "gpu_util_pct": 5.0 * (step_of + 1), "mem_used_bytes": 3e9})
    gpu.to_csv(run / "utilization" / "gpu0.csv", index=False)
    seconds = steps * step_s + 0.5
    (run / "run.json").write_text(
        json.dumps(
            {
                "status": "complete",
                "device": {"kind": "gpu"},
                "epochs": [{"epoch": 1, "seconds": seconds, "train_seconds": steps * step_s, "images": 32 * steps}],
            }
        )
    )
    return run


def test_each_step_gets_the_samples_that_fall_in_it(tmp_path):
    result = analyze(_run(tmp_path))
    steps = result.steps
    assert steps["cpu_pct"].tolist() == pytest.approx([10.0 * (k + 1) for k in range(6)])
    assert steps["gpu_util_pct"].tolist() == pytest.approx([5.0 * (k + 1) for k in range(6)])
    assert steps["proc_cpu_pct"].tolist() == pytest.approx([150.0] * 6)  # 100 = one core
    assert steps["gpu_mem_used_bytes"].tolist() == pytest.approx([3e9] * 6)
    assert steps["mem_used_bytes"].tolist() == pytest.approx([2e9] * 6)
    document = result.to_json()
    assert document["steps"][2]["cpu_pct"] == pytest.approx(30.0)
    assert any("every 250 ms" in note for note in document["notes"])


def test_steps_shorter_than_the_sampling_period_say_so(tmp_path):
    result = analyze(_run(tmp_path, steps=8, step_s=0.1, period_s=0.5))
    assert any("shorter" in note and "sample around it" in note for note in result.notes), result.notes
    assert result.steps["cpu_pct"].notna().all()
