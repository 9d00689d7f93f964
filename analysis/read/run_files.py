"""The run directory's files: their names and columns (the one owner of that contract), and run.json's reader.

`profiler/` writes run directories and imports the column lists from here; `analysis/`
reads them (the CSVs with `run_csvs.py`'s readers, on the safe reads made here), also when
they were copied from another machine or cut short by a crash.
A reader never trusts a file: a last line without its newline (the writer was killed
mid-row) is dropped, rows that do not parse are skipped with one warning naming the file
and how many, and a file that cannot be used at all raises `RunFileError` naming the file
and what is wrong.
"""

from __future__ import annotations

import json
import math
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.read.locate import file_kind

# Every JSON document devprof writes or prints carries this (docs/json.md lists the keys).
SCHEMA_VERSION = 1

RUN_JSON = "run.json"
STEPS_CSV = "steps.csv"
UTILIZATION_DIR = "utilization"

CRASH_LOG = "crash.log"  # a fatal signal's Python stacks (profiler/record/rundir.py CrashLog)
STEPS_COLUMNS = ["epoch", "step", "steps", "start_time_s", "input_ms", "call_ms", "other_host_ms", "step_ms", "images"]
STEPS_INTEGER_COLUMNS = ("epoch", "step", "steps", "images")
# The most a steps.csv cell can hold: a day per step, a trillion steps or images, a time before 5138.
STEPS_LIMITS = {
    "epoch": 1e12,
    "step": 1e12,
    "steps": 1e12,
    "start_time_s": 1e11,
    "input_ms": 8.64e7,
    "call_ms": 8.64e7,
    "other_host_ms": 8.64e7,
    "step_ms": 8.64e7,
    "images": 1e12,
}

TIME_COLUMN = "time_s"
HOST_PROCESS_COLUMNS = [
    "proc_cpu_pct",
    "proc_rss_bytes",
    "proc_count",
    "mem_used_bytes",
    "mem_available_bytes",
    "load1",
    "disk_read_bytes_per_s",
    "disk_write_bytes_per_s",
    "net_sent_bytes_per_s",
    "net_recv_bytes_per_s",
]
GPU_COLUMNS = [
    "gpu_util_pct",
    "mem_util_pct",
    "mem_used_bytes",
    "mem_total_bytes",
    "power_w",
    "temp_c",
    "sm_clock_mhz",
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    "proc_mem_bytes",
    "tf_mem_current_bytes",
    "tf_mem_peak_bytes",
]
TPU_COLUMNS = ["mxu_util_pct", "idle_pct", "step_time_ms", "infeed_pct", "tf_mem_current_bytes", "tf_mem_peak_bytes"]

# One overall utilization per sampler kind: host CPU, NVIDIA GPU (NVML's GPU-Util), TPU matrix units.
UTILIZATION_COLUMNS = ("cpu_pct", "gpu_util_pct", "mxu_util_pct")
DEVICE_UTILIZATION_COLUMNS = UTILIZATION_COLUMNS[1:]


WORKER_DIR_PREFIX = "worker-"


def worker_dirs(run_dir: str | Path) -> list[Path]:
    """The `worker-<i>/` run directories of a multi-worker run, in worker order (empty for one worker)."""
    found: dict[int, list[Path]] = {}
    odd: list[str] = []
    for child in sorted(Path(run_dir).glob(f"{WORKER_DIR_PREFIX}*")):
        index = child.name[len(WORKER_DIR_PREFIX) :]
        if not child.is_dir():
            continue
        if index.isdigit() and index.isascii() and (child / RUN_JSON).is_file():
            found.setdefault(int(index), []).append(child)
        elif index.isdigit() and index.isascii():
            odd.append(f"{child.name} has no run.json")
        else:
            odd.append(f"{child.name} is no worker-<i> name")
    if found and odd:  # a job's folder: what is left out is said, never dropped in silence
        warn(f"{run_dir}: {'; '.join(odd)}: left out of the job")
    chosen = []
    for number, paths in sorted(found.items()):
        # `worker-0` and a copy named `worker-00` are the same worker: the name devprof writes is read
        paths.sort(key=lambda path: (path.name != f"{WORKER_DIR_PREFIX}{number}", path.name))
        if len(paths) > 1:
            warn(
                f"{run_dir}: {', '.join(path.name for path in paths)} all name worker {number}; "
                f"{paths[0].name} is read, the others are left out"
            )
        chosen.append(paths[0])
    return chosen


def host_columns(cpu_count: int) -> list[str]:
    """host.csv's columns after `time_s`: all cores, each core, then the process and system metrics."""
    return ["cpu_pct", *(f"cpu{i}_pct" for i in range(cpu_count)), *HOST_PROCESS_COLUMNS]


class RunFileError(ValueError):
    """A run-directory file that cannot be used; the message names the file and the problem."""


class RunFileWarning(UserWarning):
    """Part of a run-directory file was skipped (the message names the file and counts the rows)."""


def warn(message: str) -> None:
    """Report something skipped in a run file; the CLI shows it as one `warning:` line."""
    warnings.warn(message, RunFileWarning, stacklevel=3)


# ---------------------------------------------------------------- reading a file safely

# The most each reader takes (docs/run-directory.md): far above what a run writes (run.json is
# kilobytes; a million steps are about 80 MB of steps.csv; a day of samples at 0.5 s about 40 MB)
# and far below what would exhaust memory. A file above its bound is refused before it is read.
RUN_JSON_MAX_BYTES = 64 * 2**20
CSV_MAX_BYTES = 512 * 2**20


def irregular_run_file_kinds(folder: Path) -> list[tuple[str, str]]:
    """(name, what it is) of run.json and steps.csv where they exist in `folder` but are no regular
    files (a link to /dev/zero, a FIFO): ("run.json", "a character device")."""
    found = []
    for name in (RUN_JSON, STEPS_CSV):
        path = Path(folder) / name
        if not os.path.lexists(path):
            continue
        try:
            mode = os.stat(path).st_mode
        except OSError:
            found.append((name, "a broken link"))
            continue
        if not stat.S_ISREG(mode):
            found.append((name, file_kind(mode)))
    return found


def irregular_run_files(folder: Path) -> list[str]:
    """`irregular_run_file_kinds` as "run.json (a character device)". Such a folder is no run directory,
    and saying why beats saying nothing."""
    return [f"{name} ({kind})" for name, kind in irregular_run_file_kinds(folder)]


def outside(path: Path, folder: Path) -> bool:
    """Whether `path`, its links followed, lies outside `folder` (its links followed too)."""
    try:
        return not path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a loop of links
        return True


def read_regular(path: str | Path, limit: int, within: Path | None = None) -> bytes:
    """The bytes of `path` when it is a regular file of at most `limit` bytes (inside `within`, its
    links followed, when given); anything else is a RunFileError, decided before a byte is read:
    a FIFO is opened without waiting for a writer, a device such as /dev/zero is never read."""
    path = Path(path)
    if within is not None and outside(path, within):
        raise RunFileError(f"{path}: a link to {_resolved(path)}, outside {within}: not read")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise RunFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RunFileError(f"{path}: {file_kind(info.st_mode)}, not a regular file: not read")
        if info.st_size > limit:
            raise RunFileError(
                f"{path}: {info.st_size:,} bytes, above the {limit // 2**20} MiB devprof reads from such a file"
            )
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(limit + 1 - size, 2**24))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # grew while being read
            raise RunFileError(f"{path}: more than the {limit // 2**20} MiB devprof reads from such a file")
        return b"".join(chunks)
    except OSError as exc:
        raise RunFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _resolved(path: Path) -> str:
    try:
        return str(path.resolve())
    except (OSError, RuntimeError):
        return "a loop of links"


def read_json(path: Path, within: Path | None = None):
    """The JSON document in `path` (a regular file of at most RUN_JSON_MAX_BYTES, inside `within` when
    given); a RunFileError says why not."""
    try:
        # utf-8-sig: a file saved by an editor that starts UTF-8 with a byte-order mark (Notepad, PowerShell)
        return json.loads(read_regular(path, RUN_JSON_MAX_BYTES, within).decode("utf-8-sig"))
    except RecursionError:
        raise RunFileError(f"{path}: not valid JSON (nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, RunFileError):
            raise
        raise RunFileError(f"{path}: not valid JSON ({str(exc).splitlines()[0]})") from None


def read_peak_file(path: str | Path) -> dict:
    """A `devprof peak --format json` result (or its cache file) as a dict; a RunFileError says why not."""
    path = Path(path)
    peak = read_json(path)
    if not isinstance(peak, dict) or not isinstance(peak.get("peak_flops_per_second"), dict):
        raise RunFileError(
            f"{path}: not a devprof peak result (no peak_flops_per_second; write one with "
            "devprof peak --format json > FILE)"
        )
    peak = checked_peak(peak, str(path))
    if not peak or not peak["peak_flops_per_second"]:
        raise RunFileError(
            f"{path}: no usable peak (every peak_flops_per_second must be a positive number of "
            f"FLOP/s up to {PEAK_FLOPS_LIMIT:g})"
        )
    return peak


# A peak above these is a typing slip or a corrupt file: a thousand times the fastest devices made.
PEAK_FLOPS_LIMIT = 1e18
PEAK_BYTES_LIMIT = 1e16
_PEAK_BY_DTYPE = ("peak_flops_per_second", "matmul_flops_per_second", "conv_flops_per_second")
_CEILING_LIMITS = {
    "matrix_flops_per_second": PEAK_FLOPS_LIMIT,
    "vector_flops_per_second": PEAK_FLOPS_LIMIT,
    "memory_bytes_per_second": PEAK_BYTES_LIMIT,
}


def checked_peak(peak, where: str) -> dict | None:
    """A peak dict (run.json `peak`, a peak file) with every rate a finite positive number within
    reason; a rate that is not (text, NaN, negative, 1e300) is dropped with one warning naming it,
    and a `peak` that is not an object is None. A null rate stays null (a probe that failed)."""
    if peak is None:
        return None
    if not isinstance(peak, dict):
        warn(f"{where}: 'peak' must be an object, got {_shown(peak)}: ignored")
        return None
    peak, dropped = dict(peak), []

    def kept(name: str, value, limit: float) -> bool:
        if value is None or plausible_number(value, limit) is not None:
            return True
        dropped.append(f"{name} {_shown(value)}")
        return False

    def objects(name: str) -> dict:
        value = peak.get(name)
        if isinstance(value, dict):
            return value
        kept(name, value, 0)  # anything but null is dropped
        return {}

    for key in _PEAK_BY_DTYPE:
        if key in peak:
            peak[key] = {
                dtype: rate for dtype, rate in objects(key).items() if kept(f"{key}.{dtype}", rate, PEAK_FLOPS_LIMIT)
            }
    if "memory_bytes_per_second" in peak and not kept(
        "memory_bytes_per_second", peak["memory_bytes_per_second"], PEAK_BYTES_LIMIT
    ):
        peak["memory_bytes_per_second"] = None
    if "ceilings" in peak:
        ceilings = {}
        for dtype, values in objects("ceilings").items():
            if not isinstance(values, dict):
                kept(f"ceilings.{dtype}", values, 0)
                continue
            ceilings[dtype] = {
                key: value
                for key, value in values.items()
                if key not in _CEILING_LIMITS or kept(f"ceilings.{dtype}.{key}", value, _CEILING_LIMITS[key])
            }
        peak["ceilings"] = ceilings
    if dropped:
        shown = ", ".join(dropped[:3]) + (f" and {len(dropped) - 3} more" if len(dropped) > 3 else "")
        warn(
            f"{where}: peak rates must be positive numbers (FLOP/s up to {PEAK_FLOPS_LIMIT:g}, B/s up to "
            f"{PEAK_BYTES_LIMIT:g}); ignored {shown}"
        )
    return peak


# ---------------------------------------------------------------- run.json


# run.json numbers the analysis uses: (section or None for the top level, key, largest plausible value).
# A value that is not a finite number in (0, limit] is dropped with one warning naming the field.
RUN_JSON_NUMBERS = (
    (None, "steps_per_epoch", 1e12),
    ("config", "batch_size", 1e9),
    ("config", "steps_per_execution", 1e9),
    ("model", "train_flops_per_image", 1e18),
)
RUN_JSON_OBJECTS = ("config", "device", "model", "data", "samplers")
# Per-epoch numbers: `seconds` must be usable or the epoch is skipped; the others are left empty.
EPOCH_LIMITS = {"seconds": 1e8, "train_seconds": 1e8, "images": 1e12, "images_per_second": 1e12}


def read_run_json(path: str | Path) -> dict:
    """run.json as a dict, with the fields the analysis uses checked (the one reader for analyze
    and compare): an object field that is not an object, or a number that is not a finite
    positive number within reason (a string, NaN, negative, 1e30), is dropped with one warning
    naming the field. A file that is unreadable, not JSON or not an object is a RunFileError."""
    path = Path(path)
    meta = read_json(path, path.parent)
    if not isinstance(meta, dict):
        raise RunFileError(f"{path}: expected a JSON object, got a {type(meta).__name__}")
    return _checked(meta, path)


def _shown(value) -> str:
    return repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."


def plausible_number(value, limit: float) -> float | None:
    """`value` as a float when it is a finite number (not a bool, not text) in (0, limit], else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) and 0 < number <= limit else None


RUN_STATUSES = ("running", "complete", "failed", "interrupted")  # run.json `status` (docs/json.md)


def _checked(meta: dict, path: Path) -> dict:
    meta = dict(meta)
    if "status" in meta and meta["status"] not in RUN_STATUSES:
        warn(
            f"{path}: 'status' must be one of {', '.join(RUN_STATUSES)}, got {_shown(meta['status'])}: read as unknown"
        )
        meta["status"] = None
    for key in RUN_JSON_OBJECTS:
        if key in meta and meta[key] is not None and not isinstance(meta[key], dict):
            warn(f"{path}: '{key}' must be an object, got {_shown(meta[key])}: ignored")
            meta[key] = {}
    for key, limit in ((k, lim) for sec, k, lim in RUN_JSON_NUMBERS if sec is None):
        if meta.get(key) is not None and plausible_number(meta[key], limit) is None:
            warn(f"{path}: '{key}' must be a positive number up to {limit:g}, got {_shown(meta[key])}: ignored")
            meta[key] = None
    for sec in {s for s, _, _ in RUN_JSON_NUMBERS if s is not None}:
        if not isinstance(meta.get(sec), dict):
            continue
        fields = dict(meta[sec])
        for key, limit in ((k, lim) for s, k, lim in RUN_JSON_NUMBERS if s == sec):
            if fields.get(key) is not None and plausible_number(fields[key], limit) is None:
                warn(
                    f"{path}: '{sec}.{key}' must be a positive number up to {limit:g}, got "
                    f"{_shown(fields[key])}: ignored"
                )
                fields[key] = None
        meta[sec] = fields
    if "peak" in meta:
        meta["peak"] = checked_peak(meta["peak"], f"{path}")
    return meta


def section(meta: dict, key: str) -> dict:
    """A run.json object such as `config` or `device`; a missing or mistyped one reads as empty."""
    value = meta.get(key)
    return value if isinstance(value, dict) else {}


CRASH_LOG_MAX_BYTES = 16 << 20  # every thread's stack, a few kB each


def ended_unrecorded(run_dir: Path, raw: dict) -> str | None:
    """Why a run whose run.json says `running` is not running: a fatal signal (its `crash.log`), or
    its process gone on this host (SIGKILL, the out-of-memory killer). None: it may be running,
    or its host is another machine, or it ended as recorded."""
    if raw.get("status") != "running":
        return None
    try:
        lines = read_regular(run_dir / CRASH_LOG, CRASH_LOG_MAX_BYTES, run_dir).decode("utf-8", "replace").splitlines()
    except RunFileError:
        lines = []
    if any(line.strip() for line in lines):
        first = next(line.strip() for line in lines if line.strip())
        return f"its process crashed ({first[:120]}; every thread's stack is in {CRASH_LOG})"
    pid, host = raw.get("pid"), section(raw, "device").get("host")
    if (
        isinstance(pid, int)
        and not isinstance(pid, bool)
        and pid > 0
        and host == _host_name()
        and not _alive(pid, raw.get("start_time_s"))
    ):
        return (
            f"its process (pid {pid} on this host) is gone without recording how it ended "
            "(killed with SIGKILL, or by the out-of-memory killer)"
        )
    return None


def _host_name() -> str:
    import socket

    return socket.gethostname()


def _alive(pid: int, started) -> bool:
    """Whether `pid` is the run's process: alive, and not a later process given the same number."""
    import psutil

    try:
        created = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # another user's process: it exists
        return True
    return not isinstance(started, (int, float)) or created <= started + 1.0


@dataclass(frozen=True)
class RunRecord:
    """run.json, read and checked once (`read_run_json`); its objects read as empty where missing
    or mistyped. `raw` is the checked document (`Analysis.run`, the HTML report's run table)."""

    path: Path
    raw: dict
    ended_unrecorded: str | None = None  # status `running`, but the process is gone: how, where known

    @classmethod
    def read(cls, path: str | Path) -> RunRecord:
        raw = read_run_json(path)
        return cls(Path(path), raw, ended_unrecorded(Path(path).parent, raw))

    @property
    def status(self) -> str | None:
        return self.raw.get("status")

    @property
    def config(self) -> dict:
        return section(self.raw, "config")

    @property
    def device(self) -> dict:
        return section(self.raw, "device")

    @property
    def model(self) -> dict:
        return section(self.raw, "model")

    @property
    def profiler(self) -> dict:
        return section(self.raw, "profiler")

    @property
    def peak(self) -> dict | None:
        return self.raw.get("peak")

    @property
    def steps_per_epoch(self):
        return self.raw.get("steps_per_epoch")

    @property
    def sampler_summaries(self) -> dict:
        """`samplers.summaries`: what the samplers wrote when the run ended."""
        return section(section(self.raw, "samplers"), "summaries")

    def epochs(self) -> pd.DataFrame:
        """`epochs` as a frame (`run_epochs`); a RunFileError when they cannot be used."""
        return run_epochs(self.raw, self.path)


def run_epochs(meta: dict, source: str | Path = RUN_JSON) -> pd.DataFrame:
    """run.json's `epochs` as a frame with numeric columns (empty when none finished yet)."""
    epochs = meta.get("epochs")
    if epochs in (None, []):
        return pd.DataFrame(columns=["epoch", "seconds"])
    if not isinstance(epochs, list) or not all(isinstance(e, dict) for e in epochs):
        raise RunFileError(
            f"{source}: 'epochs' must be a list of objects, got {type(epochs).__name__} {str(epochs)[:40]!r}"
        )
    frame = pd.DataFrame(epochs)
    for column in ("epoch", "seconds"):
        if column not in frame:
            raise RunFileError(f"{source}: epochs lack {column!r}")

    def number(value):  # JSON numbers only: text, booleans and null are not numbers
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan

    for column in frame.columns:
        if column != "epoch" and not pd.api.types.is_numeric_dtype(frame[column]):
            frame[column] = [number(e.get(column)) for e in epochs]
    frame["epoch"] = [
        v if math.isfinite(v) and v == int(v) else math.nan for v in (number(e.get("epoch")) for e in epochs)
    ]
    for column, limit in EPOCH_LIMITS.items():
        if column not in frame:
            continue
        values = frame[column].astype(float)
        given = pd.Series([e.get(column) is not None for e in epochs], index=frame.index)
        wrong = given & ~(np.isfinite(values) & (values > 0) & (values <= limit))
        if wrong.any():
            first = epochs[int(np.flatnonzero(wrong.to_numpy())[0])][column]
            action = "those epochs are skipped" if column == "seconds" else "left empty"
            warn(
                f"{source}: epochs' {column!r} must be a positive number up to {limit:g}, got {_shown(first)} in "
                f"{int(wrong.sum())} of {len(frame)} epochs: {action}"
            )
            frame.loc[wrong, column] = math.nan
    bad = frame["epoch"].isna() | frame["seconds"].isna()
    if bad.all():
        raise RunFileError(f"{source}: no epoch has a whole number for 'epoch' and a positive number for 'seconds'")
    if bad.any() and frame.loc[bad, "epoch"].isna().any():
        warn(
            f"{source}: skipped {int(frame['epoch'].isna().sum())} of {len(frame)} epochs without a whole epoch number"
        )
    frame = frame[~bad].copy()
    frame["epoch"] = frame["epoch"].astype(int)
    repeated = frame["epoch"].duplicated(keep="last")
    if repeated.any():
        numbers = ", ".join(map(str, sorted(set(frame.loc[repeated, "epoch"]))))
        warn(f"{source}: epoch {numbers} is listed more than once; the last entry is used")
        frame = frame[~repeated]
    return frame.sort_values("epoch").reset_index(drop=True)
