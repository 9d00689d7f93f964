"""Assemble one analysis of a trace (and its run directory) and render it.

`analyze(path)` does the reading and computing; `to_json`, `render_text` and
`render_markdown` only format; `write_outputs` writes CSVs, report.md and plots.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis import epochs as epochs_mod
from analysis import plots
from analysis.steps import StepAnalysis, analyze_steps, mean_breakdown, slowest_input_stage, steady_steps
from analysis.sampler_columns import UTILIZATION_COLUMNS
from analysis.trace import Trace, TraceError, TraceLocation, read_trace
from analysis.verdict import make_verdict

STEP_JSON_KEYS = ["step", "steps", "step_ms", "input_ms", "compute_ms", "host_ms", "compile_ms"]
MEAN_JSON_KEYS = ["step_ms", "input_ms", "compute_ms", "host_ms", "input_pct", "compute_pct", "host_pct"]


@dataclass
class Analysis:
    """Everything `devprof analyze` reports about one trace."""

    location: TraceLocation
    trace: Trace | None  # None when a run directory is analysed from steps.csv alone
    steps: StepAnalysis
    mean: dict[str, float]
    verdict: dict
    steps_used: int
    epochs: pd.DataFrame | None = None
    reconciliation: pd.DataFrame | None = None
    samplers: dict[str, pd.DataFrame] = field(default_factory=dict)
    epoch_starts_s: list[float] = field(default_factory=list)

    @property
    def run_dir(self) -> Path | None:
        return self.location.run_dir


def _read_samplers(run_dir: Path) -> dict[str, pd.DataFrame]:
    samplers = {}
    for csv in sorted((run_dir / "utilization").glob("*.csv")):
        try:
            frame = pd.read_csv(csv)
        except (pd.errors.EmptyDataError, pd.errors.ParserError):
            continue
        if "time_s" in frame and not frame.empty:
            samplers[csv.stem] = frame
    return samplers


def _utilization_evidence(samplers: dict[str, pd.DataFrame]) -> dict[str, float]:
    evidence = {}
    for name, frame in samplers.items():
        for column in UTILIZATION_COLUMNS:
            if column in frame and frame[column].notna().any():
                evidence[f"mean {name} {column.removesuffix('_pct').replace('_', ' ')}"] = float(frame[column].mean())
                break
    return evidence


def _run_settings(run_dir: Path | None) -> dict:
    """The run's precision and XLA setting, so advice does not suggest what it already does."""
    try:
        config = json.loads((run_dir / "run.json").read_text()).get("config") or {}
    except (TypeError, OSError, ValueError):  # no run directory, or no readable run.json
        return {}
    return {"precision": config.get("precision"), "jit_compile": config.get("jit_compile")}


def analyze(path: str | Path) -> Analysis:
    """Read the trace at `path` (and its run directory, if any) and break it down.

    A run directory without a trace (`--no-profile`, or a trace that failed to write) is
    still analysed, from its steps.csv alone.
    """
    try:
        trace = read_trace(path)
    except TraceError:
        run_dir = Path(path)
        if not ((run_dir / "steps.csv").is_file() and (run_dir / "run.json").is_file()):
            raise
        return analyze_steps_csv(run_dir)
    location = trace.location
    step_analysis = analyze_steps(trace)
    all_steps = step_analysis.steps
    steady = steady_steps(all_steps)
    compile_steps = all_steps[~all_steps.index.isin(steady.index)]
    mean = mean_breakdown(steady)
    samplers: dict[str, pd.DataFrame] = {}
    epochs = reconciliation = None
    epoch_starts: list[float] = []
    run_dir = location.run_dir
    if run_dir is not None:
        samplers = _read_samplers(run_dir)
        steps_csv = run_dir / "steps.csv"
        if steps_csv.is_file():
            steps_table = epochs_mod.read_steps_csv(steps_csv)
            run_epochs = epochs_mod.read_run_epochs(run_dir / "run.json")
            epochs = epochs_mod.epoch_breakdown(steps_table, run_epochs)
            reconciliation = epochs_mod.reconcile_with_trace(all_steps, steps_table)
            epoch_starts = steps_table.groupby("epoch")["start_time_s"].min().tolist()
    per_call = int(all_steps["steps"].max())
    verdict = make_verdict(
        mean,
        steps_used=len(steady),
        compile_steps=compile_steps,
        steps_per_call=per_call,
        slowest_input_stage=slowest_input_stage(trace.events, len(all_steps)),
        utilization=_utilization_evidence(samplers),
        device=step_analysis.device,
        **_run_settings(run_dir),
    )
    return Analysis(location, trace, step_analysis, mean, verdict, len(steady), epochs, reconciliation, samplers,
                    epoch_starts)


def steps_from_csv(steps_table: pd.DataFrame) -> pd.DataFrame:
    """steps.csv as a breakdown: compute is the time in the step call (on a CPU the math plus
    tf.function dispatch); the first call's excess over the median call is its tracing and
    compilation, reported as compile and counted in host overhead, as the trace analysis does."""
    frame = pd.DataFrame({
        "step": steps_table["step"].astype(int),
        "steps": steps_table["steps"].astype(int),
        "step_ms": steps_table["step_ms"],
        "input_ms": steps_table["input_ms"],
        "compute_ms": steps_table["call_ms"],
        "host_ms": steps_table["other_host_ms"],
        "compile_ms": 0.0,
    })
    first = frame.index[0]
    later = frame["compute_ms"].iloc[1:]  # with one call only, its compile time cannot be told apart
    excess = max(0.0, float(frame.at[first, "compute_ms"] - later.median())) if len(later) else 0.0
    frame.loc[first, ["compute_ms", "host_ms", "compile_ms"]] = [
        frame.at[first, "compute_ms"] - excess, frame.at[first, "host_ms"] + excess, excess]
    for part in ("input", "compute", "host"):
        frame[f"{part}_pct"] = 100.0 * frame[f"{part}_ms"] / frame["step_ms"]
    return frame


def analyze_steps_csv(run_dir: Path) -> Analysis:
    """The breakdown of a run directory that has no profiler trace, from steps.csv."""
    steps_table = epochs_mod.read_steps_csv(run_dir / "steps.csv")
    if steps_table.empty:
        raise TraceError(f"{run_dir} has no profiler trace and steps.csv has no steps yet")
    run = json.loads((run_dir / "run.json").read_text())
    steps = steps_from_csv(steps_table)
    steady = steady_steps(steps)
    mean = mean_breakdown(steady)
    samplers = _read_samplers(run_dir)
    location = TraceLocation(
        requested=run_dir, xplane=None, session="", run_dir=run_dir,
        note="no profiler trace: breakdown from steps.csv, where compute is the time in the step call "
             "(the math plus tf.function dispatch); run with the profiler window for the trace's split")
    step_analysis = StepAnalysis(device=(run.get("device") or {}).get("kind", "unknown"), marker_name="steps.csv",
                                 markers=pd.DataFrame(), steps=steps)
    verdict = make_verdict(mean, steps_used=len(steady), compile_steps=steps[~steps.index.isin(steady.index)],
                           steps_per_call=int(steps["steps"].max()), utilization=_utilization_evidence(samplers),
                           device=step_analysis.device, **_run_settings(run_dir))
    epochs = epochs_mod.epoch_breakdown(steps_table, epochs_mod.read_run_epochs(run_dir / "run.json"))
    epoch_starts = steps_table.groupby("epoch")["start_time_s"].min().tolist()
    return Analysis(location, None, step_analysis, mean, verdict, len(steady), epochs, None, samplers, epoch_starts)


def to_json(analysis: Analysis) -> dict:
    """The JSON contract: source, device, steps, mean, verdict (+ epochs for run directories)."""
    steps = analysis.steps.steps
    result = {
        "source": str(analysis.location.xplane or analysis.location.run_dir / "steps.csv"),
        "device": analysis.steps.device,
        "steps": [
            {key: (int(row[key]) if key in ("step", "steps") else float(row[key])) for key in STEP_JSON_KEYS}
            for _, row in steps.iterrows()
        ],
        "mean": {key: float(analysis.mean[key]) for key in MEAN_JSON_KEYS},
        "verdict": dict(analysis.verdict),
    }
    if analysis.epochs is not None:
        result["epochs"] = [
            {k: (int(v) if k in ("epoch", "calls", "steps", "images") else float(v)) for k, v in row.items()}
            for row in analysis.epochs.to_dict(orient="records")
        ]
    return result


def _header_lines(analysis: Analysis) -> list[str]:
    steps = analysis.steps
    unit = "calls" if steps.steps["steps"].max() > 1 else "steps"
    if analysis.location.xplane:
        lines = [f"trace: {analysis.location.xplane}",
                 f"device: {steps.device}; step marker: '{steps.marker_name}'; {len(steps.steps)} marked {unit}"]
    else:
        lines = [f"source: {analysis.location.run_dir / 'steps.csv'} (no profiler trace)",
                 f"device: {steps.device}; {len(steps.steps)} {unit}"]
    if steps.steps["steps"].max() > 1:
        lines.append(f"steps per call: {int(steps.steps['steps'].max())} (one marker per tf.function call)")
    if analysis.location.note:
        lines.append(f"note: {analysis.location.note}")
    return lines


def _steps_table(analysis: Analysis) -> pd.DataFrame:
    columns = ["step", "steps", "step_ms", "input_ms", "compute_ms", "host_ms", "compile_ms", "input_pct",
               "compute_pct", "host_pct"]
    return analysis.steps.steps[columns].round(3)


def _epochs_table(analysis: Analysis) -> pd.DataFrame:
    columns = ["epoch", "calls", "seconds", "input_s", "call_s", "other_host_s", "epoch_level_s", "input_pct",
               "call_pct", "other_host_pct", "epoch_level_pct"]
    return analysis.epochs[columns].round(3)


def render_text(analysis: Analysis) -> str:
    mean, verdict = analysis.mean, analysis.verdict
    out = _header_lines(analysis)
    out.append("")
    out.append(_steps_table(analysis).to_string(index=False))
    out.append("")
    per_call = int(analysis.steps.steps["steps"].max())
    unit = f"calls of {per_call} steps: call" if per_call > 1 else "steps: step"
    out.append(
        f"mean over {analysis.steps_used} {unit} {mean['step_ms']:.2f} ms = input {mean['input_ms']:.2f} "
        f"({mean['input_pct']:.1f} %) + compute {mean['compute_ms']:.2f} ({mean['compute_pct']:.1f} %) "
        f"+ host {mean['host_ms']:.2f} ({mean['host_pct']:.1f} %)"
    )
    if analysis.epochs is not None:
        out += ["", "epochs (from steps.csv and run.json; epoch_level = validation, iterator setup, ...):",
                _epochs_table(analysis).to_string(index=False)]
    if analysis.reconciliation is not None and not analysis.reconciliation.empty:
        rec = analysis.reconciliation
        out.append(
            f"trace vs steps.csv on {len(rec)} traced steps: step time differs by "
            f"{rec['step_diff_pct'].abs().mean():.1f} % on average, input by {rec['input_diff_pct'].abs().mean():.1f} % of step time"
        )
    out += ["", f"verdict: {verdict['bound']}-bound" + (f" ({verdict['level']})" if verdict["level"] else ""),
            verdict["evidence"], "advice:"]
    out += [f"  - {item}" for item in verdict["advice"]]
    return "\n".join(out) + "\n"


def _markdown_table(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---:" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def render_markdown(analysis: Analysis, plot_names: list[str] | None = None) -> str:
    mean, verdict = analysis.mean, analysis.verdict
    level = f" ({verdict['level']})" if verdict["level"] else ""
    out = ["# devprof analysis", ""]
    out += [f"- {line}" for line in _header_lines(analysis)]
    out += ["", f"## Verdict: {verdict['bound']}-bound{level}", "", verdict["evidence"], ""]
    out += [f"- {item}" for item in verdict["advice"]]
    out += ["", "## Mean step", "", _markdown_table(pd.DataFrame([{k: round(v, 3) for k, v in mean.items()}])), ""]
    out += ["## Steps", "", "Host overhead includes compile time.", "", _markdown_table(_steps_table(analysis)), ""]
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
    return analysis.run_dir / "analysis" if analysis.run_dir is not None else None


def write_outputs(analysis: Analysis, out_dir: str | Path) -> list[Path]:
    """Breakdown CSVs, plots, report.md and analysis.json under `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    steps_csv = out_dir / "step_breakdown.csv"
    analysis.steps.steps.to_csv(steps_csv, index=False)
    written.append(steps_csv)
    plot_names = [plots.plot_step_breakdown(analysis.steps.steps, out_dir / "step_breakdown.png").name]
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
