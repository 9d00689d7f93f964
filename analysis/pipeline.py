"""The one analysis pipeline: a path in, one `Analysis` out.

`analyze(path)` finds what `path` holds (a trace, a run's steps.csv, a session of several
host traces, a job of `worker-<i>/` run directories), runs the worker's straight line
(`analysis.worker`) once per worker file, and assembles a session or a job from those results
(`analysis.job`).
"""

from __future__ import annotations

from concurrent.futures import Executor
from pathlib import Path

from analysis import parallel
from analysis.breakdown import roofline
from analysis.executors import WorkerFailure
from analysis.job import _analyze_each, _analyze_job, assemble_session
from analysis.read import run_files
from analysis.read.inputs import RunInputs, read_inputs
from analysis.read.trace import TraceError
from analysis.worker import Analysis, analyze_inputs, check_step_name, checked_path


def analyze_and_read(
    path: str | Path, step_name: str | None = None, peak: roofline.Ceilings | None = None
) -> tuple[Analysis, RunInputs | None]:
    """`analyze(path)` and, for one worker's files, those files as read, trace included (for an export that
    draws the trace's events, so that it does not read them again); None for a job or a session of
    several hosts, whose workers are read one at a time by the export."""
    with parallel.Helpers() as helpers:
        return analyzed(path, step_name, peak=peak, helpers=helpers, keep=True)


def analyze(
    path: str | Path,
    step_name: str | None = None,
    processes: int | None = None,
    executor: Executor | None = None,
    peak: roofline.Ceilings | None = None,
) -> Analysis:
    """Find the steps at `path` and break them down; `step_name` (a regex) picks the marker or
    program that stands for a step. A multi-worker job or session is worker 0's breakdown
    with one row per worker and the straggler; its worker files are analysed in parallel
    processes when they are big enough to pay for it (`processes` sets how many; 1: in this one),
    or by `executor` (any `concurrent.futures.Executor`, e.g. a Dask client's `get_executor()`),
    one task per worker that sends back that worker's summary, never its events, and reads its files at
    their absolute path on this machine. `peak` gives the roofline's ceilings
    (`roofline.ceilings_from_peak`, `ceilings_from_tflops`) over the run's own."""
    with parallel.Helpers() as helpers:
        return analyzed(path, step_name, processes=processes, executor=executor, peak=peak, helpers=helpers)[0]


def analyzed(
    path: str | Path,
    step_name: str | None,
    *,
    processes: int | None = None,
    executor: Executor | None = None,
    peak: roofline.Ceilings | None = None,
    helpers: parallel.Helpers,
    keep: bool = False,
) -> tuple[Analysis, RunInputs | None]:
    """`analyze`, with the `helpers` the caller made (the command's began reading the trace and
    forked its plot helper), and with `keep` one worker's files as read (None for a job or a session)."""
    check_step_name(step_name)
    path = checked_path(path, "path")
    if executor is not None:  # its tasks may run in other folders, or on other machines
        path = path.absolute()
    if processes is not None:
        wrong = f"processes must be a whole number of processes, 1 or more (or None: devprof picks), got {processes!r}"
        if isinstance(processes, bool) or not isinstance(processes, int):
            raise TypeError(wrong)
        if processes < 1:
            raise ValueError(wrong)
    workers = run_files.worker_dirs(path) if path.is_dir() else []
    if workers and not (path / run_files.STEPS_CSV).is_file():
        helpers.core_free()  # the workers are read elsewhere
        return _analyze_job(path, workers, step_name, processes, executor, peak), None
    host_files = _session_files(path)
    if len(host_files) < 2:
        inputs = read_inputs(path, helpers=helpers)
        helpers.core_free()  # read: the core the decode used is free
        return analyze_inputs(inputs, step_name, peak, helpers), inputs if keep else None
    helpers.core_free()
    results = _analyze_each([path, *host_files[1:]], step_name, processes, executor, peak)
    chief = results[0]
    if isinstance(chief, WorkerFailure):
        raise chief.error or TraceError(chief.message)
    assert isinstance(chief, Analysis)  # the first task is the chief's: its whole analysis
    return assemble_session(chief, results[1:]), None


def _session_files(path: Path) -> tuple[Path, ...]:
    from analysis.read.trace import TraceError, locate_trace

    try:
        return locate_trace(path).host_files
    except TraceError:
        return ()
