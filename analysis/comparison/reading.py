"""Reading what `compare` compares: run directories and CSVs of timings measured elsewhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.read import run_files
from analysis.breakdown import utilization
from analysis.comparison.errors import CompareError

EXTERNAL_REQUIRED = ("device", "seconds_per_epoch")
EXTERNAL_OPTIONAL = ("batch_size", "images", "notes")


def read_run(path: str | Path) -> dict:
    """The files of one run directory: `{"path", "name", "meta", "steps", "trace_mean", "utilization"}`.

    `steps` is the steps.csv frame (None when absent); `trace_mean` the trace's mean steady
    step breakdown where the run has a readable trace (else None, with `trace_note`);
    `utilization` the sampler summaries (`analysis.utilization.run_summaries`, as `analyze` uses).
    """
    path = Path(path)
    run_json = path / run_files.RUN_JSON
    if not path.is_dir() or not run_json.is_file():
        raise CompareError(f"{path} is not a run directory (no run.json); pass folders written by 'devprof run'")
    workers = run_files.worker_dirs(path)
    if workers and not (path / run_files.STEPS_CSV).is_file():
        # A multi-worker job: its row is the chief's (every worker's step lasts as long in a
        # synchronous job), with each worker beside it.
        job = read_run(workers[0])
        job.update(path=str(path), name=path.name, workers=[read_run(worker) for worker in workers])
        return job
    try:
        meta = run_files.read_run_json(run_json)
    except run_files.RunFileError as exc:
        raise CompareError(str(exc)) from None
    if not meta.get("epochs"):
        raise CompareError(f"{run_json} has no finished epochs yet; nothing to compare")
    steps = None
    if (path / run_files.STEPS_CSV).is_file():
        try:
            steps = run_files.read_steps_csv(path / run_files.STEPS_CSV)
        except run_files.RunFileError as exc:
            raise CompareError(str(exc)) from None
    trace_mean, trace_note, prefetching = _read_trace_mean(path)
    return {"path": str(path), "name": path.name, "meta": meta, "steps": steps, "trace_mean": trace_mean,
            "trace_note": trace_note, "prefetches": prefetching, "utilization": utilization.run_summaries(path, meta)}


def _read_trace_mean(path: Path) -> tuple[dict | None, str | None, bool | None]:
    """Mean steady-step breakdown of the run's trace and whether its input pipeline prefetches,
    or (None, why not, None)."""
    if not any((path / "plugins" / "profile").glob("*/*.xplane.pb")):
        return None, None, None
    try:
        from analysis.pipeline import analyze_source
        from analysis.steps.sources import from_trace
        from analysis.read.trace import read_trace

        analysis = analyze_source(from_trace(read_trace(path)))
        return analysis.mean, None, analysis.facts.prefetches
    except Exception as exc:  # noqa: BLE001 - a bad trace falls back to steps.csv, with a note
        return None, f"trace not used ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})", None


def read_external(path: str | Path) -> pd.DataFrame:
    """A CSV of timings measured elsewhere: `device,seconds_per_epoch[,batch_size,images,notes]`."""
    path = Path(path)
    try:
        frame = pd.read_csv(path, dtype={"device": str, "notes": str}, skipinitialspace=True)
    except FileNotFoundError:
        raise CompareError(f"external results file {path} not found") from None
    except (OSError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise CompareError(f"{path}: not a CSV of external results ({str(exc).splitlines()[0]})") from None
    return validate_external(frame, str(path))


def validate_external(frame: pd.DataFrame, source: str = "external CSV") -> pd.DataFrame:
    frame = frame.rename(columns=lambda c: str(c).strip())
    missing = [c for c in EXTERNAL_REQUIRED if c not in frame.columns]
    if missing:
        raise CompareError(f"{source}: missing column {', '.join(missing)} "
                           "(expected device,seconds_per_epoch[,batch_size,images,notes])")
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
