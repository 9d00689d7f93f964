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
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pandas as pd

from analysis.breakdown import epochs as epochs_mod
from analysis.rules import table as rules
from analysis.read import run_files
from analysis.rules import trace_facts
from analysis.breakdown import utilization
from analysis.breakdown.devices import ROW_KEYS as DEVICE_COLUMNS
from analysis.breakdown.devices import device_rows, kernel_launch
from analysis.breakdown.input_stages import input_stage_table, prefetches, runs_python, slowest_in_table
from analysis.breakdown.ops import OP_COLUMNS, eigen_dense_pct, op_table
from analysis.render import Rendered
from analysis.steps.sources import StepSource, open_step_source
from analysis.steps.host import complete_steps, mean_breakdown, steady_steps
from analysis.breakdown.workers import WORKER_KEYS, find_straggler, worker_row

INPUT_STAGE_COLUMNS = ["stage", "ms_per_batch", "calls"]


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
    facts: rules.Facts
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
    run: dict = field(default_factory=dict)  # run.json, where there is one
    straggler_reason: str | None = None  # why no straggler is named, with several workers

    @property
    def input_bottleneck(self) -> dict | None:
        """The slowest tf.data stage when the steps wait for input (input-bound verdict), else None."""
        if self.verdict.get("bound") != "input" or self.input_stages.empty:
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


def analyze_worker(path: str | Path, step_name: str | None = None) -> Analysis:
    """One trace file or run directory, on its own (pure: reads files, returns the result)."""
    source = open_step_source(path, step_name)
    return analyze_source(source)


def analyze_source(source: StepSource) -> Analysis:
    """The analysis of one step source (a trace or a steps.csv), with its run directory's files."""
    steady = steady_steps(source.steps)
    complete = complete_steps(source.steps)
    compile_steps = complete[~complete.index.isin(steady.index)]
    mean = mean_breakdown(steady if not steady.empty else source.steps)
    used = source.steps.loc[steady.index] if not steady.empty else source.steps
    run_dir = source.run_dir
    meta: dict = {}
    samplers: dict[str, pd.DataFrame] = {}
    epochs = reconciliation = steps_table = None
    epoch_starts: list[float] = []
    notes_before: list[str] = []
    run_notes: list[str] = []
    if run_dir is not None:
        meta = run_files.read_run_json(run_dir / run_files.RUN_JSON)
        if meta.get("status") == "running":
            run_notes.append("the run is still running (run.json status 'running'): the figures cover the steps "
                             "written so far")
        samplers = run_files.read_utilization(run_dir)
        steps_csv = run_dir / run_files.STEPS_CSV
        if steps_csv.is_file():
            steps_table = run_files.read_steps_csv(steps_csv)
            try:
                epochs = epochs_mod.epoch_breakdown(steps_table, run_files.run_epochs(meta, run_dir / run_files.RUN_JSON),
                                                   str(run_dir / run_files.RUN_JSON))
            except run_files.RunFileError as exc:
                run_files.warn(f"{exc}; no epoch breakdown")  # the steps still have their breakdown
            if source.kind != "steps_csv":
                reconciliation = epochs_mod.reconcile_with_trace(source.steps, steps_table)
            epoch_starts = steps_table.groupby("epoch")["start_time_s"].min().tolist()
    steps = source.steps
    if samplers and steps_table is not None:
        steps, resolution_ms = _with_utilization(steps, steps_table, samplers, source.kind == "steps_csv")
        if steps is not source.steps and len(steps) and resolution_ms == resolution_ms:
            shorter = float(steps["step_ms"].median()) < resolution_ms
            notes_before.append(f"utilization per step from samples every {resolution_ms:.0f} ms"
                                + (": steps are shorter, so each takes the sample around it" if shorter else ""))
    summaries = utilization.run_summaries(run_dir, meta) if run_dir is not None else {}
    machine = utilization.headline(summaries)
    config = run_files.section(meta, "config")

    trace = source.trace
    events = trace.events if trace is not None else None
    notes = list(source.notes) + notes_before + run_notes
    devices: list[dict] = []
    launch = None
    ops = pd.DataFrame(columns=OP_COLUMNS)
    stages = pd.DataFrame(columns=INPUT_STAGE_COLUMNS)
    host = source.path.name.removesuffix(".xplane.pb")
    if trace is not None:
        host = trace.hostnames[0] if trace.hostnames else host
        devices, device_notes = device_rows(events, trace.planes, source.steps, used,
                                            trace.hostnames[0] if trace.hostnames else "", source.step_name)
        notes += device_notes
        launch = kernel_launch(events, used) if devices else None
        ops = op_table(events, used, source.device)
        stages = input_stage_table(events)
    stage = slowest_in_table(stages, len(source.steps)) if events is not None else None

    record = {
        **mean, **machine, **trace_facts.collect(events, source.steps, devices, run_files.section(meta, "device")),
        "kind": source.device, "producer": source.producer,
        "precision": config.get("precision"), "jit_compile": config.get("jit_compile"),
        "bfloat16_units": run_files.section(meta, "device").get("bfloat16_units"),
        "steps_per_call": source.steps_per_call, "steps_per_epoch": meta.get("steps_per_epoch"),
        "slowest_input_stage": stage,
        "input_py_function": runs_python(events, stage) if events is not None else False,
        "device_recorded": any(row["recorded"] for row in devices) if devices else None,
        "eigen_dense_pct": eigen_dense_pct(ops) if source.device == "cpu" else math.nan,
    }
    recorded = [row for row in devices if row["recorded"] and row["step_count"]]
    mean["device_step_ms"] = max(recorded, key=lambda row: row["compute_ms"])["step_ms"] if recorded else math.nan
    facts = rules.facts_from(record)
    evidence = utilization_evidence(summaries)
    verdict = rules.make_verdict(mean, facts, steps_used=len(steady), compile_steps=compile_steps,
                                 utilization=evidence,
                                 min_steps=1 if source.kind == "window" else rules.MIN_STEADY_STEPS)
    verdict["step_basis"] = _step_basis(source)
    return Analysis(
        path=source.path, step_source=source.kind, step_name=source.step_name, device=source.device,
        producer=source.producer, host=host,
        host_files=trace.location.host_files if trace is not None and trace.location else (), notes=tuple(notes), steps=steps,
        steps_per_call=source.steps_per_call, mean=mean, steps_used=len(steady), verdict=verdict,
        findings=rules.findings(facts), facts=facts, devices=pd.DataFrame(devices, columns=DEVICE_COLUMNS),
        kernel_launch=launch, workers=pd.DataFrame(columns=WORKER_KEYS), straggler=None, ops=ops,
        input_stages=stages, utilization=machine, utilization_evidence=evidence, epochs=epochs,
        reconciliation=reconciliation, samplers=samplers, epoch_starts_s=tuple(epoch_starts), run_dir=run_dir,
        run=meta,
    )


def _with_utilization(steps: pd.DataFrame, steps_table: pd.DataFrame, samplers: dict, from_csv: bool):
    """The steps with the samplers' time-weighted means over each step. A trace's clock is put on
    the samplers' wall clock by the steps both it and steps.csv hold."""
    table = steps_table.drop_duplicates("step").set_index("step")
    if from_csv:
        starts_s = steps_table["start_time_s"].to_numpy(dtype=float)
    else:
        common = steps["step"].isin(table.index)
        if not common.any():
            return steps, math.nan
        offset = float((table.loc[steps.loc[common, "step"], "start_time_s"].to_numpy()
                        - steps.loc[common, "start_ns"].to_numpy() / 1e9).mean())
        starts_s = steps["start_ns"].to_numpy(dtype=float) / 1e9 + offset
    if len(starts_s) != len(steps):
        return steps, math.nan
    ends_s = starts_s + steps["step_ms"].to_numpy(dtype=float) / 1000.0
    columns, resolution_ms = utilization.per_window(samplers, starts_s, ends_s)
    if columns.empty or not len(columns.columns):
        return steps, math.nan
    return pd.concat([steps.reset_index(drop=True), columns.reset_index(drop=True)], axis=1), resolution_ms


def _step_basis(source: StepSource) -> str:
    """"device" when the steps are the device's own (its Steps line, its programs), else "host"."""
    detected = getattr(source.analysis, "detected", None)
    from_device = detected is not None and detected.spans.empty and source.kind in ("trace_groups", "program_executions")
    return "device" if from_device else "host"


def assemble_session(chief: Analysis, others: list[Analysis]) -> Analysis:
    """Several hosts in one profile session: the chief's breakdown with one row per host trace."""
    rows = [worker_row(a.path.name.removesuffix(".xplane.pb"), a.host, a.mean, steady_steps(a.steps))
            for a in (chief, *others)]
    straggler, reason = find_straggler(rows)
    return dataclasses.replace(chief, workers=pd.DataFrame(rows, columns=WORKER_KEYS), straggler=straggler,
                               straggler_reason=reason)


def assemble_job(job_dir: Path, workers: list[Path], per_worker: list[Analysis]) -> Analysis:
    """A job of `worker-<i>/` run directories: worker 0's breakdown, one row per worker, the
    straggler, and the job's own processes not counted as CPU contention."""
    chief = per_worker[0]
    rows = []
    for index, (worker, analysis) in enumerate(zip(workers, per_worker)):
        device = run_files.section(analysis.run, "device")
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
    straggler, reason = find_straggler(rows, machine.get("other_cpu_mean_pct", math.nan))
    if len(workers) > 1 and all(a.step_source == "steps_csv" for a in per_worker):
        straggler, reason = None, ("no worker has a profiler trace, and steps.csv does not time the collective wait: "
                                   "the straggler cannot be told (profile the run)")
    return dataclasses.replace(chief, job_dir=job_dir, workers=pd.DataFrame(rows, columns=WORKER_KEYS),
                               straggler=straggler, straggler_reason=reason, utilization=machine, facts=facts,
                               findings=findings, notes=notes)


def utilization_evidence(summaries: dict) -> dict[str, float]:
    """`{"mean host cpu": 42.0, ...}`: each sampler's main utilization, time-weighted as in compare,
    and the training process's own share of the machine beside the machine's."""
    evidence = {}
    machine = utilization.headline(summaries)
    if machine["cpu_cores"] == machine["cpu_cores"] and machine["proc_cpu_mean_pct"] == machine["proc_cpu_mean_pct"]:
        evidence["training process cpu (of all cores)"] = machine["proc_cpu_mean_pct"] / machine["cpu_cores"]
    for name, summary in summaries.items():
        metrics = summary.get("metrics") or {}
        for column in run_files.UTILIZATION_COLUMNS:
            mean = (metrics.get(column) or {}).get("mean")
            if mean is not None and not math.isnan(mean):
                evidence[f"mean {name} {column.removesuffix('_pct').replace('_', ' ')}"] = float(mean)
                break
    return evidence
