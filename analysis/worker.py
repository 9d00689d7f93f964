"""One worker's files, read once, analysed in a straight line into the one `Analysis` (the result of
every path: a job's or a session's is its first worker's, with a row per worker):

    step source -> steady steps -> mean -> device rows, ops, input stages, trace facts
    -> one `Facts` (`rules.facts_from`) -> verdict and findings

Each stage is a function of typed values; nothing here reads a file but through `read_inputs`.
"""

from __future__ import annotations

import functools
import os
import re
import re._constants as re_constants  # the parsed form of a pattern: to refuse a nested repeat
import re._parser as re_parser
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pandas as pd

from analysis import parallel
from analysis.breakdown import roofline, utilization
from analysis.breakdown.devices import device_table
from analysis.breakdown.eager import EagerOps, eager_ops, tf_eager_shares
from analysis.breakdown.epochs import epoch_tables
from analysis.breakdown.input_parts import mean_input_parts, split_input
from analysis.breakdown.input_stages import STAGE_COLUMNS, InputStages, input_stages, stage_times
from analysis.breakdown.memory import MemoryReport, memory_report
from analysis.breakdown.spread import spread
from analysis.breakdown.workers import WORKER_KEYS
from analysis.parallel.child import Beside
from analysis.read.inputs import RunInputs, read_inputs
from analysis.read.run_files import RunRecord
from analysis.read.view import TraceView
from analysis.render import Rendered
from analysis.rules import finding_rules
from analysis.rules import table as rules
from analysis.rules import xprof as xprof_rules
from analysis.rules.advice_loop import pipeline_is_the_cause
from analysis.rules.facts import Facts, trace_facts, worker_facts
from analysis.rules.second_opinion import SecondOpinion, second_opinion
from analysis.rules.xprof import XProfReading
from analysis.steps.host import choose_steps, one_step_capture, per_call_host_ms
from analysis.steps.sources import find_steps

# Events from which a trace's tf.data stages and eager execution are analysed by a forked child
# (`forked.Beside`): below, the fork costs more than it saves.
BESIDE_MIN_EVENTS = 1 << 18


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
    memory: MemoryReport | None = (
        None  # each allocator's peak, what held it, the batch headroom (docs/json.md `memory`)
    )

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
            fix["rule"] == "input_wait" for fix in self.verdict.get("fixes") or ()
        )
        if not waits or self.input_stages.empty or not pipeline_is_the_cause(self.facts):
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


def write_perfetto(
    analysis: Analysis,
    path: str | Path,
    events: str = "ops",
    step_name: str | None = None,
    inputs: RunInputs | None = None,
):
    """`Analysis.to_perfetto`, returning what the trace holds (`analysis.render.perfetto.Written`); `inputs`:
    the analysis' own files as `analyze_and_read` kept them, not read again."""
    from analysis import timeline
    from analysis.worker import analyze_inputs

    return timeline.write_perfetto(
        analysis, path, functools.partial(analyze_inputs, step_name=step_name), events, inputs
    )


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
        raise ValueError(
            f"step_name {step_name!r} repeats a repetition (such as `(a+)+`), which can take exponential "
            "time to match: write it without the nested repeat"
        )


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
    with parallel.Helpers() as helpers:
        return analyze_inputs(read_inputs(checked_path(path, "path"), helpers=helpers), step_name, peak, helpers)


def analyze_inputs(
    inputs: RunInputs,
    step_name: str | None = None,
    peak: roofline.Ceilings | None = None,
    helpers: parallel.Helpers | None = None,
) -> Analysis:
    """One worker's files, read once, each stage a function of typed values (`helpers`: another core)."""
    view, run = inputs.trace, inputs.run
    with _stages_and_eager(view, helpers) as beside:  # forked first: part of its work needs no steps
        source = split_input(view, find_steps(inputs, step_name), inputs.steps_table)
        chosen = choose_steps(source.steps)
        beside.give(chosen.used)
        epochs = epoch_tables(inputs, source.steps if source.kind != "steps_csv" else None)
        steps, utilization_note = utilization.steps_with_utilization(
            source.steps, inputs.steps_table, inputs.samplers, source.kind == "steps_csv"
        )
        devices = device_table(view, source.steps, chosen.used, source.step_name)
        ops, roof = roofline.ops_on_the_roofline(inputs, chosen.used, source.device, peak)
        memory = memory_report(inputs, source.steps)
        stages, eager = beside.result()
    machine, evidence = utilization.headline(inputs.summaries), utilization.evidence(inputs.summaries)
    mean = {**chosen.mean, **mean_input_parts(chosen.steady), "device_step_ms": devices.busiest_step_ms}
    facts = worker_facts(
        mean,
        source,
        run,
        machine,
        trace_facts(view, source.steps, devices.rows, stages.prefetches),
        devices,
        stages.slowest,
        ops,
        eager,
        epochs.idle_stretch,
        roof,
        *roofline.measured_matrix_ceilings(inputs, peak),
        traced_steps=len(source.steps),
        memory=memory,
        host_per_call_ms=per_call_host_ms(chosen.steady),
        xprof=_xprof_reading(inputs),
    )
    verdict = rules.make_verdict(
        mean,
        facts,
        steps_used=len(chosen.steady),
        compile_steps=chosen.compile_steps,
        utilization=evidence,
        min_steps=_min_steps(source),
    )
    verdict["step_basis"] = source.basis
    tf = second_opinion(inputs.tensorflow, mean, source.kind, source.step_name, len(chosen.steady), devices.rows)
    return Analysis(
        path=source.path,
        step_source=source.kind,
        step_name=source.step_name,
        device=source.device,
        producer=source.producer,
        host=_host(view, source.path),
        host_files=_host_files(view),
        notes=(
            *source.notes,
            *filter(None, [utilization_note]),
            *_run_notes(run),
            *devices.notes,
            *filter(None, [tf.note if tf is not None else None]),
        ),
        steps=steps,
        steps_per_call=source.steps_per_call,
        mean=mean,
        steps_used=len(chosen.steady),
        verdict=verdict,
        findings=finding_rules.findings(facts),
        facts=facts,
        devices=devices.rows,
        memory=facts.memory,
        kernel_launch=devices.kernel_launch,
        workers=pd.DataFrame(columns=WORKER_KEYS),
        straggler=None,
        ops=ops,
        input_stages=stages.table,
        utilization=machine,
        utilization_evidence=evidence,
        epochs=epochs.epochs,
        reconciliation=epochs.reconciliation,
        samplers=inputs.samplers,
        epoch_starts_s=epochs.starts_s,
        run_dir=inputs.run_dir,
        record=run,
        tensorflow=tf,
        roofline=roof,
        spread=spread(chosen.steady, devices.work),
    )


def _xprof_reading(inputs: RunInputs) -> XProfReading | None:
    """XProf's Overview reading where TensorFlow wrote XProf's analysis beside the trace at capture."""
    tf = inputs.tensorflow
    return xprof_rules.reading(tf.input_pct, tf.statement) if tf is not None else None


def _host(view: TraceView | None, path: Path) -> str:
    """The traced host's name (the file's stem where the trace names none)."""
    return view.hostnames[0] if view is not None and view.hostnames else path.name.removesuffix(".xplane.pb")


def _host_files(view: TraceView | None) -> tuple[Path, ...]:
    location = view.trace.location if view is not None else None
    return location.host_files if location is not None else ()


def _stages_and_eager(
    view: TraceView | None, helpers: parallel.Helpers | None
) -> Beside[tuple[InputStages, EagerOps | None]]:
    """The tf.data stages and eager execution of the steps `give`n (the steady ones), analysed by a child
    forked before they are found (their parts that need no steps, a sixth of the analysis of a large
    trace, begin at once) while this process finds the steps and does the rest, on the other core."""
    wanted = helpers is not None and view is not None and len(view.events) >= BESIDE_MIN_EVENTS
    here = os.getpid()

    def work(given) -> tuple[InputStages, EagerOps | None]:
        if view is None:
            return InputStages(pd.DataFrame(columns=STAGE_COLUMNS), None, None), eager_ops(view, given())
        if os.getpid() != here:  # in the child, what needs no steps first, while this process finds them
            if not view.stages.empty:
                stage_times(view)
            if not view.host.empty:
                tf_eager_shares(view)
        used = given()
        return input_stages(view, used), eager_ops(view, used)

    return (helpers or parallel.Helpers(False)).beside(work, wanted)


def _min_steps(source) -> int:
    """Steady steps a verdict needs: one for a one-step capture or a whole window, else a few."""
    return 1 if source.kind == "window" or one_step_capture(source.steps) else rules.MIN_STEADY_STEPS


def _run_notes(run: RunRecord | None) -> tuple[str, ...]:
    if run is not None and run.ended_unrecorded:
        return (
            f"the run ended without recording its end (run.json status 'running'): {run.ended_unrecorded}; "
            "the figures cover the steps written before it",
        )
    if run is not None and run.status == "running":
        return ("the run is still running (run.json status 'running'): the figures cover the steps written so far",)
    if run is not None and run.status == "failed":
        error = run.raw.get("error")
        why = f": {' '.join(error.split())[:300]}" if isinstance(error, str) and error.strip() else ""
        return (f"the run failed (run.json status 'failed'){why}; the figures cover the steps written before it",)
    if run is not None and run.status == "interrupted":
        by = run.raw.get("interrupted_by")
        how = f" by {by}" if isinstance(by, str) and by.isidentifier() else ""
        return (
            f"the run was interrupted{how} (run.json status 'interrupted'); the figures cover the steps "
            "written before it",
        )
    return ()
