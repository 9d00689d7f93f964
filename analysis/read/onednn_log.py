"""`onednn_verbose.log`: oneDNN's own line for each primitive it ran, recorded by
`devprof run --onednn-kernels` (oneDNN's `ONEDNN_VERBOSE=profile_exec` with
`ONEDNN_VERBOSE_TIMESTAMP=1`, its lines taken off the process's stdout).

An execution line reads
`onednn_verbose,v1,<ms since the epoch>,primitive,exec,cpu,<primitive>,<implementation>,<prop kind>,
<memory descriptors>,<attributes>,<aux>,<problem>,<ms>`: which primitive ran (convolution, matmul,
reorder, ...), which of oneDNN's implementations ran it (`brg_conv_fwd:avx2`, `jit:avx2`, `gemm:jit`,
...), when it started and how long it took. Only execution lines with a timestamp are read; the
header, creation lines and lines cut short are skipped. This module owns the file's name and its
size bound: `profiler/train/onednn_verbose.py` writes it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.read.run_files import RunFileError, read_regular, warn
from analysis.read.trace import Trace, TraceError, plane_metadata

ONEDNN_LOG = "onednn_verbose.log"
ONEDNN_LOG_MAX_BYTES = 256 * 2**20  # the writer stops keeping lines here; the reader reads no more
LINE_MARKER = "onednn_verbose,"
ONEDNN_COLUMNS = ["at_ns", "ms", "primitive", "implementation", "prop"]

# Version 3 writes `v1,` after the marker and `primitive,` before `exec`; version 2 neither.
_EXEC = (
    r"^onednn_verbose,(?:v\d+,)?(?P<whole>\d+)(?:\.(?P<fraction>\d+))?,(?:primitive,)?exec,cpu[^,]*,"
    r"(?P<primitive>[^,]+),(?P<implementation>[^,]+),(?P<prop>[^,]*),.*,(?P<ms>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*$"
)


def parse_onednn_log(text: str) -> pd.DataFrame:
    """The execution lines of `text` as `ONEDNN_COLUMNS`, in file order: `at_ns` the start of the
    execution (int64 ns since the epoch, exactly as oneDNN prints it), `ms` its duration."""
    lines = pd.Series(text.splitlines(), dtype=object)
    if lines.empty:
        return _empty()
    found = lines.str.extract(_EXEC).dropna(subset=["whole", "primitive", "implementation", "ms"])
    if found.empty:
        return _empty()
    fraction = found["fraction"].fillna("").str.slice(0, 6).str.pad(6, side="right", fillchar="0")
    whole = pd.to_numeric(found["whole"], errors="coerce")
    ms = pd.to_numeric(found["ms"], errors="coerce")
    keep = whole.notna() & ms.notna() & np.isfinite(ms) & (ms >= 0) & (whole < 2**63 // 10**6 - 1)
    found, fraction, whole, ms = found[keep], fraction[keep], whole[keep], ms[keep]
    at_ns = whole.astype(np.int64) * 1_000_000 + fraction.astype(np.int64)  # 6 decimals of a ms: ns
    return pd.DataFrame(
        {
            "at_ns": at_ns.to_numpy(dtype=np.int64),
            "ms": ms.to_numpy(dtype=float),
            "primitive": found["primitive"].astype(str).to_numpy(dtype=object),
            "implementation": found["implementation"].astype(str).to_numpy(dtype=object),
            "prop": found["prop"].fillna("").astype(str).to_numpy(dtype=object),
        }
    )


def _empty() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "at_ns": pd.Series(dtype=np.int64),
            "ms": pd.Series(dtype=float),
            **{c: pd.Series(dtype=object) for c in ("primitive", "implementation", "prop")},
        }
    )


def read_onednn_log(run_dir: str | Path) -> pd.DataFrame | None:
    """The run's oneDNN executions (`parse_onednn_log`), or None when the run has no log. A file that
    cannot be read (not a regular file, above `ONEDNN_LOG_MAX_BYTES`, a link out of the run) is one
    warning and None: the ops keep the library's name only."""
    run_dir = Path(run_dir)
    path = run_dir / ONEDNN_LOG
    if not os.path.lexists(path):
        return None
    try:
        raw = read_regular(path, ONEDNN_LOG_MAX_BYTES, run_dir)
    except RunFileError as exc:
        warn(f"{exc}: oneDNN's kernel names skipped")
        return None
    return parse_onednn_log(raw.decode("utf-8", errors="replace"))


TASK_ENVIRONMENT_PLANE = "Task Environment"
PROFILE_START_STAT = "profile_start_time"  # ns since the epoch at which the capture began


def trace_origin_ns(trace: Trace) -> int | None:
    """When the trace's clock starts (its `Task Environment` plane's `profile_start_time`, ns since
    the epoch), or None where the trace does not say (its host events then cannot be laid on
    wall-clock stamps)."""
    try:
        planes = plane_metadata(trace, lambda name: name == TASK_ENVIRONMENT_PLANE)
    except TraceError:
        return None
    for plane in planes:
        value = plane.stats.get(PROFILE_START_STAT)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def on_trace_clock(executions: pd.DataFrame, origin_ns: int) -> pd.DataFrame:
    """`executions` with `start_ns` and `end_ns` on the trace's clock (ns from the capture's start,
    `origin_ns` since the epoch), the way its host events are timed."""
    start = executions["at_ns"].to_numpy(dtype=np.int64) - np.int64(origin_ns)
    duration = np.rint(executions["ms"].to_numpy(dtype=float) * 1e6).astype(np.int64)
    return executions.assign(start_ns=start, end_ns=start + duration)


__all__ = [
    "ONEDNN_COLUMNS",
    "ONEDNN_LOG",
    "ONEDNN_LOG_MAX_BYTES",
    "LINE_MARKER",
    "on_trace_clock",
    "parse_onednn_log",
    "read_onednn_log",
    "trace_origin_ns",
]
