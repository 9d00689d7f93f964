"""Pure parts of the analysis: interval arithmetic, verdict cut-offs, epoch sums (of millisecond steps
too), fake GPU."""

import numpy as np
import pandas as pd
import pytest

import trace_fixtures as fx
from analysis import analyze
from analysis import intervals as iv
from analysis.breakdown.epochs import epoch_breakdown
from analysis.rules.table import classify, make_verdict
from views import facts_from_mean


def test_union_subtract_overlap():
    merged = iv.union([0, 5, 3, 20], [4, 10, 6, 25])
    assert [a.tolist() for a in merged] == [[0, 20], [10, 25]]
    diff = iv.subtract(merged, iv.union([2, 8], [4, 21]))
    assert [a.tolist() for a in diff] == [[0, 4, 21], [2, 8, 25]]
    assert iv.overlap(merged, [0, 4, 9, 30], [30, 6, 22, 40]).tolist() == [15, 2, 3, 0]
    assert iv.total(iv.intersect(merged, iv.union([5], [22]))) == 7


@pytest.mark.parametrize(
    "input_pct, host_pct, expected",
    # The part with the largest share holds the step (compute is what input and host leave), whatever
    # its fix would save; it holds it "high" from half the step. A tie goes to compute.
    [
        (20.0, 0.0, ("compute", "high")),
        (19.9, 50.0, ("host", "high")),
        (55.0, 10.0, ("input", "high")),
        (40.0, 35.0, ("input", "moderate")),
        (4.9, 4.0, ("compute", "high")),
        (30.0, 40.0, ("host", "moderate")),
        (50.0, 0.0, ("compute", "high")),
    ],
)
def test_verdict_cutoffs(input_pct, host_pct, expected):
    assert classify(facts_from_mean({"input_pct": input_pct, "host_pct": host_pct})) == expected


def test_verdict_evidence_has_numbers():
    mean = {
        "step_ms": 20.0,
        "input_ms": 2.0,
        "compute_ms": 14.0,
        "host_ms": 4.0,
        "input_pct": 10.0,
        "compute_pct": 70.0,
        "host_pct": 20.0,
    }
    verdict = make_verdict(mean, facts_from_mean(mean), steps_used=5, utilization={"mean host cpu": 42.0})
    # Compute holds the step; several steps per call is the largest fix, and the headline says both.
    assert verdict["bound"] == "compute" and verdict["level"] == "high" and verdict["bound_pct"] == 70.0
    assert verdict["first_fix"]["rule"] == "host_bound" and verdict["cause"] == "host_bound"
    assert "The largest fix we can estimate is running several steps per call" in verdict["evidence"]
    assert "10.0 %" in verdict["evidence"] and "5 steps" in verdict["evidence"] and "42 %" in verdict["evidence"]
    assert verdict["xprof_reading"] is None  # no XProf reading reproduced from a mean alone
    assert verdict["saving_pct"] > 10.0 and verdict["saving_ms"] == pytest.approx(verdict["saving_pct"] / 5.0)
    assert verdict["saving_ms"] == verdict["first_fix"]["saving_ms"]
    # On a 10 ms step the same shares are 2 ms of host against 1 ms of input: within 1 ms, a tie, and the
    # surer fix (the input's wait) goes first; the headline says it is not the largest.
    short = {key: value / 2 if key.endswith("_ms") else value for key, value in mean.items()}
    tied = make_verdict(short, facts_from_mean(short), steps_used=5)
    assert tied["first_fix"]["rule"] == "input_wait" and [f["rule"] for f in tied["fixes"]][:2] == [
        "input_wait",
        "host_bound",
    ]
    assert "The fix to make first is hiding the wait for the input pipeline: 1.00 ms" in tied["evidence"], tied[
        "evidence"
    ]
    assert "within noise of the largest (running several steps per call" in tied["evidence"]


def test_epoch_breakdown_adds_up():
    steps = pd.DataFrame(
        {
            "epoch": [1, 1, 2],
            "step": [0, 1, 2],
            "steps": [1, 1, 1],
            "start_time_s": [0, 1, 2],
            "input_ms": [100.0, 100.0, 50.0],
            "call_ms": [300.0, 300.0, 300.0],
            "other_host_ms": [0.0, 0.0, 10.0],
            "step_ms": [400.0, 400.0, 360.0],
            "images": [8, 8, 8],
        }
    )
    epochs = pd.DataFrame({"epoch": [1, 2], "seconds": [1.0, 0.5]})
    result = epoch_breakdown(steps, epochs).set_index("epoch")
    assert result.loc[1, "epoch_level_s"] == pytest.approx(0.2)
    assert result.loc[2, "epoch_level_s"] == pytest.approx(0.14)
    assert result.loc[1, "input_pct"] == pytest.approx(20.0)
    parts = result[["input_pct", "call_pct", "other_host_pct", "epoch_level_pct"]].sum(axis=1)
    np.testing.assert_allclose(parts, 100.0)


@pytest.mark.slow
def test_fake_gpu_plane_makes_device_compute_and_input_copies(tmp_path):
    source = fx.find_xplane(fx.trace_logdir("clean"))
    fake = fx.write_with_fake_gpu(source, tmp_path / "gpu.xplane.pb", copy_ms=0.4, kernel_ms=1.0)
    cpu = analyze(source).steps
    gpu_analysis = analyze(fake)
    gpu = gpu_analysis.steps
    assert gpu_analysis.device == "gpu"
    np.testing.assert_allclose(gpu["compute_ms"], 1.0, atol=1e-3)
    np.testing.assert_allclose(gpu["input_ms"] - cpu["input_ms"], 0.4, atol=0.05)
    np.testing.assert_allclose(gpu["step_ms"], cpu["step_ms"])
    assert gpu_analysis.verdict["bound"] in {"input", "host"}


def test_compute_advice_leaves_out_what_the_run_already_does():
    from analysis.rules.advice_compute import LARGER_BATCH_ADVICE, compute_advice

    cpu = compute_advice("cpu", "float32", False)
    assert any("--precision mixed_bfloat16" in a for a in cpu)
    assert not any("--jit-compile" in a for a in cpu)  # XLA is slower than oneDNN on CPUs
    gpu = compute_advice("gpu", "float32", False)
    assert any("--precision mixed_float16" in a for a in gpu) and any("--jit-compile" in a for a in gpu)
    assert compute_advice("gpu", "mixed_float16", True) == [LARGER_BATCH_ADVICE]
    assert compute_advice("cpu", "mixed_bfloat16", False) == [LARGER_BATCH_ADVICE]


def test_json_documents_keep_each_table_row_on_one_line():
    import json

    from analysis.render.json import dumps

    document = {
        "schema_version": 1,
        "notes": ["a", "b"],
        "mean": {"step_ms": 1.5, "input_ms": None},
        "steps": [{"step": i, "step_ms": 10.0 + i, "partial": False} for i in range(3)],
        "devices": [],
        "verdict": {"advice": ["x"], "evidence": "e"},
        "nested": [{"rows": [1]}],
    }
    text = dumps(document)
    assert json.loads(text) == document
    lines = text.splitlines()
    assert '    {"step": 1, "step_ms": 11.0, "partial": false},' in lines
    # Everything but the rows of a table is laid out as json.dumps(indent=2) lays it out.
    without_rows = {key: value for key, value in document.items() if key != "steps"}
    assert dumps(without_rows) == json.dumps(without_rows, indent=2)


def _rounded_steps(epochs: int, calls: int) -> pd.DataFrame:
    """steps.csv rows as the recorder writes them: each field rounded to 0.1 us on its own, so
    `step_ms` (0.0004) is 0.1 us more than its three parts (0.0001 each) on every row."""
    return pd.DataFrame(
        {
            "epoch": np.repeat(np.arange(1, epochs + 1), calls),
            "step": np.arange(epochs * calls),
            "steps": 1,
            "start_time_s": 0.0,
            "input_ms": 0.0001,
            "call_ms": 0.0001,
            "other_host_ms": 0.0001,
            "step_ms": 0.0004,
            "images": 8,
        }
    )


# ---------------------------------------------------------------- epochs of millisecond steps


def test_epochs_of_millisecond_steps_add_up_within_the_rows_rounding():
    steps = _rounded_steps(2, 200)  # the parts sum 20 us short of step_ms in each epoch
    epochs = pd.DataFrame({"epoch": [1, 2], "seconds": [0.42, 0.026]})
    frame = epoch_breakdown(steps, epochs)
    assert frame["seconds"].tolist() == [0.42, 0.026]
    assert frame["epoch_level_s"].tolist() == pytest.approx([0.42 - 200 * 0.0004e-3, 0.026 - 200 * 0.0004e-3])
    parts = frame[["input_s", "call_s", "other_host_s", "epoch_level_s"]].sum(axis=1)
    assert (parts - frame["seconds"]).abs().max() <= 200 * 0.0001e-3 + 1e-12


def test_an_epoch_exactly_its_steps_but_read_short_adds_up():
    steps = _rounded_steps(1, 200)
    epochs = pd.DataFrame({"epoch": [1], "seconds": [200 * 0.0004e-3 - 5e-6]})  # 5 us short: rounding
    frame = epoch_breakdown(steps, epochs)
    assert frame.at[0, "epoch_level_s"] == 0.0


def test_epochs_that_really_do_not_add_up_are_still_refused():
    steps = _rounded_steps(1, 10)
    steps.loc[3, "step_ms"] = 5.0  # a row whose parts are 5 ms short of its step: not rounding
    with pytest.raises(ValueError, match="epoch 1: parts .* s against 0.500000 s"):
        epoch_breakdown(steps, pd.DataFrame({"epoch": [1], "seconds": [0.5]}))
