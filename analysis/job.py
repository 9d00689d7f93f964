"""Several workers (a job of `worker-<i>/` run directories, or a profile session of several host
traces): each analysed once, on a local pool or an executor, and assembled into one `Analysis`
without analysing anything twice.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis import executors
from analysis.breakdown import cluster, memory_allocators, roofline
from analysis.breakdown.memory import MemoryReport, WorkerMemory
from analysis.breakdown.workers import WORKER_KEYS, worker_row
from analysis.executors import WorkerFailure
from analysis.read import run_files
from analysis.read.run_files import RunRecord
from analysis.read.trace import TraceError
from analysis.rules import finding_rules
from analysis.rules import straggler as straggler_rule
from analysis.steps.host import steady_steps
from analysis.worker import Analysis, analyze_worker

# A process pool pays for itself once a worker's trace takes a second or more to analyse (about 4 MB).
POOL_MIN_TRACE_BYTES = 4 * 2**20
# Peak memory of reading and analysing a trace, per byte of .xplane.pb: measured 13x with the wide
# events table, 6.5-8x with the narrow one (BENCHMARKS.md); kept high so a pool never swaps.
MEMORY_PER_TRACE_BYTE = 16


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
        return cls(
            path=analysis.path,
            step_source=analysis.step_source,
            host=analysis.host,
            run_host=str(device["host"]) if device.get("host") else None,
            mean=analysis.mean,
            steady=steady[[c for c in SUMMARY_STEP_COLUMNS if c in steady]].reset_index(drop=True),
            utilization=analysis.utilization,
            notes=analysis.notes,
            memory=WorkerMemory(None, memory.allocators, memory.steps) if memory and memory.allocators else None,
        )


Summarised = Analysis | WorkerSummary | WorkerFailure


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


def _analyze_each(
    paths: list[Path],
    step_name: str | None,
    processes: int | None,
    executor: Executor | None = None,
    peak: roofline.Ceilings | None = None,
) -> list[Summarised]:
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


def _summary(result: Analysis | WorkerSummary) -> WorkerSummary:
    return result if isinstance(result, WorkerSummary) else WorkerSummary.of(result)


def worker_summary(
    path: Path, step_name: str | None = None, chief: bool = False, peak: roofline.Ceilings | None = None
) -> Summarised:
    """One task of a job: the chief's whole analysis, a `WorkerSummary` of any other worker, or why
    its files could not be analysed."""
    try:
        result = analyze_worker(path, step_name, peak)
    except (TraceError, ValueError, OSError) as exc:
        return WorkerFailure(Path(path), str(exc).splitlines()[0] if str(exc) else type(exc).__name__, exc)
    return result if chief else WorkerSummary.of(result)


def _with_chief(
    paths: list[Path],
    results: list[Summarised],
    step_name: str | None,
    executor: Executor | None,
    peak: roofline.Ceilings | None,
) -> list[Summarised]:
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
    return dataclasses.replace(
        chief,
        workers=_shown(frame),
        straggler=straggler,
        straggler_reason=reason,
        notes=(*chief.notes, *missing_note),
        worker_steps=worker_steps,
        memory=_every_worker_memory(chief.memory, memory),
        slowest_workers=straggler_rule.slowest_workers(ok),
        worker_distribution=cluster.distribution(frame),
    )


def _analyze_job(
    job_dir: Path,
    workers: list[Path],
    step_name: str | None,
    processes: int | None,
    executor: Executor | None,
    peak: roofline.Ceilings | None = None,
) -> Analysis:
    """Every worker with a trace analysed once (on `executor` or the local pool); when some have a
    trace, those without one are listed, not analysed from steps.csv alone (their collective wait is
    not timed). Workers the job's run.json names that have no folder are listed as missing."""
    traced = [w for w in workers if _has_trace(w)]
    analysed = traced if traced else workers
    skipped = {w.name: "no trace" for w in workers if w not in analysed}
    skipped.update({name: "missing" for name in _listed_workers(job_dir) if name not in {w.name for w in workers}})
    results = _analyze_each(analysed, step_name, processes, executor, peak)
    if traced:  # a worker whose trace could not be read fell back to its steps.csv: not comparable with the others
        results = [
            _unreadable(w, r) if not isinstance(r, WorkerFailure) and r.step_source == "steps_csv" else r
            for w, r in zip(analysed, results)
        ]
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
    index = name[len(run_files.WORKER_DIR_PREFIX) :]
    return int(index) if name.startswith(run_files.WORKER_DIR_PREFIX) and index.isdigit() else name


def _failed_row(worker: int | str, host: str, status: str) -> dict:
    row = worker_row(worker, host, {})
    row.update({key: math.nan for key in WORKER_KEYS[2:7]}, status=status)
    return row


def _job_frame(
    rows: list[dict], steps: list[pd.DataFrame], skipped: tuple[tuple[int | str, str], ...], total: int
) -> tuple[pd.DataFrame, pd.DataFrame, tuple[str, ...]]:
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


def assemble_job(
    job_dir: Path, workers: list[Path], per_worker: list[Summarised], skipped: dict[str, str] | None = None
) -> Analysis:
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
        rows.append(
            {
                **worker_row(
                    index,
                    summary.run_host or worker.name,
                    summary.mean,
                    summary.steady,
                    summary.utilization.get("proc_cpu_mean_pct", math.nan),
                ),
                "status": cluster.OK,
            }
        )
        steps.append(cluster.worker_steps(index, summary.steady))
    skipped_rows = tuple((_worker_index(name), status) for name, status in (skipped or {}).items())
    total = len(workers) + len(skipped_rows)
    frame, worker_steps, missing_note = _job_frame(rows, steps, skipped_rows, total)
    ok = frame[frame["status"] == cluster.OK].reset_index(drop=True)
    machine = dict(chief.utilization)
    facts, findings = chief.facts, chief.findings
    # Workers on the chief's machine are the job, not "other processes" competing with it.
    chief_host = _host_of(chief_dir, summaries[chief_dir])
    local = [
        a.utilization.get("proc_cpu_mean_pct", math.nan) for w, a in summaries.items() if _host_of(w, a) == chief_host
    ]
    cores = machine.get("cpu_cores", math.nan)
    if len(local) > 1 and cores == cores and all(v == v for v in local):
        job_cpu = sum(local)
        machine["proc_cpu_mean_pct"] = job_cpu
        machine["other_cpu_mean_pct"] = max(0.0, machine["cpu_util_mean_pct"] - job_cpu / cores)
        facts = dataclasses.replace(facts, proc_cpu_pct=job_cpu, other_cpu_pct=machine["other_cpu_mean_pct"])
        findings = finding_rules.findings(facts)
    notes = chief.notes
    if total > 1:
        shown = (
            "one row per worker below"
            if total <= straggler_rule.SLOWEST_SHOWN
            else f"the {straggler_rule.SLOWEST_SHOWN} slowest below, every worker in workers.csv and the JSON"
        )
        notes = (
            *notes,
            f"{total} workers: the breakdown is worker {_worker_index(chief_dir.name)}'s ({chief_dir.name}); {shown}",
        )
    notes = (*notes, *missing_note)
    other_cpu = machine.get("other_cpu_mean_pct", math.nan)
    straggler, reason = straggler_rule.find_straggler(ok, other_cpu)
    if len(done) > 1 and all(a.step_source == "steps_csv" for _, a in done):
        straggler, reason = None, straggler_rule.NO_TRACE
    return dataclasses.replace(
        chief,
        job_dir=job_dir,
        workers=_shown(frame),
        straggler=straggler,
        straggler_reason=reason,
        memory=_every_worker_memory(chief.memory, memory),
        utilization=machine,
        facts=facts,
        findings=findings,
        notes=notes,
        worker_steps=worker_steps,
        slowest_workers=straggler_rule.slowest_workers(ok, other_cpu_pct=other_cpu),
        worker_distribution=cluster.distribution(frame),
    )


def _every_worker_memory(chief: MemoryReport | None, workers: list[WorkerMemory | None]) -> MemoryReport | None:
    """The chief's memory report with every worker's allocators (`memory.workers`), where several
    workers were analysed and any of them traced its allocators."""
    traced = tuple(worker for worker in workers if worker is not None)
    if len(workers) < 2 or not traced:
        return chief
    if chief is None:
        empty = pd.DataFrame(columns=memory_allocators.STEP_COLUMNS)
        chief = MemoryReport((), pd.DataFrame(columns=memory_allocators.TIMELINE_COLUMNS), empty, (), math.nan)
    return dataclasses.replace(chief, workers=traced)


def _host_of(worker: Path, summary: WorkerSummary) -> str:
    return summary.run_host or worker.name
