"""One worker's files, read once, analysed in a straight line:

    step source -> steady steps -> mean -> device rows, ops, input stages, trace facts
    -> one `Facts` (`rules.facts_from`) -> verdict and findings

Each stage is a function of typed values; nothing here reads a file but through `read_inputs`.
"""

from __future__ import annotations

import os
import re
import re._constants as re_constants  # the parsed form of a pattern: to refuse a nested repeat
import re._parser as re_parser
from pathlib import Path

import pandas as pd

from analysis import parallel
from analysis.breakdown import roofline, utilization
from analysis.breakdown.devices import device_table
from analysis.breakdown.eager import EagerOps, eager_ops, tf_eager_shares
from analysis.breakdown.epochs import epoch_tables
from analysis.breakdown.input_parts import mean_input_parts, split_input
from analysis.breakdown.input_stages import STAGE_COLUMNS, InputStages, input_stages, stage_times
from analysis.breakdown.memory import memory_report
from analysis.breakdown.spread import spread
from analysis.breakdown.workers import WORKER_KEYS
from analysis.parallel.child import Beside
from analysis.read.inputs import RunInputs, read_inputs
from analysis.read.run_files import RunRecord
from analysis.read.view import TraceView
from analysis.result import Analysis
from analysis.rules import table as rules
from analysis.rules import xprof as xprof_rules
from analysis.rules.facts import trace_facts, worker_facts
from analysis.rules.second_opinion import second_opinion
from analysis.rules.xprof import XProfReading
from analysis.steps.host import choose_steps, one_step_capture, per_call_host_ms
from analysis.steps.sources import find_steps

# Events from which a trace's tf.data stages and eager execution are analysed by a forked child
# (`forked.Beside`): below, the fork costs more than it saves.
BESIDE_MIN_EVENTS = 1 << 18


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
    with parallel.Helpers() as helpers:
        return analyze_inputs(read_inputs(checked_path(path, "path"), helpers=helpers), step_name, peak, helpers)


def analyze_inputs(inputs: RunInputs, step_name: str | None = None, peak: roofline.Ceilings | None = None,
                   helpers: parallel.Helpers | None = None) -> Analysis:
    """The analysis of one worker's files, read once: each stage a function of typed values. `helpers`:
    lend the stages that need no steps another core."""
    view, run = inputs.trace, inputs.run
    with _stages_and_eager(view, helpers) as beside:  # forked first: part of its work needs no steps
        source = split_input(view, find_steps(inputs, step_name), inputs.steps_table)
        chosen = choose_steps(source.steps)
        beside.give(chosen.used)
        epochs = epoch_tables(inputs, source.steps if source.kind != "steps_csv" else None)
        steps, utilization_note = utilization.steps_with_utilization(source.steps, inputs.steps_table,
                                                                     inputs.samplers, source.kind == "steps_csv")
        devices = device_table(view, source.steps, chosen.used, source.step_name)
        ops, roof = roofline.ops_on_the_roofline(inputs, chosen.used, source.device, peak)
        memory = memory_report(inputs, source.steps)
        stages, eager = beside.result()
    machine, evidence = utilization.headline(inputs.summaries), utilization.evidence(inputs.summaries)
    mean = {**chosen.mean, **mean_input_parts(chosen.steady), "device_step_ms": devices.busiest_step_ms}
    facts = worker_facts(mean, source, run, machine, trace_facts(view, source.steps, devices.rows, stages.prefetches),
                         devices, stages.slowest, ops, eager, epochs.idle_stretch, roof,
                         *roofline.measured_matrix_ceilings(inputs, peak), traced_steps=len(source.steps), memory=memory,
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


def _stages_and_eager(view: TraceView | None, helpers: parallel.Helpers | None
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


