"""JSON documents (docs/json.md): `--format json` and `analysis.json`. NaN is written as null."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from analysis.read.run_files import SCHEMA_VERSION
from analysis.render import tables

STEP_KEYS = [
    "step",
    "steps",
    "step_ms",
    "input_ms",
    "compute_ms",
    "collective_ms",
    "host_ms",
    "compile_ms",
    "partial",
    "input_wait_ms",
    "input_copy_ms",
    "between_steps_ms",
]
# Per-step utilization, where the run has samplers (analysis.utilization.per_window).
UTILIZATION_KEYS = [
    "cpu_pct",
    "proc_cpu_pct",
    "proc_rss_bytes",
    "mem_used_bytes",
    "gpu_util_pct",
    "gpu_mem_used_bytes",
    "mxu_util_pct",
]
MEAN_KEYS = [
    "step_ms",
    "input_ms",
    "compute_ms",
    "collective_ms",
    "host_ms",
    "input_pct",
    "compute_pct",
    "collective_pct",
    "host_pct",
    "input_overlapped_ms",
    "device_step_ms",
    "input_wait_ms",
    "input_copy_ms",
]


def jsonable(value):
    """A value as JSON has it: NaN as null, numpy scalars as Python numbers, recursively."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {key: jsonable(v) for key, v in value.items()}
    return value


def dumps(value, level: int = 0) -> str:
    """`json.dumps(value, indent=2)`, except that a table's rows (a list of flat objects) are one
    line each: Python's indenting encoder is pure Python (11 s for 200,000 steps), the compact
    one is C, and a row a line is also what a reader scans."""
    pad = "  " * (level + 1)
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(str(key))}: {dumps(item, level + 1)}" for key, item in value.items()]
    elif isinstance(value, list) and value:
        # A table's rows share their shape: the first one tells whether they nest.
        flat_rows = all(isinstance(item, dict) for item in value) and not any(
            isinstance(v, (dict, list)) for v in value[0].values()
        )
        items = (
            [pad + row for row in map(json.dumps, value)]
            if flat_rows
            else [pad + dumps(item, level + 1) for item in value]
        )
    else:
        return json.dumps(value)
    opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
    return opening + "\n" + ",\n".join(items) + "\n" + "  " * level + closing


def records(frame: pd.DataFrame, integer_keys=()) -> list[dict]:
    """Rows as dicts: every number a float (NaN: null), except the keys in `integer_keys`, which count things.
    Converted a column at a time: a million steps' rows in seconds, not a minute."""
    columns = [_column_values(frame[key], key in integer_keys) for key in frame.columns]
    keys = [str(key) for key in frame.columns]
    return [dict(zip(keys, row)) for row in zip(*columns)] if keys else [{} for _ in range(len(frame))]


def _column_values(column: pd.Series, integer: bool) -> list:
    if pd.api.types.is_bool_dtype(column.dtype) and not column.isna().any():
        return [bool(value) for value in column.tolist()]
    if pd.api.types.is_numeric_dtype(column.dtype) and not pd.api.types.is_bool_dtype(column.dtype):
        values = column.to_numpy(dtype=float, na_value=np.nan).tolist()
        return [None if value != value else int(value) if integer else value for value in values]

    def value_of(value):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
            return jsonable(value)
        return jsonable(int(value) if integer else float(value))

    return [value_of(value) for value in column.tolist()]


def analysis_document(analysis) -> dict:
    tables.check_figures(analysis)
    result = {
        "schema_version": SCHEMA_VERSION,
        "source": str(analysis.path),
        "step_source": analysis.step_source,
        "step_name": analysis.step_name,
        "device": analysis.device,
        "notes": list(analysis.notes),
        "steps": records(
            analysis.steps[STEP_KEYS + [c for c in UTILIZATION_KEYS if c in analysis.steps]], ("step", "steps")
        ),
        "mean": jsonable({key: float(analysis.mean.get(key, math.nan)) for key in MEAN_KEYS}),
        "steps_used": int(analysis.steps_used),
        "verdict": dict(analysis.verdict),
        "findings": list(analysis.findings),
        "devices": jsonable(analysis.devices.to_dict(orient="records")),
        "kernel_launch": analysis.kernel_launch,
        "workers": jsonable(analysis.workers.to_dict(orient="records")),
        "straggler": analysis.straggler,
        "straggler_reason": analysis.straggler_reason,
        "slowest_workers": jsonable(list(analysis.slowest_workers)),
        "worker_distribution": jsonable(analysis.worker_distribution),
        "ops": records(analysis.ops),
        "input_stages": records(analysis.input_stages),
        "input_bottleneck": analysis.input_bottleneck,
        "eager": jsonable(analysis.eager.as_dict()) if analysis.eager is not None else None,
        "roofline": jsonable(analysis.roofline),
        "spread": jsonable(analysis.spread),
        "utilization": jsonable(dict(analysis.utilization)),
        "memory": jsonable(analysis.memory.as_dict()) if analysis.memory is not None else None,
    }
    if analysis.epochs is not None:
        result["epochs"] = records(analysis.epochs, ("epoch", "calls", "steps", "images"))
    if analysis.tensorflow is not None:
        result["tensorflow_analysis"] = jsonable(analysis.tensorflow.as_dict())
    return result


def render_analysis(analysis) -> str:
    return dumps(analysis_document(analysis)) + "\n"


def comparison_document(comparison) -> dict:
    """`{"baseline": run, "fastest": run, "warnings": [...], "rows": [...]}`."""
    table = comparison.table
    rows = [{key: jsonable(value) for key, value in record.items()} for record in table.to_dict(orient="records")]
    document = {
        "schema_version": SCHEMA_VERSION,
        "baseline": comparison.baseline,
        "fastest": str(table.loc[table["fastest"], "run"].iloc[0]),
        "warnings": list(comparison.warnings),
        "rows": rows,
    }
    if comparison.op_diff is not None:
        document["op_diff_unit"] = comparison.op_diff["unit"]
        document["op_diff"] = [jsonable(record) for record in comparison.op_diff["rows"].to_dict(orient="records")]
    return document


def render_comparison(comparison) -> str:
    return dumps(comparison_document(comparison)) + "\n"
