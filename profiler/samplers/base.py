"""The sampler interface: one object per CSV, values only, no thread and no I/O.

A sampler knows *what* to read and how to turn it into numbers; `runner.SamplerThread`
decides *when* and writes the rows. Keeping `sample()` pure lets tests call it directly
with a fake backend and lets one thread loop serve every kind of sampler.
"""

from __future__ import annotations

import abc
import math

NAN = float("nan")


class Sampler(abc.ABC):
    """One source of utilization numbers, written to `utilization/<name>.csv`.

    Subclasses set `name` (the CSV stem, e.g. ``"host"``, ``"gpu0"``) and `columns` (a fixed,
    ordered list with the unit in each name, e.g. ``cpu_pct``, ``rss_bytes``, ``power_w``).
    A metric that cannot be read is NaN (an empty CSV cell), never a guess; when it is
    turned off for good the reason goes to `disabled`, so a reader can tell "zero" from
    "not measured".
    """

    name: str = "sampler"

    def __init__(self) -> None:
        self.disabled: dict[str, str] = {}
        self.notes: list[str] = []
        self._inactive_reason: str | None = None

    @property
    @abc.abstractmethod
    def columns(self) -> list[str]:
        """CSV columns after `time_s`, in order; the same for every row of a run."""

    @abc.abstractmethod
    def sample(self) -> dict[str, float]:
        """Read every column once now; unreadable values are NaN."""

    def prime(self) -> None:
        """Take baselines (CPU-time counters, byte counters) in the thread that samples.

        psutil's system CPU baseline is kept per calling thread, so the runner calls this
        from its own thread just before the first `sample()`.
        """

    def close(self) -> None:
        """Release handles (NVML, processes); safe to call more than once."""

    @property
    def active(self) -> bool:
        """False once the whole sampler has stopped for good (e.g. its GPU was lost)."""
        return self._inactive_reason is None

    def deactivate(self, reason: str) -> None:
        """Stop this sampler for good, keeping the first reason given."""
        if self._inactive_reason is None:
            self._inactive_reason = reason
            self.notes.append(reason)

    def disable(self, metric: str, reason: str) -> None:
        """Turn one metric off for the rest of the run and say why (first reason wins)."""
        if metric not in self.disabled:
            self.disabled[metric] = reason
            self.notes.append(f"{metric} disabled: {reason}")

    def status(self) -> dict:
        """What ran, what did not and why, in a JSON-ready dict for run.json."""
        return {
            "name": self.name,
            "active": self.active,
            "reason": self._inactive_reason,
            "disabled": dict(self.disabled),
            "notes": list(self.notes),
        }

    def empty_row(self) -> dict[str, float]:
        """A row with every column NaN, the start of each `sample()`."""
        return dict.fromkeys(self.columns, NAN)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def is_nan(value: object) -> bool:
    """True for NaN (and None), the marker of a value that was not measured."""
    return value is None or (isinstance(value, float) and math.isnan(value))
