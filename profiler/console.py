"""What a run prints while it trains: Keras-like progress and one line per epoch."""

from __future__ import annotations

import sys

from models.training import EpochResult


class Console:
    """Keras-like output: a progress bar on a terminal, one line per epoch."""

    def __init__(self, quiet: bool, stream=None):
        self.quiet = quiet
        self.stream = stream or sys.stdout
        self.interactive = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar = None

    def print(self, text: str = "") -> None:
        if not self.quiet:
            print(text, file=self.stream, flush=True)

    def warn(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def epoch_begin(self, epoch: int, epochs: int, steps: int) -> None:
        if self.quiet:
            return
        self.print(f"Epoch {epoch}/{epochs}")
        if self.interactive:
            import keras

            self.bar = keras.utils.Progbar(steps, stateful_metrics=["loss", "accuracy"])

    def step(self, done_steps: int, loss: float, accuracy: float) -> None:
        if self.bar is not None:
            self.bar.update(done_steps, [("loss", loss), ("accuracy", accuracy)])

    def epoch_end(self, r: EpochResult) -> None:
        self.bar = None
        self.print(f"{r.steps}/{r.steps} - {r.seconds:.1f}s - loss: {r.loss:.4f} - accuracy: {r.accuracy:.4f}"
                   f" - val_loss: {r.val_loss:.4f} - val_accuracy: {r.val_accuracy:.4f}"
                   f" - {r.seconds:.2f} s/epoch - {r.images_per_second:.0f} images/s")
