"""Op by op, how much of the step-time gap between two runs each op explains.

Ops are matched by name across the runs (with their types shown); one more row holds
the time outside ops (input, host overhead, idle), so the rows add up to the gap
exactly. Times are per training step, or per image when the batch sizes differ.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.comparison.errors import CompareError
from analysis.comparison.reading import RunRead

OP_DIFF_KEYS = ["op", "type", "a_ms", "b_ms", "delta_ms", "share_pct", "only_in"]
OUTSIDE_OPS = "(outside ops: input, host, idle)"
NEITHER = np.array(None, dtype=object)  # an op in both runs


def _per_op(ops: pd.DataFrame, scale: float) -> pd.DataFrame:
    grouped = ops.groupby("op", sort=False).agg(type=("type", "first"), ms=("ms_per_step", "sum"))
    grouped["ms"] *= scale
    return grouped


def op_diff(a, b, a_batch: float = math.nan, b_batch: float = math.nan) -> tuple[pd.DataFrame, str, float]:
    """(rows, unit, gap) for two `analysis.Analysis`; gap = b - a, in the unit.

    `unit` is `ms_per_step`, or `ms_per_image` when both batch sizes are known and differ.
    """
    per_image = a_batch == a_batch and b_batch == b_batch and a_batch != b_batch
    scale_a, scale_b = (1.0 / a_batch, 1.0 / b_batch) if per_image else (1.0, 1.0)
    a_step = a.mean["step_ms"] / a.steps_per_call * scale_a
    b_step = b.mean["step_ms"] / b.steps_per_call * scale_b
    a_ops, b_ops = _per_op(a.ops, scale_a), _per_op(b.ops, scale_b)
    merged = a_ops.join(b_ops, how="outer", lsuffix="_a", rsuffix="_b")
    rows = pd.DataFrame(
        {
            "op": merged.index.astype(str),
            "type": [_types(ta, tb) for ta, tb in zip(merged["type_a"], merged["type_b"])],
            "a_ms": merged["ms_a"].fillna(0.0).to_numpy(),
            "b_ms": merged["ms_b"].fillna(0.0).to_numpy(),
            "only_in": np.where(merged["ms_a"].isna(), "b", np.where(merged["ms_b"].isna(), "a", NEITHER)),
        }
    )
    outside = {
        "op": OUTSIDE_OPS,
        "type": "",
        "a_ms": a_step - rows["a_ms"].sum(),
        "b_ms": b_step - rows["b_ms"].sum(),
        "only_in": None,
    }
    rows = pd.concat([rows, pd.DataFrame([outside])], ignore_index=True)
    rows["delta_ms"] = rows["b_ms"] - rows["a_ms"]
    gap = b_step - a_step
    rows["share_pct"] = 100.0 * rows["delta_ms"] / gap if gap != 0 else math.nan
    rows = rows.sort_values("share_pct" if gap != 0 else "delta_ms", ascending=False, kind="stable")
    assert math.isclose(rows["delta_ms"].sum(), gap, rel_tol=1e-9, abs_tol=1e-9), "op rows must add up to the gap"
    return rows[OP_DIFF_KEYS].reset_index(drop=True), ("ms_per_image" if per_image else "ms_per_step"), gap


def _types(a, b) -> str:
    a = a if isinstance(a, str) else ""
    b = b if isinstance(b, str) else ""
    return a if a == b or not b else b if not a else f"{a} / {b}"


def op_diff_runs(a: RunRead, b: RunRead) -> tuple[pd.DataFrame, str, float]:
    """The op diff of two runs as compare read them (their traces' analyses), B against A."""
    analyses, batches = [], []
    for run in (a, b):
        if run.analysis is None or run.analysis.ops.empty:
            raise CompareError(f"{run.path}: no ops in its trace (run it with the profiler window, not --no-profile)")
        analyses.append(run.analysis)
        try:
            batches.append(float(str(run.record.config.get("batch_size"))))
        except (TypeError, ValueError):
            batches.append(math.nan)
    return op_diff(analyses[0], analyses[1], batches[0], batches[1])
