"""`op_costs.csv`: the FLOPs and bytes of each op of the traced functions, recorded at capture.

TensorFlow's trace carries no shapes, so the run works the costs out from its live graphs when
the profile window closes (`profiler/roofline/op_costs.py` writes the file); an XLA program's costs come
from the HLO in the trace instead (`analysis/read/hlo_costs.py`), in the same columns. This
module owns the columns and reads the file; docs/run-directory.md and docs/rules.md say what
each column means and how each number is counted.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.read.run_files import CSV_MAX_BYTES, RunFileError, read_regular, warn

OP_COSTS_CSV = "op_costs.csv"

OP_COST_COLUMNS = [
    "function",
    "op",
    "type",
    "dtype",
    "kind",
    "input_shapes",
    "output_shapes",
    "flops",
    "bytes",
    "flops_source",
    "chain_flops",
    "chain_bytes",
]
OP_COST_NUMBER_COLUMNS = ("flops", "bytes", "chain_flops", "chain_bytes")
OP_COST_TEXT_COLUMNS = tuple(c for c in OP_COST_COLUMNS if c not in OP_COST_NUMBER_COLUMNS)

# kind: what the op's arithmetic can run on.
KIND_MATRIX = "matrix"  # convolutions, matmuls, dots: can use matrix units
KIND_VECTOR = "vector"  # everything else that computes
KIND_NONE = ""  # no arithmetic (reshapes, reads, copies), or not known
KINDS = (KIND_MATRIX, KIND_VECTOR, KIND_NONE)

# flops_source: where an op's FLOPs come from.
SOURCE_TENSORFLOW = "tensorflow"  # TensorFlow's registered statistic (what tf.compat.v1.profiler counts)
SOURCE_FORMULA = "formula"  # devprof's stated formula (docs/rules.md)
SOURCE_HLO = "hlo"  # from the HLO instruction's shapes
SOURCE_NONE = "none"  # no arithmetic: 0 FLOPs
SOURCE_UNKNOWN = ""  # a shape or the op's arithmetic is not known: NaN FLOPs
FLOPS_SOURCES = (SOURCE_TENSORFLOW, SOURCE_FORMULA, SOURCE_HLO, SOURCE_NONE, SOURCE_UNKNOWN)

# One op's FLOPs or bytes per execution above this is a corrupt file: a thousand seconds of today's
# fastest device, for one op.
OP_COST_LIMIT = 1e18

SHAPE_SEPARATOR = ";"  # between the tensors of input_shapes / output_shapes
DIMENSION_SEPARATOR = "x"  # between the dimensions of one tensor ("128x32x32x3"; "" for a scalar)
UNKNOWN_DIMENSION = "?"


def read_op_costs(run_dir: str | Path) -> pd.DataFrame | None:
    """The run's op costs, one row per (function, op), in `OP_COST_COLUMNS` order; None when the
    run has none (no profile window, or recorded before devprof wrote them).

    A file that cannot be used (not a regular file, above the size bound, a link out of the run,
    not a CSV, a column missing) is one warning and None: the analysis goes on without costs. Text
    columns are strings ("" when empty); number columns are floats, NaN where empty, and NaN with one
    warning where not a number, negative, infinite or above `OP_COST_LIMIT`; a `kind` or `flops_source` devprof does not write reads as "".
    """
    run_dir = Path(run_dir)
    path = run_dir / OP_COSTS_CSV
    if not os.path.lexists(path):
        return None
    try:
        raw = read_regular(path, CSV_MAX_BYTES, run_dir)
    except RunFileError as exc:
        warn(f"{exc}: op costs skipped")
        return None
    raw = raw[: raw.rfind(b"\n") + 1]  # a last line without its newline was cut off mid-row
    if not raw.strip():
        warn(f"{path}: empty file (no header): op costs skipped")
        return None
    try:
        frame = pd.read_csv(
            io.BytesIO(raw), dtype=str, keep_default_na=False, on_bad_lines="skip", encoding_errors="replace"
        )
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        warn(f"{path}: not a CSV ({str(exc).splitlines()[0]}): op costs skipped")
        return None
    frame.columns = [str(c).strip() for c in frame.columns]
    missing = [c for c in OP_COST_COLUMNS if c not in frame.columns]
    if missing:
        warn(f"{path}: missing columns {', '.join(missing)}: op costs skipped")
        return None
    frame = frame.loc[:, ~frame.columns.duplicated()][OP_COST_COLUMNS].copy()
    unusable = 0
    for column in OP_COST_NUMBER_COLUMNS:
        text = frame[column].str.strip()
        values = pd.to_numeric(text, errors="coerce").to_numpy(dtype=float, copy=True)
        bad = ~np.isfinite(values) | (values < 0) | (values > OP_COST_LIMIT)
        unusable += int((bad & (text != "").to_numpy()).sum())
        values[bad] = np.nan
        frame[column] = values
    if unusable:
        warn(
            f"{path}: {unusable:,} FLOPs or bytes {'is' if unusable == 1 else 'are'} not a number from 0 to "
            f"{OP_COST_LIMIT:g}: those ops' costs read as unknown"
        )
    frame["kind"] = frame["kind"].where(frame["kind"].isin(KINDS), KIND_NONE)
    frame["flops_source"] = frame["flops_source"].where(frame["flops_source"].isin(FLOPS_SOURCES), SOURCE_UNKNOWN)
    return frame.reset_index(drop=True)
