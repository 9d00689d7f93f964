"""Ground truth: inject a known cost into a real traced loop and find it in the breakdown."""

import numpy as np
import pytest

import trace_fixtures as fx
from analysis import analyze
from analysis.steps.host import mean_breakdown, steady_steps


def _close(measured_ms, expected_ms):
    """An injected sleep never takes less than asked, but a busy machine can wake it late: the
    bound below is tight, the one above loose, and a missing or doubled cost fails both ways."""
    return expected_ms - max(0.10 * expected_ms, 2.0) <= measured_ms <= 1.5 * expected_ms


@pytest.fixture(scope="module")
def analyses():
    return {kind: analyze(fx.trace_logdir(kind)) for kind in ("clean", "input_delay", "host_delay")}


@pytest.mark.slow
def test_custom_loop_steps_carry_marker_numbers(analyses):
    steps = analyses["clean"].steps
    assert steps["step"].tolist() == list(range(3, 11))
    assert (steps["steps"] == 1).all()
    assert analyses["clean"].step_name == "train"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["clean", "input_delay", "host_delay"])
def test_parts_add_up_to_step_time(analyses, kind):
    steps = analyses[kind].steps
    np.testing.assert_allclose(steps["input_ms"] + steps["compute_ms"] + steps["host_ms"], steps["step_ms"], atol=1e-9)
    assert (steps[["input_ms", "compute_ms", "host_ms", "compile_ms"]] >= 0).all().all()


@pytest.mark.slow
def test_input_delay_is_input(analyses):
    analysis = analyses["input_delay"]
    assert _close(analysis.mean["input_ms"], fx.INPUT_DELAY_MS), analysis.mean
    assert analysis.verdict["bound"] == "input"
    assert analysis.verdict["level"] == "high"
    assert "Map" in analysis.verdict["advice"][0]


@pytest.mark.slow
def test_host_delay_is_host_not_input(analyses):
    analysis = analyses["host_delay"]
    assert _close(analysis.mean["host_ms"], fx.HOST_DELAY_MS), analysis.mean
    # none of the host work shows as input: against the clean loop, recorded in the same conditions
    assert analysis.mean["input_ms"] - analyses["clean"].mean["input_ms"] < 0.1 * fx.HOST_DELAY_MS, analysis.mean
    assert analysis.verdict["bound"] == "host"
    # A custom TensorFlow loop is told how to run several steps per call in its own terms.
    assert any("steps inside one `tf.function` call" in item for item in analysis.verdict["advice"])
    assert not any("--steps-per-execution" in item for item in analysis.verdict["advice"])


@pytest.mark.slow
def test_clean_loop_computes_most_and_names_no_bound_its_fix_would_not_save(analyses):
    """Compute is the clean loop's largest part; its input and host time are a fraction of the delays
    the other loops inject. (A loaded machine can stretch a fetch of a few-ms step, and the call's own
    dispatch, past the 5 % of the step that names a bound, so the verdict is held to its saving.)"""
    mean = analyses["clean"].mean
    assert mean["compute_ms"] > max(mean["input_ms"], mean["host_ms"]), mean
    assert mean["input_ms"] < fx.INPUT_DELAY_MS / 4 and mean["host_ms"] < fx.HOST_DELAY_MS / 4, mean
    verdict = analyses["clean"].verdict
    # The bound is the largest part; what a fix would save is said apart (a loaded machine can stretch a
    # fetch past 5 % of the step, so the fixes may list one).
    assert verdict["bound"] == "compute" and verdict["bound_pct"] == pytest.approx(mean["compute_pct"], abs=1e-3)
    assert all(fix["saving_ms"] >= 0.05 * mean["step_ms"] - 1e-6 for fix in verdict["fixes"]), verdict


@pytest.mark.slow
def test_delays_move_the_breakdown_by_their_size(analyses):
    clean = analyses["clean"].mean
    assert _close(analyses["input_delay"].mean["input_ms"] - clean["input_ms"], fx.INPUT_DELAY_MS)
    assert _close(analyses["host_delay"].mean["host_ms"] - clean["host_ms"], fx.HOST_DELAY_MS)


@pytest.mark.slow
def test_first_step_compile_is_reported_separately():
    analysis = analyze(fx.trace_logdir("first_step"))
    steps = analysis.steps
    first = steps.iloc[0]
    assert first["step"] == 0
    assert first["compile_ms"] > 0.5 * first["step_ms"]
    assert first["compile_ms"] <= first["host_ms"]
    assert (steps.iloc[1:]["compile_ms"] < 0.05 * steps.iloc[1:]["step_ms"]).all()
    assert analysis.steps_used == len(steps) - 1
    assert "tracing/compiling" in analysis.verdict["evidence"]
    expected = mean_breakdown(steady_steps(steps))
    assert {key: analysis.mean[key] for key in expected} == expected
    assert analysis.mean["input_wait_ms"] + analysis.mean["input_copy_ms"] == pytest.approx(expected["input_ms"])
    assert analysis.mean["device_step_ms"] != analysis.mean["device_step_ms"]  # no device: NaN, null in JSON


@pytest.mark.slow
def test_keras_fit_profiled_batches_are_found():
    analysis = analyze(fx.trace_logdir("keras_fit"))
    steps = analysis.steps
    assert analysis.step_name == "Profiled batch"
    assert len(steps) >= 3
    assert steps["step"].is_monotonic_increasing
    assert (steps["compute_ms"] > 0).all()
    np.testing.assert_allclose(steps["input_ms"] + steps["compute_ms"] + steps["host_ms"], steps["step_ms"], atol=1e-9)


@pytest.mark.slow
def test_several_steps_per_call_are_reported_per_call():
    analysis = analyze(fx.trace_logdir("multi_step"))
    steps = analysis.steps
    assert steps["step"].tolist() == [8, 12, 16, 20]
    assert (steps["steps"] == 4).all()
    assert (steps["input_ms"] > 0).all(), "in-graph IteratorGetNext is input"
    assert (steps["compute_ms"] > steps["host_ms"]).all()
    assert "4 steps" in analysis.verdict["evidence"]
