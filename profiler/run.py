"""One profiled training run: resolve the device, load data, train under the hooks, and keep
the run directory complete and readable whatever happens."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict
from pathlib import Path

from models.training import EpochResult
from profiler import rundir, samplers, tracing
from profiler.config import RunConfig, UsageError
from profiler.console import Console
from profiler.hooks import RunHooks
from profiler.scalars import Scalars
from profiler.version import __version__


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, Docker, Kubernetes, Slurm) arrived: the run stops as it does on Ctrl-C."""


class Run:
    """The state of one run; `execute()` drives it."""

    def __init__(self, config: RunConfig, console: Console | None = None, backend=None):
        self.config = config
        self.console = console or Console(config.quiet)
        self.backend = backend
        self.path: Path | None = None
        self.meta: dict = {}
        self.steps: rundir.StepsWriter | None = None
        self.scalars: Scalars | None = None
        self.window: tracing.ProfileWindow | None = None
        self.samplers = None
        self.trainer = None
        self.reserve: rundir.Reserve | None = None
        self.write_errors: list[str] = []  # files that could not be written from other threads
        self._to_close: list | None = None
        self.recorded = False  # the last run.json, with how the run ended, was written
        self._finishing = False
        self.job_dir: Path | None = None  # a worker of a multi-worker job: the job's folder
        self.job_meta: dict | None = None  # the chief's job run.json
        self.stopped_by: int | None = None  # a signal that cancelled a blocked collective (workers only)
        self._rearm_signals = None

    # ------------------------------------------------------------ set-up (no run directory yet)

    def prepare(self):
        """Everything that can fail because of the user's input, before anything is written."""
        from models import data as data_mod
        from profiler import devices

        from profiler import job

        cfg = self.config
        cfg.validate()
        try:
            rundir.check_output_folder(Path(cfg.out))
        except rundir.OutputError as exc:
            raise UsageError(str(exc)) from None
        cluster = cfg.cluster
        if cluster is not None:  # <out>/<run-name>/ is the job's; other workers may have made it already
            self.job_dir = Path(cfg.out) / cfg.run_name
            rundir.check_new(self.job_dir / cluster.name)
            if cluster.is_chief:
                job.check_free(self.job_dir, job.job_id_from_environment())
        elif cfg.run_name is not None:
            rundir.check_new(Path(cfg.out) / cfg.run_name)
        if cfg.profiler_port is not None:
            try:
                tracing.check_port_free(cfg.profiler_port)
            except OSError as exc:
                raise UsageError(f"--profiler-port {cfg.profiler_port} is not free "
                                 f"({exc.strerror or exc}); choose another port") from None
        try:
            resolved = devices.resolve(cfg.device, cfg.gpus, cfg.tpu, backend=self.backend, cluster=cluster,
                                       collective_timeout_s=cfg.collective_timeout_s)
        except devices.DeviceError as exc:
            raise UsageError(str(exc)) from None
        try:
            arrays = data_mod.load(cfg.data, cfg.data_dir, cfg.limit_images, cfg.train.seed,
                                   notice=self.console.notice, limit_test_images=cfg.limit_test_images)
        except data_mod.DataError as exc:
            raise UsageError(str(exc)) from None
        if cluster is not None:
            self.path = self.job_dir / cluster.name
        else:
            name = cfg.run_name or rundir.default_run_name(resolved.kind, devices.host_name())
            self.path = Path(cfg.out) / name
        rundir.check_new(self.path)
        slow = devices.precision_warning(cfg.train.precision, resolved.kind,
                                         devices.cpu_flags() if resolved.kind == "cpu" else None)
        if slow:
            self.console.warn(f"warning: {slow}")
        return resolved, arrays

    def execute(self) -> Path:
        with self._sigterm_stops_the_run():
            try:
                return self._execute()
            except BaseException as exc:
                if self.stopped_by is not None and not isinstance(exc, KeyboardInterrupt):
                    # A signal cancelled the collective the loop was blocked in: the run was stopped.
                    raise (Terminated() if self.stopped_by == signal.SIGTERM else KeyboardInterrupt()) from exc
                raise

    def _execute(self) -> Path:
        resolved, arrays = self.prepare()
        if self._rearm_signals is not None:
            self._rearm_signals()
        rundir.create(self.path)
        self.reserve = rundir.Reserve(self.path)
        self.meta = self._initial_meta(resolved, arrays)
        try:
            self._save()
            self._start_job_record()
            self._train(resolved, arrays)
            self._close(strict=True)  # closing writes files too: a failure there fails the run
            self.meta["status"] = "complete"
        except KeyboardInterrupt as exc:
            self.meta["status"] = "interrupted"
            self.meta["interrupted_by"] = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
            raise
        except BaseException as exc:
            if self.stopped_by is not None:
                self.meta["status"] = "interrupted"
                self.meta["interrupted_by"] = signal.Signals(self.stopped_by).name
            else:
                self.meta["status"] = "failed"
                self.meta["error"] = f"{type(exc).__name__}: {exc}"
                self.meta["traceback"] = traceback.format_exc()
            raise
        finally:
            self._finish()
        return self.path

    @contextlib.contextmanager
    def _sigterm_stops_the_run(self):
        """While the run executes, SIGTERM raises `Terminated` in the main thread, as Ctrl-C raises
        KeyboardInterrupt; while the run directory is being finished it is only noted.

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

        handled = (signal.SIGTERM, signal.SIGINT) if workers else (signal.SIGTERM,)
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

    # ------------------------------------------------------------ training

    def _train(self, resolved, arrays) -> None:
        from models.cnn import build_cnn, train_flops_per_image
        from models.training import Trainer

        cfg = self.config
        if cfg.measure_peak:  # before the samplers and training, so nothing competes with it
            from profiler import peak

            self.console.print("Measuring the device's peak matmul rate and memory bandwidth...")
            self.meta["peak"] = peak.record_for_run(resolved.kind, resolved.info.get("name"))
            if self.meta["peak"].get("cache_error"):
                self.console.warn(f"warning: {peak.not_cached_message(self.meta['peak']['cache_error'])}")
        self.steps = rundir.StepsWriter(self.path / "steps.csv")
        self.scalars = Scalars(self.path)
        self._start_samplers(resolved)
        if cfg.profiler_port is not None:
            try:
                tracing.start_server(cfg.profiler_port)
                self.meta["profiler"]["server_port"] = cfg.profiler_port
                self.console.print(f"profiler server listening on port {cfg.profiler_port} "
                                   f"(capture with: devprof capture grpc://localhost:{cfg.profiler_port})")
            except Exception as exc:  # noqa: BLE001
                self._profiler_warning(f"profiler server did not start on port {cfg.profiler_port} ({exc})")
        hooks = RunHooks(self)
        self.trainer = trainer = Trainer(resolved.strategy, build_cnn, arrays, self.train_config(), hooks)
        self.meta["model"] = {"name": trainer.model.name, "params": int(trainer.model.count_params()),
                              "train_flops_per_image": train_flops_per_image(trainer.model)}
        self.meta["steps_per_epoch"] = trainer.steps_per_epoch
        if cfg.profile:
            start, stop = (tracing.parse_window(cfg.profile_steps) if cfg.profile_steps
                           else tracing.default_window(trainer.steps_per_epoch))
            total = trainer.steps_per_epoch * cfg.train.epochs
            if start >= total:
                self._profiler_warning(f"profile window {start}:{stop} is never reached: the run has "
                                       f"{total} steps; no trace will be written")
            else:
                self._open_window(start, min(stop, total), resolved.kind)
        self._save()
        trainer.fit()
        self.console.print(evaluation_message(len(arrays.x_test), cfg.limit_test_images))
        began = time.perf_counter()
        test_loss, test_accuracy = trainer.evaluate()
        self.meta["test"] = {"loss": test_loss, "accuracy": test_accuracy, "images": len(arrays.x_test),
                             "seconds": time.perf_counter() - began}
        self.console.print(f"test_loss: {test_loss:.4f} - test_accuracy: {test_accuracy:.4f}")

    def train_config(self):
        """The training options this process trains with: an injected cost named for one worker
        (`MS@WORKER`) is paid by that worker only."""
        cfg = self.config
        index = cfg.cluster.index if cfg.cluster is not None else None
        injected_input, injected_host = cfg.injections()
        return dataclasses.replace(cfg.train, inject_input_delay_ms=injected_input.for_worker(index),
                                   inject_host_delay_ms=injected_host.for_worker(index))

    def _open_window(self, start: int, stop: int, device_kind: str) -> None:
        cfg = self.config
        self.window = tracing.ProfileWindow(self.path, start, stop, cfg.tracer, warn=self.console.warn,
                                            steps_per_call=cfg.train.steps_per_execution, notes=self.meta["profiler"])
        self.meta["profiler"]["window"] = [start, stop]
        estimate = tracing.estimate_events(stop - start, cfg.tracer, device_kind)
        self.meta["profiler"]["estimated_events"] = estimate
        if estimate > tracing.VIEWER_EVENT_LIMIT:
            self._profiler_warning(
                f"profile window {start}:{stop} may hold about {estimate:,} events, more than the "
                f"{tracing.VIEWER_EVENT_LIMIT:,} XProf's trace viewer shows; use a shorter --profile-steps")

    def _start_samplers(self, resolved) -> None:
        cfg = self.config
        if not cfg.sample:
            self.meta["samplers"] = {"enabled": False, "reason": "turned off with --no-sample"}
            return
        lock = threading.Lock()

        def to_tensorboard(name, row):
            step = self.trainer.global_step if self.trainer is not None else 0
            with lock:  # each sampler calls from its own thread
                if self.write_errors:
                    return
                try:
                    self.scalars.system(name, step, row)
                except rundir.WriteError as exc:  # the run fails on it at the next epoch end
                    self.write_errors.append(str(exc))

        group = samplers.build_sampler_group(self.path / "utilization", resolved.kind, cfg.sample_interval,
                                             on_row=to_tensorboard,
                                             tpu_service_addr=tpu_monitor_address(resolved.info.get("tpu")))
        self.samplers = group.start()
        self.meta["samplers"] = {"enabled": True, "interval_s": cfg.sample_interval, "status": group.status()}
        for name, status in group.status().items():
            if not status.get("ran", True) and status.get("reason"):
                self.console.notice(f"notice: {status['reason']}")

    def _profiler_warning(self, message: str) -> None:
        self.meta["profiler"].setdefault("warnings", []).append(message)
        self.console.warn(f"warning: {message}")

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

    def _initial_meta(self, resolved, arrays) -> dict:
        from profiler import devices

        cfg = self.config
        config = asdict(cfg)
        config.update(config.pop("train"))
        config.pop("cluster")
        validated = min(cfg.train.validation_images, len(arrays.x_test))
        config["validation_images"] = validated  # as validated: the test set may be smaller than asked
        meta = {
            "status": "running",
            "error": None,
            "devprof_version": __version__,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "start_time_s": time.time(),
            "finished_at": None,
            "command": sys.argv,
            "config": config,
            "device": {"kind": resolved.kind, "host": devices.host_name(), **resolved.info},
            "data": {"source": arrays.source, "path": arrays.path, "train_images": len(arrays.x_train),
                     "val_images": validated,
                     "test_images": len(arrays.x_test)},
            "versions": versions(),
            "model": {},
            "profiler": {"enabled": cfg.profile},
            "epochs": [],
        }
        if cfg.cluster is not None:
            cluster = cfg.cluster
            train = self.train_config()
            meta["worker"] = {"index": cluster.index, "name": cluster.name, "num_workers": cluster.num_workers,
                              "chief": cluster.is_chief, "addresses": list(cluster.workers),
                              "address": cluster.workers[cluster.index], "source": cluster.source,
                              "job": str(self.job_dir)}
            meta["global_batch_size"] = cfg.train.batch_size
            meta["per_worker_batch_size"] = cfg.train.batch_size // cluster.num_workers
            meta["injected"] = {"input_delay_ms": train.inject_input_delay_ms,
                                "host_delay_ms": train.inject_host_delay_ms}
        return meta

    def _save(self, final: bool = False) -> None:
        """Rewrite run.json. On a full disk the last save gets the reserved space; an earlier
        one fails the run (`WriteError`), so that the last save can still say so."""
        try:
            rundir.write_json_atomic(self.path / "run.json", self.meta)
        except OSError as exc:
            if final and rundir.is_disk_full(exc) and self.reserve is not None and self.reserve.release():
                rundir.write_json_atomic(self.path / "run.json", self.meta)
                return
            raise rundir.WriteError(f"cannot write {self.path / 'run.json'}: {rundir.reason(exc)}") from exc

    def _close(self, strict: bool = False) -> None:
        """Stop the profiler and samplers and close the files, once. With `strict`, a file that
        could not be written raises `WriteError` after everything is closed."""
        if self._to_close is None:
            self._to_close = [lambda: self.window and self.window.maybe_stop(0, force=True),
                              lambda: self.window and self.window.describe(),
                              self._stop_samplers,
                              lambda: self.steps and self.steps.close(),
                              lambda: self.scalars and self.scalars.close()]
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

    def _finish(self) -> None:
        """Close what is still open and write the last run.json, whatever the outcome."""
        self._finishing = True
        try:
            self._close()
            self.meta["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            self._save(final=True)
            self.recorded = True
        finally:
            if self.reserve is not None:
                self.reserve.release()
            self._finish_job_record()

    # ------------------------------------------------------------ the job's run.json (the chief)

    def _start_job_record(self) -> None:
        """The chief writes the job's run.json beside the workers' folders: the job, its workers."""
        from profiler import job

        cluster = self.config.cluster
        if cluster is None or not cluster.is_chief:
            return
        job_id = job.job_id_from_environment()
        found = job.read(self.job_dir) if job_id else None
        meta = found if found and found.get("job_id") == job_id else job.new_meta(self.config, list(cluster.workers),
                                                                                  job_id)
        meta.update(status="running", chief=cluster.name, device={"kind": self.meta["device"]["kind"],
                                                                  "name": self.meta["device"].get("name")})
        meta.setdefault("config", {})["validation_images"] = self.meta["config"]["validation_images"]
        self.job_meta = meta
        try:
            job.write(self.job_dir, meta)
        except OSError as exc:
            raise rundir.WriteError(f"cannot write {job.run_json(self.job_dir)}: {rundir.reason(exc)}") from exc

    def _finish_job_record(self) -> None:
        """The chief's outcome is the job's (a synchronous job stops together); the workers' own
        outcomes where their folders are readable from here (shared storage, or one machine)."""
        from profiler import job

        if self.job_meta is None:
            return
        cluster = self.config.cluster
        meta = self.job_meta
        meta.update(status=self.meta.get("status"), error=self.meta.get("error"),
                    finished_at=self.meta.get("finished_at"),
                    worker_status=job.worker_outcomes(self.job_dir, cluster.num_workers))
        if "interrupted_by" in self.meta:
            meta["interrupted_by"] = self.meta["interrupted_by"]
        with contextlib.suppress(OSError):  # the chief's own run.json already says how it ended
            job.write(self.job_dir, meta)

    def _stop_samplers(self) -> None:
        if self.samplers is None:
            return
        self.samplers.stop()
        windows = [(e["epoch"], e["start_time_s"], e["start_time_s"] + e["seconds"]) for e in self.meta["epochs"]]
        self.meta["samplers"].update(status=self.samplers.status(), summaries=self.samplers.summaries(windows))


def evaluation_message(test_images: int, limit_test_images: int | None) -> str:
    """What the test pass at the end does: the whole test set, or the first N (--limit-test-images)."""
    if limit_test_images is not None and test_images >= limit_test_images:
        return f"Evaluating on the first {test_images:,} test images (--limit-test-images)..."
    return f"Evaluating on the whole test set ({test_images:,} images)..."


def tpu_monitor_address(tpu: str | None) -> str | None:
    """Cloud TPU workers serve gRPC on 8470 and the profiler's monitor on 8466."""
    if not tpu or not tpu.startswith("grpc://"):
        return None
    host, _, port = tpu[len("grpc://"):].rpartition(":")
    return f"{host}:8466" if host and port == "8470" else None


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
    return {"python": platform.python_version(), "tensorflow": tf.__version__, "keras": keras.__version__,
            "numpy": numpy.__version__, "devprof": __version__, **build}


COLLECTIVE_STOP_GRACE_S = 1.0  # how long a signal's handler may take before the collectives are cancelled


class _CollectiveCanceller:
    """Cancels the collectives of a worker whose main thread does not answer a signal.

    `signal.set_wakeup_fd` makes the interpreter's C-level handler write the signal's number to
    a pipe the moment it arrives; this thread reads it, gives the Python handler
    `COLLECTIVE_STOP_GRACE_S` to run, and otherwise marks the run stopped and aborts TensorFlow's
    collectives, so that the blocked call returns with an error.
    """

    def __init__(self, run: Run, lock, raised: threading.Event):
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
