"""The recording side of one run, whatever trains: the run directory and run.json's lifecycle,
steps.csv, TensorBoard scalars, the samplers, the profiler window and its step markers, and
signal handling. `devprof run` (`profiler.train.run.Run`), `profiler.profile()` and
`profiler.KerasCallback` are its clients, so they write the same run directory.

Nothing here imports TensorFlow at module import time.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from models.training import EpochResult, StepRecord
from profiler import samplers
from profiler.record import oom, rundir, tracing
from profiler.record.console import Console
from profiler.record.scalars import Scalars
from profiler.record.version import __version__


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, Docker, Kubernetes, Slurm) arrived: the run stops as it does on Ctrl-C."""


class Session:
    """One run directory being recorded.

    A client sets `config` (an object with `out`, `run_name`, `profile`, `profile_steps`,
    `tracer`, `profiler_port`, `sample`, `sample_interval`, `scalars_every`, `cluster`),
    `path`, `meta` and `console`, then: `_open()` (the directory and the first run.json),
    `_start_recording(resolved)` (files, samplers, profiler server), `_open_window(...)`,
    and per step `record_step` / `step_done`, per epoch `record_epoch`; `_mark_ended(exc)`
    when it fails or stops, and `_finish()` always.
    """

    _window_option = "--profile-steps"  # how the user names the window, in messages
    _real_os_exit: Callable[[int], NoReturn] | None = None  # while recording: os._exit as it was

    def __init__(self, config, console: Console | None = None):
        self.config = config
        self.console = console or Console(getattr(config, "quiet", False))
        self.path: Path | None = None
        self.meta: dict = {}
        self.steps: rundir.StepsWriter | None = None
        self.scalars: Scalars | None = None
        self.window: tracing.ProfileWindow | None = None
        self.samplers: samplers.SamplerGroup | None = None
        self.reserve: rundir.Reserve | None = None
        self.default_name: str | None = None  # the run's name was not given: `<time>-<device>-<host>`
        self.crash_log: rundir.CrashLog | None = None
        self.write_errors: list[str] = []  # files that could not be written from other threads
        # TensorBoard scalars held while the trace records: each write runs eager TensorFlow ops (on a sampler's
        # thread, or between steps) that the trace would show as the program's own eager work.
        self._scalar_lock = threading.Lock()
        self._held_scalars: list = []
        self._to_close: list | None = None
        self.recorded = False  # the last run.json, with how the run ended, was written
        self._finishing = False
        self.job_dir: Path | None = None  # a worker of a multi-worker job: the job's folder
        self.job_meta: dict | None = None  # the chief's job run.json
        self.stopped_by: int | None = None  # a signal that cancelled a blocked collective (workers only)
        self._rearm_signals: Callable[[], object] | None = None
        self._scalar_step = 0  # the last step whose scalars were written
        self._graphs_before: frozenset[int] | None = None  # the traced graphs alive as the window opened

    @property
    def _run_dir(self) -> Path:
        """`path`, which the client names before `_open()`."""
        if self.path is None:
            raise RuntimeError("the session's run directory is not named yet")
        return self.path

    # ------------------------------------------------------------ what a client may override

    def current_step(self) -> int:
        """The global step now, for scalars written from the samplers' threads."""
        return 0

    def _new_job_meta(self, addresses: list[str], job_id: str | None) -> dict:
        """The job's run.json at start (several workers): the options this worker was given."""
        from profiler.record import job

        return job.meta_for(dict(self.meta.get("config") or {}), addresses, job_id, self.meta.get("global_batch_size"))

    def _worker_meta(self) -> dict:
        """run.json `worker`: this process's place in a multi-worker job."""
        cluster = self.config.cluster
        return {
            "index": cluster.index,
            "name": cluster.name,
            "num_workers": cluster.num_workers,
            "chief": cluster.is_chief,
            "addresses": list(cluster.workers),
            "address": cluster.workers[cluster.index],
            "source": cluster.source,
            "job": str(self.job_dir),
        }

    # ------------------------------------------------------------ the run directory

    def _check_destinations(self) -> None:
        """Before anything is written: the run's folder (a worker's, inside its job's) is new, and
        a job's folder holds no other job (RunExistsError)."""
        cfg = self.config
        if cfg.cluster is not None:  # <out>/<run-name>/ is the job's; other workers may have made it already
            from profiler.record import job

            self.job_dir = Path(cfg.out) / cfg.run_name
            rundir.check_new(self.job_dir / cfg.cluster.name)
            if cfg.cluster.is_chief:
                job.check_free(self.job_dir, job.job_id_from_environment())
        elif cfg.run_name is not None:
            rundir.check_new(Path(cfg.out) / cfg.run_name)

    def _open(self, meta: dict) -> None:
        """Make the run directory (never an existing one; a default name taken meanwhile gets the next
        free suffix), set space aside, write run.json."""
        if self.default_name:
            self.path = rundir.create_default(self._run_dir.parent, self.default_name)
        else:
            rundir.create(self._run_dir)
        self.reserve = rundir.Reserve(self._run_dir)
        self.crash_log = rundir.CrashLog(self._run_dir)
        self.meta = meta

    def _start_recording(self, resolved) -> None:
        """steps.csv, the TensorBoard scalars, the samplers and the profiler server."""
        cfg = self.config
        self.steps = rundir.StepsWriter(self._run_dir / "steps.csv")
        self.scalars = Scalars(self._run_dir)
        self._start_samplers(resolved)
        self._record_os_exit()
        if cfg.profiler_port is not None:
            try:
                tracing.start_server(cfg.profiler_port)
                self.meta["profiler"]["server_port"] = cfg.profiler_port
                self.console.print(
                    f"profiler server listening on port {cfg.profiler_port} "
                    f"(capture with: devprof capture grpc://localhost:{cfg.profiler_port})"
                )
            except Exception as exc:  # noqa: BLE001
                self._profiler_warning(f"profiler server did not start on port {cfg.profiler_port} ({exc})")

    def _open_window(self, start: int, stop: int, device_kind: str, steps_per_call: int = 1) -> tracing.ProfileWindow:
        self._graphs_before = self._live_graph_ids()
        window = self.window = tracing.ProfileWindow(
            self._run_dir,
            start,
            stop,
            self.config.tracer,
            warn=self.console.warn,
            steps_per_call=steps_per_call,
            notes=self.meta["profiler"],
        )
        self.meta["profiler"]["window"] = [start, stop]
        estimate = tracing.estimate_events(stop - start, self.config.tracer, device_kind)
        self.meta["profiler"]["estimated_events"] = estimate
        if estimate > tracing.VIEWER_EVENT_LIMIT:
            self._profiler_warning(
                f"profile window {start}:{stop} may hold about {estimate:,} events, more than the "
                f"{tracing.VIEWER_EVENT_LIMIT:,} XProf's trace viewer shows; use a shorter {self._window_option}"
            )
        compile_only = tracing.compile_only_window(start, stop, steps_per_call, self._window_option)
        if compile_only:
            self._profiler_warning(compile_only)
        return window

    def _start_samplers(self, resolved) -> None:
        cfg = self.config
        if not cfg.sample:
            self.meta["samplers"] = {"enabled": False, "reason": "turned off with --no-sample"}
            return

        def system(name, step, row):
            if self.write_errors or self.scalars is None:
                return
            try:
                self.scalars.system(name, step, row)
            except rundir.WriteError as exc:  # the run fails on it at the next epoch end
                self.write_errors.append(str(exc))

        def to_tensorboard(name, row):  # each sampler calls from its own thread
            step = self.current_step()
            self._write_scalars(lambda: system(name, step, row))

        group = samplers.build_sampler_group(
            self._run_dir / "utilization",
            resolved.kind,
            cfg.sample_interval,
            on_row=to_tensorboard,
            tpu_service_addr=tpu_monitor_address(resolved.info.get("tpu")),
        )
        self.samplers = group.start()
        self.meta["samplers"] = {"enabled": True, "interval_s": cfg.sample_interval, "status": group.status()}
        for name, status in group.status().items():
            if not status.get("ran", True) and status.get("reason"):
                self.console.notice(f"notice: {status['reason']}")

    def _profiler_warning(self, message: str) -> None:
        self.meta["profiler"].setdefault("warnings", []).append(message)
        self.console.warn(f"warning: {message}")

    # ------------------------------------------------------------ steps and epochs

    def step_scope(self, step: int, steps: int = 1):
        """The step marker XProf and `devprof analyze` find steps by."""
        return tracing.step_marker(step, steps)

    def step_done(self, next_step: int, steps: int = 1, **values) -> None:
        """A call returned: step scalars every `scalars_every` steps, and the window may start."""
        if self.scalars is not None and values:
            every = self.config.scalars_every
            if next_step // every != (next_step - steps) // every:
                scalars = self.scalars
                self._write_scalars(lambda: scalars.step(next_step, **values))
        if self.window is not None:
            self.window.maybe_start(next_step)

    def _write_scalars(self, write=None) -> None:
        """Run `write` (a TensorBoard scalar write), and those held before it, unless the trace is recording:
        then hold it."""
        with self._scalar_lock:
            if write is not None:
                self._held_scalars.append(write)
            if self.window is not None and self.window.active:
                return
            held, self._held_scalars = self._held_scalars, []
            for each in held:  # each one written, whichever thread flushes them; a failure fails the run later
                try:
                    each()
                except rundir.WriteError as exc:
                    self.write_errors.append(str(exc))

    def record_step(self, record: StepRecord) -> None:
        """A finished step's timing (delivered when the next one begins): steps.csv, and the
        window stops after its last step."""
        assert self.steps is not None, "record_step before _start_recording"
        self.steps.write(record)
        if self.window is not None:
            self.window.maybe_stop(record.step + record.steps)
            if self._held_scalars and not self.window.active:
                self._write_scalars()

    def record_epoch(self, result: EpochResult) -> None:
        self.meta["epochs"].append(result.as_dict())
        if self.scalars is not None:
            self.scalars.epoch(result)
        self._save()
        problems = self._background_write_errors()
        if problems:
            raise rundir.WriteError(problems[0])

    def _background_write_errors(self) -> list[str]:
        """Files the samplers' threads could not write (their CSVs, the system scalars)."""
        found = list(self.write_errors)
        if self.samplers is not None:
            found += self.samplers.write_errors()
        return found

    # ------------------------------------------------------------ run.json

    def _save(self, final: bool = False) -> None:
        """Rewrite run.json. On a full disk the last save gets the reserved space; an earlier
        one fails the run (`WriteError`), so that the last save can still say so."""
        run_json = self._run_dir / "run.json"
        try:
            rundir.write_json_atomic(run_json, self.meta)
        except OSError as exc:
            if final and rundir.is_disk_full(exc) and self.reserve is not None and self.reserve.release():
                rundir.write_json_atomic(run_json, self.meta)
                return
            raise rundir.WriteError(f"cannot write {run_json}: {rundir.reason(exc)}") from exc

    def _mark_ended(self, exc: BaseException) -> None:
        """run.json says how the run stopped: interrupted by a signal, or failed with `exc`."""
        if isinstance(exc, KeyboardInterrupt):
            self.meta["status"] = "interrupted"
            self.meta["interrupted_by"] = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
        elif self.stopped_by is not None:
            self.meta["status"] = "interrupted"
            self.meta["interrupted_by"] = signal.Signals(self.stopped_by).name
        else:
            self.meta["status"] = "failed"
            self.meta["error"] = f"{type(exc).__name__}: {exc}"
            self.meta["traceback"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            found = oom.oom_record(exc)
            if found is not None:
                self.meta["oom"] = found

    def _close(self, strict: bool = False) -> None:
        """Stop the profiler and samplers and close the files, once. With `strict`, a file that
        could not be written raises `WriteError` after everything is closed."""
        if self._to_close is None:
            self._to_close = [
                lambda: None if self.window is None else self.window.maybe_stop(0, force=True),
                lambda: None if self.window is None else self.window.describe(),
                self._record_op_costs,
                self._stop_samplers,
                lambda: None if self.steps is None else self.steps.close(),
                lambda: None if self.scalars is None else self._write_scalars(),
                lambda: None if self.scalars is None else self.scalars.close(),
            ]
        failures = []
        while self._to_close:  # each once, even when an interruption cuts this short and it is called again
            action = self._to_close.pop(0)
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - closing must not hide the run's own outcome
                self.meta.setdefault("close_errors", []).append(f"{type(exc).__name__}: {exc}")
                if isinstance(exc, (rundir.WriteError, OSError)):
                    failures.append(str(exc))
        failures += self._background_write_errors()
        if strict and failures:
            raise rundir.WriteError(failures[0])

    @staticmethod
    def _live_graph_ids() -> frozenset[int] | None:
        """The traced graphs alive as the window opens (None: unknown, every live graph is recorded)."""
        try:
            from profiler.roofline import op_costs

            return op_costs.graph_ids()
        except Exception:  # noqa: BLE001 - costs are a nicety; never the run's failure
            return None

    def _record_op_costs(self) -> None:
        """op_costs.csv: the FLOPs and bytes of the traced functions' ops, once the window's trace
        is written (the time it takes is in no traced step). A failure is a warning, never the run's."""
        if self.window is None or not self.window.written or self.path is None:
            return
        began = time.perf_counter()
        try:
            from profiler.roofline import op_costs

            self.meta["profiler"].update(op_costs.write(self.path, before=self._graphs_before))
        except Exception as exc:  # noqa: BLE001 - costs are a nicety; the run and its trace stand
            self.meta["profiler"]["op_costs_seconds"] = time.perf_counter() - began
            self._profiler_warning(f"op costs were not recorded ({rundir.reason(exc)})")

    def _record_os_exit(self) -> None:
        """`os._exit` in the training program skips every `finally`: while recording, it first says in
        run.json that the run failed so (with every completed step on disk), then exits as asked."""
        real, recording = os._exit, os.getpid()
        self._real_os_exit = real

        def recorded_exit(status: int = 0) -> NoReturn:  # os._exit's parameter: a call by keyword works too
            try:
                # a forked child (multiprocessing ends its children with os._exit) is not the run
                if not self.recorded and os.getpid() == recording:
                    self._before_exit()
                    self.meta["status"] = "failed"
                    self.meta["error"] = f"the program called os._exit({status}) while devprof recorded it"
                    self._finish()
            except BaseException:  # noqa: BLE001 - exit as asked, whatever the record could do
                pass
            real(status)

        os._exit = recorded_exit

    def _before_exit(self) -> None:
        """What the loop still holds of its completed steps, written before an `os._exit` (a session that
        holds some says how)."""

    def _finish(self) -> None:
        """Close what is still open and write the last run.json, whatever the outcome."""
        self._finishing = True
        real_exit = getattr(self, "_real_os_exit", None)
        if real_exit is not None:
            os._exit = real_exit
            self._real_os_exit = None
        try:
            self._close()
            self.meta["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            self._save(final=True)
            self.recorded = True
        finally:
            if self.reserve is not None:
                self.reserve.release()
            if self.crash_log is not None:
                self.crash_log.close()
            self._finish_job_record()

    def _stop_samplers(self) -> None:
        if self.samplers is None:
            return
        self.samplers.stop()
        windows = [(e["epoch"], e["start_time_s"], e["start_time_s"] + e["seconds"]) for e in self.meta["epochs"]]
        self.meta["samplers"].update(status=self.samplers.status(), summaries=self.samplers.summaries(windows))

    # ------------------------------------------------------------ the job's run.json (the chief)

    def _start_job_record(self) -> None:
        """The chief writes the job's run.json beside the workers' folders: the job, its workers."""
        from profiler.record import job

        cluster = self.config.cluster
        if cluster is None or not cluster.is_chief or self.job_dir is None:
            return
        job_id = job.job_id_from_environment()
        found = job.read(self.job_dir) if job_id else None
        if found and found.get("job_id") == job_id:
            meta = found
        else:
            meta = self._new_job_meta(list(cluster.workers), job_id)
        meta.update(
            status="running",
            chief=cluster.name,
            device={"kind": self.meta["device"]["kind"], "name": self.meta["device"].get("name")},
        )
        if "validation_images" in self.meta.get("config", {}):
            meta.setdefault("config", {})["validation_images"] = self.meta["config"]["validation_images"]
        self.job_meta = meta
        try:
            job.write(self.job_dir, meta)
        except OSError as exc:
            raise rundir.WriteError(f"cannot write {job.run_json(self.job_dir)}: {rundir.reason(exc)}") from exc

    def _finish_job_record(self) -> None:
        """The chief's outcome is the job's (a synchronous job stops together); the workers' own
        outcomes where their folders are readable from here (shared storage, or one machine)."""
        from profiler.record import job

        if self.job_meta is None or self.job_dir is None:
            return
        cluster = self.config.cluster
        meta = self.job_meta
        meta.update(
            status=self.meta.get("status"),
            error=self.meta.get("error"),
            finished_at=self.meta.get("finished_at"),
            worker_status=job.worker_outcomes(self.job_dir, cluster.num_workers),
        )
        if "interrupted_by" in self.meta:
            meta["interrupted_by"] = self.meta["interrupted_by"]
        with contextlib.suppress(OSError):  # the chief's own run.json already says how it ended
            job.write(self.job_dir, meta)

    # ------------------------------------------------------------ signals

    @contextlib.contextmanager
    def _sigterm_stops_the_run(self, only_if_default: bool = False):
        """While the run executes, SIGTERM raises `Terminated` in the main thread, as Ctrl-C raises
        KeyboardInterrupt; while the run directory is being finished it is only noted.
        `only_if_default`: leave a handler the program installed itself alone.

        A worker of a multi-worker job can be blocked in a collective, waiting for a peer, and
        Python runs a signal handler only once the main thread is back from TensorFlow: there a
        watcher thread, woken by the signal itself, cancels the collectives if the handler has not
        run within `COLLECTIVE_STOP_GRACE_S`. The loop then stops with TensorFlow's cancellation
        error, which the run records as the signal's interruption."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        workers = self.config.cluster is not None
        lock = threading.RLock()  # RLock: a second signal can arrive while the handler holds it
        raised = threading.Event()

        def on_signal(signum, frame):
            if self._finishing:
                return  # run.json is being finished; the process ends right after
            with lock:
                if self.stopped_by is not None:
                    return  # the collectives were cancelled: the loop's error ends the run
                raised.set()
            raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

        handled: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT) if workers else (signal.SIGTERM,)
        if only_if_default:
            handled = tuple(
                s for s in handled if signal.getsignal(s) in (signal.SIG_DFL, signal.default_int_handler, None)
            )
        previous = {signum: signal.signal(signum, on_signal) for signum in handled}
        watcher = _CollectiveCanceller(self, lock, raised) if workers else None
        # MultiWorkerMirroredStrategy starts TensorFlow's coordination service, whose preemption
        # notifier takes SIGTERM over (it only notes the signal): once the strategy exists, the
        # run's handlers are put back.
        self._rearm_signals = lambda: [signal.signal(signum, on_signal) for signum in handled]
        try:
            yield
        finally:
            self._rearm_signals = None
            if watcher is not None:
                watcher.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def tpu_monitor_address(tpu: str | None) -> str | None:
    """Cloud TPU workers serve gRPC on 8470 and the profiler's monitor on 8466."""
    if not tpu or not tpu.startswith("grpc://"):
        return None
    host, _, port = tpu[len("grpc://") :].rpartition(":")
    return f"{host}:8466" if host and port == "8470" else None


def starting_meta(resolved, config: dict, profile: bool, **sections) -> dict:
    """run.json as a run starts (status `running`), for `devprof run` and `profiler.profile()`
    alike; `sections` add what only one of them knows (`data`, `recorded_by`)."""
    import sys

    from profiler.device import devices
    from profiler.roofline import peak

    cached_peak = peak.cached_for_run(resolved.kind, resolved.info.get("name"))
    return {
        "status": "running",
        "error": None,
        "devprof_version": __version__,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "start_time_s": time.time(),
        "finished_at": None,
        "pid": os.getpid(),
        "command": sys.argv,
        "config": config,
        "device": {"kind": resolved.kind, "host": devices.host_name(), **resolved.info},
        **sections,
        **({"peak": cached_peak} if cached_peak is not None else {}),
        "versions": versions(),
        "model": {},
        "profiler": {"enabled": profile},
        "epochs": [],
    }


def versions() -> dict:
    """Versions of what the run used, for run.json."""
    import keras
    import numpy
    import tensorflow as tf

    build = {}
    try:
        build = {k: v for k, v in tf.sysconfig.get_build_info().items() if k in ("cuda_version", "cudnn_version")}
    except Exception:  # noqa: BLE001
        pass
    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": numpy.__version__,
        "devprof": __version__,
        **build,
    }


COLLECTIVE_STOP_GRACE_S = 1.0  # how long a signal's handler may take before the collectives are cancelled


class _CollectiveCanceller:
    """Cancels the collectives of a worker whose main thread does not answer a signal.

    `signal.set_wakeup_fd` makes the interpreter's C-level handler write the signal's number to
    a pipe the moment it arrives; this thread reads it, gives the Python handler
    `COLLECTIVE_STOP_GRACE_S` to run, and otherwise marks the run stopped and aborts TensorFlow's
    collectives, so that the blocked call returns with an error.
    """

    def __init__(self, run: Session, lock, raised: threading.Event):
        self.run, self.lock, self.raised = run, lock, raised
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        self.thread = threading.Thread(target=self._watch, name="devprof-signal-watch", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self.read_fd, 64)
            except OSError:
                return
            if not data:
                return  # closed
            signums = [b for b in data if b in (signal.SIGTERM, signal.SIGINT)]
            if not signums or self.raised.wait(COLLECTIVE_STOP_GRACE_S):
                continue
            with self.lock:
                if self.raised.is_set() or self.run.stopped_by is not None or self.run._finishing:
                    continue
                self.run.stopped_by = signums[0]
            _abort_collectives(f"devprof: stopped by {signal.Signals(signums[0]).name}")

    def close(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(self.previous_fd)
        with contextlib.suppress(OSError):
            os.close(self.write_fd)  # the thread reads end-of-file and ends
        self.thread.join(1.0)
        with contextlib.suppress(OSError):
            os.close(self.read_fd)


def _abort_collectives(message: str) -> None:
    try:
        from tensorflow.python.eager import context

        context.context().abort_collective_ops(1, message)  # 1: CANCELLED
    except Exception:  # noqa: BLE001 - nothing to cancel (TensorFlow not started): the handler stops the run
        pass
