"""Step markers and epoch accounting of the recording API, and what `analyze` makes of them:
epochs of millisecond steps that add up, steps that never ran (the data ran out, the loop broke,
the call raised), a window of only the compiling first call, and an idle stretch outside steps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.breakdown.epochs import epoch_breakdown

# ---------------------------------------------------------------- 5. epochs of millisecond steps


def _rounded_steps(epochs: int, calls: int) -> pd.DataFrame:
    """steps.csv rows as the recorder writes them: each field rounded to 0.1 us on its own, so
    `step_ms` (0.0004) is 0.1 us more than its three parts (0.0001 each) on every row."""
    return pd.DataFrame({
        "epoch": np.repeat(np.arange(1, epochs + 1), calls), "step": np.arange(epochs * calls),
        "steps": 1, "start_time_s": 0.0, "input_ms": 0.0001, "call_ms": 0.0001, "other_host_ms": 0.0001,
        "step_ms": 0.0004, "images": 8})


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
