"""An `Analysis` and the files it was made from as timelines, one per worker or host: what the Perfetto
export draws (analysis/render/perfetto.py).

The analysis keeps figures, not events: the trace's events, each device's busy spans and the
allocators' events are read again here through `analysis.read`, one worker at a time, so a job's
export holds one worker's trace at once. A job's or session's other workers are analysed again from
that same read (the job kept only their summaries). Samples are put on the trace's clock by the steps
both the trace and steps.csv hold (`utilization.trace_clock_offset_s`), as the per-step utilization is.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.breakdown.busy import busy_spans
from analysis.breakdown.utilization import trace_clock_offset_s
from analysis.read import run_files
from analysis.read.inputs import RunInputs, read_inputs
from analysis.read.run_files import TIME_COLUMN, RunFileWarning
from analysis.read.trace import TraceError
from analysis.render import perfetto
from analysis.rules import memory as memory_rules
from analysis.steps.host import steady_steps

NS_PER_US = 1000


def check_events(events: str) -> str:
    if events not in perfetto.EVENT_CHOICES:
        raise ValueError(f"events must be one of {', '.join(perfetto.EVENT_CHOICES)}, not {events!r}")
    return events


Analyse = Callable[[RunInputs], object]  # a worker's files, read once, to its Analysis (worker.analyze_inputs)


def write_perfetto(
    analysis, path: str | Path, analyse: Analyse, events: str = "ops", inputs: RunInputs | None = None
) -> perfetto.Written:
    """`analysis` as a Perfetto trace at `path` (see analysis/render/perfetto.py); `events`: the trace's
    own events beside it (`ops`, `all`, `none`); `analyse` makes the Analysis of a job's other worker
    from its files (the job kept only a summary of it); `inputs`: the analysis' own files, already read."""
    check_events(events)
    return perfetto.write(processes(analysis, analyse, events, inputs), path)


def write_runs(
    runs: Iterable[tuple[str, Callable[[], object]]], path: str | Path, analyse: Analyse, events: str = "ops"
) -> perfetto.Written:
    """Several runs' timelines in one trace, each run's processes named by the run: `runs` gives each
    run's name and how to analyse it (one at a time, so one run's trace is held at once)."""
    check_events(events)

    def each() -> Iterator[perfetto.ProcessTimeline]:
        for run, analysed in runs:
            try:
                result = analysed()
            except (TraceError, ValueError, OSError) as exc:  # the other runs are still drawn
                run_files.warn(f"{run}: not in the Perfetto trace: {exc}")
                continue
            for process in processes(result, analyse, events):
                yield replace(process, name=run if process.name == run else f"{run}: {process.name}")

    return perfetto.write(each(), path)


def processes(
    analysis, analyse: Analyse, events: str = "ops", kept: RunInputs | None = None
) -> Iterator[perfetto.ProcessTimeline]:
    """One timeline per worker (a job), host (a session of several hosts) or the one run, in order;
    `kept`: the files of `analysis` itself as already read (one worker's)."""
    for label, path, own in members(analysis):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RunFileWarning)  # said once already, by the analysis
                inputs = kept if kept is not None and own is analysis else _read(path, own)
                mine = own if own is not None else analyse(inputs)
        except (TraceError, ValueError, OSError) as exc:
            run_files.warn(f"{path}: not in the Perfetto trace: {exc}")
            continue
        if own is None and analysis.job_dir is not None:
            mine = _with_job_machine_findings(mine, analysis)
        yield timeline(_name(label, mine), mine, inputs, events)
        del inputs


# Findings about the machine, not the worker: the job judges them once, counting its own workers as the job.
MACHINE_FINDINGS = ("cpu_contention",)


def _with_job_machine_findings(worker, job):
    """A job's other worker as the job's JSON and text see it: its machine findings the job's own, so the
    job's workers are never each other's "other processes" in one view and strangers in another."""
    said = {finding["rule"]: finding for finding in job.findings if finding["rule"] in MACHINE_FINDINGS}
    kept = [finding for finding in worker.findings if finding["rule"] not in MACHINE_FINDINGS]
    return replace(worker, findings=[*kept, *said.values()])


def _name(label: str, analysis) -> str:
    """`worker-1 (host)`; one run's own host (its run directory's name without a trace)."""
    host = analysis.host
    if analysis.step_source == "steps_csv":
        device = analysis.record.device if analysis.record is not None else {}
        folder = analysis.run_dir.name if analysis.run_dir is not None else host
        host = str(device.get("host") or folder)
    return f"{label} ({host})" if label and label != host else host


def members(analysis) -> list[tuple[str, Path, object]]:
    """(label, path, its Analysis where the job kept it whole) for each worker or host to show."""
    if analysis.job_dir is not None:
        shown = {str(w) for w, status in zip(analysis.workers["worker"], analysis.workers["status"]) if status == "ok"}
        found = []
        for worker in run_files.worker_dirs(analysis.job_dir):
            index = worker.name[len(run_files.WORKER_DIR_PREFIX) :]
            if analysis.run_dir is not None and worker.resolve() == Path(analysis.run_dir).resolve():
                found.append((worker.name, worker, analysis))
            elif index in shown or worker.name in shown:
                found.append((worker.name, worker, None))
        return found
    if len(analysis.host_files) > 1:
        return [
            (Path(f).name.removesuffix(".xplane.pb"), Path(f), analysis if i == 0 else None)
            for i, f in enumerate(analysis.host_files)
        ]
    return [("", analysis.path, analysis)]


def _read(path: Path, own) -> RunInputs:
    if own is not None and own.step_source == "steps_csv":
        return read_inputs(own.run_dir or Path(path).parent, trace=False)
    return read_inputs(path)


def timeline(name: str, analysis, inputs: RunInputs, events: str = "ops") -> perfetto.ProcessTimeline:
    """One worker's timeline from its analysis and its files, read once."""
    view = inputs.trace if analysis.step_source != "steps_csv" else None
    steps = step_table(analysis, inputs)
    offset_ns = _clock_offset_ns(steps, inputs) if view is not None else 0
    shown = view.timeline_events(events) if view is not None and events != "none" else None
    return perfetto.ProcessTimeline(
        name=name,
        steps=steps,
        devices=busy_spans(view),
        findings=placed_findings(analysis, steps, view, offset_ns),
        counters=[*sampler_counters(inputs.samplers, offset_ns), *memory_counters(view)],
        events=shown,
    )


def wall_ns(seconds) -> np.ndarray:
    """Wall-clock seconds (steps.csv, the samplers: microseconds) as integer ns."""
    return np.round(np.asarray(seconds, dtype=float) * 1e6).astype(np.int64) * NS_PER_US


def step_table(analysis, inputs: RunInputs) -> pd.DataFrame:
    """The steps with their start and end in ns on the trace's clock (steps.csv's own times where the
    steps are its rows) and, for each slow step of the spread, its cause and excess."""
    steps = analysis.steps
    if "start_ns" not in steps:
        table = inputs.steps_table
        if table is None or len(table) != len(steps):
            return pd.DataFrame(columns=["step", "start_ns", "end_ns", *perfetto.STEP_ARGUMENTS])
        starts = wall_ns(table["start_time_s"].to_numpy(dtype=float))
        steps = steps.assign(
            start_ns=starts, end_ns=starts + np.round(steps["step_ms"].to_numpy(dtype=float) * 1e6).astype(np.int64)
        )
    columns = ["step", "start_ns", "end_ns", *(c for c in perfetto.STEP_ARGUMENTS if c in steps)]
    frame = steps[columns].reset_index(drop=True)
    outliers = (analysis.spread or {}).get("outliers") or []
    causes = {int(o["step"]): (o["cause"], o["excess_ms"]) for o in outliers}
    frame["cause"] = [causes.get(int(s), (None, math.nan))[0] for s in frame["step"]]
    frame["excess_ms"] = [causes.get(int(s), (None, math.nan))[1] for s in frame["step"]]
    return frame


def _clock_offset_ns(steps: pd.DataFrame, inputs: RunInputs) -> int:
    """The samplers' clock minus the trace's, in ns (0 where no step is in both: TensorFlow's trace
    clock is the wall clock)."""
    table = inputs.steps_table
    if table is None or steps.empty:
        return 0
    offset = trace_clock_offset_s(steps, table.drop_duplicates("step").set_index("step"))
    return int(round(offset * 1e9)) if offset is not None else 0


def placed_findings(analysis, steps: pd.DataFrame, view, offset_ns: int) -> list[dict]:
    """The findings, each with `at_ns`: the idle stretch's start, the peak of the allocator a memory
    finding names, else the first steady step's start (what the findings are measured over)."""
    if not analysis.findings:
        return []
    steady = steady_steps(analysis.steps) if not analysis.steps.empty else analysis.steps
    first = steps.loc[steps["step"].isin(steady["step"]), "start_ns"] if not steps.empty else pd.Series(dtype="int64")
    default = int(first.min()) if len(first) else (int(steps["start_ns"].min()) if not steps.empty else 0)
    facts = analysis.facts
    origin = view.window[0] if view is not None else None
    out = []
    for finding in analysis.findings:
        at = default
        rule = finding.get("rule")
        if rule == "idle_stretch" and facts.idle_stretch is not None:
            at = int(wall_ns(facts.idle_stretch.start_s)) - offset_ns
        elif origin is not None and rule in _MEMORY_PEAK:
            peak = _MEMORY_PEAK[rule](facts)
            if peak is not None:
                at = origin + int(round(peak.peak_time_ms * 1e6))
        out.append({**finding, "at_ns": at})
    return out


_MEMORY_PEAK = {
    "memory_near_capacity": memory_rules.near_capacity,
    "memory_fragmentation": memory_rules.fragmented,
    "memory_one_holder": lambda facts: (memory_rules.one_holder(facts) or (None,))[0],
}


def _unit(column: str) -> str:
    return "bytes" if column.endswith("_bytes") else "%" if column.endswith("_pct") else ""


def sampler_counters(samplers: dict[str, pd.DataFrame], offset_ns: int = 0) -> list[perfetto.Counter]:
    """A counter per sampler column (every number but the time), its samples on the trace's clock;
    a sample with no value is left out (not recorded, not zero)."""
    counters = []
    for name, frame in samplers.items():
        if TIME_COLUMN not in frame:
            continue
        times = wall_ns(frame[TIME_COLUMN].to_numpy(dtype=float)) - offset_ns
        for column in frame.columns:
            if column == TIME_COLUMN or not pd.api.types.is_numeric_dtype(frame[column]):
                continue
            values = frame[column].to_numpy(dtype=float)
            present = ~np.isnan(values)
            if present.any():
                counters.append(perfetto.Counter(f"{name} {column}", _unit(column), times[present], values[present]))
    return counters


def memory_counters(view) -> list[perfetto.Counter]:
    """Bytes in use per allocator after each of its events (the trace's own clock)."""
    memory = view.memory if view is not None else None
    if memory is None or memory.empty:
        return []
    counters = []
    for allocator, events in memory.groupby(memory["allocator"].astype(str), sort=True):
        values = events["bytes_in_use"].to_numpy(dtype=float)
        present = ~np.isnan(values)
        if present.any():
            counters.append(
                perfetto.Counter(
                    f"{allocator} bytes in use",
                    "bytes",
                    events["start_ns"].to_numpy(dtype=np.int64)[present],
                    values[present],
                )
            )
    return counters
