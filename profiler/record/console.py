"""What a run prints while it trains: Keras-like progress and one line per epoch."""

from __future__ import annotations

import sys
import time

from models.training import EpochResult

# Where the output is not a terminal (a job scheduler's log, `| tee`) there is no progress bar:
# a line at least this often during an epoch shows the job is alive.
PROGRESS_EVERY_S = 30.0


class Console:
    """Keras-like output: a progress bar on a terminal, one line per epoch, and elsewhere a
    progress line every `progress_every_s` seconds of an epoch (`clock`: seconds, monotonic)."""

    def __init__(self, quiet: bool, stream=None, clock=time.monotonic, progress_every_s: float = PROGRESS_EVERY_S):
        self.quiet = quiet
        self.stream = stream or sys.stdout
        self.interactive = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar = None
        self.clock = clock
        self.progress_every_s = progress_every_s
        self._epoch_steps = 0
        self._epoch_began: float | None = None
        self._last_line: float | None = None

    def print(self, text: str = "") -> None:
        if not self.quiet:
            print(text, file=self.stream, flush=True)

    def warn(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def notice(self, text: str) -> None:
        """A `notice: ...` line: about the run, not its output, so on stderr (not shown with --quiet)."""
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    def epoch_begin(self, epoch: int, epochs: int, steps: int) -> None:
        if self.quiet:
            return
        self.print(f"Epoch {epoch}/{epochs}")
        self._epoch_steps = steps
        self._epoch_began = self._last_line = self.clock()
        if self.interactive:
            import keras

            self.bar = keras.utils.Progbar(steps, stateful_metrics=["loss", "accuracy"])

    def step(self, done_steps: int, loss: float, accuracy: float) -> None:
        if self.bar is not None:
            self.bar.update(done_steps, [("loss", loss), ("accuracy", accuracy)])
            return
        if self.quiet or self._last_line is None or done_steps >= self._epoch_steps:
            return  # the epoch's own line follows at once
        now = self.clock()
        if now - self._last_line >= self.progress_every_s:
            self._last_line = now
            self.print(
                f"{done_steps}/{self._epoch_steps} - {now - self._epoch_began:.0f}s - loss: {loss:.4f}"
                f" - accuracy: {accuracy:.4f}"
            )

    def epoch_end(self, r: EpochResult) -> None:
        self.bar = None
        self._last_line = None
        # A metric the run does not compute (no validation data with --dataset) is left out, not "nan".
        metrics = " - ".join(
            f"{name}: {value:.4f}"
            for name, value in (
                ("loss", r.loss),
                ("accuracy", r.accuracy),
                ("val_loss", r.val_loss),
                ("val_accuracy", r.val_accuracy),
            )
            if value == value
        )
        self.print(
            f"{r.steps}/{r.steps} - {r.seconds:.1f}s"
            + (f" - {metrics}" if metrics else "")
            + f" - {r.seconds:.2f} s/epoch - {r.images_per_second:.0f} images/s"
        )
