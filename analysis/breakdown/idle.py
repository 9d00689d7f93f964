"""Idle stretches outside training steps: where the process sat doing nothing, from its host sampler.

A program can sit idle between or after its steps (a thread winding down, a wait on a file or
another process) where no step and no epoch figure shows it: the wall clock runs, the CPU does
not. A sample of `host.csv` holds its value over the interval since the previous one, so a
stretch is a run of consecutive samples with the process's CPU (`proc_cpu_pct`, 100 = one core;
the machine's `cpu_pct` where the process was not sampled) under `IDLE_CPU_PCT`, less the time
of `steps.csv`'s steps; what is left and lasts more than `MIN_IDLE_S` is reported with its place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis.read.run_files import TIME_COLUMN, RunFileError, RunRecord

IDLE_CPU_PCT = 5.0
MIN_IDLE_S = 2.0
NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class IdleStretch:
    """One stretch: its start and end (Unix seconds), its length, and where it is in the run."""

    start_s: float
    end_s: float
    seconds: float
    place: str  # "after the last epoch (2)", "between steps 39 and 40", ...
    cpu_column: str  # the sampler column it was found in


def _ns(seconds) -> np.ndarray:
    return np.round(np.asarray(seconds, dtype=float) * NS_PER_S).astype(np.int64)


def idle_stretches(
    host: pd.DataFrame | None, steps: pd.DataFrame | None, epochs: pd.DataFrame | None = None
) -> list[IdleStretch]:
    """The stretches outside steps where the process was idle for more than `MIN_IDLE_S`, longest first."""
    if host is None or host.empty or TIME_COLUMN not in host:
        return []
    column = next((c for c in ("proc_cpu_pct", "cpu_pct") if c in host and host[c].notna().any()), None)
    if column is None:
        return []  # not recorded: no claim either way
    times = host[TIME_COLUMN].to_numpy(dtype=float)
    cpu = host[column].to_numpy(dtype=float)
    covers_from = np.insert(times[:-1], 0, times[0])
    low = ~np.isnan(cpu) & (cpu < IDLE_CPU_PCT)
    low[0] = False  # the first sample covers no interval
    idle = iv.union(_ns(covers_from[low]), _ns(times[low]))
    if steps is not None and not steps.empty:
        starts = steps["start_time_s"].to_numpy(dtype=float)
        idle = iv.subtract(idle, iv.union(_ns(starts), _ns(starts + steps["step_ms"].to_numpy(dtype=float) / 1e3)))
    found = [
        IdleStretch(
            s / NS_PER_S, e / NS_PER_S, (e - s) / NS_PER_S, place(s / NS_PER_S, e / NS_PER_S, steps, epochs), column
        )
        for s, e in zip(*idle)
        if e - s > MIN_IDLE_S * NS_PER_S
    ]
    return sorted(found, key=lambda stretch: -stretch.seconds)


def place(start_s: float, end_s: float, steps: pd.DataFrame | None, epochs: pd.DataFrame | None) -> str:
    """Where `[start_s, end_s)` is: before the first step, between two steps of an epoch, after an
    epoch's training steps (before its evaluation ends), between epochs, or after the last epoch."""
    if steps is None or steps.empty:
        return "in a run without recorded steps"
    ordered = steps.sort_values("start_time_s", kind="stable")
    starts = ordered["start_time_s"].to_numpy(dtype=float)
    before = int(np.searchsorted(starts, start_s, side="right")) - 1  # the last step begun before the stretch
    if before < 0:
        return f"before the first step ({int(ordered['step'].iloc[0])})"
    last = ordered.iloc[before]
    epoch = int(last["epoch"])
    if before + 1 < len(ordered) and int(ordered["epoch"].iloc[before + 1]) == epoch:
        return f"between steps {int(last['step'])} and {int(ordered['step'].iloc[before + 1])} (epoch {epoch})"
    ends = _epoch_ends(epochs)
    final = int(ordered["epoch"].max())
    if epoch in ends and start_s < ends[epoch]:
        return (
            f"after the last step of epoch {epoch} (step {int(last['step'])}), before its evaluation ends"
            if epoch < final
            else f"after the last step of the last epoch ({epoch}), before its evaluation ends"
        )
    if before + 1 < len(ordered):
        return f"between epochs {epoch} and {int(ordered['epoch'].iloc[before + 1])}"
    return f"after the last epoch ({epoch})"


def _epoch_ends(epochs: pd.DataFrame | None) -> dict[int, float]:
    """Epoch -> its end on the samplers' clock (`start_time_s + seconds`), where run.json has both."""
    if epochs is None or epochs.empty or "start_time_s" not in epochs:
        return {}
    ends = {}
    for row in epochs.itertuples(index=False):
        start, seconds = float(getattr(row, "start_time_s", math.nan)), float(getattr(row, "seconds", math.nan))
        if start == start and seconds == seconds:
            ends[int(row.epoch)] = start + seconds
    return ends


def longest_idle_stretch(
    samplers: dict[str, pd.DataFrame], steps: pd.DataFrame | None, run: RunRecord | None
) -> IdleStretch | None:
    """The longest idle stretch of a run directory (its `host` sampler, steps.csv, run.json's epochs)."""
    epochs = None
    if run is not None:
        try:
            epochs = run.epochs()
        except RunFileError:
            epochs = None  # places are then told by the steps alone
    found = idle_stretches(samplers.get("host"), steps, epochs)
    return found[0] if found else None
