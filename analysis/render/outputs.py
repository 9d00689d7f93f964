"""The files `devprof analyze` writes beside a run: breakdown CSVs, PNG plots, report.md, report.html,
analysis.json.

Each file is written under a temporary name in the same folder and renamed into place, so a
full disk or a crash never leaves a cut or empty file where a complete one is expected.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from analysis.render import html, markdown, plots
from analysis.render import json as json_format
from analysis.render.csv_safety import neutralize_frame


def temporary_path(path: Path) -> Path:
    """A name beside `path` that no other writer uses, with the same suffix (plots pick their format by it)."""
    return path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")


def write_text_atomically(path: Path, text: str) -> Path:
    tmp = temporary_path(path)
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def csv_text(frame: pd.DataFrame) -> str:
    """A frame as devprof writes every CSV: text cells that a spreadsheet would run as formulas quoted."""
    return neutralize_frame(frame).to_csv(index=False)


def write_outputs(analysis, out_dir: str | Path) -> list[Path]:
    """Every file under `out_dir`; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    written.append(write_text_atomically(out_dir / "step_breakdown.csv", csv_text(analysis.steps)))
    if not analysis.ops.empty:
        written.append(write_text_atomically(out_dir / "ops.csv", csv_text(analysis.ops)))
    plot_names = [plots.plot_step_breakdown(analysis.steps, out_dir / "step_breakdown.png").name]
    if analysis.epochs is not None:
        written.append(write_text_atomically(out_dir / "epoch_breakdown.csv", csv_text(analysis.epochs)))
        plot_names.append(plots.plot_epoch_breakdown(analysis.epochs, out_dir / "epoch_breakdown.png").name)
    if analysis.reconciliation is not None:
        written.append(write_text_atomically(out_dir / "trace_vs_steps.csv", csv_text(analysis.reconciliation)))
    if analysis.samplers:
        plot_names.append(
            plots.plot_utilization(analysis.samplers, list(analysis.epoch_starts_s), out_dir / "utilization.png").name
        )
    written += [out_dir / name for name in plot_names]
    written.append(write_text_atomically(out_dir / "report.md", markdown.render_analysis(analysis, plot_names)))
    written.append(write_text_atomically(out_dir / "report.html", html.render_analysis(analysis)))
    document = json.dumps(json_format.analysis_document(analysis), indent=2)
    written.append(write_text_atomically(out_dir / "analysis.json", document))
    return written
