"""`profiler.profile()` and `profiler.KerasCallback` under misuse: nested steps, a window of only
the compile step, two sessions at once, steps after the block, SIGTERM, and fit() stopped by
another callback or Ctrl-C. Real TensorFlow, tiny models, synthetic data."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest

import profiler


def read_meta(path: Path) -> dict:
    return json.loads((path / "run.json").read_text())


def quiet_session(out: Path, name: str, **options):
    options = {"profile": False, "sample": False, "quiet": True, **options}
    return profiler.profile(out, run_name=name, **options)


@pytest.mark.slow
def test_nested_steps_are_refused_and_the_run_goes_on(tmp_path):
    with quiet_session(tmp_path, "nested") as session:
        with pytest.raises(RuntimeError, match="session.step\\(\\) is already open; steps do not nest"):
            with session.step(images=4):
                with session.step(images=4):
                    pass
        for _ in range(3):
            with session.step(images=4):
                pass
    meta = read_meta(tmp_path / "nested")
    assert meta["status"] == "complete", meta.get("error")
    steps = pd.read_csv(tmp_path / "nested" / "steps.csv")
    assert steps["step"].tolist() == [0, 1, 2] and (steps["images"] == 4).all()  # the refused step ran no call


@pytest.mark.slow
def test_a_window_of_only_the_compile_step_is_said_at_start(tmp_path, capsys):
    with quiet_session(tmp_path, "compile-only", profile=True, profile_steps="0:1") as session:
        for _ in range(3):
            with session.step():
                pass
    warnings = [w for w in read_meta(tmp_path / "compile-only")["profiler"].get("warnings", []) if "compiles" in w]
    assert len(warnings) == 1 and 'profile_steps="1:11"' in warnings[0], warnings
    assert f"warning: {warnings[0]}" in capsys.readouterr().err


def _fake_batches(session, count):
    for _ in session.iterate(range(count)):
        with session.step(images=8):
            pass


@pytest.mark.slow
def test_a_second_session_at_once_is_refused_and_the_first_keeps_only_its_own_steps(tmp_path):
    import threading

    import analysis

    refused = []
    with quiet_session(tmp_path, "outer", profile=True, profile_steps="2:6") as outer:
        for step in range(8):
            with outer.step(images=8):
                time.sleep(0.005)  # a step of some length: no-op steps are not what this is about
                if step == 3:  # a second session inside the first one's loop
                    with pytest.raises(RuntimeError, match="another profile\\(\\) session is recording into"):
                        with quiet_session(tmp_path, "inner", profile=True, profile_steps="0:4") as inner:
                            _fake_batches(inner, 4)

                    def other_thread():  # and one from another thread
                        try:
                            with quiet_session(tmp_path, "thread"):
                                pass
                        except RuntimeError as exc:
                            refused.append(str(exc))

                    thread = threading.Thread(target=other_thread)
                    thread.start()
                    thread.join()
    assert len(refused) == 1 and "one session records at a time" in refused[0], refused
    assert not (tmp_path / "inner").exists() and not (tmp_path / "thread").exists()  # refused before writing
    assert read_meta(tmp_path / "outer")["status"] == "complete"
    result = analysis.analyze(tmp_path / "outer")
    assert result.step_source == "markers"
    assert result.steps["step"].tolist() == [2, 3, 4, 5], result.steps  # its own window, each step once
    with quiet_session(tmp_path, "after") as after:  # once the first has ended, another may start
        _fake_batches(after, 2)
    assert read_meta(tmp_path / "after")["status"] == "complete"
