"""`RunHooks`: what watches the training loop's step and epoch boundaries during a run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from models.training import EpochResult, LoopHooks, StepRecord
from profiler import tracing

if TYPE_CHECKING:
    from profiler.run import Run


class RunHooks(LoopHooks):
    """Everything that watches the loop: steps.csv, run.json, scalars, profiler window, console."""

    def __init__(self, run: "Run"):
        self.run = run
        self.epoch_steps_done = 0

    def on_train_begin(self, trainer) -> None:
        self.trainer = trainer
        window = self.run.window
        if window is not None:
            window.maybe_start(0)

    def on_epoch_begin(self, epoch: int) -> None:
        self.epoch_steps_done = 0
        self.run.console.epoch_begin(epoch, self.run.config.train.epochs, self.trainer.steps_per_epoch)

    def step_scope(self, step: int, steps: int):
        return tracing.step_marker(step, steps)

    def on_step_end(self, epoch, next_step, steps, loss, accuracy) -> None:
        self.epoch_steps_done += steps
        self.run.console.step(self.epoch_steps_done, loss, accuracy)
        every = self.run.config.scalars_every
        if self.run.scalars is not None and next_step // every != (next_step - steps) // every:
            self.run.scalars.step(next_step, loss=loss, accuracy=accuracy)
        if self.run.window is not None:
            self.run.window.maybe_start(next_step)

    def on_step_record(self, record: StepRecord) -> None:
        self.run.steps.write(record)
        if self.run.window is not None:
            self.run.window.maybe_stop(record.step + record.steps)

    def on_epoch_end(self, result: EpochResult) -> None:
        self.run.console.epoch_end(result)
        self.run.record_epoch(result)

    def on_train_end(self) -> None:
        if self.run.window is not None:
            self.run.window.maybe_stop(0, force=True)
            self.run.window.describe()
