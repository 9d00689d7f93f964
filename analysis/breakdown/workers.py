"""One row per worker of a job or host of a session: its mean step and parts, and the spread
of each part over its steady steps (what the straggler rule, `analysis.rules.straggler`, reads)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

WORKER_KEYS = [
    "worker",
    "host",
    "step_ms",
    "input_ms",
    "compute_ms",
    "host_ms",
    "collective_ms",
    "steps_used",
    "own_noise_ms",
    "proc_cpu_mean_pct",
]
CAUSES = ("input", "compute", "host")


def worker_row(
    worker: str | int, host: str, mean: dict, steps: pd.DataFrame | None = None, proc_cpu_pct: float = math.nan
) -> dict:
    """One worker: its mean step and parts, how many steady steps they average, the standard
    deviation of its step without collective wait over those steps, and its process's CPU."""
    row: dict[str, Any] = {"worker": worker, "host": host}
    row.update({key: float(mean.get(key, 0.0)) for key in WORKER_KEYS[2:7]})
    own = None if steps is None else steps["step_ms"] - steps.get("collective_ms", 0.0)
    row["steps_used"] = int(len(own)) if own is not None else 0
    row["own_noise_ms"] = float(own.std(ddof=1)) if own is not None and len(own) > 1 else math.nan
    row["proc_cpu_mean_pct"] = float(proc_cpu_pct)
    for part in CAUSES:  # each part's own spread, for the rule (not a column of the table)
        column = f"{part}_ms"
        spread = steps[column].std(ddof=1) if steps is not None and column in steps and len(steps) > 1 else math.nan
        row[f"{part}_noise_ms"] = float(spread)
    return row
