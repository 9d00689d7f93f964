"""Assemble one analysis of a step source (a trace, or a run's steps.csv) and render it.

`analyze(path)` is the one pipeline: step source -> steady steps -> mean breakdown ->
rules (verdict and advice) -> the run directory's epochs and utilization. `to_json`,
`render_text` and `render_markdown` only format; `write_outputs` writes CSVs, report.md
and plots.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis import epochs as epochs_mod
from analysis import plots, run_files, trace_facts, utilization
from analysis import rules
from analysis.rules import make_verdict
from analysis.step_sources import StepSource, open_step_source
from analysis.device_rows import device_rows, kernel_launch
from analysis.input_stages import input_stage_table, prefetches, runs_python, slowest_in_table
from analysis.ops import OP_COLUMNS, op_table
from analysis.workers import find_straggler, worker_row, worker_rows
from analysis.steps import mean_breakdown, steady_steps

TOP_OPS = 10
STEP_JSON_KEYS = ["step", "steps", "step_ms", "input_ms", "compute_ms", "collective_ms", "host_ms", "compile_ms"]
MEAN_JSON_KEYS = ["step_ms", "input_ms", "compute_ms", "collective_ms", "host_ms", "input_pct", "compute_pct",
                  "collective_pct", "host_pct"]


@dataclass
class Analysis:
    """Everything `devprof analyze` reports about one step source."""

    source: StepSource
    mean: dict[str, float]
    verdict: dict
    steps_used: int
    epochs: pd.DataFrame | None = None
    reconciliation: pd.DataFrame | None = None
    samplers: dict[str, pd.DataFrame] = field(default_factory=dict)
    utilization: dict[str, float] = field(default_factory=dict)
    findings: list[dict] = field(default_factory=list)
    devices: list[dict] = field(default_factory=list)
    kernel_launch: dict | None = None
    workers: list[dict] = field(default_factory=list)
    straggler: dict | None = None
    ops: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=OP_COLUMNS))
    input_stages: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["stage", "ms_per_batch"]))
    epoch_starts_s: list[float] = field(default_factory=list)
    job_dir: Path | None = None  # a multi-worker run: the job's folder (the breakdown is worker 0's)
    facts: object = None  # the rules.Facts the findings were drawn from

    @property
    def run_dir(self) -> Path | None:
        return self.source.run_dir


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


def analyze(path: str | Path, step_name: str | None = None) -> Analysis:
    """Find the steps at `path` (a trace, or a run directory's steps.csv) and break them down;
    `step_name` (a regex) picks the marker or program that stands for a step. A multi-worker
    run is worker 0's breakdown with one row per worker and the straggler."""
    workers = run_files.worker_dirs(path) if Path(path).is_dir() else []
    if workers and not (Path(path) / run_files.STEPS_CSV).is_file():
        return _analyze_job(Path(path), workers, step_name)
    source = open_step_source(path, step_name)
    steady = steady_steps(source.steps)
    compile_steps = source.steps[~source.steps.index.isin(steady.index)]
    mean = mean_breakdown(steady if not steady.empty else source.steps)
    run_dir = source.run_dir
    meta: dict = {}
    samplers: dict[str, pd.DataFrame] = {}
    epochs = reconciliation = None
    epoch_starts: list[float] = []
    if run_dir is not None:
        meta = run_files.read_run_json(run_dir / run_files.RUN_JSON)
        samplers = run_files.read_utilization(run_dir)
        steps_csv = run_dir / run_files.STEPS_CSV
        if steps_csv.is_file():
            steps_table = run_files.read_steps_csv(steps_csv)
            epochs = epochs_mod.epoch_breakdown(steps_table, run_files.run_epochs(meta, run_dir / run_files.RUN_JSON))
            if source.kind != "steps_csv":
                reconciliation = epochs_mod.reconcile_with_trace(source.steps, steps_table)
            epoch_starts = steps_table.groupby("epoch")["start_time_s"].min().tolist()
    summaries = utilization.run_summaries(run_dir, meta) if run_dir is not None else {}
    config = run_files.section(meta, "config")
    events = source.trace.events if source.trace is not None else None
    stages = input_stage_table(events) if events is not None else None
    stage = slowest_in_table(stages, len(source.steps)) if stages is not None else None
    verdict = make_verdict(
        mean,
        steps_used=len(steady),
        compile_steps=compile_steps,
        steps_per_call=source.steps_per_call,
        slowest_input_stage=stage,
        prefetches=prefetches(events) if events is not None else None,
        input_py_function=runs_python(events, stage) if events is not None else False,
        utilization=utilization_evidence(summaries),
        device=source.device,
        precision=config.get("precision"),
        jit_compile=config.get("jit_compile"),
        steps_per_epoch=_number(meta.get("steps_per_epoch")),
        min_steps=1 if source.kind == "window" else rules.MIN_STEADY_STEPS,  # one window is all there is
    )
    machine = utilization.headline(summaries)
    result = Analysis(source, mean, verdict, len(steady), epochs, reconciliation, samplers, machine,
                      epoch_starts_s=epoch_starts)
    used = source.steps.loc[steady.index] if not steady.empty else source.steps
    if source.trace is not None:
        trace = source.trace
        host = trace.hostnames[0] if trace.hostnames else ""
        result.devices = device_rows(trace.events, trace.planes, used, host)
        result.kernel_launch = kernel_launch(trace.events, used) if result.devices else None
        own = worker_row(trace.location.xplane.name.removesuffix(".xplane.pb"), host or
                         trace.location.xplane.name.removesuffix(".xplane.pb"), mean)
        result.workers = worker_rows(trace.location.host_files, step_name, {trace.location.xplane: own})
        result.straggler = find_straggler(result.workers)
        result.ops = op_table(trace.events, used, source.device)
        result.input_stages = stages
    found = trace_facts.collect(source.trace.events if source.trace is not None else None, source.steps,
                                result.devices, run_files.section(meta, "device"))
    facts = rules.Facts(mean["input_pct"], mean["compute_pct"], mean["host_pct"], device=source.device,
                        precision=config.get("precision"), other_cpu_pct=machine["other_cpu_mean_pct"],
                        proc_cpu_pct=machine["proc_cpu_mean_pct"], cpu_cores=machine["cpu_cores"],
                        device_mem_peak_bytes=machine["device_mem_peak_bytes"],
                        device_mem_total_bytes=machine["device_mem_total_bytes"], **found)
    result.facts = facts
    result.findings = rules.findings(facts)
    return result


def _analyze_job(job_dir: Path, workers: list[Path], step_name: str | None) -> Analysis:
    per_worker = [analyze(worker, step_name) for worker in workers]
    chief = per_worker[0]
    chief.job_dir = job_dir
    chief.workers = []
    for index, (worker, analysis) in enumerate(zip(workers, per_worker)):
        device = run_files.section(run_files.read_run_json(worker / run_files.RUN_JSON), "device")
        chief.workers.append(worker_row(index, str(device.get("host") or worker.name), analysis.mean))
    chief.straggler = find_straggler(chief.workers)
    # Workers on the chief's machine are the job, not "other processes" competing with it.
    hosts = [row["host"] for row in chief.workers]
    local = [a.utilization.get("proc_cpu_mean_pct", math.nan) for a, host in zip(per_worker, hosts) if host == hosts[0]]
    cores = chief.utilization.get("cpu_cores", math.nan)
    if len(local) > 1 and chief.facts is not None and cores == cores and all(v == v for v in local):
        job_cpu = sum(local)
        chief.utilization["proc_cpu_mean_pct"] = job_cpu
        chief.utilization["other_cpu_mean_pct"] = max(0.0, chief.utilization["cpu_util_mean_pct"] - job_cpu / cores)
        chief.facts.proc_cpu_pct = job_cpu
        chief.facts.other_cpu_pct = chief.utilization["other_cpu_mean_pct"]
        chief.findings = rules.findings(chief.facts)
    chief.source.notes.append(f"{len(workers)} workers: the breakdown is worker 0's ({workers[0].name}); "
                              "one row per worker below")
    return chief


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _json_value(value):
    return None if isinstance(value, float) and math.isnan(value) else value


def input_bottleneck(analysis: Analysis) -> dict | None:
    """The slowest tf.data stage when the steps wait for input (input-bound verdict), else None."""
    if analysis.verdict.get("bound") != "input" or analysis.input_stages.empty:
        return None
    slowest = analysis.input_stages.iloc[0]
    return {"stage": str(slowest["stage"]), "ms_per_batch": float(slowest["ms_per_batch"])}


def _records(frame: pd.DataFrame) -> list[dict]:
    return [{k: (_json_value(float(v)) if isinstance(v, (float, int)) and not isinstance(v, bool) and k not in ("op", "type")
                 else v) for k, v in row.items()} for row in frame.to_dict(orient="records")]


def to_json(analysis: Analysis) -> dict:
    """The JSON contract (docs/json.md): source, step source, device, steps, mean, verdict, utilization,
    and epochs for run directories."""
    source = analysis.source
    result = {
        "schema_version": run_files.SCHEMA_VERSION,
        "source": str(source.path),
        "step_source": source.kind,
        "step_name": source.step_name,
        "device": source.device,
        "notes": list(source.notes),
        "steps": [
            {key: (int(row[key]) if key in ("step", "steps") else float(row[key])) for key in STEP_JSON_KEYS}
            for _, row in source.steps.iterrows()
        ],
        "mean": {key: float(analysis.mean[key]) for key in MEAN_JSON_KEYS},
        "steps_used": int(analysis.steps_used),
        "verdict": dict(analysis.verdict),
        "findings": list(analysis.findings),
        "devices": [dict(row) for row in analysis.devices],
        "kernel_launch": analysis.kernel_launch,
        "workers": [dict(row) for row in analysis.workers],
        "straggler": analysis.straggler,
        "ops": _records(analysis.ops),
        "input_stages": _records(analysis.input_stages),
        "input_bottleneck": input_bottleneck(analysis),
        "utilization": {key: _json_value(value) for key, value in analysis.utilization.items()},
    }
    if analysis.epochs is not None:
        result["epochs"] = [
            {k: (int(v) if k in ("epoch", "calls", "steps", "images") else _json_value(float(v))) for k, v in row.items()}
            for row in analysis.epochs.to_dict(orient="records")
        ]
    return result


def _header_lines(analysis: Analysis) -> list[str]:
    source = analysis.source
    unit = "calls" if source.steps_per_call > 1 else "steps"
    if source.kind == "steps_csv":
        lines = [f"source: {source.path} (no profiler trace)",
                 f"device: {source.device}; {len(source.steps)} {unit}"]
    else:
        how = {"markers": "step marker", "trace_groups": "the trace's step groups",
               "program_executions": "executions of", "window": "one interval:"}.get(source.kind, source.kind)
        lines = [f"trace: {source.path}",
                 f"device: {source.device}; {len(source.steps)} {unit} found by {source.kind} "
                 f"({how} '{source.step_name}')"]
    if source.steps_per_call > 1:
        lines.append(f"steps per call: {source.steps_per_call} (one marker per tf.function call)")
    lines += [f"note: {note}" for note in source.notes]
    return lines


def _steps_table(analysis: Analysis) -> pd.DataFrame:
    columns = ["step", "steps", "step_ms", "input_ms", "compute_ms", "host_ms", "compile_ms", "input_pct",
               "compute_pct", "host_pct"]
    return analysis.source.steps[columns].round(3)


def _epochs_table(analysis: Analysis) -> pd.DataFrame:
    columns = ["epoch", "calls", "seconds", "input_s", "call_s", "other_host_s", "epoch_level_s", "input_pct",
               "call_pct", "other_host_pct", "epoch_level_pct"]
    return analysis.epochs[columns].round(3)


def devices_table(analysis: Analysis) -> pd.DataFrame:
    columns = ["device", "step_count", "step_ms", "compute_ms", "input_ms", "copy_ms", "collective_ms", "idle_ms",
               "idle_input_ms", "idle_host_ms"]
    return pd.DataFrame(analysis.devices, columns=columns).round(3)


def workers_table(analysis: Analysis) -> pd.DataFrame:
    return pd.DataFrame(analysis.workers).round(3)


def _device_lines(analysis: Analysis) -> list[str]:
    out = []
    if analysis.devices:
        out += ["", "devices (mean ms per step in which the device ran; idle split: waiting for input / the rest):",
                devices_table(analysis).to_string(index=False)]
    launch = analysis.kernel_launch
    if launch and launch["calls"]:
        out.append(f"kernel launches on the host: {launch['calls']} calls, {launch['calls_per_step']:.1f} per step, "
                   f"{launch['ms_per_step']:.3f} ms per step")
    if analysis.workers:
        out += ["", "workers (mean ms per steady step of each host's trace):",
                workers_table(analysis).to_string(index=False)]
        straggler = analysis.straggler
        out.append(f"straggler: {straggler['worker']} ({straggler['cause']}): {straggler['evidence']}" if straggler
                   else "straggler: none (no worker's step without collective wait is 10 % above the others')")
    return out


def _findings_lines(findings: list[dict], bullet: str) -> list[str]:
    if not findings:
        return []
    return ["findings:"] + [f"{bullet}[{f['severity']}] {f['rule']}: {f['evidence']} Fix: {f['advice']}." for f in findings]


def verdict_title(verdict: dict) -> str:
    if verdict["bound"] is None:
        return f"none ({verdict['reason']})"
    return f"{verdict['bound']}-bound" + (f" ({verdict['level']})" if verdict["level"] else "")


def render_text(analysis: Analysis) -> str:
    mean, verdict = analysis.mean, analysis.verdict
    out = _header_lines(analysis)
    out.append("")
    out.append(_steps_table(analysis).to_string(index=False))
    out.append("")
    per_call = analysis.source.steps_per_call
    unit = f"calls of {per_call} steps: call" if per_call > 1 else "steps: step"
    out.append(
        f"mean over {analysis.steps_used} {unit} {mean['step_ms']:.2f} ms = input {mean['input_ms']:.2f} "
        f"({mean['input_pct']:.1f} %) + compute {mean['compute_ms']:.2f} ({mean['compute_pct']:.1f} %) "
        f"+ host {mean['host_ms']:.2f} ({mean['host_pct']:.1f} %)"
    )
    out += _device_lines(analysis)
    if not analysis.ops.empty:
        out += ["", f"top ops (of {len(analysis.ops)}; all in ops.csv; ms per training step, share of op time):",
                analysis.ops.head(TOP_OPS).round(3).to_string(index=False)]
    if not analysis.input_stages.empty:
        out += ["", "tf.data stages (self time per batch, slowest first):",
                analysis.input_stages.head(TOP_OPS).round(3).to_string(index=False)]
    if analysis.epochs is not None:
        out += ["", "epochs (from steps.csv and run.json; epoch_level = validation, iterator setup, ...):",
                _epochs_table(analysis).to_string(index=False)]
    if analysis.reconciliation is not None and not analysis.reconciliation.empty:
        rec = analysis.reconciliation
        out.append(
            f"trace vs steps.csv on {len(rec)} traced steps: step time differs by "
            f"{rec['step_diff_pct'].abs().mean():.1f} % on average, input by {rec['input_diff_pct'].abs().mean():.1f} % of step time"
        )
    out += ["", f"verdict: {verdict_title(verdict)}", verdict["evidence"]]
    if verdict["advice"]:
        out += ["advice:", *(f"  - {item}" for item in verdict["advice"])]
    out += _findings_lines(analysis.findings, "  - ")
    return "\n".join(out) + "\n"


def _markdown_table(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---:" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def render_markdown(analysis: Analysis, plot_names: list[str] | None = None) -> str:
    mean, verdict = analysis.mean, analysis.verdict
    out = ["# devprof analysis", ""]
    out += [f"- {line}" for line in _header_lines(analysis)]
    out += ["", f"## Verdict: {verdict_title(verdict)}", "", verdict["evidence"], ""]
    out += [f"- {item}" for item in verdict["advice"]]
    if analysis.findings:
        out += ["", "## Findings", ""] + _findings_lines(analysis.findings, "- ")[1:]
    out += ["", "## Mean step", "", _markdown_table(pd.DataFrame([{k: round(v, 3) for k, v in mean.items()}])), ""]
    out += ["## Steps", "", "Host overhead includes compile time.", "", _markdown_table(_steps_table(analysis)), ""]
    if analysis.devices:
        out += ["## Devices", "", _markdown_table(devices_table(analysis)), ""]
    if analysis.workers:
        out += ["## Workers", "", _markdown_table(workers_table(analysis)), ""]
        if analysis.straggler:
            out += [f"Straggler: **{analysis.straggler['worker']}** ({analysis.straggler['cause']}): "
                    f"{analysis.straggler['evidence']}", ""]
    if analysis.epochs is not None:
        out += ["## Epochs", "", "From steps.csv and run.json; `epoch_level` is work outside training steps "
                "(validation, iterator setup, checkpoints).", "", _markdown_table(_epochs_table(analysis)), ""]
    if analysis.reconciliation is not None and not analysis.reconciliation.empty:
        out += ["## Trace vs steps.csv", "", _markdown_table(analysis.reconciliation.round(3)), ""]
    for name in plot_names or []:
        out += [f"![{name}]({name})", ""]
    return "\n".join(out)


def render(analysis: Analysis, fmt: str) -> str:
    """`fmt` is text, markdown or json."""
    if fmt == "json":
        return json.dumps(to_json(analysis), indent=2) + "\n"
    if fmt == "markdown":
        return render_markdown(analysis) + "\n"
    return render_text(analysis)


def default_out_dir(analysis: Analysis) -> Path | None:
    folder = analysis.job_dir or analysis.run_dir
    return folder / "analysis" if folder is not None else None


def write_outputs(analysis: Analysis, out_dir: str | Path) -> list[Path]:
    """Breakdown CSVs, plots, report.md and analysis.json under `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    steps_csv = out_dir / "step_breakdown.csv"
    analysis.source.steps.to_csv(steps_csv, index=False)
    written.append(steps_csv)
    if not analysis.ops.empty:
        analysis.ops.to_csv(out_dir / "ops.csv", index=False)
        written.append(out_dir / "ops.csv")
    plot_names = [plots.plot_step_breakdown(analysis.source.steps, out_dir / "step_breakdown.png").name]
    if analysis.epochs is not None:
        epochs_csv = out_dir / "epoch_breakdown.csv"
        analysis.epochs.to_csv(epochs_csv, index=False)
        written.append(epochs_csv)
        plot_names.append(plots.plot_epoch_breakdown(analysis.epochs, out_dir / "epoch_breakdown.png").name)
    if analysis.reconciliation is not None:
        reconcile_csv = out_dir / "trace_vs_steps.csv"
        analysis.reconciliation.to_csv(reconcile_csv, index=False)
        written.append(reconcile_csv)
    if analysis.samplers:
        plot_names.append(
            plots.plot_utilization(analysis.samplers, analysis.epoch_starts_s, out_dir / "utilization.png").name
        )
    written += [out_dir / name for name in plot_names]
    report = out_dir / "report.md"
    report.write_text(render_markdown(analysis, plot_names))
    written.append(report)
    json_path = out_dir / "analysis.json"
    json_path.write_text(json.dumps(to_json(analysis), indent=2))
    written.append(json_path)
    return written
