"""The console's progress lines: when not on a terminal, a line every 30 s of steps (the launcher's too),
the epoch line, and nothing with --quiet."""

from __future__ import annotations

import io
import json

from profiler.cli import launcher
from profiler.record.console import Console


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


# ---------------------------------------------------------------- progress when not on a terminal


def test_progress_lines_when_not_on_a_terminal():
    clock, stream = FakeClock(), io.StringIO()
    console = Console(False, stream=stream, clock=clock)
    console.epoch_begin(1, 2, 100)
    for step in range(1, 100):
        clock.now += 1.0  # a step a second: a line every 30 steps
        console.step(step, loss=2.0 - step / 100, accuracy=step / 200)
    lines = stream.getvalue().splitlines()
    assert lines == [
        "Epoch 1/2",
        "30/100 - 30s - loss: 1.7000 - accuracy: 0.1500",
        "60/100 - 60s - loss: 1.4000 - accuracy: 0.3000",
        "90/100 - 90s - loss: 1.1000 - accuracy: 0.4500",
    ], lines


def test_no_progress_lines_when_steps_are_quick_or_quiet():
    clock, stream = FakeClock(), io.StringIO()
    console = Console(False, stream=stream, clock=clock)
    console.epoch_begin(1, 1, 100)
    for step in range(1, 101):
        clock.now += 0.1  # 10 s for the whole epoch
        console.step(step, 1.0, 0.5)
    assert stream.getvalue().splitlines() == ["Epoch 1/1"]
    quiet_stream = io.StringIO()
    silent = Console(True, stream=quiet_stream, clock=clock)
    silent.epoch_begin(1, 1, 100)
    for step in range(1, 100):
        clock.now += 60.0
        silent.step(step, 1.0, 0.5)
    assert quiet_stream.getvalue() == ""


def test_the_epoch_line_restarts_the_clock_of_progress_lines():
    from models.training import EpochResult

    clock, stream = FakeClock(), io.StringIO()
    console = Console(False, stream=stream, clock=clock)
    console.epoch_begin(1, 2, 10)
    clock.now += 29.0
    console.step(5, 1.0, 0.5)
    console.epoch_end(EpochResult(1, 30.0, 29.0, 100, 3.4, 1.0, 0.5, 1.0, 0.5, steps=10))
    console.epoch_begin(2, 2, 10)
    clock.now += 29.0
    console.step(5, 1.0, 0.5)
    assert not any(line.startswith("5/10") for line in stream.getvalue().splitlines())


def test_the_launcher_shows_progress_when_not_on_a_terminal(tmp_path):
    clock, stream = FakeClock(), io.StringIO()
    chief = tmp_path / "worker-0"
    chief.mkdir()
    (chief / "run.json").write_text(json.dumps({"status": "running", "steps_per_epoch": 20, "epochs": []}))
    progress = launcher._Progress(chief, 2, Console(False, stream=stream, clock=clock))
    steps = chief / "steps.csv"
    steps.write_text("epoch,step\n")
    for step in range(40):
        with open(steps, "a") as f:
            f.write(f"1,{step}\n")
        clock.now += 2.0
        progress.update()
    lines = stream.getvalue().splitlines()
    # The first update starts the clock: 30 s later step 16 of 20; 60 s later step 11 of epoch 2.
    assert lines == ["Epoch 1/2 - step 16/20", "Epoch 2/2 - step 11/20"], lines


# ---------------------------------------------------------------- the epoch line


def test_the_epoch_line_leaves_out_metrics_the_run_does_not_compute():
    """`--dataset` runs have no validation data: they printed 'val_loss: nan - val_accuracy: nan'."""
    import io
    import math

    from models.training import EpochResult
    from profiler.record.console import Console

    stream = io.StringIO()
    console = Console(False, stream=stream)
    console.epoch_end(EpochResult(1, 3.0, 2.9, 100, 34.5, 0.25, 0.5, math.nan, math.nan, steps=10))
    line = stream.getvalue().strip()
    assert "nan" not in line and "loss: 0.2500 - accuracy: 0.5000" in line and "val_" not in line, line
    stream.truncate(0)
    console.epoch_end(EpochResult(1, 3.0, 2.9, 100, 34.5, 0.25, 0.5, 0.75, 0.4, steps=10))
    assert "val_loss: 0.7500 - val_accuracy: 0.4000" in stream.getvalue()
