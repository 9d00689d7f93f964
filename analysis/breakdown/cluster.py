"""What a job of many workers needs read at a glance: each worker's straggler score and clock
offset, its steps side by side with the others' (the heat map's cells), and the spread of step
time across workers. Pure functions of each worker's steady steps (`steps/host.steady_steps`).

Straggler score (0 to 1): `1 - pace * steadiness`, where `pace` is the fastest worker's mean step
without collective wait over this worker's (1 for the fastest) and `steadiness` is this worker's
10th-percentile step over its 90th-percentile step (1 when every step is alike). A worker that is as fast as
the fastest and never slows scores 0; one twice as slow scores at least 0.5. Its best and slowest
steps are its 10th and 90th percentiles, so one lucky or unlucky step does not set them. The step *without
collective wait* is used because in a synchronous job every worker's whole step is the same.

Clock offset: a synchronous step ends for every worker when its all-reduce ends, at one moment.
Steps are matched by their step number, and each worker's offset is the median, over the matched
steps, of its step end minus the first analysed worker's (its clock ahead of that one's, in ms).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

CLUSTER_KEYS = ["straggler_score", "clock_offset_ms", "status"]
STEP_COLUMNS = ["worker", "step", "own_ms", "step_ms", "end_ns"]
OK = "ok"


def worker_steps(worker, steps: pd.DataFrame) -> pd.DataFrame:
    """One worker's steady steps as rows of the job's steps table: its step number, its step without
    collective wait (`own_ms`), its whole step and its end on its own clock."""
    if steps is None or steps.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    collective = steps["collective_ms"] if "collective_ms" in steps else 0.0
    frame = pd.DataFrame(
        {
            "worker": [worker] * len(steps),
            "step": steps["step"].to_numpy(),
            "own_ms": (steps["step_ms"] - collective).to_numpy(dtype=float),
            "step_ms": steps["step_ms"].to_numpy(dtype=float),
            "end_ns": steps["end_ns"].to_numpy() if "end_ns" in steps else np.nan,
        }
    )
    return frame[STEP_COLUMNS]


def straggler_scores(steps: pd.DataFrame) -> pd.Series:
    """Each worker's score from the job's steps table (`worker_steps` rows), indexed by worker."""
    if steps.empty:
        return pd.Series(dtype=float)
    by = steps.groupby("worker", sort=False)["own_ms"]
    mean, best, slow = by.mean(), by.quantile(0.1), by.quantile(0.9)
    fastest = float(mean[mean > 0].min()) if (mean > 0).any() else math.nan
    pace = (fastest / mean).where(mean > 0)
    steadiness = (best / slow).where(slow > 0, 1.0)
    return (1.0 - pace * steadiness).clip(0.0, 1.0)


def clock_offsets(steps: pd.DataFrame, reference) -> pd.Series:
    """Each worker's clock minus `reference`'s, in ms, from the ends of the steps both ran (by step
    number); NaN for a worker with no step in common or without step ends."""
    if steps.empty or steps["end_ns"].isna().all():
        return pd.Series(dtype=float)
    ends = steps.pivot_table(index="step", columns="worker", values="end_ns", aggfunc="first", sort=False)
    if reference not in ends:
        return pd.Series(math.nan, index=ends.columns)
    # int64 nanoseconds since the epoch do not fit a float's 53 bits: subtract before converting
    base = ends[reference]
    offsets = {}
    for worker in ends.columns:
        both = ends[worker].notna() & base.notna()
        diff = ends.loc[both, worker].astype("int64") - base[both].astype("int64")
        offsets[worker] = float(diff.median()) / 1e6 if len(diff) else math.nan
    return pd.Series(offsets)


def distribution(workers: pd.DataFrame) -> dict | None:
    """p50, p90 and max across workers of the mean step without collective wait (`own_step_ms`)
    and of the whole step (`step_ms`); None with fewer than two analysed workers."""
    ok = workers[workers["status"] == OK] if "status" in workers else workers
    if len(ok) < 2:
        return None
    own = ok["step_ms"] - ok["collective_ms"]

    def spread(values: pd.Series) -> dict:
        return {"p50": float(values.quantile(0.5)), "p90": float(values.quantile(0.9)), "max": float(values.max())}

    return {"workers": int(len(ok)), "own_step_ms": spread(own), "step_ms": spread(ok["step_ms"])}
