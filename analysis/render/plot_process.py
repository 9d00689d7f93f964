"""The PNG plots of `devprof analyze`, drawn by a second process while this one analyses the trace.

matplotlib's import (about 0.45 s) and drawing the plots (about 0.25 s) were half of the
command's fixed cost. The helper is a fork of this process that imports matplotlib, then draws the
PNGs it is sent while this process writes the CSVs and reports, on another core. The result is
the same files: the same plot functions draw them. The command forks it before the trace is read,
once pandas is loaded (shared with it) and before any event is decoded (so it holds none of the
read's memory), and lets it begin its imports (`go`) when a core is free: when the read's own forked
child has ended, or once the trace is read. A fork needs a process of one thread (the command
sets OPENBLAS_NUM_THREADS=1 before numpy starts its own). Where there is no second core or no fork,
other threads run, the helper is lost, or DEVPROF_PLOT_PROCESS=0, the plots are drawn here as before.

Nothing heavy is imported at module level.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import sys
import threading
import warnings
from pathlib import Path
from types import ModuleType

PLOTS = ("plot_step_breakdown", "plot_epoch_breakdown", "plot_utilization")  # analysis.render.plots
_LENGTH = struct.Struct("<Q")
GO = b"g"  # to a helper started with `wait`: begin


class HelperLost(RuntimeError):
    """The helper ended without an answer (killed, crashed)."""


ENV_VAR = "DEVPROF_PLOT_PROCESS"  # 0: draw in this process
WAIT_S = 120.0  # drawing takes under a second; a helper that takes this long is given up on


def _single_threaded_linux() -> bool:
    """Whether this is Linux and the process has one thread: a fork of a process with other threads
    (numpy's, TensorFlow's) can deadlock in the child on a lock one of them held."""
    try:
        return len(os.listdir("/proc/self/task")) == 1 and len(os.sched_getaffinity(0)) >= 2
    except (AttributeError, OSError):
        return False


def start(wait: bool = False) -> PlotProcess | None:
    """A helper process, or None where it would not help (one core) or is not safe (not Linux, other
    threads running) or cannot start. With `wait`, it does nothing until `go()` (or `draw`)."""
    if "plots" in os.environ.get("DEVPROF_WITHOUT", "").split(",") or os.environ.get(ENV_VAR, "").strip() == "0" or not hasattr(os, "fork") or not _single_threaded_linux():
        return None
    try:
        from_parent, to_child = os.pipe()  # (read, write)
        from_child, to_parent = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        for fd in (to_child, from_parent, from_child, to_parent):
            os.close(fd)
        return None
    if pid == 0:  # the helper: never returns into the caller's code
        code = 1
        try:
            os.close(to_child)
            os.close(from_child)
            _serve(from_parent, to_parent, wait)
            code = 0
        except BaseException:  # noqa: BLE001 - Ctrl-C or a lost parent: the parent draws or reports
            pass
        finally:
            os._exit(code)  # not the parent's atexit handlers nor its buffered stdout
    os.close(from_parent)
    os.close(to_parent)
    return PlotProcess(pid, to_child, from_child, waiting=wait)


def _serve(request_fd: int, reply_fd: int, wait: bool = False) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it ends this one
    if wait and _read(request_fd, len(GO)) != GO:
        return
    failed: BaseException | None = None
    drawing: ModuleType | None = None
    try:
        import_2d_matplotlib()  # the slow imports, while the parent reads
        from analysis.render import plots as drawing
    except BaseException as exc:  # noqa: BLE001 - reported when asked to draw
        failed = exc
    payload = _receive(request_fd)
    if payload is None:
        return
    reply: tuple[str, object]
    try:
        if drawing is None:
            raise failed or HelperLost("no plots module")
        jobs = pickle.loads(payload)
        reply = ("ok", [getattr(drawing, name)(*args) for name, args in jobs if name in PLOTS])
    except BaseException as exc:  # noqa: BLE001 - the parent raises it, as drawing there would have
        reply = ("error", exc)
    try:
        data = pickle.dumps(reply)
    except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
        data = pickle.dumps(("error", RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}")))
    _send(reply_fd, data)
    _read(request_fd, 1)  # until the parent closes (it kills this process): its memory can be read until then


def import_2d_matplotlib() -> None:
    """matplotlib's figure and Agg backend without its 3-D toolkit. matplotlib imports
    `mpl_toolkits.mplot3d` only to register the "3d" projection, a quarter of its import time (0.08 of
    0.33 s); the helper draws 2-D plots and is its own process, so that import is refused here (matplotlib
    then warns that the 3-D projection is unavailable, which is on purpose and not shown)."""
    from analysis.render import mpl_config

    mpl_config.ensure_config_dir()
    if "mpl_toolkits.mplot3d" not in sys.modules:  # None: `import` raises ImportError, which matplotlib catches
        sys.modules["mpl_toolkits.mplot3d"] = None  # type: ignore[assignment]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Unable to import Axes3D")
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401


def _send(fd: int, data: bytes) -> None:
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(fd: int) -> bytes | None:
    header = _read(fd, _LENGTH.size)
    return None if header is None else _read(fd, _LENGTH.unpack(header)[0])


class PlotProcess:
    """The parent's handle on the helper: `draw` once, `wait` for the paths, `close` always."""

    def __init__(self, pid: int, to_child: int, from_child: int, waiting: bool = False):
        self.pid, self._to_child, self._from_child = pid, to_child, from_child
        self._waiting = waiting
        self._sender: threading.Thread | None = None
        self._sent: BaseException | None = None
        self._closed = False
        self.rusage: object = None  # os.wait4's, once it has ended

    def go(self) -> None:
        """Let a helper started with `wait` begin its imports (once; a lost helper is found by `wait`)."""
        if self._waiting and not self._closed:
            self._waiting = False
            try:
                os.write(self._to_child, GO)  # one byte into an empty pipe: never blocks
            except OSError:
                pass

    def draw(self, jobs: list[tuple[str, tuple]]) -> None:
        """Send `(plot function name, args)` jobs; sent from a thread, so a large request does not
        wait for the helper to finish its imports."""
        self.go()
        data = pickle.dumps(jobs, protocol=pickle.HIGHEST_PROTOCOL)

        def send():
            try:
                _send(self._to_child, data)
            except OSError as exc:
                self._sent = exc

        self._sender = threading.Thread(target=send, name="devprof-plot-request", daemon=True)
        self._sender.start()

    def wait(self) -> list[Path]:
        """The paths the helper drew; its exception raised here; `HelperLost` when it ended without
        an answer or gave none in `WAIT_S`."""
        reply = None
        if self._sender is not None:
            self._sender.join(WAIT_S)
        if self._sent is None and select.select([self._from_child], [], [], WAIT_S)[0]:
            reply = _receive(self._from_child)
        self.close()
        if reply is None:
            raise HelperLost("the plot process ended without drawing")
        status, value = pickle.loads(reply)
        if status == "error":
            raise value
        return value

    def close(self) -> None:
        """End the helper (at once, whatever it is doing) and reap it."""
        if self._closed:
            return
        self._closed = True
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.rusage = os.wait4(self.pid, 0)[2]  # its CPU time and peak RSS, for the benchmarks
        except ChildProcessError:
            pass
