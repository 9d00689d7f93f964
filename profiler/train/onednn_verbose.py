"""`devprof run --onednn-kernels`: oneDNN's own line for each primitive it runs, kept in
`<run>/onednn_verbose.log`, so that `devprof analyze` can name the implementation that ran each
CPU op (`jit:avx2`, `brg_conv_fwd:avx2`, ...).

oneDNN prints these lines to standard output (file descriptor 1, flushed line by line) when
`ONEDNN_VERBOSE=profile_exec` is set before it loads; `ONEDNN_VERBOSE_TIMESTAMP=1` stamps each with
the wall clock, which is how they are laid on the trace. The run's descriptor 1 is pointed at a
pipe; a thread reads it and writes the lines that start with `onednn_verbose,` to the log and
everything else, byte for byte and at once (a progress bar's line without its newline too), to
the real standard output.

The log is bounded: lines are kept from the run directory's creation until the profile window's
trace is written (later executions are in no trace), and never past `ONEDNN_LOG_MAX_BYTES`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import BinaryIO

from analysis.read.onednn_log import LINE_MARKER, ONEDNN_LOG, ONEDNN_LOG_MAX_BYTES

VERBOSE_VAR = "ONEDNN_VERBOSE"
VERBOSE_VALUE = "profile_exec"
TIMESTAMP_VAR = "ONEDNN_VERBOSE_TIMESTAMP"
ONEDNN_OPTS_VAR = "TF_ENABLE_ONEDNN_OPTS"
_MARKER = LINE_MARKER.encode()
JOIN_S = 10.0  # how long the end of a run waits for the last lines (a child process may hold the pipe)


def problem(environ=None, modules=None) -> str | None:
    """Why `--onednn-kernels` cannot work in this process, or None."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if "tensorflow" in modules:
        return (
            "--onednn-kernels must be given before TensorFlow is loaded (oneDNN reads ONEDNN_VERBOSE once); "
            "run devprof run in a new process"
        )
    value = environ.get(VERBOSE_VAR)
    if value not in (None, "", VERBOSE_VALUE):
        return (
            f"--onednn-kernels sets {VERBOSE_VAR}={VERBOSE_VALUE}, but it is set to {value!r}: unset it "
            "(devprof keeps oneDNN's lines in the run's onednn_verbose.log)"
        )
    stamp = environ.get(TIMESTAMP_VAR)
    if stamp not in (None, "", "1"):
        return (
            f"--onednn-kernels needs {TIMESTAMP_VAR}=1 (the stamps lay oneDNN's lines on the trace), but it is "
            f"set to {stamp!r}: unset it"
        )
    if environ.get(ONEDNN_OPTS_VAR, "").strip() in ("0", "false", "False"):
        return (
            f"--onednn-kernels names oneDNN's kernels, but {ONEDNN_OPTS_VAR}=0 turns them off (TensorFlow's "
            "Eigen kernels run instead): unset it"
        )
    return None


def configure(environ=None) -> None:
    """Turn oneDNN's execution lines with their stamps on (before TensorFlow is imported)."""
    environ = os.environ if environ is None else environ
    environ[VERBOSE_VAR] = VERBOSE_VALUE
    environ[TIMESTAMP_VAR] = "1"


class Diversion:
    """Descriptor 1 through a pipe: oneDNN's lines to a file once `attach`ed (counted and dropped
    before), everything else to the real standard output. A context manager; the log is flushed
    and closed when the block ends, however it ends."""

    def __init__(self, fd: int = 1, max_bytes: int = ONEDNN_LOG_MAX_BYTES):
        self.fd = fd
        self.max_bytes = max_bytes
        self.lines = 0  # kept in the log
        self.bytes = 0
        self.dropped = 0  # oneDNN lines not kept: before the log was opened, after the trace, past the bound
        self.capped = False
        self._log: BinaryIO | None = None
        self._until_ms: float | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._real: int | None = None

    # ------------------------------------------------------------ set up and tear down

    def __enter__(self) -> Diversion:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        read_end, write_end = os.pipe()
        self._real = os.dup(self.fd)
        out = os.dup(self._real)
        os.dup2(write_end, self.fd)
        os.close(write_end)
        self._thread = threading.Thread(target=self._pump, args=(read_end, out), name="devprof-onednn-log", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        if self._real is not None:
            os.dup2(self._real, self.fd)  # the pipe ends once no one else holds it: the pump drains it
            os.close(self._real)
            self._real = None
        if self._thread is not None:
            self._thread.join(JOIN_S)
        with self._lock:
            if self._log is not None:
                with contextlib.suppress(OSError):
                    self._log.close()
                self._log = None

    def attach(self, path: Path) -> None:
        """Keep oneDNN's lines in `path` from now on."""
        log = open(path, "wb")  # noqa: SIM115 - closed by __exit__
        with self._lock:
            self._log = log

    def keep_until(self, wall_s: float) -> None:
        """Keep no execution that starts after `wall_s` (the trace is written: later ones are in none).
        The first call holds."""
        with self._lock:
            if self._until_ms is None:
                self._until_ms = wall_s * 1e3

    def summary(self) -> dict:
        """run.json `profiler.onednn_verbose`."""
        return {
            "file": ONEDNN_LOG,
            "lines": self.lines,
            "bytes": self.bytes,
            "dropped_lines": self.dropped,
            "capped": self.capped,
        }

    # ------------------------------------------------------------ the pump

    def _pump(self, read_end: int, out: int) -> None:
        pending = b""  # the start of a line not yet known to be oneDNN's or not
        mode = None  # for the current line: None undecided, "pass" or "keep"
        line = bytearray()  # a oneDNN line being read
        try:
            while True:
                try:
                    chunk = os.read(read_end, 65536)
                except InterruptedError:
                    continue
                if not chunk:
                    break
                data = pending + chunk
                pending = b""
                passed = bytearray()
                start = 0
                while start < len(data):
                    newline = data.find(b"\n", start)
                    stop = len(data) if newline < 0 else newline + 1
                    if mode is None:
                        head = data[start:stop]
                        if len(head) >= len(_MARKER) or newline >= 0:
                            mode = "keep" if head.startswith(_MARKER) else "pass"
                        elif _MARKER.startswith(head):
                            pending = head  # could still be oneDNN's: wait for more
                            break
                        else:
                            mode = "pass"
                    if mode == "pass":
                        passed += data[start:stop]
                    else:
                        line += data[start:stop]
                    if newline >= 0:
                        if mode == "keep":
                            self._keep(bytes(line))
                            line.clear()
                        mode = None
                    start = stop
                if passed:
                    _write_all(out, bytes(passed))
            if pending:
                _write_all(out, pending)
            if line:
                self._keep(bytes(line))  # cut short: the reader skips it
        finally:
            os.close(read_end)
            with contextlib.suppress(OSError):
                os.close(out)

    def _keep(self, raw: bytes) -> None:
        with self._lock:
            if self._log is None or self.capped or self._after_trace(raw):
                self.dropped += 1
                return
            if self.bytes + len(raw) > self.max_bytes:
                self.capped = True
                self.dropped += 1
                return
            try:
                self._log.write(raw)
            except OSError:
                self.capped = True  # a full disk: keep what is there
                self.dropped += 1
                return
            self.lines += 1
            self.bytes += len(raw)

    def _after_trace(self, raw: bytes) -> bool:
        if self._until_ms is None:
            return False
        parts = raw.split(b",", 3)
        if len(parts) < 3:
            return False
        stamp = parts[2] if parts[1].startswith(b"v") else parts[1]
        try:
            return float(stamp) > self._until_ms
        except ValueError:
            return False  # the header: kept


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return  # the real stdout is gone (a closed pipe): nothing to show it on
        view = view[written:]


def cap_warning(summary: dict, max_bytes: int = ONEDNN_LOG_MAX_BYTES) -> str | None:
    if not summary.get("capped"):
        return None
    return (
        f"{ONEDNN_LOG} reached {max_bytes // 2**20} MiB (or could not be written): oneDNN's later lines were "
        f"dropped ({summary.get('dropped_lines', 0):,}), so ops that ran after that have no kernel name; "
        "use an earlier or shorter --profile-steps"
    )
