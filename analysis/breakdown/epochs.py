"""Whole-epoch breakdown from a run directory's `steps.csv` and `run.json` (read by `analysis.run_files`).

`steps.csv` times every training call of every epoch (input wait, step call, other
host time); `run.json` has each epoch's wall time including validation. Their
difference is epoch-level work (iterator creation, validation, checkpointing), kept
as its own line. The traced window covers a few of the same global steps, so the two
measurements are reconciled step by step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.breakdown.idle import IdleStretch, longest_idle_stretch
from analysis.read.inputs import RunInputs
from analysis.read.run_files import RunFileError, warn

# How far one steps.csv row may be off by rounding: four fields at 0.1 us (0.05 us each at most),
# with room to spare.
ROUNDING_S_PER_ROW = 1e-6


def epoch_breakdown(steps: pd.DataFrame, epochs: pd.DataFrame, source: str = "run.json") -> pd.DataFrame:
    """Per epoch: seconds split into input, step call, other host and epoch-level work.

    `epoch_level_s = seconds - sum(step_ms)/1000`; the four parts add up to `seconds`
    (when run.json lacks an epoch, `seconds` is the sum of its steps). Percentages are
    of the epoch's wall time.
    """
    sums = steps.groupby("epoch").agg(
        calls=("step", "size"),
        steps=("steps", "sum"),
        images=("images", "sum"),
        input_ms=("input_ms", "sum"),
        call_ms=("call_ms", "sum"),
        other_host_ms=("other_host_ms", "sum"),
        step_ms=("step_ms", "sum"),
    )
    frame = pd.DataFrame(index=sums.index)
    frame["calls"] = sums["calls"]
    frame["steps"] = sums["steps"]
    frame["images"] = sums["images"]
    for part in ("input", "call", "other_host", "step"):
        frame[f"{part}_s"] = sums[f"{part}_ms"] / 1000.0
    if not epochs.empty and "seconds" in epochs:
        seconds = epochs.set_index("epoch")["seconds"].astype(float)
        frame["seconds"] = seconds.reindex(frame.index)
    else:
        frame["seconds"] = np.nan
    frame["seconds"] = frame["seconds"].fillna(frame["step_s"])
    # An epoch shorter than its own steps (a clock step, a hand-edited file) would show negative
    # epoch-level work and shares over 100 %: its steps' time stands in, with a warning. Each
    # steps.csv field is rounded to 0.1 us, and `step_ms` apart from its three parts, so an
    # epoch that is exactly its steps (a whole run recorded by profile()) may read a few
    # microseconds short, and the parts may sum a little off `step_ms`: within `rounding`, not
    # worth a warning, and not a contradiction.
    rounding = ROUNDING_S_PER_ROW * (frame["calls"] + 1)
    short = frame["seconds"] < frame["step_s"] - rounding
    if short.any():
        first = frame.index[short][0]
        warn(
            f"{source}: epoch {first} lasts {frame.at[first, 'seconds']:.3g} s, less than its steps in steps.csv "
            f"({frame.at[first, 'step_s']:.3g} s){f' (and {int(short.sum()) - 1} more epochs)' if short.sum() > 1 else ''}"
            ": the steps' time is used"
        )
        frame.loc[short, "seconds"] = frame.loc[short, "step_s"]
    frame["epoch_level_s"] = (frame["seconds"] - frame["step_s"]).clip(lower=0.0)
    for part in ("input", "call", "other_host", "epoch_level"):
        frame[f"{part}_pct"] = 100.0 * frame[f"{part}_s"] / frame["seconds"]
    parts = frame[["input_s", "call_s", "other_host_s", "epoch_level_s"]].sum(axis=1)
    off = (parts - frame["seconds"]).abs() > rounding + 1e-9 * frame["seconds"]
    if off.any():
        first = frame.index[off][0]
        raise ValueError(
            f"{source}: the epochs' seconds do not add up with steps.csv (epoch {first}: parts "
            f"{parts[first]:.6f} s against {frame.at[first, 'seconds']:.6f} s, more than the "
            f"{1e6 * rounding[first]:.0f} us its rows' rounding allows)"
        )
    return frame.reset_index()


def reconcile_with_trace(trace_steps: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Trace and steps.csv side by side for the traced global steps.

    Differences are in % of the steps.csv step time, so they read as "how much of
    the step the two measurements disagree on".
    """
    merged = trace_steps[["step", "step_ms", "input_ms"]].merge(
        steps[["epoch", "step", "step_ms", "input_ms", "call_ms", "other_host_ms"]],
        on="step",
        how="inner",
        suffixes=("_trace", "_csv"),
    )
    merged["step_diff_pct"] = 100.0 * (merged["step_ms_trace"] - merged["step_ms_csv"]) / merged["step_ms_csv"]
    merged["input_diff_pct"] = 100.0 * (merged["input_ms_trace"] - merged["input_ms_csv"]) / merged["step_ms_csv"]
    return merged


@dataclass(frozen=True)
class EpochTables:
    """A run's epochs (None without steps.csv, or when run.json's epochs cannot be used), the trace
    beside steps.csv step by step (None for steps.csv's own steps), each epoch's first step's
    start on the samplers' clock, and the longest stretch outside steps where the process sat idle."""

    epochs: pd.DataFrame | None = None
    reconciliation: pd.DataFrame | None = None
    starts_s: tuple[float, ...] = ()
    idle_stretch: IdleStretch | None = None


def epoch_tables(inputs: RunInputs, trace_steps: pd.DataFrame | None) -> EpochTables:
    """The epoch tables of a run directory; `trace_steps` are the trace's steps where they come from one."""
    run, steps_table = inputs.run, inputs.steps_table
    if run is None or steps_table is None:
        return EpochTables()
    epochs = None
    try:
        epochs = epoch_breakdown(steps_table, run.epochs(), str(run.path))
    except RunFileError as exc:
        warn(f"{exc}; no epoch breakdown")  # the steps still have their breakdown
    reconciliation = reconcile_with_trace(trace_steps, steps_table) if trace_steps is not None else None
    return EpochTables(
        epochs,
        reconciliation,
        tuple(steps_table.groupby("epoch")["start_time_s"].min().tolist()),
        longest_idle_stretch(inputs.samplers, steps_table, run),
    )
