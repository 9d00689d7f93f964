"""The one analysis pipeline: a path in, one `Analysis` out.

`analyze(path)` finds what `path` holds (a trace, a run's steps.csv, a session of several
host traces, a job of `worker-<i>/` run directories), runs `analyze_worker` once per
worker file, and assembles the job from those results without analysing anything twice:

    step source -> steady steps -> mean -> device rows, ops, input stages, trace facts
    -> one `Facts` (`rules.facts_from`) -> verdict and findings

Render modules (`analysis.render`) only format an `Analysis`; nothing here prints.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import os
import re
import re._constants as re_constants  # the parsed form of a pattern: to refuse a nested repeat
import re._parser as re_parser
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pandas as pd

from analysis import executors
from analysis.breakdown import cluster, onednn, roofline, utilization
from analysis.breakdown import memory as memory_breakdown
from analysis.breakdown.devices import device_table
from analysis.breakdown.eager import EagerOps, eager_ops, tf_eager_shares
from analysis.breakdown.epochs import epoch_tables
from analysis.breakdown.input_parts import mean_input_parts, split_input
from analysis.breakdown.input_stages import STAGE_COLUMNS, InputStages, input_stages, stage_times
from analysis.breakdown.memory import MemoryReport, WorkerMemory, memory_report
from analysis.breakdown.ops import OP_COLUMNS, OP_KEYS, op_table
from analysis.breakdown.spread import spread
from analysis.breakdown.workers import WORKER_KEYS, worker_row
from analysis.executors import WorkerFailure
from analysis.read import forked, run_files
from analysis.read.inputs import RunInputs, read_inputs
from analysis.read.run_files import RunRecord
from analysis.read.trace import TraceError
from analysis.read.view import TraceView
from analysis.render import Rendered
from analysis.rules import straggler as straggler_rule
from analysis.rules import table as rules
from analysis.rules import xprof as xprof_rules
from analysis.rules.facts import Facts, trace_facts, worker_facts
from analysis.rules.second_opinion import SecondOpinion, second_opinion
from analysis.rules.xprof import XProfReading
from analysis.steps.host import choose_steps, one_step_capture, per_call_host_ms, steady_steps
from analysis.steps.sources import find_steps


@dataclass(frozen=True)
class Analysis(Rendered):
    """Everything `devprof analyze` reports about one trace, run directory or job.

    Tables are DataFrames with units in their column names (`step_ms`, `compute_pct`);
    `mean`, `verdict`, `findings`, `straggler` and `utilization` have the shapes of the JSON
    keys of the same names (docs/json.md)."""

    KIND: ClassVar[str] = "analysis"
    path: Path  # the file the steps were read from
    step_source: str  # markers | trace_groups | program_executions | window | steps_csv
    step_name: str
    device: str  # cpu, gpu, tpu, "gpu x8", ...
    producer: str  # who wrote the trace (analysis.producers.program_of)
    host: str  # the traced host's name (the file's stem where the trace names none)
    host_files: tuple[Path, ...]  # every host trace of the session, this one first (empty: steps.csv)
    notes: tuple[str, ...]
    steps: pd.DataFrame  # one row per step (or call of several steps)
    steps_per_call: int
    mean: dict[str, float]  # over the steady steps
    steps_used: int
    verdict: dict
    findings: list[dict]
    facts: Facts
    devices: pd.DataFrame  # one row per GPU/TPU plane
    kernel_launch: dict | None
    workers: pd.DataFrame  # one row per worker (empty for one)
    straggler: dict | None
    ops: pd.DataFrame
    input_stages: pd.DataFrame
    utilization: dict[str, float]  # the sampler headline (time-weighted means, peaks)
    utilization_evidence: dict[str, float]  # the verdict's utilization numbers
    epochs: pd.DataFrame | None = None  # from steps.csv and run.json
    reconciliation: pd.DataFrame | None = None  # trace vs steps.csv
    samplers: dict[str, pd.DataFrame] = field(default_factory=dict)
    epoch_starts_s: tuple[float, ...] = ()
    run_dir: Path | None = None
    job_dir: Path | None = None  # a multi-worker run: the job's folder (the breakdown is worker 0's)
    record: RunRecord | None = None  # run.json, where there is one
    straggler_reason: str | None = None  # why no straggler is named, with several workers
    worker_steps: pd.DataFrame | None = None  # several workers: each one's steady steps (breakdown/cluster.py)
    slowest_workers: list[dict] = field(default_factory=list)  # several workers: the highest straggler scores
    worker_distribution: dict | None = None  # several workers: p50, p90, max of step time across them
    tensorflow: SecondOpinion | None = None  # TensorFlow's own analysis beside the trace, beside devprof's figures
    roofline: dict | None = None  # ceilings, FLOPs per step and MFU from the ops' costs (docs/json.md `roofline`)
    spread: dict | None = None  # the steady steps' median, p90 and slow steps with their cause (docs/json.md `spread`)
    memory: MemoryReport | None = None  # each allocator's peak, what held it, the batch headroom (docs/json.md `memory`)

    @property
    def eager(self) -> EagerOps | None:
        """Ops executed eagerly in the steady steps (None: none, or no trace)."""
        return self.facts.eager

    @property
    def run(self) -> dict:
        """run.json as read (empty without one)."""
        return self.record.raw if self.record is not None else {}

    @property
    def input_bottleneck(self) -> dict | None:
        """The slowest tf.data stage when the steps wait for it (the host's wait is input-bound or one of
        the verdict's fixes, material and explained by the stage's own time), else None."""
        waits = self.verdict.get("bound") == "input" or any(
            fix["rule"] == "input_wait" for fix in self.verdict.get("fixes") or ())
        if not waits or self.input_stages.empty or not rules.pipeline_is_the_cause(self.facts):
            return None
        slowest = self.input_stages.iloc[0]
        return {"stage": str(slowest["stage"]), "ms_per_batch": float(slowest["ms_per_batch"])}

    @property
    def out_dir(self) -> Path | None:
        """Where `devprof analyze` writes its files by default: `<run>/analysis`."""
        folder = self.job_dir or self.run_dir
        return folder / "analysis" if folder is not None else None

    def write(self, out_dir: str | Path, plotter=None) -> list[Path]:
        """CSVs, plots, report.md and analysis.json under `out_dir` (`plotter`: `outputs.write_outputs`)."""
        from analysis.render import outputs

        return outputs.write_outputs(self, out_dir, plotter)

    def to_perfetto(self, path: str | Path, events: str = "ops", step_name: str | None = None) -> Path:
        """The analysis as a Perfetto trace at `path` (ui.perfetto.dev opens it): one process per worker
        or host with its steps and their parts, devices' busy and idle spans, findings, sampler and
        allocator counters, and the trace's own events (`events`: `ops`, `all` or `none`); the trace
        files are read again. `step_name`: as given to `analyze`, for a job's other workers."""
        return write_perfetto(self, path, events, step_name).path


def write_perfetto(analysis: Analysis, path: str | Path, events: str = "ops", step_name: str | None = None,
                   inputs: RunInputs | None = None):
    """`Analysis.to_perfetto`, returning what the trace holds (`analysis.render.perfetto.Written`); `inputs`:
    the analysis' own files as `analyze_and_read` kept them, not read again."""
    from analysis import timeline

    return timeline.write_perfetto(analysis, path, functools.partial(analyze_inputs, step_name=step_name), events,
                                   inputs)


def analyze_and_read(path: str | Path, step_name: str | None = None, peak: roofline.Ceilings | None = None,
                     after_read: Callable[[], object] | None = None) -> tuple[Analysis, RunInputs | None]:
    """`analyze(path)` and, for one worker's files, those files as read, trace included (for an export that
    draws the trace's events, so that it does not read them again); None for a job or a session of
    several hosts, whose workers are read one at a time by the export."""
    return _analyzed(path, step_name, None, None, peak, keep=True, after_read=after_read)


def analyze(path: str | Path, step_name: str | None = None, processes: int | None = None,
            executor: Executor | None = None, peak: roofline.Ceilings | None = None,
            after_read: Callable[[], object] | None = None) -> Analysis:
    """Find the steps at `path` and break them down; `step_name` (a regex) picks the marker or
    program that stands for a step. A multi-worker job or session is worker 0's breakdown
    with one row per worker and the straggler; its worker files are analysed in parallel
    processes when they are big enough to pay for it (`processes` sets how many; 1: in this one),
    or by `executor` (any `concurrent.futures.Executor`, e.g. a Dask client's `get_executor()`),
    one task per worker that sends back that worker's summary, never its events, and reads its files at
    their absolute path on this machine. `peak` gives the roofline's ceilings
    (`roofline.ceilings_from_peak`, `ceilings_from_tflops`) over the run's own. `after_read()` is called
    once one worker's files are read, before they are analysed (for a job or a session: before its workers
    are); the command starts its plot process there, on the core the reading used."""
    return _analyzed(path, step_name, processes, executor, peak, after_read=after_read)[0]


def _analyzed(path: str | Path, step_name: str | None, processes: int | None, executor: Executor | None,
              peak: roofline.Ceilings | None, keep: bool = False,
              after_read: Callable[[], object] | None = None) -> tuple[Analysis, RunInputs | None]:
    """`analyze`, and with `keep` one worker's files as read (None for a job or a session)."""
    read = after_read or (lambda: None)
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
        read()
        return _analyze_job(path, workers, step_name, processes, executor, peak), None
    host_files = _session_files(path)
    if len(host_files) < 2:
        inputs = read_inputs(path)
        read()
        return analyze_inputs(inputs, step_name, peak), inputs if keep else None
    read()
    results = _analyze_each([path, *host_files[1:]], step_name, processes, executor, peak)
    chief = results[0]
    if isinstance(chief, WorkerFailure):
        raise chief.error or TraceError(chief.message)
    assert isinstance(chief, Analysis)  # the first task is the chief's: its whole analysis
    return assemble_session(chief, results[1:]), None


# Events from which a trace's tf.data stages and eager execution are analysed by a forked child
# (`forked.Beside`): below, the fork costs more than it saves.
BESIDE_MIN_EVENTS = 1 << 18
# A process pool pays for itself once a worker's trace takes a second or more to analyse (about 4 MB).
POOL_MIN_TRACE_BYTES = 4 * 2**20
# Peak memory of reading and analysing a trace, per byte of .xplane.pb: measured 13x with the wide
# events table, 6.5-8x with the narrow one (BENCHMARKS.md); kept high so a pool never swaps.
MEMORY_PER_TRACE_BYTE = 16


def _session_files(path: Path) -> tuple[Path, ...]:
    from analysis.read.trace import TraceError, locate_trace

    try:
        return locate_trace(path).host_files
    except TraceError:
        return ()


def _trace_bytes(path: Path) -> int:
    files = [path] if path.is_file() else list(path.rglob("*.xplane.pb"))
    sizes = []
    for file in files:  # a dangling link or an unreadable file elsewhere in the folder is not this work's
        try:
            sizes.append(file.stat().st_size)
        except OSError:
            continue
    return max(sizes, default=0)


def pool_size(paths: list[Path], processes: int | None = None) -> int:
    """Processes to analyse `paths` with: bounded by the cores and by the memory each trace needs."""
    if processes is not None:
        return max(1, min(int(processes), len(paths)))
    biggest = max((_trace_bytes(Path(p)) for p in paths), default=0)
    if len(paths) < 2 or biggest < POOL_MIN_TRACE_BYTES:
        return 1
    import os

    import psutil

    by_memory = int(psutil.virtual_memory().available // (MEMORY_PER_TRACE_BYTE * biggest))
    return max(1, min(len(paths), os.cpu_count() or 1, by_memory))


def _analyze_each(paths: list[Path], step_name: str | None, processes: int | None,
                  executor: Executor | None = None, peak: roofline.Ceilings | None = None) -> list[Summarised]:
    """Each worker's task result, in order: the first worker's `Analysis` (its breakdown is the job's),
    a `WorkerSummary` of each other one, or why it could not be analysed."""
    calls = [(p, step_name, i == 0, peak) for i, p in enumerate(paths)]
    if executor is not None:
        return executors.run_all(worker_summary, calls, executor)
    count = pool_size(paths, processes)
    if count <= 1:
        return executors.run_all(worker_summary, calls, None)
    with executors.local_pool(count) as pool:
        return executors.run_all(worker_summary, calls, pool)


# The steady steps' columns the job reads: the workers table and straggler rule (each part's mean and
# spread), and the job's steps table (straggler scores, clock offsets, the heat map).
SUMMARY_STEP_COLUMNS = ("step", "step_ms", "input_ms", "compute_ms", "host_ms", "collective_ms", "end_ns")


@dataclass(frozen=True)
class WorkerSummary:
    """What a job keeps of a worker whose breakdown it does not show: a few columns of its steady
    steps, its means, utilization and host, and its notes; a task sends back this instead of the
    worker's `Analysis`, so the client's memory grows by little more than each worker's steps."""

    path: Path
    step_source: str
    host: str  # the traced host's name
    run_host: str | None  # run.json's device.host
    mean: dict[str, float]
    steady: pd.DataFrame  # SUMMARY_STEP_COLUMNS of its steady steps (those it has)
    utilization: dict[str, float]
    notes: tuple[str, ...]
    memory: WorkerMemory | None = None  # its allocators' peaks (None: none traced)

    @classmethod
    def of(cls, analysis: Analysis) -> WorkerSummary:
        steady = steady_steps(analysis.steps)
        device = analysis.record.device if analysis.record is not None else {}
        memory = analysis.memory
        return cls(path=analysis.path, step_source=analysis.step_source, host=analysis.host,
                   run_host=str(device["host"]) if device.get("host") else None, mean=analysis.mean,
                   steady=steady[[c for c in SUMMARY_STEP_COLUMNS if c in steady]].reset_index(drop=True),
                   utilization=analysis.utilization, notes=analysis.notes,
                   memory=WorkerMemory(None, memory.allocators, memory.steps) if memory and memory.allocators else None)


Summarised = Analysis | WorkerSummary | WorkerFailure


def _summary(result: Analysis | WorkerSummary) -> WorkerSummary:
    return result if isinstance(result, WorkerSummary) else WorkerSummary.of(result)


def worker_summary(path: Path, step_name: str | None = None, chief: bool = False,
                   peak: roofline.Ceilings | None = None) -> Summarised:
    """One task of a job: the chief's whole analysis, a `WorkerSummary` of any other worker, or why
    its files could not be analysed."""
    try:
        result = analyze_worker(path, step_name, peak)
    except (TraceError, ValueError, OSError) as exc:
        return WorkerFailure(Path(path), str(exc).splitlines()[0] if str(exc) else type(exc).__name__, exc)
    return result if chief else WorkerSummary.of(result)


def _with_chief(paths: list[Path], results: list[Summarised], step_name: str | None, executor: Executor | None,
                peak: roofline.Ceilings | None) -> list[Summarised]:
    """`results` with the first analysed worker's whole `Analysis`: when the first worker could not be
    analysed, the next one that was is analysed again in full (once, on `executor` when given)."""
    results = list(results)
    for i, result in enumerate(results):
        if isinstance(result, Analysis):
            break
        if isinstance(result, WorkerSummary):
            call = (paths[i], step_name, True, peak)
            results[i] = executors.run_all(worker_summary, [call], executor)[0]
            if isinstance(results[i], Analysis):
                break
    return results


def checked_path(path, name: str) -> Path:
    """`path` as a Path; a TypeError naming the argument when it is no str or os.PathLike of one
    (None, bytes, a number) instead of the error a Path raises about itself."""
    if isinstance(path, str) or (isinstance(path, os.PathLike) and isinstance(os.fspath(path), str)):
        return Path(path)
    raise TypeError(f"{name} must be a path (str or pathlib.Path), got {type(path).__name__} {path!r}"[:200])


def check_step_name(step_name: str | None) -> None:
    """A ValueError naming `step_name` when it is not a regular expression (re.error is not one)."""
    if step_name is None:
        return
    if not isinstance(step_name, str):
        raise TypeError(f"step_name must be a regular expression (str) or None, got {type(step_name).__name__}")
    try:
        parsed = re_parser.parse(step_name)
        re.compile(step_name)
    except (re.error, TypeError, OverflowError, RecursionError) as exc:
        raise ValueError(f"step_name {step_name!r} is not a regular expression: {exc}") from None
    if _nested_repeat(parsed):
        # `(a+)+b` against a long name backtracks for hours; a step's name never needs one
        raise ValueError(f"step_name {step_name!r} repeats a repetition (such as `(a+)+`), which can take exponential "
                         "time to match: write it without the nested repeat")


_REPEATS = {re_constants.MAX_REPEAT, re_constants.MIN_REPEAT, getattr(re_constants, "POSSESSIVE_REPEAT", None)}


def _nested_repeat(parsed, inside: bool = False) -> bool:
    """Whether a parsed pattern has a repeat (of more than one item), or a choice between equal branches,
    inside another repeat: what makes a backtracking match take exponential time."""
    for op, value in parsed:
        if op in _REPEATS:
            low, high, item = value
            if inside and high != 1:
                return True
            if _nested_repeat(item, inside or high > 1):
                return True
        elif op is re_constants.SUBPATTERN:
            if _nested_repeat(value[-1], inside):
                return True
        elif op is re_constants.BRANCH:
            branches = [str(list(branch)) for branch in value[1]]
            if inside and len(set(branches)) < len(branches):  # `(b|b)*`: two ways to match each repeat
                return True
            if any(_nested_repeat(branch, inside) for branch in value[1]):
                return True
    return False


def analyze_worker(path: str | Path, step_name: str | None = None, peak: roofline.Ceilings | None = None) -> Analysis:
    """One trace file or run directory, on its own (pure: reads files, returns the result)."""
    check_step_name(step_name)
    return analyze_inputs(read_inputs(checked_path(path, "path")), step_name, peak)


def analyze_inputs(inputs: RunInputs, step_name: str | None = None, peak: roofline.Ceilings | None = None) -> Analysis:
    """The analysis of one worker's files, read once: each stage a function of typed values."""
    view, run = inputs.trace, inputs.run
    with _stages_and_eager(view) as beside:  # forked first: part of its work needs no steps
        source = split_input(view, find_steps(inputs, step_name), inputs.steps_table)
        chosen = choose_steps(source.steps)
        beside.give(chosen.used)
        epochs = epoch_tables(inputs, source.steps if source.kind != "steps_csv" else None)
        steps, utilization_note = utilization.steps_with_utilization(source.steps, inputs.steps_table,
                                                                     inputs.samplers, source.kind == "steps_csv")
        devices = device_table(view, source.steps, chosen.used, source.step_name)
        ops, roof = _ops_on_the_roofline(inputs, chosen.used, source.device, peak)
        memory = memory_report(inputs, source.steps)
        stages, eager = beside.result()
    machine, evidence = utilization.headline(inputs.summaries), utilization.evidence(inputs.summaries)
    mean = {**chosen.mean, **mean_input_parts(chosen.steady), "device_step_ms": devices.busiest_step_ms}
    facts = worker_facts(mean, source, run, machine, trace_facts(view, source.steps, devices.rows, stages.prefetches),
                         devices, stages.slowest, ops, eager, epochs.idle_stretch, roof,
                         *_measured_matrix_ceilings(inputs, peak), traced_steps=len(source.steps), memory=memory,
                         host_per_call_ms=per_call_host_ms(chosen.steady), xprof=_xprof_reading(inputs))
    verdict = rules.make_verdict(mean, facts, steps_used=len(chosen.steady), compile_steps=chosen.compile_steps,
                                 utilization=evidence, min_steps=_min_steps(source))
    verdict["step_basis"] = source.basis
    tf = second_opinion(inputs.tensorflow, mean, source.kind, source.step_name, len(chosen.steady), devices.rows)
    notes = (*source.notes, *([utilization_note] if utilization_note else []), *_run_notes(run), *devices.notes,
             *([tf.note] if tf is not None and tf.note else []))
    host = view.hostnames[0] if view is not None and view.hostnames else source.path.name.removesuffix(".xplane.pb")
    return Analysis(
        path=source.path, step_source=source.kind, step_name=source.step_name, device=source.device,
        producer=source.producer, host=host, host_files=_host_files(view),
        notes=notes, steps=steps, steps_per_call=source.steps_per_call, mean=mean, steps_used=len(chosen.steady),
        verdict=verdict, findings=rules.findings(facts), facts=facts, devices=devices.rows, memory=facts.memory,
        kernel_launch=devices.kernel_launch, workers=pd.DataFrame(columns=WORKER_KEYS), straggler=None, ops=ops,
        input_stages=stages.table, utilization=machine, utilization_evidence=evidence, epochs=epochs.epochs,
        reconciliation=epochs.reconciliation, samplers=inputs.samplers, epoch_starts_s=epochs.starts_s,
        run_dir=inputs.run_dir, record=run, tensorflow=tf, roofline=roof, spread=spread(chosen.steady, devices.work))


def _xprof_reading(inputs: RunInputs) -> XProfReading | None:
    """XProf's Overview reading where TensorFlow wrote XProf's analysis beside the trace at capture."""
    tf = inputs.tensorflow
    return xprof_rules.reading(tf.input_pct, tf.statement) if tf is not None else None


def _host_files(view: TraceView | None) -> tuple[Path, ...]:
    location = view.trace.location if view is not None else None
    return location.host_files if location is not None else ()


def _stages_and_eager(view: TraceView | None) -> forked.Beside[tuple[InputStages, EagerOps | None]]:
    """The tf.data stages and eager execution of the steps `give`n (the steady ones), analysed by a child
    forked before they are found (their parts that need no steps, a sixth of the analysis of a large
    trace, begin at once) while this process finds the steps and does the rest, on the other core."""
    fork = view is not None and len(view.events) >= BESIDE_MIN_EVENTS and forked.can_fork() and not forked.without("stages")

    def work(given) -> tuple[InputStages, EagerOps | None]:
        if view is None:
            return InputStages(pd.DataFrame(columns=STAGE_COLUMNS), None, None), eager_ops(view, given())
        # In the child, what needs no steps first, while this process finds them; here, only what is used.
        times = stage_times(view) if fork and not view.stages.empty else None
        shares = tf_eager_shares(view) if fork and not view.host.empty else None
        used = given()
        return input_stages(view, used, times), eager_ops(view, used, shares)

    return forked.Beside(work, fork=fork)


def _ops_on_the_roofline(inputs: RunInputs, used: pd.DataFrame, device: str, peak: roofline.Ceilings | None
                         ) -> tuple[pd.DataFrame, dict | None]:
    """The op table of the `used` steps with each op's costs and share of its ceiling, and the
    roofline summary. The ceilings: `peak` (the user's), else the run's measured peak, a CPU one
    scaled to this worker's share of the cores; a peak and a bandwidth the trace states fill in what
    neither gives; a compute ceiling the ops beat is refused, with a warning."""
    view = inputs.trace
    ops = op_table(view, used, device) if view is not None else pd.DataFrame(columns=OP_COLUMNS + OP_KEYS)
    implementations = (onednn.op_implementations(view, used, inputs.onednn)
                       if view is not None and device == "cpu" and inputs.onednn is not None else None)
    ops = roofline.attach_costs(ops, inputs.op_costs, device, implementations)
    dtypes = sorted(set(ops["dtype"]) - {""})
    run = inputs.run
    ceilings = peak if peak is not None else roofline.ceilings_from_peak(run.peak if run is not None else None,
                                                                           "run.json peak")
    ceilings = ceilings.for_dtypes(dtypes) if ceilings is not None else None
    if device == "cpu" and run is not None:
        ceilings = roofline.for_worker_cores(ceilings, *_worker_cores(run))
    ceilings = roofline.with_stated_peak(ceilings, inputs.stated_peak_flops, dtypes, "trace (stated peak)")
    ceilings = roofline.with_bandwidth(ceilings, inputs.stated_bandwidth, dtypes, "trace (stated bandwidth)")
    ceilings, refused = roofline.refuse_beaten(ops, ceilings)
    for sentence in refused:
        run_files.warn(f"roofline: {sentence}")
    ops = roofline.apply_ceilings(ops, ceilings)
    summary = roofline.summary(ops, ceilings, _model_flops_per_step(run),
                               inputs.op_costs is not None and not inputs.op_costs.empty, refused)
    return ops, summary


def _worker_cores(run: RunRecord) -> tuple[float, float]:
    """(the intra-op threads of a worker that shared its machine with other workers, the machine's
    cores); NaN where the worker had the machine to itself or run.json does not say."""
    device = run.device
    local, threads, cores = device.get("local_workers"), device.get("intra_op_threads"), device.get("cores")
    number = (int, float)
    if not isinstance(local, number) or local <= 1 or not isinstance(threads, number) or threads <= 0:
        return math.nan, math.nan
    return float(threads), float(cores) if isinstance(cores, number) and cores > 0 else math.nan


def _min_steps(source) -> int:
    """Steady steps a verdict needs: one for a one-step capture or a whole window, else a few."""
    return 1 if source.kind == "window" or one_step_capture(source.steps) else rules.MIN_STEADY_STEPS


def _measured_matrix_ceilings(inputs: RunInputs, peak: roofline.Ceilings | None
                              ) -> tuple[dict[str, float], str | None, tuple]:
    """The matrix FLOP/s measured (or given) per dtype, their source, and what the smallest matrix ops
    `devprof peak` timed reached per dtype: what precision advice compares. A ceiling given for every
    dtype at once, or stated by the trace, says nothing of one dtype against another."""
    run = inputs.run
    ceilings = peak if peak is not None else roofline.ceilings_from_peak(run.peak if run is not None else None,
                                                                           "run.json peak")
    if ceilings is None:
        return {}, None, ()
    rates = {dtype: values.get("matrix_flops_per_second", math.nan) for dtype, values in ceilings.by_dtype.items()
             if dtype != roofline.ANY_DTYPE}
    small = roofline.smallest_matrix_rates(run.peak) if peak is None and run is not None else ()
    return rates, ceilings.source, small


def _model_flops_per_step(run: RunRecord | None) -> float:
    """The model's training FLOPs per step from run.json (FLOPs per image x this worker's batch); NaN unknown."""
    if run is None:
        return math.nan
    per_image = run.model.get("train_flops_per_image")
    batch = run.raw.get("per_worker_batch_size") or run.config.get("batch_size")
    if not isinstance(per_image, (int, float)) or not isinstance(batch, (int, float)) or per_image <= 0 or batch <= 0:
        return math.nan
    return float(per_image) * float(batch)


def _run_notes(run: RunRecord | None) -> tuple[str, ...]:
    if run is not None and run.ended_unrecorded:
        return (f"the run ended without recording its end (run.json status 'running'): {run.ended_unrecorded}; "
                "the figures cover the steps written before it",)
    if run is not None and run.status == "running":
        return ("the run is still running (run.json status 'running'): the figures cover the steps written so far",)
    if run is not None and run.status == "failed":
        error = run.raw.get("error")
        why = f": {' '.join(error.split())[:300]}" if isinstance(error, str) and error.strip() else ""
        return (f"the run failed (run.json status 'failed'){why}; the figures cover the steps written before it",)
    if run is not None and run.status == "interrupted":
        by = run.raw.get("interrupted_by")
        how = f" by {by}" if isinstance(by, str) and by.isidentifier() else ""
        return (f"the run was interrupted{how} (run.json status 'interrupted'); the figures cover the steps "
                "written before it",)
    return ()


def assemble_session(chief: Analysis, others: list[Summarised]) -> Analysis:
    """Several hosts in one profile session: the chief's breakdown with one row per host trace."""
    rows, steps, memory = [], [], []
    for a in (chief, *others):
        name = a.path.name.removesuffix(".xplane.pb")
        if isinstance(a, WorkerFailure):
            rows.append(_failed_row(name, name, f"unreadable: {a.message}"))
            continue
        summary = _summary(a)
        rows.append({**worker_row(name, summary.host, summary.mean, summary.steady), "status": cluster.OK})
        steps.append(cluster.worker_steps(name, summary.steady))
        memory.append(dataclasses.replace(summary.memory, worker=name) if summary.memory else None)
    frame, worker_steps, missing_note = _job_frame(rows, steps, (), len(rows))
    ok = frame[frame["status"] == cluster.OK]
    straggler, reason = straggler_rule.find_straggler(ok)
    return dataclasses.replace(chief, workers=_shown(frame), straggler=straggler, straggler_reason=reason,
                               notes=(*chief.notes, *missing_note), worker_steps=worker_steps,
                               memory=_every_worker_memory(chief.memory, memory),
                               slowest_workers=straggler_rule.slowest_workers(ok),
                               worker_distribution=cluster.distribution(frame))


def _analyze_job(job_dir: Path, workers: list[Path], step_name: str | None, processes: int | None,
                 executor: Executor | None, peak: roofline.Ceilings | None = None) -> Analysis:
    """Every worker with a trace analysed once (on `executor` or the local pool); when some have a
    trace, those without one are listed, not analysed from steps.csv alone (their collective wait is
    not timed). Workers the job's run.json names that have no folder are listed as missing."""
    traced = [w for w in workers if _has_trace(w)]
    analysed = traced if traced else workers
    skipped = {w.name: "no trace" for w in workers if w not in analysed}
    skipped.update({name: "missing" for name in _listed_workers(job_dir) if name not in {w.name for w in workers}})
    results = _analyze_each(analysed, step_name, processes, executor, peak)
    if traced:  # a worker whose trace could not be read fell back to its steps.csv: not comparable with the others
        results = [_unreadable(w, r) if not isinstance(r, WorkerFailure) and r.step_source == "steps_csv" else r
                   for w, r in zip(analysed, results)]
    return assemble_job(job_dir, analysed, _with_chief(analysed, results, step_name, executor, peak), skipped)


def _unreadable(worker: Path, result: Analysis | WorkerSummary) -> WorkerFailure:
    why = next((note for note in result.notes if "trace" in note), "its trace could not be read")
    return WorkerFailure(worker, why.split("; breakdown from")[0])


def _has_trace(worker: Path) -> bool:
    return next(worker.rglob("*.xplane.pb"), None) is not None


def _listed_workers(job_dir: Path) -> list[str]:
    """The `worker-<i>` folders the job's own run.json names (`workers`, else `num_workers`)."""
    path = job_dir / run_files.RUN_JSON
    if not path.is_file():
        return []
    try:
        raw = RunRecord.read(path).raw
    except (ValueError, OSError):
        return []
    names = raw.get("workers")
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        return names
    count = raw.get("num_workers")
    return [f"{run_files.WORKER_DIR_PREFIX}{i}" for i in range(count)] if isinstance(count, int) else []


def _worker_index(name: str) -> int | str:
    index = name[len(run_files.WORKER_DIR_PREFIX):]
    return int(index) if name.startswith(run_files.WORKER_DIR_PREFIX) and index.isdigit() else name


def _failed_row(worker: int | str, host: str, status: str) -> dict:
    row = worker_row(worker, host, {})
    row.update({key: math.nan for key in WORKER_KEYS[2:7]}, status=status)
    return row


def _job_frame(rows: list[dict], steps: list[pd.DataFrame], skipped: tuple[tuple[int | str, str], ...],
               total: int) -> tuple[pd.DataFrame, pd.DataFrame, tuple[str, ...]]:
    """The workers table with each one's straggler score and clock offset (and the per-part noise the
    straggler rule reads: `_shown` keeps the reported columns), the job's steps table, and one note
    naming the workers that were not analysed."""
    rows = rows + [_failed_row(worker, str(worker), status) for worker, status in skipped]
    frame = pd.DataFrame(rows)
    frame = frame.iloc[sorted(range(len(frame)), key=lambda i: _order(frame["worker"].iat[i]))].reset_index(drop=True)
    worker_steps = pd.concat(steps, ignore_index=True) if steps else pd.DataFrame(columns=cluster.STEP_COLUMNS)
    ok = frame.loc[frame["status"] == cluster.OK, "worker"].tolist()
    scores = cluster.straggler_scores(worker_steps) if len(ok) > 1 else pd.Series(dtype=float)  # none to lag behind
    offsets = cluster.clock_offsets(worker_steps, ok[0]) if ok else pd.Series(dtype=float)
    frame["straggler_score"] = [float(scores.get(w, math.nan)) for w in frame["worker"]]
    frame["clock_offset_ms"] = [float(offsets.get(w, math.nan)) for w in frame["worker"]]
    notes = []
    failed = frame[frame["status"] != cluster.OK]
    if not failed.empty:
        by_status: dict[str, list] = {}
        for worker, status in zip(failed["worker"], failed["status"]):
            by_status.setdefault(status if status in ("missing", "no trace") else "unreadable", []).append(worker)
        parts = [f"{status}: {_ranges(workers)}" for status, workers in by_status.items()]
        notes.append(f"{len(failed)} of {total} workers not analysed ({'; '.join(parts)}); their rows say why")
    return frame, worker_steps, tuple(notes)


def _shown(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[[*WORKER_KEYS, *cluster.CLUSTER_KEYS]]


def _order(worker: int | str) -> tuple:
    return (0, int(worker), "") if isinstance(worker, numbers.Integral) else (1, 0, str(worker))


def _ranges(workers: list) -> str:
    """`0-3, 7, 9-12` for worker indices (names as they are)."""
    indices = sorted(int(w) for w in workers if isinstance(w, numbers.Integral))
    out, start = [], None
    for i, n in enumerate(indices):
        start = n if start is None else start
        if i + 1 == len(indices) or indices[i + 1] != n + 1:
            out.append(f"{start}" if start == n else f"{start}-{n}")
            start = None
    return ", ".join([*out, *(str(w) for w in workers if not isinstance(w, numbers.Integral))])


def assemble_job(job_dir: Path, workers: list[Path], per_worker: list[Summarised],
                 skipped: dict[str, str] | None = None) -> Analysis:
    """A job of `worker-<i>/` run directories: the first analysed worker's breakdown (worker 0's; its
    whole `Analysis`, the others' may be summaries), one row per worker, the straggler, and the job's
    own processes not counted as CPU contention. `skipped` names the workers that were not analysed,
    and why (`no trace`, `missing`)."""
    done = [(w, a) for w, a in zip(workers, per_worker) if not isinstance(a, WorkerFailure)]
    if not done:
        failure = next(a for a in per_worker if isinstance(a, WorkerFailure))
        raise failure.error or TraceError(failure.message)
    chief_dir, chief = done[0]
    if not isinstance(chief, Analysis):
        raise ValueError(f"{chief_dir.name} gives the job's breakdown: it needs its whole Analysis, not a summary")
    summaries = {w: _summary(a) for w, a in done}
    rows, steps, memory = [], [], []
    for worker, analysis in zip(workers, per_worker):
        index = _worker_index(worker.name)
        if isinstance(analysis, WorkerFailure):
            rows.append(_failed_row(index, worker.name, f"unreadable: {analysis.message}"))
            continue
        summary = summaries[worker]
        memory.append(dataclasses.replace(summary.memory, worker=index) if summary.memory else None)
        rows.append({**worker_row(index, summary.run_host or worker.name, summary.mean, summary.steady,
                                  summary.utilization.get("proc_cpu_mean_pct", math.nan)), "status": cluster.OK})
        steps.append(cluster.worker_steps(index, summary.steady))
    skipped_rows = tuple((_worker_index(name), status) for name, status in (skipped or {}).items())
    total = len(workers) + len(skipped_rows)
    frame, worker_steps, missing_note = _job_frame(rows, steps, skipped_rows, total)
    ok = frame[frame["status"] == cluster.OK].reset_index(drop=True)
    machine = dict(chief.utilization)
    facts, findings = chief.facts, chief.findings
    # Workers on the chief's machine are the job, not "other processes" competing with it.
    chief_host = _host_of(chief_dir, summaries[chief_dir])
    local = [a.utilization.get("proc_cpu_mean_pct", math.nan) for w, a in summaries.items()
             if _host_of(w, a) == chief_host]
    cores = machine.get("cpu_cores", math.nan)
    if len(local) > 1 and cores == cores and all(v == v for v in local):
        job_cpu = sum(local)
        machine["proc_cpu_mean_pct"] = job_cpu
        machine["other_cpu_mean_pct"] = max(0.0, machine["cpu_util_mean_pct"] - job_cpu / cores)
        facts = dataclasses.replace(facts, proc_cpu_pct=job_cpu, other_cpu_pct=machine["other_cpu_mean_pct"])
        findings = rules.findings(facts)
    notes = chief.notes
    if total > 1:
        shown = ("one row per worker below" if total <= straggler_rule.SLOWEST_SHOWN else
                 f"the {straggler_rule.SLOWEST_SHOWN} slowest below, every worker in workers.csv and the JSON")
        notes = (*notes, f"{total} workers: the breakdown is worker {_worker_index(chief_dir.name)}'s "
                         f"({chief_dir.name}); {shown}")
    notes = (*notes, *missing_note)
    other_cpu = machine.get("other_cpu_mean_pct", math.nan)
    straggler, reason = straggler_rule.find_straggler(ok, other_cpu)
    if len(done) > 1 and all(a.step_source == "steps_csv" for _, a in done):
        straggler, reason = None, straggler_rule.NO_TRACE
    return dataclasses.replace(chief, job_dir=job_dir, workers=_shown(frame), straggler=straggler,
                               straggler_reason=reason, memory=_every_worker_memory(chief.memory, memory),
                               utilization=machine, facts=facts, findings=findings, notes=notes,
                               worker_steps=worker_steps, slowest_workers=straggler_rule.slowest_workers(ok, other_cpu_pct=other_cpu),
                               worker_distribution=cluster.distribution(frame))


def _every_worker_memory(chief: MemoryReport | None, workers: list[WorkerMemory | None]) -> MemoryReport | None:
    """The chief's memory report with every worker's allocators (`memory.workers`), where several
    workers were analysed and any of them traced its allocators."""
    traced = tuple(worker for worker in workers if worker is not None)
    if len(workers) < 2 or not traced:
        return chief
    if chief is None:
        empty = pd.DataFrame(columns=memory_breakdown.STEP_COLUMNS)
        chief = MemoryReport((), pd.DataFrame(columns=memory_breakdown.TIMELINE_COLUMNS), empty, (), math.nan)
    return dataclasses.replace(chief, workers=traced)


def _host_of(worker: Path, summary: WorkerSummary) -> str:
    return summary.run_host or worker.name
