"""Agreement with XProf's input_pipeline_analyzer on traces where XProf finds steps."""

import pytest

import trace_fixtures as fx
from analysis import analyze
from repo_paths import REPO
from xprof_oracle import beside_devprof, tensorflow_own_analysis, xprof_steps

TOLERANCE_PCT_OF_STEP = 3.0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["clean", "input_delay", "host_delay"])
def test_step_input_and_compute_agree_with_xprof(kind):
    logdir = fx.trace_logdir(kind)
    ours = analyze(logdir).steps
    theirs, _ = xprof_steps(fx.find_xplane(logdir))
    assert not theirs.empty, "XProf should find the train markers"
    both = ours.merge(theirs, on="step", suffixes=("", "_xprof"))
    assert len(both) >= len(theirs) - 1 >= 3
    scale = both["step_ms_xprof"] / 100.0
    for ours_col, xprof_col in (
        ("step_ms", "step_ms_xprof"),
        ("input_ms", "input_ms_xprof"),
        ("compute_ms", "host_compute_ms"),
    ):
        diff_pct = (both[ours_col] - both[xprof_col]).abs() / scale
        assert (diff_pct <= TOLERANCE_PCT_OF_STEP).all(), (ours_col, diff_pct.round(2).tolist())


@pytest.mark.slow
def test_xprof_finds_no_steps_in_keras_fit_but_devprof_does():
    logdir = fx.trace_logdir("keras_fit")
    theirs, summary = xprof_steps(fx.find_xplane(logdir))
    assert theirs.empty
    assert "No step time measured" in summary.get("input_conclusion", "")
    assert len(analyze(logdir).steps) >= 3


@pytest.mark.slow
def test_previous_steps_late_executor_span_is_not_compute_of_the_next_step(tmp_path):
    """An executor span closing late (a preempted thread) counts for its own step, as XProf groups it."""
    source = fx.find_xplane(fx.trace_logdir("clean"))
    late, added = fx.write_with_late_executor_tails(source, tmp_path / "plugins/profile/s/host.xplane.pb")
    assert added >= 3
    before = analyze(source).steps
    ours = analyze(late).steps
    assert ours["compute_ms"].round(6).tolist() == before["compute_ms"].round(6).tolist()
    theirs, _ = xprof_steps(late)
    both = ours.merge(theirs, on="step", suffixes=("", "_xprof"))
    assert len(both) >= 3
    diff_pct = (both["compute_ms"] - both["host_compute_ms"]).abs() / (both["step_ms_xprof"] / 100.0)
    assert (diff_pct <= TOLERANCE_PCT_OF_STEP).all(), diff_pct.round(2).tolist()


CENSUS = REPO.parent / "shared/traces/tf-cpu-keras-census"


@pytest.mark.slow
@pytest.mark.skipif(not CENSUS.is_dir(), reason="the real traces folder beside the repository is not here")
def test_tensorflows_analysis_at_capture_agrees_with_xprofs_converter_and_devprof_says_why_it_differs():
    xplane = fx.find_xplane(CENSUS)
    at_capture = tensorflow_own_analysis(xplane)
    assert at_capture is not None
    converter, _ = xprof_steps(xplane)
    assert at_capture["steps"] == len(converter) == 1
    assert converter["step_ms"].iloc[0] == pytest.approx(at_capture["step_ms"], abs=1e-6)
    assert 100 * converter["input_ms"].iloc[0] / converter["step_ms"].iloc[0] == pytest.approx(
        at_capture["input_pct"], abs=0.01
    )
    table = beside_devprof(CENSUS, xplane).set_index("source")
    assert abs(table.loc["devprof", "input_pct"] - table.loc["tensorflow", "input_pct"]) <= 5
    ours, theirs = table.loc["devprof", "step_ms"], table.loc["tensorflow", "step_ms"]
    note = analyze(CENSUS).tensorflow.note
    assert (note is not None) == (abs(ours - theirs) > 0.05 * theirs)  # a step of its own is explained
