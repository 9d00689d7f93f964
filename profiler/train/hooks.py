"""`RunHooks`: devprof's own training loop reporting its step and epoch boundaries to the
recording session (the same calls `profiler.profile()` makes for any loop)."""

from __future__ import annotations

from typing import Any, Protocol

from models.training import EpochResult, LoopHooks, StepRecord


class Recording(Protocol):
    """What the hooks report to: a `profiler.train.run.Run`, named by what it offers so that this module
    does not import the one that imports it."""

    window: Any
    console: Any
    config: Any

    def step_scope(self, step: int, steps: int): ...

    def step_done(self, next_step: int, steps: int = 1, **values) -> None: ...

    def record_step(self, record: StepRecord) -> None: ...

    def record_epoch(self, result: EpochResult) -> None: ...


class RunHooks(LoopHooks):
    """Everything that watches the loop: the session (steps.csv, run.json, scalars, profiler
    window) and the console."""

    def __init__(self, run: Recording):
        self.run = run
        self.epoch_steps_done = 0

    def on_train_begin(self, trainer) -> None:
        self.trainer = trainer
        if self.run.window is not None:
            self.run.window.maybe_start(0)

    def on_epoch_begin(self, epoch: int) -> None:
        self.epoch_steps_done = 0
        self.run.console.epoch_begin(epoch, self.run.config.train.epochs, self.trainer.steps_per_epoch)

    def step_scope(self, step: int, steps: int):
        return self.run.step_scope(step, steps)

    def on_step_end(self, epoch, next_step, steps, loss, accuracy) -> None:
        self.epoch_steps_done += steps
        self.run.console.step(self.epoch_steps_done, loss, accuracy)
        self.run.step_done(next_step, steps, loss=loss, accuracy=accuracy)

    def on_step_record(self, record: StepRecord) -> None:
        self.run.record_step(record)

    def on_epoch_end(self, result: EpochResult) -> None:
        self.run.console.epoch_end(result)
        self.run.record_epoch(result)

    def on_train_end(self) -> None:
        if self.run.window is not None:
            self.run.window.maybe_stop(0, force=True)
            self.run.window.describe()
