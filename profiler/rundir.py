"""The run directory: created once, never overwritten; run.json rewritten atomically; steps.csv streamed."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import tempfile
import time
from pathlib import Path

from analysis.run_files import STEPS_COLUMNS


class RunExistsError(Exception):
    """The run folder is already there (a usage error: runs are never overwritten)."""


def default_run_name(device_kind: str, host: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{device_kind}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', host)}"


def check_new(path: Path) -> None:
    if path.exists():
        raise RunExistsError(f"run directory {path} already exists; runs are never overwritten "
                             "(choose another --run-name or --out)")


def create(path: Path) -> Path:
    check_new(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir()
    except FileExistsError:
        raise RunExistsError(f"run directory {path} already exists; runs are never overwritten") from None
    return path


def _clean(value):
    """JSON has no NaN or Infinity; a missing number is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        return _clean(value.item())
    return value


def write_json_atomic(path: Path, data: dict) -> None:
    """Temp file in the same folder + rename, so a reader (or a crash) never sees half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_clean(data), f, indent=2, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a run directory is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class StepsWriter:
    """Streams steps.csv, flushed every row (a step is milliseconds; a write is microseconds),
    so even a killed process keeps every completed step."""

    def __init__(self, path: Path):
        self._file = open(path, "w", newline="")
        self._writer = csv.writer(self._file)
        self._writer.writerow(STEPS_COLUMNS)
        self._file.flush()
        self.rows = 0

    def write(self, record) -> None:
        self._writer.writerow([
            record.epoch, record.step, record.steps, f"{record.start_time_s:.6f}",
            f"{record.input_ms:.4f}", f"{record.call_ms:.4f}", f"{record.other_host_ms:.4f}",
            f"{record.step_ms:.4f}", record.images,
        ])
        self._file.flush()
        self.rows += 1

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
