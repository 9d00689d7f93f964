"""Compare runs (and timings measured elsewhere) side by side, and say why each is slower.

One row per run: seconds per epoch in steady state (the median of the epochs after the
first; the only epoch if there is just one), images/s, speed-up against a baseline, the
epoch split into input / compute / host overhead / epoch-level work (from steps.csv, with
the trace's compute share where the run has a trace), utilization and memory from the
samplers, and achieved FLOP/s against the device peak measured by `devprof peak`.

`compare_runs` is the entry: reading (`reading`), rows (`rows`), the table and its "why"
(`table`, `explain`), then rendering (`render`) and the chart (`chart`). TensorFlow is
never imported.
"""

from __future__ import annotations

from pathlib import Path

from analysis import run_files
from analysis.compare.chart import plot_compare
from analysis.compare.errors import CompareError
from analysis.compare.explain import LABELS, advice, explain, per_image_gaps
from analysis.compare.gate import slower_than_baseline
from analysis.compare.op_diff import op_diff_runs
from analysis.compare.reading import read_external, read_run, validate_external
from analysis.compare.render import render, render_markdown, render_text, to_csv_frame, to_json
from analysis.compare.rows import COMPONENTS, external_rows, run_row, steady_components, steady_epochs
from analysis.compare.table import compare, flags_for, pick_baseline, speedups, warnings
from analysis.rules import suggest_steps_per_execution


def compare_runs(runs, externals=(), baseline: str | None = None):
    """The comparison table of run directories `runs` and external timing CSVs `externals`.

    Folders among `runs` that are not run directories (a captures folder beside the runs,
    as `runs/*` gives) are skipped with one warning naming them.
    """
    runs = [Path(path) for path in runs]
    skipped = [path for path in runs if path.is_dir() and not (path / run_files.RUN_JSON).is_file()]
    if skipped and len(skipped) < len(runs) + len(externals):
        run_files.warn(f"skipped {len(skipped)} folder{'s' if len(skipped) > 1 else ''} that "
                       f"{'are' if len(skipped) > 1 else 'is'} not a run directory (no run.json): "
                       f"{', '.join(map(str, skipped))}")
        runs = [path for path in runs if path not in skipped]
    rows = [run_row(read_run(path)) for path in runs]
    for csv in externals:
        rows += external_rows(read_external(csv))
    return compare(rows, baseline)


__all__ = [
    "COMPONENTS", "LABELS", "CompareError", "advice", "compare", "compare_runs", "explain", "external_rows",
    "flags_for", "op_diff_runs", "per_image_gaps", "pick_baseline", "plot_compare", "read_external", "read_run",
    "render", "render_markdown", "render_text", "run_row", "slower_than_baseline", "speedups", "steady_components",
    "steady_epochs",
    "suggest_steps_per_execution", "to_csv_frame", "to_json", "validate_external", "warnings",
]
