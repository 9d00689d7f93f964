"""Step markers of the recording API, and what `analyze` makes of them: epochs of no-op steps,
steps that never ran (the data ran out, the loop broke, the call raised), a window of only the
compiling first call, and markers of no duration."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import analysis

# ---------------------------------------------------------------- 5. epochs of millisecond steps


def _session(out: Path, name: str, **options):
    import profiler

    options = {"profile": False, "sample": False, "quiet": True, **options}
    return profiler.profile(out, run_name=name, **options)


@pytest.mark.slow
def test_profile_with_epochs_of_no_op_steps_is_analysed(tmp_path):
    import analysis

    for trial in range(3):  # refused 3 times in 3 before
        with _session(tmp_path, f"noop-{trial}", profile=True, profile_steps="5:15") as session:
            for _ in range(2):
                with session.epoch():
                    for _ in session.iterate(range(200)):
                        with session.step(images=8):
                            pass
        result = analysis.analyze(tmp_path / f"noop-{trial}")
        assert result.epochs["calls"].tolist() == [200, 200]
        parts = result.epochs[["input_s", "call_s", "other_host_s", "epoch_level_s"]].sum(axis=1)
        assert np.allclose(parts, result.epochs["seconds"], rtol=0, atol=2e-4)


# ---------------------------------------------------------------- 6. steps that never ran

STEP_MS, MARKER_MS, ABORTED_MS, VALIDATION_MS = 2.0, 1.5, 0.18, 50.0
LIVE_VALIDATION_MS = 1000.0  # long beside a 2 ms step: a loaded machine's late wake-up never reaches it


def _write_marker_trace(path: Path, markers: list[tuple[int, float, float, dict]]) -> Path:
    """A CPU trace of `train` markers on one thread: (step_num, start ms, end ms, other stats)."""
    import trace_fixtures as fx

    space = fx._xspace_class()()
    space.hostnames.append("vm")
    host = fx._Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", fx.ABSOLUTE_BASE_NS)
    for step, start, end, stats in markers:
        host.event(
            python,
            "train",
            fx.ABSOLUTE_BASE_NS + fx._ns(start),
            fx.ABSOLUTE_BASE_NS + fx._ns(end),
            step_num=step,
            **stats,
        )
    host.finish()
    return fx._write_space(space, path)


def _two_epochs_with_the_data_running_out(first: int = 15, per_epoch: int = 20) -> list:
    """Steps 15-19 of epoch 1, the step that found no batch (20, `steps=0`), validation, steps 20-24."""
    markers, t = [], 1.0
    for step in range(first, per_epoch):
        markers.append((step, t, t + MARKER_MS, {"_r": 1}))
        t += STEP_MS
    markers.append((per_epoch, t, t + ABORTED_MS, {"steps": 0}))
    t += ABORTED_MS + VALIDATION_MS
    for step in range(per_epoch, per_epoch + 5):
        markers.append((step, t, t + MARKER_MS, {"_r": 1}))
        t += STEP_MS
    return markers


def test_a_step_that_found_no_batch_is_no_step_and_ends_the_one_before(tmp_path):
    import analysis

    path = _write_marker_trace(tmp_path / "vm.xplane.pb", _two_epochs_with_the_data_running_out())
    result = analysis.analyze(path)
    assert result.step_source == "markers"
    assert result.steps["step"].tolist() == list(range(15, 25))  # 10 steps, step 20 once
    assert result.steps_used == 10
    step_ms = dict(zip(result.steps["step"], result.steps["step_ms"]))
    assert step_ms[19] == pytest.approx(STEP_MS)  # ends where the step that found no batch began
    assert step_ms[24] == pytest.approx(MARKER_MS)  # the last one ends with its marker
    assert result.mean["step_ms"] == pytest.approx((9 * STEP_MS + MARKER_MS) / 10)


def test_a_step_that_raised_between_steps_leaves_them_consecutive(tmp_path):
    import analysis

    markers = [
        (0, 1.0, 2.5, {"_r": 1}),
        (1, 3.0, 4.5, {"_r": 1}),
        (2, 5.0, 5.4, {"steps": 0}),
        (2, 9.0, 10.5, {"_r": 1}),
        (3, 11.0, 12.5, {"_r": 1}),
    ]  # step 2 raised, then ran again
    result = analysis.analyze(_write_marker_trace(tmp_path / "vm.xplane.pb", markers))
    assert result.steps["step"].tolist() == [0, 1, 2, 3]
    assert result.steps["step_ms"].tolist() == pytest.approx([2.0, 2.0, 2.0, 1.5])


def _markers_in(run: Path) -> pd.DataFrame:
    """Every `train` marker of the run's trace with its stats: step_num, _r, steps."""
    from analysis.read.trace import locate_trace, read_trace

    events = read_trace(locate_trace(run).xplane).events
    return events[events["name"].astype(str) == "train"].sort_values("start_ns")[["step_num", "_r", "steps"]]


@pytest.mark.slow
def test_the_step_that_finds_the_data_ended_is_no_step(tmp_path):
    import time

    import analysis

    with _session(tmp_path, "ran-out", profile=True, profile_steps="15:25") as session:
        for _ in range(2):
            with session.epoch():
                for _ in session.iterate(range(20)):
                    with session.step(images=8):
                        time.sleep(STEP_MS / 1e3)
                time.sleep(LIVE_VALIDATION_MS / 1e3)  # validation, inside the epoch, outside every step
    markers = _markers_in(tmp_path / "ran-out")
    aborted = markers[markers["steps"] == 0]
    assert aborted["step_num"].tolist() == [20] and aborted["_r"].isna().all()  # no step for XProf either
    assert (markers.loc[markers["steps"] != 0, "_r"] == 1).all()
    result = analysis.analyze(tmp_path / "ran-out")
    assert result.steps["step"].tolist() == list(range(15, 25)) and result.steps_used == 10
    step_ms = dict(zip(result.steps["step"], result.steps["step_ms"]))
    assert STEP_MS <= step_ms[19] < LIVE_VALIDATION_MS  # ends where the step without a batch began


@pytest.mark.slow
def test_a_step_that_raised_or_was_broken_off_is_no_step(tmp_path):
    import analysis

    with _session(tmp_path, "raised", profile=True, profile_steps="0:12") as session:
        for _ in session.iterate(range(8)):
            try:
                with session.step(images=8):
                    if session.global_step == 6 and not getattr(session, "_raised", False):
                        session._raised = True
                        raise RuntimeError("a step that fails once")
            except RuntimeError:
                pass
        for _ in session.iterate(range(8)):
            break  # the loop leaves with a batch fetched and its step not run
    markers = _markers_in(tmp_path / "raised")
    # 8 batches, one of them spent on the step that raised: steps 0-6 ran
    assert markers.loc[markers["steps"] == 0, "step_num"].tolist() == [6, 7, 7]  # raised, data ended, broke off
    result = analysis.analyze(tmp_path / "raised")
    assert result.steps["step"].tolist() == list(range(7))
    assert pd.read_csv(tmp_path / "raised" / "steps.csv")["step"].tolist() == list(range(7))


@pytest.mark.slow
def test_devprof_runs_step_scope_marks_a_call_that_raised_as_no_step(tmp_path):
    import tensorflow as tf

    from profiler.record import tracing

    tf.profiler.experimental.start(str(tmp_path))
    try:
        with tracing.step_marker(0, 4):
            pass
        with pytest.raises(KeyboardInterrupt), tracing.step_marker(4, 4):
            raise KeyboardInterrupt
    finally:
        tf.profiler.experimental.stop()
    markers = _markers_in(tmp_path)
    assert markers["step_num"].tolist() == [0, 4]
    assert markers["steps"].tolist() == [4, 0] and markers["_r"].tolist()[0] == 1 and pd.isna(markers["_r"].iloc[1])


# ---------------------------------------------------------------- 13. the first call is never a steady step

COMPILE_MS = 300.0


def _steps_from(tmp_path, first: int, count: int, first_ms: float = COMPILE_MS) -> Path:
    """Marked steps `first`..`first+count-1`, back to back: step 0 lasts `first_ms`, the others STEP_MS."""
    markers, t = [], 1.0
    for step in range(first, first + count):
        ms = first_ms if step == 0 else STEP_MS
        markers.append((step, t, t + ms - 0.5, {"_r": 1}))
        t += ms
    return _write_marker_trace(tmp_path / "vm.xplane.pb", markers)


def test_the_first_call_is_left_out_of_the_mean(tmp_path):
    import analysis

    result = analysis.analyze(_steps_from(tmp_path, 0, 6))
    assert result.steps_used == 5
    assert result.mean["step_ms"] == pytest.approx((4 * STEP_MS + STEP_MS - 0.5) / 5)  # not the 300 ms step 0
    assert not any("compile step" in note for note in result.notes)


def test_a_trace_of_only_the_first_call_says_it_is_the_compile_step_in_every_format(tmp_path):
    import analysis

    result = analysis.analyze(_steps_from(tmp_path, 0, 1))
    assert result.steps_used == 0 and result.verdict["bound"] is None
    said = "the only traced step is the compile step: step 0, the first call"
    assert any(note.startswith(said) for note in result.notes), result.notes
    document = json.loads(result.render("json"))
    assert any(note.startswith(said) for note in document["notes"]) and document["steps_used"] == 0
    for fmt in ("text", "markdown", "html"):
        assert said in result.render(fmt).replace("\n", " "), fmt
    text = result.render("text")
    assert "1 steady step" not in text and "mean over" not in text
    assert "0 step" not in text and "0 steady" not in text, text
    assert result.verdict["reason"].startswith("no steady step: every traced step traces or compiles")
    assert f"no steady step (see the notes); the traced steps: step {COMPILE_MS - 0.5:.2f} ms" in text, text


def test_one_step_and_one_call_are_singular(tmp_path):
    import analysis

    text = analysis.analyze(_steps_from(tmp_path, 3, 1)).render("text")
    assert "; 1 step found by markers" in text and "mean over 1 step: step" in text, text
    two = analysis.analyze(_steps_from(tmp_path, 0, 2)).render("text")
    assert "; 2 steps found by markers" in two and "mean over 1 step: step" in two, two


# ---------------------------------------------------------------- 15. an idle stretch outside steps


MS = 1_000_000  # ns
BASE_NS = 1_700_000_000 * 10**9


# ---------------------------------------------------------------- a marker of no duration


def test_a_marker_of_no_duration_after_the_last_step_is_no_step_of_0_ms(tmp_path):
    """Markers that hold nothing (`with Trace("train", step_num=k): pass` before each step): a step runs to
    the next marker, and the last one, which ends nowhere, counted as a 0 ms step in the mean (8 ms, not 10)."""
    from trace_fixtures import _Plane, _write_space, _xspace_class

    space = _xspace_class()()
    space.hostnames.append("host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", BASE_NS)
    for k in range(6):
        t = BASE_NS + 10 * MS + k * 10 * MS
        host.event(python, "train", t, t, step_num=k, _r=1)
    host.finish()
    result = analysis.analyze(_write_space(space, tmp_path / "t.xplane.pb"))
    assert result.step_source == "markers" and len(result.steps) == 6
    assert result.mean["step_ms"] == pytest.approx(10.0)
    assert bool(result.steps["partial"].iloc[-1]) and not result.steps["partial"].iloc[:-1].any()
