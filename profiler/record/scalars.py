"""TensorBoard scalars in the run directory: the training curves and system metrics beside the Profile tab."""

from __future__ import annotations

import contextlib
from pathlib import Path

from models.training import EpochResult
from profiler.record.rundir import WriteError, reason


class Scalars:
    """A TensorBoard event file writer for step, epoch and sampler scalars.

    A write that fails (TensorFlow raises its own errors, e.g. ResourceExhaustedError for a
    full disk) raises `WriteError`: the run's record would be incomplete.
    """

    def __init__(self, logdir: Path):
        import tensorflow as tf

        self.tf = tf
        self.logdir = Path(logdir)
        with self._writing():
            self.writer = tf.summary.create_file_writer(str(logdir))

    @contextlib.contextmanager
    def _writing(self):
        try:
            yield
        except Exception as exc:
            raise WriteError(f"cannot write TensorBoard scalars in {self.logdir}: {reason(exc)}") from exc

    def step(self, step: int, **values) -> None:
        with self._writing(), self.writer.as_default(step=step):
            for name, value in values.items():
                self.tf.summary.scalar(f"step/{name}", value)

    def epoch(self, result: EpochResult) -> None:
        with self._writing():
            with self.writer.as_default(step=result.epoch):
                for name in ("loss", "accuracy", "val_loss", "val_accuracy", "images_per_second", "seconds"):
                    self.tf.summary.scalar(f"epoch/{name}", getattr(result, name))
            self.writer.flush()

    def system(self, sampler: str, step: int, row: dict) -> None:
        with self._writing(), self.writer.as_default(step=step):
            for name, value in row.items():
                if name != "time_s" and value == value:  # NaN means not measured
                    self.tf.summary.scalar(f"system/{sampler}/{name}", value)

    def close(self) -> None:
        with self._writing():
            self.writer.close()
