"""Where the steps of an analysis come from: a profiler trace, or a run's steps.csv.

Every source gives the same thing, a `StepSource` whose `steps` frame has one row per
step (or per call of several steps) with `step_ms = input_ms + compute_ms + host_ms`
and `compile_ms` (part of host), so the rest of the analysis never asks where the
steps came from. `kind` says how they were found, for users and scripts alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis import producers
from analysis.read import run_files
from analysis.steps.host import analyze_steps
from analysis.read.trace import Trace, TraceError, TraceNotFound, TraceUnreadable, read_trace

STEPS_CSV_COMPUTE_NOTE = ("no profiler trace: breakdown from steps.csv, where compute is the time in the step call "
                          "(the math plus tf.function dispatch); run with the profiler window for the trace's split")


@dataclass
class StepSource:
    kind: str  # how the steps were found: markers, trace_groups, program_executions, window, steps_csv
    step_name: str  # the marker or program taken as the step, or "steps.csv"
    device: str  # "cpu", "gpu", "tpu", "gpu x8", ... (from run.json for steps.csv)
    steps: pd.DataFrame
    path: Path  # the file the steps were read from
    run_dir: Path | None  # the devprof run directory it belongs to, if any
    notes: list[str] = field(default_factory=list)
    trace: Trace | None = None  # the parsed trace (None for steps.csv)
    analysis: object = None  # analysis.steps.StepAnalysis of a trace (its detected steps and spans)
    producer: str = "devprof"  # who wrote the trace (producers.program_of); steps.csv: devprof's recorder

    @property
    def steps_per_call(self) -> int:
        return int(self.steps["steps"].max()) if len(self.steps) else 1


def from_trace(trace: Trace, step_name: str | None = None) -> StepSource:
    analysis = analyze_steps(trace, step_name)
    location = trace.location
    notes = ([location.note] if location.note else []) + analysis.notes
    producer = "devprof" if location.run_dir is not None else producers.program_of(trace.events)
    return StepSource(analysis.method, analysis.step_name, analysis.device, analysis.steps, location.xplane,
                      location.run_dir, notes, trace, analysis, producer)


def steps_from_csv(steps_table: pd.DataFrame) -> pd.DataFrame:
    """steps.csv as a breakdown: compute is the time in the step call (on a CPU the math plus
    tf.function dispatch); the first call's excess over the median call is its tracing and
    compilation, reported as compile and counted in host overhead, as the trace analysis does."""
    frame = pd.DataFrame({
        "step": steps_table["step"].astype(int),
        "steps": steps_table["steps"].astype(int),
        "step_ms": steps_table["step_ms"],
        "input_ms": steps_table["input_ms"],
        "compute_ms": steps_table["call_ms"],
        "host_ms": steps_table["other_host_ms"],
        "compile_ms": 0.0,
        "collective_ms": 0.0,
        "partial": False,
    }).reset_index(drop=True)
    first = frame.index[0]
    later = frame["compute_ms"].iloc[1:]  # with one call only, its compile time cannot be told apart
    excess = max(0.0, float(frame.at[first, "compute_ms"] - later.median())) if len(later) else 0.0
    frame.loc[first, ["compute_ms", "host_ms", "compile_ms"]] = [
        frame.at[first, "compute_ms"] - excess, frame.at[first, "host_ms"] + excess, excess]
    for part in ("input", "compute", "host", "compile"):
        frame[f"{part}_pct"] = 100.0 * frame[f"{part}_ms"] / frame["step_ms"].where(frame["step_ms"] > 0)
    frame[[f"{p}_pct" for p in ("input", "compute", "host", "compile")]] = frame[
        [f"{p}_pct" for p in ("input", "compute", "host", "compile")]].fillna(0.0)
    return frame


def from_steps_csv(run_dir: Path, note: str = STEPS_CSV_COMPUTE_NOTE) -> StepSource:
    steps_csv = run_dir / run_files.STEPS_CSV
    steps_table = run_files.read_steps_csv(steps_csv)
    if steps_table.empty:
        raise TraceError(f"{run_dir} has no profiler trace and steps.csv has no steps yet")
    meta = run_files.read_run_json(run_dir / run_files.RUN_JSON)
    device = str(run_files.section(meta, "device").get("kind") or "unknown")
    return StepSource("steps_csv", "steps.csv", device, steps_from_csv(steps_table), steps_csv, run_dir, [note])


def _is_run_dir(path: Path) -> bool:
    return path.is_dir() and (path / run_files.STEPS_CSV).is_file() and (path / run_files.RUN_JSON).is_file()


def open_step_source(path: str | Path, step_name: str | None = None) -> StepSource:
    """The trace at `path`; for a run directory without a readable trace, its steps.csv.

    A trace that is there but cannot be parsed (a full disk cuts it short) is named in the
    note, never passed off as "no trace".
    """
    path = Path(path)
    try:
        return from_trace(read_trace(path), step_name)
    except TraceNotFound:
        if not _is_run_dir(path):
            raise
        return from_steps_csv(path)
    except TraceUnreadable as exc:
        if not _is_run_dir(path):
            raise
        return from_steps_csv(path, f"the profiler trace is truncated or corrupt ({exc}); breakdown from steps.csv, "
                                    "where compute is the time in the step call")
