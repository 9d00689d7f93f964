"""The files `devprof analyze` writes beside a run: breakdown CSVs, PNG plots, report.md, analysis.json."""

from __future__ import annotations

import json
from pathlib import Path

from analysis import plots
from analysis.render import json as json_format
from analysis.render import markdown


def write_outputs(analysis, out_dir: str | Path) -> list[Path]:
    """Every file under `out_dir`; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    steps_csv = out_dir / "step_breakdown.csv"
    analysis.steps.to_csv(steps_csv, index=False)
    written.append(steps_csv)
    if not analysis.ops.empty:
        analysis.ops.to_csv(out_dir / "ops.csv", index=False)
        written.append(out_dir / "ops.csv")
    plot_names = [plots.plot_step_breakdown(analysis.steps, out_dir / "step_breakdown.png").name]
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
            plots.plot_utilization(analysis.samplers, list(analysis.epoch_starts_s), out_dir / "utilization.png").name
        )
    written += [out_dir / name for name in plot_names]
    report = out_dir / "report.md"
    report.write_text(markdown.render_analysis(analysis, plot_names))
    written.append(report)
    json_path = out_dir / "analysis.json"
    json_path.write_text(json.dumps(json_format.analysis_document(analysis), indent=2))
    written.append(json_path)
    return written
