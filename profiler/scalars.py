"""TensorBoard scalars in the run directory: the training curves and system metrics beside the Profile tab."""

from __future__ import annotations

from pathlib import Path

from models.training import EpochResult


class Scalars:
    """A TensorBoard event file writer for step, epoch and sampler scalars."""

    def __init__(self, logdir: Path):
        import tensorflow as tf

        self.tf = tf
        self.writer = tf.summary.create_file_writer(str(logdir))

    def step(self, step: int, **values) -> None:
        with self.writer.as_default(step=step):
            for name, value in values.items():
                self.tf.summary.scalar(f"step/{name}", value)

    def epoch(self, result: EpochResult) -> None:
        with self.writer.as_default(step=result.epoch):
            for name in ("loss", "accuracy", "val_loss", "val_accuracy", "images_per_second", "seconds"):
                self.tf.summary.scalar(f"epoch/{name}", getattr(result, name))
        self.writer.flush()

    def system(self, sampler: str, step: int, row: dict) -> None:
        with self.writer.as_default(step=step):
            for name, value in row.items():
                if name != "time_s" and value == value:  # NaN means not measured
                    self.tf.summary.scalar(f"system/{sampler}/{name}", value)

    def close(self) -> None:
        self.writer.close()
