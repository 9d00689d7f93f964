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

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pandas as pd

from analysis.comparison.chart import plot_compare
from analysis.comparison.errors import CompareError, UnusableRun
from analysis.comparison.explain import LABELS, advice, explain, per_image_gaps
from analysis.comparison.gate import slower_than_baseline
from analysis.comparison.op_diff import op_diff_runs
from analysis.comparison.reading import RunRead, read_external, read_run, read_tune, validate_external
from analysis.comparison.rows import COMPONENTS, external_rows, run_row, steady_components, steady_epochs
from analysis.comparison.table import compare, flags_for, pick_baseline, speedups, warnings
from analysis.pipeline import analyze
from analysis.read import run_files
from analysis.read.tune_files import is_tune
from analysis.render import Rendered
from analysis.rules.advice_loop import suggest_steps_per_execution
from analysis.worker import analyze_inputs, checked_path


@dataclass(frozen=True)
class Comparison(Rendered):
    """The comparison of several runs: `table` has one row per run (docs/json.md, compare's `rows`)."""

    KIND: ClassVar[str] = "comparison"
    table: pd.DataFrame
    op_diff: dict | None = None  # `rows`, `unit`, `gap`, `a`, `b` of `compare --ops`
    plot_name: str | None = None  # the chart beside a written report

    @property
    def baseline(self) -> str:
        return str(self.table.loc[self.table["baseline"], "run"].iloc[0])

    @property
    def fastest(self) -> str:
        return str(self.table.loc[self.table["fastest"], "run"].iloc[0])

    @property
    def warnings(self) -> list[str]:
        return warnings(self.table)

    def to_perfetto(self, path: str | Path, events: str = "ops") -> Path:
        """Every compared run as a Perfetto trace at `path`: each run's processes (a job: one per worker),
        named by the run, as `Analysis.to_perfetto` draws them; the runs are analysed again."""
        return write_perfetto(self, path, events).path


def write_perfetto(comparison: Comparison, path: str | Path, events: str = "ops"):
    """`Comparison.to_perfetto`, returning what the trace holds (`analysis.render.perfetto.Written`)."""
    from analysis import timeline

    runs = [
        (str(run), functools.partial(analyze, where, processes=1))
        for run, where in zip(comparison.table["run"], comparison.table["path"])
        if isinstance(where, str) and where
    ]  # a timing measured elsewhere has no timeline
    return timeline.write_runs(runs, path, analyze_inputs, events)


def compare_runs(runs, externals=(), baseline: str | None = None) -> pd.DataFrame:
    """The comparison table of run directories `runs` and external timing CSVs `externals`.

    Folders among `runs` that are not run directories (a captures folder beside the runs,
    as `runs/*` gives) are skipped with one warning naming them.
    """
    return compare(_rows(_read_runs(runs, externals), externals, _tunes(runs)), baseline)


def _read_runs(runs, externals=()) -> dict[Path, RunRead]:
    """Each usable run directory read once (its files and its trace's analysis), in order."""
    runs = [Path(path) for path in runs if not is_tune(Path(path))]
    skipped = [path for path in runs if path.is_dir() and not (path / run_files.RUN_JSON).is_file()]
    if skipped and len(skipped) < len(runs) + len(externals):
        why = {path: ", ".join(run_files.irregular_run_files(path)) or "no run.json" for path in skipped}
        run_files.warn(
            f"skipped {len(skipped)} folder{'s' if len(skipped) > 1 else ''} that "
            f"{'are' if len(skipped) > 1 else 'is'} not a run directory: "
            f"{', '.join(f'{path} ({why[path]})' for path in skipped)}"
        )
        runs = [path for path in runs if path not in skipped]
    return {path: read_run(path) for path in _each_once(runs)}


def _rows(reads: dict[Path, RunRead], externals=(), tunes=()) -> list[dict]:
    """The rows of the runs read, the timings measured elsewhere and the tunes (default and best each)."""
    rows = []
    for path, run in reads.items():
        try:
            rows.append(run_row(run))
        except UnusableRun as exc:
            if len(reads) + len(externals) + 2 * len(tunes) < 2:
                raise
            run_files.warn(f"skipped {path}: {exc}")
    for csv in externals:
        rows += external_rows(read_external(csv))
    for tune in tunes:
        rows += external_rows(read_tune(tune))
    return rows


def _tunes(runs) -> list[Path]:
    """The `devprof tune` folders among `runs`: each compared at its default and best setting."""
    return [Path(path) for path in runs if is_tune(Path(path))]


def _each_once(runs: list[Path]) -> list[Path]:
    """`runs` with a run directory given twice (also as another spelling of its path) kept once, with a warning."""
    seen: dict[Path, Path] = {}
    for path in runs:
        key = path.resolve() if path.exists() else path
        if key in seen:
            run_files.warn(f"{path} was given twice (as {seen[key]} before): it is shown once")
        else:
            seen[key] = path
    return list(seen.values())


def _paths(given, name: str) -> list:
    if isinstance(given, (str, os.PathLike)):
        return [checked_path(given, name)]
    try:
        items = list(given)
    except TypeError:
        raise TypeError(f"{name} must be paths (a list of str or pathlib.Path), got {type(given).__name__}") from None
    return [checked_path(item, f"each of {name}") for item in items]


def compare_paths(runs, externals=(), baseline: str | None = None, ops: bool = False) -> Comparison:
    """Compare run directories `runs` (and timing CSVs `externals`); with `ops`, the op diff of two runs.
    One path for `runs` or `externals` is a list of one (a str is not read as its characters)."""
    runs, externals = _paths(runs, "runs"), _paths(externals, "externals")
    if baseline is not None and not isinstance(baseline, str):
        raise TypeError(f"baseline must be a run name, run path or device (str), got {type(baseline).__name__}")
    reads = _read_runs(runs, externals)
    table = compare(_rows(reads, externals, _tunes(runs)), baseline)
    op_diff = None
    if ops:
        if len(runs) != 2:
            raise CompareError(f"the op diff compares two runs, A and B; got {len(runs)}")
        a, b = (reads.get(Path(path)) or read_run(path) for path in runs)
        rows, unit, gap = op_diff_runs(a, b)
        op_diff = {"rows": rows, "unit": unit, "gap": gap, "a": Path(runs[0]).name, "b": Path(runs[1]).name}
    return Comparison(table, op_diff)


__all__ = [
    "COMPONENTS",
    "LABELS",
    "CompareError",
    "Comparison",
    "compare_paths",
    "advice",
    "compare",
    "compare_runs",
    "explain",
    "external_rows",
    "flags_for",
    "op_diff_runs",
    "per_image_gaps",
    "pick_baseline",
    "plot_compare",
    "read_external",
    "read_run",
    "run_row",
    "slower_than_baseline",
    "speedups",
    "steady_components",
    "steady_epochs",
    "suggest_steps_per_execution",
    "validate_external",
    "warnings",
]
