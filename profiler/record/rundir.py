"""The run directory: created once, never overwritten; run.json rewritten atomically; steps.csv streamed."""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import math
import os
import re
import tempfile
import time
from pathlib import Path
from typing import NoReturn

from analysis.read.run_files import CRASH_LOG, STEPS_COLUMNS


class RunExistsError(Exception):
    """The run folder is already there (a usage error: runs are never overwritten)."""


class OutputError(Exception):
    """The folder runs go into cannot hold a run (a usage error, found before training)."""


class WriteError(Exception):
    """A file of the run directory could not be written (a full disk, a lost mount): the run fails."""


RESERVE_NAME = ".devprof-reserve"
RESERVE_BYTES = 1 << 20  # room for the last run.json (a few kB to a few hundred kB) on a full disk


def is_disk_full(exc: BaseException) -> bool:
    """An error that says the disk (or the user's quota) is full, from Python or from TensorFlow."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return "No space left on device" in text or "Disk quota exceeded" in text


def reason(exc: BaseException) -> str:
    """One line for an error: an OSError's own words, else the first line of its message."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"[Errno {exc.errno}] {exc.strerror}" if exc.errno else exc.strerror
    lines = str(exc).strip().splitlines()
    first = re.sub(r"^\{\{[^}]*\}\}\s*", "", lines[0]) if lines else ""  # TensorFlow's op prefix
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def check_output_folder(folder: Path) -> None:
    """Raise `OutputError` unless a run directory can be made in `folder`, creating nothing.

    The nearest folder of the path that exists must be a folder and take a new file (probed
    with a temporary file): a regular file, a read-only mount or `/proc` fail here, before
    training, instead of when the run directory is made.
    """
    folder = Path(folder)
    existing = folder
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"--out {folder}: {existing} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".devprof-probe-", dir=existing)
    except OSError as exc:
        why = exc.strerror or str(exc)
        if exc.errno == errno.ENOENT:  # e.g. /proc: it exists but takes no new files
            why = "this file system takes no new files"
        raise OutputError(f"--out {folder}: cannot write in {existing} ({why})") from None
    os.close(fd)
    os.unlink(probe)


def default_run_name(device_kind: str, host: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{device_kind}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', host)}"


def free_run_dir(out: Path, name: str) -> Path:
    """`out/name`, else `out/name-2`, `-3`, ...: a default name is stamped to the second, and runs
    started in the same second (a loop of `profile()` sessions, a script starting two jobs) each
    get their own folder."""
    path, number = Path(out) / name, 1
    while os.path.lexists(path):
        number += 1
        path = Path(out) / f"{name}-{number}"
    return path


def create_default(out: Path, name: str) -> Path:
    """Make the first free `free_run_dir(out, name)`, even against another process taking it first."""
    Path(out).mkdir(parents=True, exist_ok=True)
    while True:
        path = free_run_dir(out, name)
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def check_new(path: Path) -> None:
    if path.exists():
        raise RunExistsError(
            f"run directory {path} already exists; runs are never overwritten (choose another --run-name or --out)"
        )


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


class Reserve:
    """Space set aside in the run directory, given back for the last run.json when the disk is full,
    so that run.json can still say how the run ended. Removed when the run ends."""

    def __init__(self, folder: Path, size: int = RESERVE_BYTES):
        self.path: Path | None = Path(folder) / RESERVE_NAME
        while True:
            try:
                with open(self.path, "wb") as f:
                    f.write(os.urandom(size))  # not zeros: compressing file systems would store nothing
                return
            except OSError:
                self.path.unlink(missing_ok=True)
                if size <= 16 << 10:
                    self.path = None  # best effort: a run on a nearly full disk still starts
                    return
                size //= 4

    def release(self) -> bool:
        """Free the space; False if there was none to free."""
        if self.path is None:
            return False
        self.path.unlink(missing_ok=True)
        self.path = None
        return True


class CrashLog:
    """`crash.log`: where Python's fault handler writes every thread's stack when the process dies
    of a fatal signal (a segfault or abort in native code), which no `finally` outlives; run.json
    then still says `running`, and this file says what happened. Removed when the run ends and
    nothing was written to it. A fault handler the program enabled itself is left alone."""

    def __init__(self, folder: Path):
        import faulthandler

        self.file = None
        if faulthandler.is_enabled():
            return
        try:
            self.file = open(Path(folder) / CRASH_LOG, "w")
            faulthandler.enable(self.file, all_threads=True)
        except (OSError, ValueError):
            self.close()

    def close(self) -> None:
        import faulthandler

        file, self.file = self.file, None
        if file is None:
            return
        faulthandler.disable()
        path = Path(file.name)
        file.close()
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:
                path.unlink()


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
        self.path = Path(path)
        try:
            self._file = open(path, "w", newline="")
            self._writer = csv.writer(self._file)
            self._writer.writerow(STEPS_COLUMNS)
            self._file.flush()
        except OSError as exc:
            self._fail(exc)
        self.rows = 0

    def write(self, record) -> None:
        # One formatted line and one system call: this runs every step of the user's loop.
        line = "%d,%d,%d,%.6f,%.4f,%.4f,%.4f,%.4f,%d\r\n" % (
            record.epoch,
            record.step,
            record.steps,
            record.start_time_s,
            record.input_ms,
            record.call_ms,
            record.other_host_ms,
            record.input_ms + record.call_ms + record.other_host_ms,
            record.images,
        )
        try:
            self._file.write(line)
            self._file.flush()
        except OSError as exc:
            self._fail(exc)
        self.rows += 1

    def close(self) -> None:
        if self._file is None or self._file.closed:
            return
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            self._fail(exc)
        finally:
            try:
                self._file.close()
            except OSError:
                pass  # the flush above already failed and said why

    def _fail(self, exc: OSError) -> NoReturn:
        raise WriteError(f"cannot write {self.path}: {reason(exc)}") from exc
