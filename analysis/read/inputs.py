"""Everything one worker's analysis reads, read once: `read_inputs(path) -> RunInputs`.

A path is a trace (a file, a profile session, a log folder) or a devprof run directory. The
trace is decoded once into a `TraceView`; the run directory's files (run.json, steps.csv, the
sampler CSVs) are read once, each by its one reader in `run_files` or `run_csvs`, and the samplers'
summaries made once. No later stage opens a file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from analysis.read import run_csvs, run_files
from analysis.read.hlo_costs import hlo_costs
from analysis.read.onednn_log import ONEDNN_LOG, on_trace_clock, read_onednn_log, trace_origin_ns
from analysis.read.op_costs import read_op_costs
from analysis.read.run_files import RunFileError, RunRecord
from analysis.read.samples import summarize
from analysis.read.tf_analysis import TensorFlowAnalysis, read_tf_analysis
from analysis.read.trace import TraceNotFound, TraceUnreadable, read_trace
from analysis.read.view import TraceView

if TYPE_CHECKING:
    from analysis.parallel import Helpers


@dataclass(frozen=True)
class RunInputs:
    """One worker's files: its trace as a view (None: no readable trace) and, for a run directory,
    its run record, steps table, sampler frames and their summaries."""

    path: Path  # what was asked for
    trace: TraceView | None
    trace_error: TraceUnreadable | None = None  # a trace that is there but cannot be parsed
    run_dir: Path | None = None
    run: RunRecord | None = None
    steps_table: pd.DataFrame | None = None  # steps.csv, where the run has one
    samplers: dict[str, pd.DataFrame] = field(default_factory=dict)
    summaries: dict = field(default_factory=dict)  # {sampler: time-weighted stats}, from the CSVs or run.json
    tensorflow: TensorFlowAnalysis | None = None  # TensorFlow's own analysis written beside the trace
    op_costs: pd.DataFrame | None = None  # FLOPs and bytes per op: op_costs.csv and the trace's HLO shapes
    stated_bandwidth: float = float("nan")  # the device's memory bandwidth as the trace states it (bytes/s)
    # oneDNN's primitive executions (onednn_verbose.log) on the trace's clock (`start_ns`, `end_ns`)
    onednn: pd.DataFrame | None = None
    stated_peak_flops: float = float("nan")  # the device's peak FLOP/s as the trace states it

    @property
    def source(self) -> Path:
        """The file the steps are read from: the trace, else steps.csv."""
        if self.trace is not None and self.trace.trace.location is not None:
            return self.trace.trace.location.xplane
        return (self.run_dir or self.path) / run_files.STEPS_CSV

    def without_trace(self) -> RunInputs:
        """The same files with the trace let go (what is kept once the trace has been analysed)."""
        return RunInputs(
            self.path,
            None,
            self.trace_error,
            self.run_dir,
            self.run,
            self.steps_table,
            self.samplers,
            self.summaries,
            self.tensorflow,
            self.op_costs,
            self.stated_bandwidth,
            self.onednn,
            self.stated_peak_flops,
        )


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and (path / run_files.STEPS_CSV).is_file() and (path / run_files.RUN_JSON).is_file()


def read_inputs(path: str | Path, *, trace: bool = True, helpers: Helpers | None = None) -> RunInputs:
    """The trace at `path` and, where it lies in a devprof run directory (or `path` is one), that
    run's files. A run directory without a readable trace is analysed from its steps.csv: a
    trace that is there but cannot be parsed (a full disk cuts it short) is kept as
    `trace_error`, never passed off as no trace. `trace=False` reads only the run's files.
    `helpers`: lend the trace's decode another core (`analysis.parallel`)."""
    path = Path(path)
    view, error = None, None
    if trace:
        try:
            view = TraceView(read_trace(path, helpers))
        except TraceNotFound as exc:
            if not is_run_dir(path):
                odd = run_files.irregular_run_files(path) if path.is_dir() else []
                if odd:
                    raise TraceNotFound(f"{exc}; {', '.join(odd)}: not a regular file, not read") from None
                raise
        except TraceUnreadable as exc:
            if not is_run_dir(path):
                raise
            error = exc
    location = view.trace.location if view is not None else None
    tensorflow = read_tf_analysis(location.xplane) if location is not None else None
    run_dir = location.run_dir if location is not None else path
    if location is not None:
        _warn_irregular_run_files(location.xplane, run_dir)
    costs, bandwidth, peak = _trace_costs(view)
    if run_dir is None:
        return RunInputs(
            path, view, tensorflow=tensorflow, op_costs=costs, stated_bandwidth=bandwidth, stated_peak_flops=peak
        )
    # steps.csv first where it is the steps' source: its problems are the ones to hear first
    steps_csv = run_dir / run_files.STEPS_CSV
    steps_table = run_csvs.read_steps_csv(steps_csv) if view is None and steps_csv.is_file() else None
    try:
        record = RunRecord.read(run_dir / run_files.RUN_JSON)
    except RunFileError as exc:
        if view is None:
            raise
        run_files.warn(f"{exc}: the run's settings are not read; its trace is analysed without them")
        record = None
    samplers = run_csvs.read_utilization(run_dir)
    if steps_table is None and steps_csv.is_file():
        steps_table = run_csvs.read_steps_csv(steps_csv)
    recorded = read_op_costs(run_dir) if is_run_dir(run_dir) else None
    if recorded is not None:
        costs = recorded if costs is None else pd.concat([recorded, costs], ignore_index=True)
    return RunInputs(
        path,
        view,
        error,
        run_dir,
        record,
        steps_table,
        samplers,
        _summaries(samplers, record),
        tensorflow,
        costs,
        bandwidth,
        _onednn_executions(run_dir, view),
        peak,
    )


def _warn_irregular_run_files(xplane: Path, run_dir: Path | None) -> None:
    """One warning for each run.json or steps.csv beside the trace (its run directory, or a folder it lies
    in) that is no regular file: skipped, never in silence."""
    folders = [run_dir] if run_dir is not None else list(xplane.parents)[:5]
    for folder in folders:
        for name, kind in run_files.irregular_run_file_kinds(folder):
            run_files.warn(f"{folder / name}: {kind}, not a regular file: not read")


def _onednn_executions(run_dir: Path, view: TraceView | None) -> pd.DataFrame | None:
    """The run's oneDNN log on its trace's clock; None without a log, a trace, or the trace's start
    time (the trace's metadata is read only where a log lies beside it)."""
    if view is None or not os.path.lexists(run_dir / ONEDNN_LOG):
        return None
    executions = read_onednn_log(run_dir)
    origin = trace_origin_ns(view.trace) if executions is not None else None
    return on_trace_clock(executions, origin) if executions is not None and origin is not None else None


def _trace_costs(view: TraceView | None) -> tuple[pd.DataFrame | None, float, float]:
    """The costs of the XLA programs the trace's kernels ran (from their HLO), and the memory
    bandwidth and peak FLOP/s its busiest device plane states; each read from the file's metadata
    only where the trace has device kernels. A peak above what devprof takes from any device is a
    corrupt stat, not used."""
    nan = float("nan")
    if view is None or view.device.empty:
        return None, nan, nan
    costs = hlo_costs(view.trace) if "hlo_op" in view.device and view.device["hlo_op"].notna().any() else None
    busiest = view.device.groupby(view.device["plane_name"].astype(str), observed=True)["duration_ns"].sum()
    spec = view.device_specs.get(str(busiest.idxmax())) if not busiest.empty else None
    if spec is None:
        return costs, nan, nan
    peak = spec.peak_flops_per_second
    return costs, spec.memory_bandwidth_bytes_per_second, peak if peak <= run_files.PEAK_FLOPS_LIMIT else nan


def read_run_files(path: str | Path) -> RunInputs:
    """A run directory's files without its trace (`read_inputs(path, trace=False)`)."""
    return read_inputs(path, trace=False)


def _summaries(samplers: dict[str, pd.DataFrame], record: RunRecord | None) -> dict:
    """`{sampler: summarize(...)}`: from the CSVs, else from run.json's `samplers.summaries` (a run
    copied without its utilization folder)."""
    if samplers:
        return {name: summarize(frame) for name, frame in samplers.items()}
    summaries = record.sampler_summaries if record is not None else {}
    return {name: value for name, value in summaries.items() if isinstance(value, dict)}


__all__ = ["RunFileError", "RunInputs", "read_inputs", "read_run_files", "is_run_dir"]
