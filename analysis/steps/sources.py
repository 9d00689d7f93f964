"""Where the steps of an analysis come from: a profiler trace, or a run's steps.csv.

Every source gives the same thing, a `StepSource` whose `steps` frame has one row per
step (or per call of several steps) with `step_ms = input_ms + compute_ms + host_ms`
and `compile_ms` (part of host), so the rest of the analysis never asks where the
steps came from. `kind` says how they were found, for users and scripts alike.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from analysis.read.inputs import RunInputs
from analysis.read.trace import TraceError
from analysis.read.view import TraceView
from analysis.steps.detection import detect_steps
from analysis.steps.host import analyze_steps
from analysis.steps.recorded import DetectedSteps

STEPS_CSV_COMPUTE_NOTE = (
    "no profiler trace: breakdown from steps.csv, where compute is the time in the step call "
    "(the math plus tf.function dispatch); run with the profiler window for the trace's split"
)


@dataclass(frozen=True)
class StepSource:
    kind: str  # how the steps were found: markers, trace_groups, program_executions, window, steps_csv
    step_name: str  # the marker or program taken as the step, or "steps.csv"
    device: str  # "cpu", "gpu", "tpu", "gpu x8", ... (from run.json for steps.csv)
    steps: pd.DataFrame
    path: Path  # the file the steps were read from
    notes: tuple[str, ...] = ()
    detected: DetectedSteps | None = None  # how a trace's steps were found (None for steps.csv)
    producer: str = "devprof"  # who wrote the trace (TraceView.producer); steps.csv: devprof's recorder
    python_iterator: bool = False  # the loop's input came from a Python iterator only steps.csv timed

    @property
    def steps_per_call(self) -> int:
        return int(self.steps["steps"].max()) if len(self.steps) else 1

    @property
    def basis(self) -> str:
        """ "device" when the steps are the device's own (its Steps line, its programs), else "host"."""
        from_device = (
            self.detected is not None
            and self.detected.spans.empty
            and self.kind in ("trace_groups", "program_executions")
        )
        return "device" if from_device else "host"


def find_steps(inputs: RunInputs, step_name: str | None = None) -> StepSource:
    """The steps of one worker: from its trace, else from its run's steps.csv."""
    if inputs.trace is not None:
        source = from_trace(inputs.trace, inputs.run_dir is not None, step_name)
        return (
            replace(source, producer=recording_program(inputs.run, inputs.trace.producer))
            if inputs.run_dir is not None
            else source
        )
    note = STEPS_CSV_COMPUTE_NOTE
    unwritten = trace_write_failure(inputs.run)
    if inputs.trace_error is not None:
        note = (
            f"the profiler trace is truncated or corrupt ({inputs.trace_error}); breakdown from steps.csv, "
            "where compute is the time in the step call"
        )
    elif unwritten is not None:
        note = f"{unwritten}; breakdown from steps.csv, where compute is the time in the step call"
    if inputs.steps_table is None or inputs.steps_table.empty:
        status = inputs.run.status if inputs.run is not None else None
        lost = inputs.run.ended_unrecorded if inputs.run is not None else None
        what = (
            f"no steps (the run ended without recording its end: {lost})"
            if lost
            else "no steps yet (the run is still running)"
            if status == "running"
            else f"no steps (no usable rows; run.json status {status!r})"
            if status
            else "no steps (no usable rows)"
        )
        none = f"no profiler trace ({unwritten})" if unwritten else "no profiler trace"
        if inputs.steps_table is None:
            raise TraceError(f"{inputs.run_dir} has {none} and no steps.csv")
        raise TraceError(f"{inputs.run_dir} has {none} and steps.csv has {what}")
    device = str((inputs.run.device if inputs.run is not None else {}).get("kind") or "unknown")
    return StepSource(
        "steps_csv",
        "steps.csv",
        device,
        steps_from_csv(inputs.steps_table),
        inputs.source,
        (note,),
        producer=recording_program(inputs.run, "unknown"),
    )


def trace_write_failure(run) -> str | None:
    """What run.json says of a profiler window whose trace could not be written (a full disk), or
    None: such a run had its window, and the reason is what to show, not a hint to trace it."""
    profiler = run.profiler if run is not None else {}
    error = profiler.get("trace_error")
    partial = profiler.get("partial_trace")
    if not error and not partial and profiler.get("trace_complete") is not False:
        return None
    kept = f"; the part written is set aside as {partial}" if isinstance(partial, str) and partial else ""
    if isinstance(error, str) and error:
        return f"the profiler window ran but its trace could not be written ({_one_line(error)}){kept}"
    # Runs recorded before `trace_error`, or a trace that vanished: the profiler's warning says why.
    said = next((w for w in profiler.get("warnings") or () if isinstance(w, str) and "trace" in w), None)
    return (
        f"the profiler window ran but left no readable trace ({_one_line(said or 'run.json does not say why')}){kept}"
    )


def _one_line(text: str, limit: int = 300) -> str:
    """run.json's words, as one line of bounded length (the file may come from anywhere)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def recording_program(run, trace_producer: str) -> str:
    """Which program a run directory recorded, so advice speaks its language: `devprof` (devprof run,
    whose flags apply), `keras` (`profiler.KerasCallback` in `fit`), or a custom loop under
    `profiler.profile()` (`tensorflow`, or what its trace shows: `keras`, `jax`)."""
    raw = run.raw if run is not None else {}
    if raw.get("recorded_by") is None:
        return "devprof"
    if (run.config or {}).get("program") == "keras_fit":
        return "keras"
    return trace_producer if trace_producer in ("keras", "jax") else "tensorflow"


def from_trace(view: TraceView, in_run_dir: bool, step_name: str | None = None) -> StepSource:
    detected = detect_steps(view, step_name)
    analysis = analyze_steps(view, detected)
    location = view.trace.location
    notes = ([location.note] if location is not None and location.note else []) + analysis.notes
    producer = "devprof" if in_run_dir else view.producer
    return StepSource(
        analysis.method,
        analysis.step_name,
        analysis.device,
        analysis.steps,
        location.xplane if location is not None else Path("<memory>"),
        tuple(notes),
        detected,
        producer,
    )


def steps_from_csv(steps_table: pd.DataFrame) -> pd.DataFrame:
    """steps.csv as a breakdown: compute is the time in the step call (on a CPU the math plus
    tf.function dispatch); the first call's excess over the median call is its tracing and
    compilation, reported as compile and counted in host overhead, as the trace analysis does."""
    frame = pd.DataFrame(
        {
            "step": steps_table["step"].astype(int),
            "steps": steps_table["steps"].astype(int),
            "step_ms": steps_table["step_ms"],
            "input_ms": steps_table["input_ms"],
            "compute_ms": steps_table["call_ms"],
            "host_ms": steps_table["other_host_ms"],
            "compile_ms": 0.0,
            "collective_ms": 0.0,
            "between_steps_ms": 0.0,  # steps.csv's steps follow one another
            "partial": False,
        }
    ).reset_index(drop=True)
    first = frame.index[0]
    later = frame["compute_ms"].iloc[1:]  # with one call only, its compile time cannot be told apart
    excess = max(0.0, float(frame.at[first, "compute_ms"] - later.median())) if len(later) else 0.0
    frame.loc[first, ["compute_ms", "host_ms", "compile_ms"]] = [
        frame.at[first, "compute_ms"] - excess,
        frame.at[first, "host_ms"] + excess,
        excess,
    ]
    for part in ("input", "compute", "host", "compile"):
        frame[f"{part}_pct"] = 100.0 * frame[f"{part}_ms"] / frame["step_ms"].where(frame["step_ms"] > 0)
    frame[[f"{p}_pct" for p in ("input", "compute", "host", "compile")]] = frame[
        [f"{p}_pct" for p in ("input", "compute", "host", "compile")]
    ].fillna(0.0)
    return frame
