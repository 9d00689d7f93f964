"""Reading what `compare` compares: run directories and CSVs of timings measured elsewhere."""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.comparison.errors import CompareError
from analysis.read import run_files, tune_files
from analysis.read.inputs import RunInputs, read_inputs, read_run_files
from analysis.read.run_files import RunRecord
from analysis.read.trace import TraceError, TraceNotFound
from analysis.worker import Analysis, analyze_inputs

EXTERNAL_REQUIRED = ("device", "seconds_per_epoch")
EXTERNAL_OPTIONAL = ("batch_size", "images", "notes")


@dataclass(frozen=True)
class RunRead:
    """One run as compare sees it, read once: its files (`files`, the trace let go) and the analysis
    of its trace (None without a trace, or where it could not be analysed: `trace_note` says why).
    A multi-worker job reads as its chief, with every worker's read in `workers`."""

    path: str
    name: str
    files: RunInputs
    analysis: Analysis | None = None
    trace_note: str | None = None
    workers: tuple[RunRead, ...] = ()

    @property
    def record(self) -> RunRecord:
        """The run's run.json (compare reads only run directories: there is always one)."""
        assert self.files.run is not None
        return self.files.run

    @property
    def trace_mean(self) -> dict | None:
        """The trace's mean steady step breakdown (None: no trace analysed)."""
        return self.analysis.mean if self.analysis is not None else None

    @property
    def prefetches(self) -> bool | None:
        return self.analysis.facts.prefetches if self.analysis is not None else None


def read_run(path: str | Path) -> RunRead:
    """One run directory (or a job of `worker-<i>/` run directories): its files and its trace's
    analysis, through the one pipeline (`analysis.worker.analyze_inputs`)."""
    path = Path(path)
    run_json = path / run_files.RUN_JSON
    if not path.is_dir() or not run_json.is_file():
        raise CompareError(f"{path} is not a run directory (no run.json); pass folders written by 'devprof run'")
    workers = run_files.worker_dirs(path)
    if workers and not (path / run_files.STEPS_CSV).is_file():
        # A multi-worker job: its row is the chief's (every worker's step lasts as long in a
        # synchronous job), with each worker beside it.
        reads = tuple(read_run(worker) for worker in workers)
        return dataclasses.replace(reads[0], path=str(path), name=path.name, workers=reads)
    note = None
    odd = run_files.irregular_run_files(path)
    if odd:
        run_files.warn(f"{path}: {', '.join(odd)}: not a regular file, not read")
    try:
        try:
            inputs = read_inputs(path)
        except TraceNotFound:
            inputs = read_run_files(path)
        except TraceError as exc:  # a trace that is there but holds nothing to analyse
            inputs, note = read_run_files(path), _not_used(exc)
    except run_files.RunFileError as exc:
        raise CompareError(str(exc)) from None
    if inputs.run is None or not inputs.run.raw.get("epochs"):
        raise CompareError(f"{run_json} has no finished epochs yet; nothing to compare")
    analysis = None
    if inputs.trace_error is not None:
        note = _not_used(inputs.trace_error)
    elif inputs.trace is not None:
        try:
            analysis = analyze_inputs(inputs)
        except Exception as exc:  # noqa: BLE001 - a bad trace falls back to steps.csv, with a note
            note = _not_used(exc)
    return RunRead(str(path), path.name, inputs.without_trace(), analysis, note)


def _not_used(exc: Exception) -> str:
    return f"trace not used ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"


def read_external(path: str | Path) -> pd.DataFrame:
    """A CSV of timings measured elsewhere: `device,seconds_per_epoch[,batch_size,images,notes]`."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise CompareError(f"external results file {path} not found")
    try:
        raw = run_files.read_regular(path, run_files.CSV_MAX_BYTES)
    except run_files.RunFileError as exc:
        raise CompareError(str(exc)) from None
    try:
        frame = pd.read_csv(io.BytesIO(raw), dtype={"device": str, "notes": str}, skipinitialspace=True)
    except (OSError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise CompareError(f"{path}: not a CSV of external results ({str(exc).splitlines()[0]})") from None
    return validate_external(frame, str(path))


def validate_external(frame: pd.DataFrame, source: str = "external CSV") -> pd.DataFrame:
    frame = frame.rename(columns=lambda c: str(c).strip())
    missing = [c for c in EXTERNAL_REQUIRED if c not in frame.columns]
    if missing:
        raise CompareError(
            f"{source}: missing column {', '.join(missing)} "
            "(expected device,seconds_per_epoch[,batch_size,images,notes])"
        )
    if frame.empty:
        raise CompareError(f"{source}: no rows")
    out = pd.DataFrame({"device": frame["device"].astype(str).str.strip()})
    for column in ("seconds_per_epoch", "batch_size", "images"):
        if column not in frame.columns:
            out[column] = np.nan
            continue
        values = pd.to_numeric(frame[column], errors="coerce")
        given = frame[column].notna() if column != "seconds_per_epoch" else pd.Series(True, index=frame.index)
        bad = given & ~(np.isfinite(values) & (values > 0))
        if bad.any():
            line = int(np.flatnonzero(bad.to_numpy())[0]) + 2
            cell = frame[column].iloc[line - 2]
            shown = "nothing" if pd.isna(cell) else repr(str(cell).strip())
            raise CompareError(f"{source}, line {line}: {column} must be a finite positive number, got {shown}")
        out[column] = values.astype(float)
    if (out["device"] == "").any() or frame["device"].isna().any():
        raise CompareError(f"{source}: every row needs a device name")
    out["notes"] = frame["notes"].fillna("").astype(str) if "notes" in frame.columns else ""
    return out


def read_tune(path: str | Path) -> pd.DataFrame:
    """A `devprof tune` folder as two timings: seconds per epoch at the default setting and at the best
    one, on the device its trials ran on, the best's note saying what made the difference."""
    path = Path(path)
    try:
        document = tune_files.read_tune_json(path)
    except run_files.RunFileError as exc:
        raise CompareError(str(exc)) from None
    baseline, best = document.get("baseline"), document.get("best")
    if not isinstance(baseline, dict) or not isinstance(best, dict):
        raise CompareError(f"{path}: the tune has no baseline and best yet (status {document.get('status')!r})")
    device = tune_files.tune_device(path)
    kept = [trial for trial in document.get("trials") or () if isinstance(trial, dict) and trial.get("kept")]
    difference = (
        "; ".join(
            f"{trial.get('label') or trial.get('rule')} ({trial.get('rule')}): "
            f"{_number(trial.get('measured_ms')):.3g} ms a step saved"
            for trial in kept
        )
        or "nothing measured faster than the default"
    )
    start = (baseline.get("setting") or {}).get("options") or {}
    notes = {
        # tunes start from TensorFlow's own setting (older ones from devprof run's)
        "default": "TensorFlow's own setting, as the program runs outside devprof"
        if isinstance(start, dict) and "--tensorflow-defaults" in start
        else "",
        "best": f"tune {path.name}, best against default: {difference}; {best.get('command', '')}",
    }
    rows = []
    for which, summary in (("default", baseline), ("best", best)):
        rows.append(
            {
                "run": f"{path.name} ({which})",
                "device": device,
                "seconds_per_epoch": _number(summary.get("seconds_per_epoch")),
                "notes": notes[which],
            }
        )
    frame = pd.DataFrame(rows)
    frame["batch_size"] = float("nan")
    frame["images"] = float("nan")
    return frame


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")
