"""The files `devprof analyze` writes beside a run: breakdown CSVs, PNG plots, report.md, report.html,
analysis.json; each written as `files.write_text_atomically` does, never through a link."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from analysis.render import html, markdown, plots
from analysis.render import json as json_format
from analysis.render.csv_safety import frame_csv
from analysis.render.files import OutsideRunError, check_inside, temporary_path, write_text_atomically

__all__ = ["OutsideRunError", "check_inside", "csv_text", "temporary_path", "write_outputs", "write_text_atomically"]


def csv_text(frame: pd.DataFrame) -> str:
    """A frame as devprof writes every CSV: text cells that a spreadsheet would run as formulas quoted."""
    return frame_csv(frame)


Jobs = list[tuple[str, tuple]]  # (a function of analysis.render.plots, its arguments)


def write_outputs(
    analysis, out_dir: str | Path, draw: Callable[[Jobs], Callable[[], list[Path]]] | None = None
) -> list[Path]:
    """Every file under `out_dir`; returns their paths. `draw(jobs)` begins drawing the PNGs elsewhere
    (another process) while the other files are written here, and gives what waits for their paths."""
    out_dir = Path(out_dir)
    check_inside(out_dir, analysis.job_dir or analysis.run_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs: list[tuple[str, tuple]] = [("plot_step_breakdown", (analysis.steps, out_dir / "step_breakdown.png"))]
    if analysis.epochs is not None:
        jobs.append(("plot_epoch_breakdown", (analysis.epochs, out_dir / "epoch_breakdown.png")))
    if analysis.samplers:
        jobs.append(
            ("plot_utilization", (analysis.samplers, list(analysis.epoch_starts_s), out_dir / "utilization.png"))
        )
    drawn = draw(jobs) if draw is not None else None
    written = [write_text_atomically(out_dir / "step_breakdown.csv", csv_text(analysis.steps))]
    if not analysis.ops.empty:
        written.append(write_text_atomically(out_dir / "ops.csv", csv_text(analysis.ops)))
    if analysis.epochs is not None:
        written.append(write_text_atomically(out_dir / "epoch_breakdown.csv", csv_text(analysis.epochs)))
    if not analysis.workers.empty:  # every worker, however many; the reports show the slowest
        written.append(write_text_atomically(out_dir / "workers.csv", csv_text(analysis.workers)))
    if analysis.memory is not None and not analysis.memory.timeline.empty:  # every allocator event of the trace
        written.append(write_text_atomically(out_dir / "memory.csv", csv_text(analysis.memory.timeline)))
    if analysis.reconciliation is not None:
        written.append(write_text_atomically(out_dir / "trace_vs_steps.csv", csv_text(analysis.reconciliation)))
    plot_names = [path.name for _, (*_, path) in jobs]
    reports = [
        write_text_atomically(out_dir / "report.md", markdown.render_analysis(analysis, plot_names)),
        write_text_atomically(out_dir / "report.html", html.render_analysis(analysis)),
    ]
    document = json_format.dumps(json_format.analysis_document(analysis))
    reports.append(write_text_atomically(out_dir / "analysis.json", document))
    return written + (drawn() if drawn is not None else [getattr(plots, name)(*args) for name, args in jobs]) + reports
