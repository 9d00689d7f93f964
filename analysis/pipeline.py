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
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pandas as pd

from analysis.breakdown import utilization
from analysis.breakdown.devices import device_table
from analysis.breakdown.eager import EagerOps, eager_ops
from analysis.breakdown.epochs import epoch_tables
from analysis.breakdown.input_parts import mean_input_parts, split_input
from analysis.breakdown.input_stages import STAGE_COLUMNS, InputStages, input_stages
from analysis.breakdown.ops import OP_COLUMNS, op_table
from analysis.breakdown.workers import WORKER_KEYS, worker_row
from analysis.read import run_files
from analysis.read.inputs import RunInputs, read_inputs
from analysis.read.run_files import RunRecord
from analysis.render import Rendered
from analysis.rules import straggler as straggler_rule
from analysis.rules import table as rules
from analysis.rules.facts import Facts, trace_facts, worker_facts
from analysis.rules.second_opinion import SecondOpinion, second_opinion
from analysis.steps.host import choose_steps, one_step_capture, steady_steps
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
    tensorflow: SecondOpinion | None = None  # TensorFlow's own analysis beside the trace, beside devprof's figures

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
        """The slowest tf.data stage when the steps wait for it (input-bound verdict, the host's wait
        material and explained by the stage's own time), else None."""
        if self.verdict.get("bound") != "input" or self.input_stages.empty or not rules.pipeline_is_the_cause(self.facts):
            return None
        slowest = self.input_stages.iloc[0]
        return {"stage": str(slowest["stage"]), "ms_per_batch": float(slowest["ms_per_batch"])}

    @property
    def out_dir(self) -> Path | None:
        """Where `devprof analyze` writes its files by default: `<run>/analysis`."""
        folder = self.job_dir or self.run_dir
        return folder / "analysis" if folder is not None else None

    def write(self, out_dir: str | Path) -> list[Path]:
        """CSVs, plots, report.md and analysis.json under `out_dir`."""
        from analysis.render import outputs

        return outputs.write_outputs(self, out_dir)


def analyze(path: str | Path, step_name: str | None = None, processes: int | None = None) -> Analysis:
    """Find the steps at `path` and break them down; `step_name` (a regex) picks the marker or
    program that stands for a step. A multi-worker job or session is worker 0's breakdown
    with one row per worker and the straggler; its worker files are analysed in parallel
    processes when they are big enough to pay for it (`processes` sets how many; 1: in this one)."""
    check_step_name(step_name)
    path = Path(path)
    workers = run_files.worker_dirs(path) if path.is_dir() else []
    if workers and not (path / run_files.STEPS_CSV).is_file():
        return assemble_job(path, workers, _analyze_each(workers, step_name, processes))
    host_files = _session_files(path)
    if len(host_files) < 2:
        return analyze_worker(path, step_name)
    chief, *others = _analyze_each([path, *host_files[1:]], step_name, processes)
    return assemble_session(chief, others)


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
    return max((f.stat().st_size for f in files), default=0)


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


def _analyze_each(paths: list[Path], step_name: str | None, processes: int | None) -> list[Analysis]:
    count = pool_size(paths, processes)
    if count <= 1:
        return [analyze_worker(p, step_name) for p in paths]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else methods[0])
    with ProcessPoolExecutor(max_workers=count, mp_context=context) as pool:
        return list(pool.map(analyze_worker, paths, [step_name] * len(paths)))


def check_step_name(step_name: str | None) -> None:
    """A ValueError naming `step_name` when it is not a regular expression (re.error is not one)."""
    if step_name is None:
        return
    try:
        re.compile(step_name)
    except (re.error, TypeError) as exc:
        raise ValueError(f"step_name {step_name!r} is not a regular expression: {exc}") from None


def analyze_worker(path: str | Path, step_name: str | None = None) -> Analysis:
    """One trace file or run directory, on its own (pure: reads files, returns the result)."""
    check_step_name(step_name)
    return analyze_inputs(read_inputs(path), step_name)


def analyze_inputs(inputs: RunInputs, step_name: str | None = None) -> Analysis:
    """The analysis of one worker's files, read once: each stage a function of typed values."""
    view, run = inputs.trace, inputs.run
    source = split_input(view, find_steps(inputs, step_name))
    chosen = choose_steps(source.steps)
    epochs = epoch_tables(inputs, source.steps if source.kind != "steps_csv" else None)
    steps, utilization_note = utilization.steps_with_utilization(source.steps, inputs.steps_table, inputs.samplers,
                                                                 source.kind == "steps_csv")
    devices = device_table(view, source.steps, chosen.used, source.step_name)
    ops = op_table(view, chosen.used, source.device) if view is not None else pd.DataFrame(columns=OP_COLUMNS)
    stages = input_stages(view, len(source.steps)) if view is not None \
        else InputStages(pd.DataFrame(columns=STAGE_COLUMNS), None, None)
    machine = utilization.headline(inputs.summaries)
    evidence = utilization.evidence(inputs.summaries)
    mean = {**chosen.mean, **mean_input_parts(chosen.steady), "device_step_ms": devices.busiest_step_ms}
    facts = worker_facts(mean, source, run, machine, trace_facts(view, source.steps, devices.rows, stages.prefetches),
                         devices, stages.slowest, ops, eager_ops(view, chosen.used), epochs.idle_stretch)
    verdict = rules.make_verdict(mean, facts, steps_used=len(chosen.steady), compile_steps=chosen.compile_steps,
                                 utilization=evidence,
                                 min_steps=1 if source.kind == "window" or one_step_capture(source.steps)
                                 else rules.MIN_STEADY_STEPS)
    verdict["step_basis"] = source.basis
    tf = second_opinion(inputs.tensorflow, mean, source.kind, source.step_name, len(chosen.steady), devices.rows)
    notes = (*source.notes, *([utilization_note] if utilization_note else []), *_run_notes(run), *devices.notes,
             *([tf.note] if tf is not None and tf.note else []))
    host = view.hostnames[0] if view is not None and view.hostnames else source.path.name.removesuffix(".xplane.pb")
    location = view.trace.location if view is not None else None
    return Analysis(
        path=source.path, step_source=source.kind, step_name=source.step_name, device=source.device,
        producer=source.producer, host=host, host_files=location.host_files if location is not None else (),
        notes=notes, steps=steps, steps_per_call=source.steps_per_call, mean=mean, steps_used=len(chosen.steady),
        verdict=verdict, findings=rules.findings(facts), facts=facts, devices=devices.rows,
        kernel_launch=devices.kernel_launch, workers=pd.DataFrame(columns=WORKER_KEYS), straggler=None, ops=ops,
        input_stages=stages.table, utilization=machine, utilization_evidence=evidence, epochs=epochs.epochs,
        reconciliation=epochs.reconciliation, samplers=inputs.samplers, epoch_starts_s=epochs.starts_s,
        run_dir=inputs.run_dir, record=run, tensorflow=tf)


def _run_notes(run: RunRecord | None) -> tuple[str, ...]:
    if run is not None and run.status == "running":
        return ("the run is still running (run.json status 'running'): the figures cover the steps written so far",)
    return ()


def assemble_session(chief: Analysis, others: list[Analysis]) -> Analysis:
    """Several hosts in one profile session: the chief's breakdown with one row per host trace."""
    rows = [worker_row(a.path.name.removesuffix(".xplane.pb"), a.host, a.mean, steady_steps(a.steps))
            for a in (chief, *others)]
    straggler, reason = straggler_rule.find_straggler(pd.DataFrame(rows))
    return dataclasses.replace(chief, workers=pd.DataFrame(rows, columns=WORKER_KEYS), straggler=straggler,
                               straggler_reason=reason)


def assemble_job(job_dir: Path, workers: list[Path], per_worker: list[Analysis]) -> Analysis:
    """A job of `worker-<i>/` run directories: worker 0's breakdown, one row per worker, the
    straggler, and the job's own processes not counted as CPU contention."""
    chief = per_worker[0]
    rows = []
    for index, (worker, analysis) in enumerate(zip(workers, per_worker)):
        device = analysis.record.device if analysis.record is not None else {}
        rows.append(worker_row(index, str(device.get("host") or worker.name), analysis.mean,
                               steady_steps(analysis.steps), analysis.utilization.get("proc_cpu_mean_pct", math.nan)))
    machine = dict(chief.utilization)
    facts, findings = chief.facts, chief.findings
    # Workers on the chief's machine are the job, not "other processes" competing with it.
    local = [a.utilization.get("proc_cpu_mean_pct", math.nan) for a, row in zip(per_worker, rows)
             if row["host"] == rows[0]["host"]]
    cores = machine.get("cpu_cores", math.nan)
    if len(local) > 1 and cores == cores and all(v == v for v in local):
        job_cpu = sum(local)
        machine["proc_cpu_mean_pct"] = job_cpu
        machine["other_cpu_mean_pct"] = max(0.0, machine["cpu_util_mean_pct"] - job_cpu / cores)
        facts = dataclasses.replace(facts, proc_cpu_pct=job_cpu, other_cpu_pct=machine["other_cpu_mean_pct"])
        findings = rules.findings(facts)
    notes = chief.notes
    if len(workers) > 1:
        notes = (*notes, f"{len(workers)} workers: the breakdown is worker 0's ({workers[0].name}); one row per "
                         "worker below")
    straggler, reason = straggler_rule.find_straggler(pd.DataFrame(rows), machine.get("other_cpu_mean_pct", math.nan))
    if len(workers) > 1 and all(a.step_source == "steps_csv" for a in per_worker):
        straggler, reason = None, straggler_rule.NO_TRACE
    return dataclasses.replace(chief, job_dir=job_dir, workers=pd.DataFrame(rows, columns=WORKER_KEYS),
                               straggler=straggler, straggler_reason=reason, utilization=machine, facts=facts,
                               findings=findings, notes=notes)
