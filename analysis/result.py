"""What the analysis of a path gives: one `Analysis` (a worker, a session or a job), and the
`WorkerSummary` a job keeps of each worker whose breakdown it does not show.

Render modules (`analysis.render`) only format an `Analysis`; nothing here prints.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pandas as pd

from analysis.breakdown.eager import EagerOps
from analysis.breakdown.memory import MemoryReport, WorkerMemory
from analysis.executors import WorkerFailure
from analysis.read.inputs import RunInputs
from analysis.read.run_files import RunRecord
from analysis.render import Rendered
from analysis.rules import table as rules
from analysis.rules.facts import Facts
from analysis.rules.second_opinion import SecondOpinion
from analysis.steps.host import steady_steps


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

    def write(self, out_dir: str | Path) -> list[Path]:
        """CSVs, plots, report.md and analysis.json under `out_dir`."""
        from analysis.render import outputs

        return outputs.write_outputs(self, out_dir)

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
    from analysis.worker import analyze_inputs

    return timeline.write_perfetto(analysis, path, functools.partial(analyze_inputs, step_name=step_name), events,
                                   inputs)



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


