"""`profiler.profile()` and `profiler.KerasCallback` under misuse: nested steps, a window of only
the compile step, two sessions at once, steps after the block, SIGTERM, and fit() stopped by
another callback or Ctrl-C. Real TensorFlow, tiny models, synthetic data."""

from __future__ import annotations

import json
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
