"""TensorFlow's own analysis written beside a trace (`<host>.overview_page.pb`, `<host>.input_pipeline.pb`):
read once in the read stage, put beside devprof's figures, and a difference of more than 5 points explained."""

import warnings
from pathlib import Path

import pytest

import trace_fixtures as fx
from analysis import analyze
from analysis.read.inputs import read_inputs
from analysis.read.run_files import RunFileWarning
from analysis.read.tf_analysis import read_tf_analysis
from repo_paths import REPO
from tf_analysis_fixtures import input_result, write_overview
from xprof_oracle import beside_devprof, tensorflow_own_analysis

CENSUS = REPO.parent / "shared/traces/tf-cpu-keras-census"


def write_input_pipeline(xplane: Path, result) -> Path:
    path = xplane.parent / xplane.name.replace(".xplane.pb", ".input_pipeline.pb")
    path.write_bytes(result.SerializeToString())
    return path


@pytest.fixture
def window_trace(tmp_path) -> Path:
    """One host trace where nothing repeats: devprof's step is the 80 ms window (12.5 % input)."""
    return fx.write_unrepeated_trace(tmp_path / "plugins/profile/s/census-like.xplane.pb")


def _analysis_json(path) -> dict:
    return analyze(path).to_json()


def _run_file_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RunFileWarning)]


def test_a_crafted_overview_page_is_read_with_its_known_values(window_trace):
    write_overview(
        window_trace,
        input_result(steps=3, step_ms=78.0, input_pct=14.0, host_wait_input_ms=10.92, host_compute_ms=40.0),
    )
    tf = read_tf_analysis(window_trace)
    assert tf is not None and [f.name for f in tf.files] == ["census-like.overview_page.pb"]
    assert (tf.steps, tf.step_ms, tf.input_pct, tf.hardware) == (3, 78.0, 14.0, "CPU_ONLY")
    assert (tf.host_wait_input_ms, tf.input_ms, tf.host_compute_ms) == (10.92, 10.92, 40.0)
    assert tf.host_to_device_ms != tf.host_to_device_ms  # never sampled: not measured, not 0
    assert tf.device_compute_ms != tf.device_compute_ms
    assert (tf.bound, tf.statement) == ("input", "Your program is input-bound.")


def test_tensorflows_step_and_input_share_stand_beside_devprofs_in_the_json(window_trace):
    write_overview(window_trace, input_result(steps=1, step_ms=78.0, input_pct=14.0, host_wait_input_ms=10.92))
    document = _analysis_json(window_trace)
    tf = document["tensorflow_analysis"]
    assert (tf["steps"], tf["step_ms"], tf["input_pct"]) == (1, 78.0, 14.0)
    assert (tf["devprof_step_ms"], tf["devprof_input_pct"]) == (80.0, 12.5)
    assert tf["step_diff_pct"] == pytest.approx(100 * 2 / 78)
    assert tf["input_diff_points"] == pytest.approx(-1.5)
    assert tf["host_to_device_ms"] is None and tf["bound"] == "input"
    # within 5 points of input and 5 % of step time: no note
    assert tf["note"] is None and not any("TensorFlow's own analysis" in n for n in document["notes"])


def test_the_reading_happens_once_in_the_read_stage(window_trace):
    write_overview(window_trace, input_result(steps=1, step_ms=78.0, input_pct=14.0))
    inputs = read_inputs(window_trace)
    assert inputs.tensorflow is not None and inputs.tensorflow.step_ms == 78.0
    assert inputs.without_trace().tensorflow is inputs.tensorflow
    window_trace.with_name("census-like.overview_page.pb").unlink()  # nothing later opens the file again
    from analysis.worker import analyze_inputs

    opinion = analyze_inputs(inputs).tensorflow
    assert opinion is not None
    assert opinion.tensorflow.step_ms == 78.0


def test_the_input_pipeline_file_wins_and_the_overview_gives_the_verdict(window_trace):
    write_overview(
        window_trace, input_result(steps=1, step_ms=50.0, input_pct=2.0), bound="device", statement="NOT input-bound"
    )
    write_input_pipeline(window_trace, input_result(steps=4, step_ms=79.0, input_pct=13.0))
    tf = read_tf_analysis(window_trace)
    assert tf is not None
    assert (tf.steps, tf.step_ms, tf.input_pct, tf.bound, tf.statement) == (4, 79.0, 13.0, "device", "NOT input-bound")
    assert [f.name for f in tf.files] == ["census-like.input_pipeline.pb", "census-like.overview_page.pb"]


def test_a_step_source_difference_is_explained_in_one_note(window_trace):
    write_overview(window_trace, input_result(steps=1, step_ms=60.0, input_pct=12.0))
    analysis = analyze(window_trace)
    notes = [n for n in analysis.notes if "TensorFlow's own analysis" in n]
    assert len(notes) == 1 and notes[0] == analysis.tensorflow.note
    assert "step 60.00 ms, input 12.0 % over 1 step; devprof 80.00 ms, input 12.5 % over 1 step" in notes[0]
    assert "whole traced window as one step" in notes[0] and "+20.00 ms per step" in notes[0]
    assert analysis.tensorflow.step_diff_pct == pytest.approx(100 * 20 / 60)


def test_an_exposed_host_to_device_copy_is_named_when_tensorflow_counts_no_input(tmp_path):
    """TensorFlow counts a copy no kernel overlaps as no input; devprof counts it (the device waits for its data)."""
    trace = fx.write_synthetic_device_trace(
        tmp_path / "plugins/profile/s/gpu.xplane.pb", gpus=1, empty_gpus=0, steps=5, kernel_ms=6.0, h2d_ms=1.5
    )
    write_overview(
        trace.path,
        input_result(
            steps=5, step_ms=12.0, input_pct=0.0, host_wait_input_ms=0.0, host_to_device_ms=0.0, hardware="GPU"
        ),
        bound="device",
    )
    analysis = analyze(trace.path)
    assert analysis.mean["input_pct"] == pytest.approx(12.5)  # 1.5 ms exposed copy of a 12 ms step
    opinion = analysis.tensorflow
    assert opinion.input_diff_points == pytest.approx(12.5) and opinion.step_diff_pct == pytest.approx(0.0)
    assert "the host-to-device copy that no kernel overlaps as input (1.50 ms per device step" in opinion.note
    assert "TensorFlow 0.00 ms" in opinion.note and "steps are not the same" not in opinion.note
    assert [n for n in analysis.notes if "TensorFlow's own analysis" in n] == [opinion.note]


def test_steps_found_another_way_are_named_in_the_note(tmp_path):
    trace = fx.write_synthetic_device_trace(
        tmp_path / "plugins/profile/s/gpu.xplane.pb", gpus=1, empty_gpus=0, steps=5, kernel_ms=6.0, h2d_ms=1.5
    )
    write_overview(trace.path, input_result(steps=4, step_ms=9.0, input_pct=12.0, hardware="GPU"))
    opinion = analyze(trace.path).tensorflow
    assert opinion.step_diff_pct == pytest.approx(100 * 3 / 9) and abs(opinion.input_diff_points) < 5
    assert (
        "the steps are not the same: devprof's are executions of "
        f"'{trace.step_name}' (5 steady), TensorFlow's its own grouping (4 steps)"
    ) in opinion.note
    assert "host-to-device" not in opinion.note


def test_missing_files_are_no_error_and_no_key(window_trace):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        document = _analysis_json(window_trace)
    assert "tensorflow_analysis" not in document and not _run_file_warnings(caught)
    assert read_tf_analysis(window_trace) is None


def test_an_empty_file_is_no_analysis_and_no_warning(window_trace):
    window_trace.with_name("census-like.overview_page.pb").write_bytes(b"")  # TensorFlow writes empty tool files
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_tf_analysis(window_trace) is None
    assert not _run_file_warnings(caught)


@pytest.mark.parametrize("content", [b"\xff\xff\xff\xff\xff", b"\x0a\x05ab", b"not a protobuf message at all"])
def test_a_corrupt_file_is_left_out_with_one_warning(window_trace, content):
    path = window_trace.with_name("census-like.overview_page.pb")
    path.write_bytes(content)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        document = _analysis_json(window_trace)
    said = _run_file_warnings(caught)
    assert len(said) == 1 and str(path) in said[0] and "left out" in said[0]
    assert "tensorflow_analysis" not in document and document["mean"]["step_ms"] == 80.0


def test_a_corrupt_input_pipeline_falls_back_to_the_overview_page(window_trace):
    write_overview(window_trace, input_result(steps=2, step_ms=70.0, input_pct=11.0))
    window_trace.with_name("census-like.input_pipeline.pb").write_bytes(b"\x0a\xff")  # cut short
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tf = read_tf_analysis(window_trace)
    assert tf is not None
    assert (tf.steps, tf.step_ms) == (2, 70.0) and [f.name for f in tf.files] == ["census-like.overview_page.pb"]
    assert len(_run_file_warnings(caught)) == 1


def test_an_implausible_step_time_is_left_out_with_a_warning(window_trace):
    write_overview(window_trace, input_result(steps=1, step_ms=-5.0, input_pct=3.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_tf_analysis(window_trace) is None
    assert len(_run_file_warnings(caught)) == 1


def test_the_oracle_puts_tensorflows_figures_beside_devprofs(window_trace):
    write_overview(window_trace, input_result(steps=1, step_ms=60.0, input_pct=12.0))
    assert tensorflow_own_analysis(window_trace) == {"steps": 1, "step_ms": 60.0, "input_pct": 12.0}
    table = beside_devprof(window_trace, window_trace).set_index("source")
    assert table.loc["devprof", "step_ms"] == 80.0 and table.loc["tensorflow", "step_ms"] == 60.0
    assert table.loc["devprof", "input_pct"] == 12.5 and table.loc["tensorflow", "input_pct"] == 12.0


@pytest.mark.skipif(not CENSUS.is_dir(), reason="the real traces folder beside the repository is not here")
def test_the_real_census_trace_has_tensorflows_own_figures_beside_devprofs():
    xplane = fx.find_xplane(CENSUS)
    assert tensorflow_own_analysis(xplane) == {
        "steps": 1,
        "step_ms": pytest.approx(6.408728),
        "input_pct": pytest.approx(1.4123707543837092),
    }
    analysis = analyze(CENSUS)
    opinion = analysis.tensorflow
    tf = opinion.tensorflow
    assert (tf.hardware, tf.bound, tf.steps) == ("CPU_ONLY", "device", 1)
    assert (tf.step_ms, tf.host_wait_input_ms, tf.host_compute_ms) == (6.408728, 0.090515, 6.185406)
    assert (opinion.step_ms, opinion.input_pct) == (analysis.mean["step_ms"], analysis.mean["input_pct"])
    assert abs(opinion.input_diff_points) < 1  # 1.4 % by both
    if abs(opinion.step_diff_pct) > 5:  # devprof's step is not TensorFlow's group: the note says which it took
        assert "the steps are not the same" in opinion.note or "whole traced window" in opinion.note
    else:
        assert opinion.note is None
