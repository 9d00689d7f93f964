"""`devprof run --workers N`: one multi-worker job on this machine.

Starts N `python -m profiler run` processes, each a worker of one MultiWorkerMirroredStrategy
job (TF_CONFIG with a free 127.0.0.1 port per worker, and `--task-index`), waits for them and
shows the job's progress from the chief's files. Workers run quiet, their output goes to
`<job>/worker-<i>.log`. When one worker fails or dies, the others are stopped (SIGTERM, then
SIGKILL after `GRACE_S`, or `STARTING_GRACE_S` for a worker still starting); Ctrl-C or SIGTERM
on the launcher is passed on to every worker. At the end every worker's run.json says how it
ended (a worker killed by a signal cannot write its own: the launcher does) and the job's
run.json sums them up. More workers than the machine's cores or memory can run are refused
unless `--oversubscribe` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.read import run_files
from profiler.cli.common import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, EXIT_USAGE, Option, error
from profiler.device import cluster as cluster_mod
from profiler.record import job, rundir
from profiler.record.console import Console

if TYPE_CHECKING:
    from profiler.train.config import RunConfig

GRACE_S = 10.0  # a worker asked to stop (SIGTERM) is killed (SIGKILL) after this long
# A worker without its run.json yet (importing TensorFlow, waiting for the others in the
# strategy's start-up, where TensorFlow may hold SIGTERM) has nothing to save: killed sooner.
STARTING_GRACE_S = 2.0
POLL_S = 0.2
# Memory one worker process takes (TensorFlow, the CNN, its data and tf.data buffers), with room to spare.
WORKER_MEMORY_BYTES = int(1.5 * 2**30)


@dataclass
class Worker:
    index: int
    process: subprocess.Popen
    log: Path
    returncode: int | None = None
    ended_at: float | None = None
    signalled: list[str] = field(default_factory=list)  # signals the launcher sent it
    killed: bool = False  # SIGKILLed by the launcher after the grace period

    @property
    def name(self) -> str:
        return cluster_mod.worker_name(self.index)


def launch(
    args: argparse.Namespace,
    build_config: Callable[[argparse.Namespace, cluster_mod.Cluster], RunConfig],
    options: Sequence[Option],
) -> int:
    """Check the options, start the workers, watch them; the exit code of the job. `build_config`
    and `options` are `devprof run`'s: the launcher checks what a worker would, and passes on
    the options it was given."""
    from profiler.train.config import UsageError

    n = args.workers
    problem = _launcher_problem(args)
    if not problem and not args.oversubscribe:  # before the other options: the advice they give depends on N
        problem = capacity_problem(n, *machine_capacity())
    if problem:
        return error(problem)
    run_name = (
        args.run_name or rundir.free_run_dir(Path(args.out), rundir.default_run_name(f"cpu-{n}workers", _host())).name
    )
    args.run_name = run_name
    job_dir = Path(args.out) / run_name
    # Every check a worker would make before training, made once here on a stand-in cluster.
    stand_in = cluster_mod.Cluster(
        tuple(f"127.0.0.1:{i + 1}" for i in range(n)),
        0,
        "--workers",
        cluster_mod.local_tf_config(list(range(1, n + 1)), 0),
    )
    config = build_config(args, stand_in)
    try:
        config.validate()
        rundir.check_output_folder(Path(args.out))
        rundir.check_new(job_dir)
        profiler_ports = _check_profiler_ports(args.profiler_port, n)
    except (UsageError, rundir.OutputError, rundir.RunExistsError) as exc:
        return error(str(exc))
    ports = cluster_mod.free_ports(n)
    job_id = uuid.uuid4().hex
    rundir.create(job_dir)
    meta = job.new_meta(config, [f"127.0.0.1:{port}" for port in ports], job_id)
    threads = cluster_mod.thread_counts(n)
    meta["launcher"] = {
        "pid": os.getpid(),
        "ports": ports,
        "profiler_ports": profiler_ports,
        "logs": [f"{cluster_mod.worker_name(i)}.log" for i in range(n)],
        "grace_s": GRACE_S,
        "intra_op_threads": threads[0] if threads else None,
    }
    job.write(job_dir, meta)
    console = Console(args.quiet)
    cores = os.cpu_count() or 1
    workers = f"{n} worker{'s' if n != 1 else ''}"
    console.print(
        f"job {job_dir}: {workers} on this machine ({', '.join(meta['addresses'])}), "
        f"{threads[0] if threads else cores} of {cores} cores each; global batch {args.batch_size} = "
        f"{n} x {args.batch_size // n}; worker output in {job_dir}/worker-<i>.log"
    )
    common = child_options(args, options)
    return _Job(args, job_dir, job_id, ports, profiler_ports, common, console).run()


def _host() -> str:
    import socket

    return socket.gethostname()


def machine_capacity() -> tuple[int, int | None]:
    """(cores this process may run on, bytes of memory available now, or None where unknown)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        import psutil

        available = int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - unknown memory is no reason to refuse
        available = None
    return cores, available


def capacity_problem(n: int, cores: int, available: int | None) -> str | None:
    """Why this machine cannot run `n` TensorFlow worker processes at once, or None. One worker
    always may: it is one ordinary run."""
    if n > max(cores, 1):
        return (
            f"--workers {n} is more workers than this machine has cores ({cores}); each worker is a "
            f"TensorFlow process and more of them than cores only slow each other down (and the machine): "
            f"use --workers {max(cores, 1)} or fewer, or --oversubscribe to start them anyway"
        )
    if available is not None and n > 1 and n * WORKER_MEMORY_BYTES > available:
        fits = max(1, available // WORKER_MEMORY_BYTES)
        return (
            f"--workers {n} needs about {n * WORKER_MEMORY_BYTES / 2**30:.1f} GiB of memory "
            f"({WORKER_MEMORY_BYTES / 2**30:.1f} GiB per worker) but {available / 2**30:.1f} GiB is available: "
            f"use --workers {fits} or fewer, or --oversubscribe to start them anyway"
        )
    return None


def _launcher_problem(args) -> str | None:
    if args.workers < 1:
        return f"--workers must be at least 1 (got {args.workers})"
    if args.cluster is not None or args.task_index is not None:
        return (
            "--workers starts a job on this machine; --cluster and --task-index are for one worker of a job "
            "on several hosts (run 'devprof run --cluster ... --task-index I' on each host)"
        )
    if os.environ.get(cluster_mod.TF_CONFIG):
        return (
            "--workers starts a job on this machine with its own TF_CONFIG, but TF_CONFIG is set in the "
            "environment (unset it, or run one worker per host without --workers)"
        )
    if args.device in ("gpu", "tpu") or args.gpus is not None:
        return (
            "--workers starts CPU workers on this machine; for several GPUs in one machine use --gpus N "
            "(MirroredStrategy), and for GPUs on several machines run one worker per host with --cluster "
            "or TF_CONFIG"
        )
    return None


def _check_profiler_ports(port: int | None, n: int) -> list[int] | None:
    """--profiler-port P with N workers: worker i listens on P + i; each must be free."""
    from profiler.record import tracing
    from profiler.train.config import UsageError

    if port is None:
        return None
    ports = [port + i for i in range(n)]
    if ports[-1] > 65535:
        raise UsageError(
            f"--profiler-port {port} with {n} workers needs ports up to {ports[-1]}; the last port is 65535"
        )
    for candidate in ports:
        try:
            tracing.check_port_free(candidate)
        except OSError as exc:
            raise UsageError(
                f"--profiler-port {port}: worker {candidate - port} would listen on {candidate}, which "
                f"is not free ({exc.strerror or exc}); choose another port"
            ) from None
    return ports


def child_options(args: argparse.Namespace, options: Sequence[Option]) -> list[str]:
    """`devprof run`'s options as the launcher was given them, for its workers (without the ones
    the launcher sets per worker). From the run command's own table, so a new option is passed on too."""
    out = given_options(args, options)
    if args.device == "auto":
        out += ["--device", "cpu"]  # the workers share this machine's CPU
    return out


def given_options(args: argparse.Namespace, options: Sequence[Option]) -> list[str]:
    """The options of `options` that `args` sets to other than their defaults, as a command line, less the
    ones each process sets for itself (`per_worker`)."""
    out = []
    for option in options:
        if option.per_worker:
            continue
        value = getattr(args, option.dest, option.default)
        if value == option.default:
            continue
        if not option.takes_value:
            out.append(option.flag)
        elif isinstance(value, cluster_mod.Injection):
            out += [option.flag, repr(value.ms) + ("" if value.worker is None else f"@{value.worker}")]
        else:
            out += [option.flag, repr(value) if isinstance(value, float) else str(value)]
    return out


class _Job:
    """The workers of one job on this machine, from start to the job's last run.json."""

    def __init__(
        self,
        args,
        job_dir: Path,
        job_id: str,
        ports: list[int],
        profiler_ports: list[int] | None,
        common: list[str],
        console: Console,
    ):
        self.args, self.job_dir, self.job_id = args, job_dir, job_id
        self.ports, self.profiler_ports, self.common = ports, profiler_ports, common
        self.console = console
        self.workers: list[Worker] = []
        self.failed: Worker | None = None  # the worker whose failure stopped the job
        self.stop_signal: int | None = None  # a signal the launcher got (Ctrl-C, SIGTERM)
        self.stop_sent_at: float | None = None
        self.kill_now = False  # asked to stop twice: no grace period
        self.progress = _Progress(job_dir / cluster_mod.worker_name(0), args.epochs, console)

    # ------------------------------------------------------------ start and watch

    def run(self) -> int:
        previous = {signum: signal.signal(signum, self._on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            for index in range(self.args.workers):
                if self.stop_signal is not None:
                    break  # stopped while starting: start no more
                self.workers.append(self._start(index))
            self._note_pids()
            self._watch()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            for worker in self.workers:  # nothing outlives the launcher
                if worker.process.poll() is None:
                    worker.process.kill()
                    worker.process.wait()
        self.progress.finish()
        return self._conclude()

    def _note_pids(self) -> None:
        meta = job.read(self.job_dir)
        if meta is not None:
            meta.setdefault("launcher", {})["pids"] = {w.name: w.process.pid for w in self.workers}
            with contextlib.suppress(OSError):
                job.write(self.job_dir, meta)

    def _on_signal(self, signum, frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
        else:  # asked twice: stop waiting for the grace period
            self.kill_now = True

    def command(self, index: int) -> list[str]:
        """Worker `index`'s command line."""
        argv = [
            sys.executable,
            "-m",
            "profiler",
            "run",
            *self.common,
            "--out",
            str(self.args.out),
            "--run-name",
            self.args.run_name,
            "--quiet",
            "--task-index",
            str(index),
        ]
        if self.profiler_ports:
            argv += ["--profiler-port", str(self.profiler_ports[index])]
        return argv

    def _start(self, index: int) -> Worker:
        argv = self.command(index)
        env = dict(
            os.environ,
            **{
                cluster_mod.TF_CONFIG: cluster_mod.local_tf_config(self.ports, index),
                job.JOB_ID_ENV: self.job_id,
                "PYTHONUNBUFFERED": "1",
            },
        )
        log = self.job_dir / f"{cluster_mod.worker_name(index)}.log"
        with open(log, "wb") as out:
            # Its own session: a Ctrl-C in the terminal reaches the launcher only, which passes it on.
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        return Worker(index, process, log)

    def _watch(self) -> None:
        while True:
            now = time.monotonic()
            running = []
            ended = []
            for worker in self.workers:
                if worker.returncode is None:
                    code = worker.process.poll()
                    if code is None:
                        running.append(worker)
                        continue
                    worker.returncode, worker.ended_at = code, now
                    ended.append(worker)
            if self.failed is None and self.stop_signal is None:
                failures = [w for w in ended if w.returncode != 0]
                if failures:  # a worker killed by a signal first: the others' errors follow from it
                    self.failed = min(failures, key=lambda w: (w.returncode is None or w.returncode >= 0, w.index))
                    self._signal(running, signal.SIGTERM)
            if self.stop_signal is not None and self.stop_sent_at is None:
                self._signal(running, self.stop_signal)
            if not running:
                return
            if self.stop_sent_at is not None:
                for worker in running:
                    if not worker.killed and (self.kill_now or now - self.stop_sent_at >= self._grace(worker)):
                        worker.killed = True
                        worker.signalled.append("SIGKILL")
                        with contextlib.suppress(ProcessLookupError):
                            worker.process.kill()
            self.progress.update()
            time.sleep(POLL_S)

    def _grace(self, worker: Worker) -> float:
        """How long `worker` may take to stop: a worker training has its run directory to finish."""
        started = (self.job_dir / worker.name / run_files.RUN_JSON).exists()
        return GRACE_S if started else STARTING_GRACE_S

    def _signal(self, workers: list[Worker], signum: int) -> None:
        self.stop_sent_at = time.monotonic()
        for worker in workers:
            worker.signalled.append(signal.Signals(signum).name)
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(signum)

    # ------------------------------------------------------------ how it ended

    def _conclude(self) -> int:
        why = self._failure_reason(self.failed) if self.failed is not None else None
        for worker in self.workers:
            self._record_worker(worker, why)
        outcomes = job.worker_outcomes(self.job_dir, len(self.workers))
        meta = job.read(self.job_dir) or {}
        if self.stop_signal is not None:
            status, error_text = "interrupted", None
            meta["interrupted_by"] = signal.Signals(self.stop_signal).name
        elif self.failed is not None:
            status, error_text = "failed", f"{self.failed.name}: {why}"
        elif all(w.returncode == 0 for w in self.workers):
            status, error_text = "complete", None
        else:
            status, error_text = "failed", "a worker failed"
        meta.update(
            status=status, error=error_text, finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), worker_status=outcomes
        )
        meta.setdefault("launcher", {})["exit_codes"] = {w.name: w.returncode for w in self.workers}
        if self.failed is not None:
            meta["failed_worker"] = self.failed.name
        job.write(self.job_dir, meta)
        self._relay_warnings()
        if self.stop_signal is not None:
            what = "terminated (SIGTERM)" if self.stop_signal == signal.SIGTERM else "interrupted"
            print(f"\n{what}: job {self.job_dir} stopped; each worker-<i>/run.json says how it ended", file=sys.stderr)
            return EXIT_TERMINATED if self.stop_signal == signal.SIGTERM else EXIT_INTERRUPTED
        if self.failed is not None:
            usage = self.failed.returncode == EXIT_USAGE
            return error(
                f"worker {self.failed.index} {'refused to start' if usage else 'failed'}: {why}; "
                f"{'the other workers were stopped; ' if len(self.workers) > 1 else ''}"
                f"details in {self.failed.log} and {self.job_dir / run_files.RUN_JSON}",
                code=EXIT_USAGE if usage else EXIT_FAILURE,
            )
        self.console.print(f"run directory: {self.job_dir}")
        return EXIT_OK

    def _failure_reason(self, worker: Worker) -> str:
        code = worker.returncode
        if code is not None and code < 0:
            return f"killed by signal {-code} ({_signal_name(-code)})"
        meta = _read_worker(self.job_dir, worker)
        if meta and meta.get("error"):
            return job.error_summary(str(meta["error"]))
        if meta and meta.get("status") == "interrupted":
            return f"stopped by {meta.get('interrupted_by') or 'a signal'} from outside the job"
        line = _last_error_line(worker.log)
        if line:
            return line
        return f"exited with code {code}"

    def _record_worker(self, worker: Worker, why: str | None) -> None:
        """A worker that could not say how it ended (killed by a signal) gets its run.json from here;
        a worker stopped because another failed says so; one whose collective failed as its peers
        stopped on Ctrl-C or SIGTERM is interrupted, as they are."""
        path = self.job_dir / worker.name / run_files.RUN_JSON
        meta = _read_worker(self.job_dir, worker)
        if meta is None:
            return  # it never got as far as its run directory: the job's run.json and its log say why
        changed = False
        code = worker.returncode
        stopped_by = self._failed_after_the_stop(worker, meta)
        if stopped_by is not None:
            # Its peers stopped first, and its collective failed before its own handler ran: the stop's doing.
            meta["stop_note"] = f"its collective failed as its peers stopped: {meta.get('error')}"
            meta.update(status="interrupted", interrupted_by=stopped_by, error=None)
            meta.pop("traceback", None)
            changed = True
        if meta.get("status") == "running" and code is not None and code != 0:
            if worker.killed:
                meta.update(status="interrupted", interrupted_by="SIGKILL")
                meta["stop_note"] = f"did not stop within {GRACE_S:g} s of {worker.signalled[0]}; killed"
            elif code < 0:
                meta.update(status="failed", error=f"killed by signal {-code}")
                meta["signal"] = _signal_name(-code)
            else:
                meta.update(status="failed", error=f"exited with code {code} without saying why")
            meta["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            changed = True
        if worker is not self.failed and worker.signalled:
            if self.failed is not None:
                meta["stopped_by_launcher"] = f"{self.failed.name} failed: {why}"
            elif self.stop_signal is not None:
                meta["stopped_by_launcher"] = f"the launcher got {signal.Signals(self.stop_signal).name}"
            changed = True
        if changed:
            with contextlib.suppress(OSError):
                rundir.write_json_atomic(path, meta)

    def _failed_after_the_stop(self, worker: Worker, meta: dict) -> str | None:
        """The signal's name where a worker says itself it failed, having ended after the launcher passed
        on Ctrl-C or SIGTERM (and no worker's failure had stopped the job first)."""
        after_the_stop = (
            self.failed is None
            and meta.get("status") == "failed"
            and not worker.killed
            and self.stop_sent_at is not None
            and worker.ended_at is not None
            and worker.ended_at >= self.stop_sent_at
        )
        return signal.Signals(self.stop_signal).name if after_the_stop and self.stop_signal is not None else None

    def _relay_warnings(self) -> None:
        """Each distinct `warning:` a worker printed, once, naming the first worker that printed it."""
        seen = set()
        for worker in self.workers:
            for line in _log_lines(worker.log):
                if line.startswith("warning: ") and line not in seen:
                    seen.add(line)
                    print(f"warning: {worker.name}: {line[len('warning: ') :]}", file=sys.stderr)


class _Progress:
    """The job's progress from the chief's files: a step counter on a terminal, and each epoch's
    line as the chief records it in its run.json."""

    def __init__(self, chief_dir: Path, epochs: int, console: Console):
        self.chief_dir, self.epochs, self.console = chief_dir, epochs, console
        self.offset = 0
        self.newlines = 0
        self.rows = 0
        self.epochs_shown = 0
        self.last_epoch_seen = 0
        self.test_shown = False
        self.steps_per_epoch: int | None = None
        self.meta_mtime: int | None = None
        self.line_open = False
        self.last_line: float | None = None  # when a progress line was last printed (not on a terminal)

    def update(self) -> None:
        if self.console.quiet:
            return
        self._read_meta()
        if self.last_line is None:
            self.last_line = self.console.clock()
        self._read_steps()
        if not (self.rows and self.steps_per_epoch):
            return
        epoch = min(self.rows // self.steps_per_epoch + 1, self.epochs)
        done = self.rows - (epoch - 1) * self.steps_per_epoch
        if self.console.interactive:
            print(
                f"\rEpoch {epoch}/{self.epochs} - step {done}/{self.steps_per_epoch}",
                end="",
                file=self.console.stream,
                flush=True,
            )
            self.line_open = True
            return
        # Not a terminal (a scheduler's log, `| tee`): a line now and then, not one per poll.
        now = self.console.clock()
        if now - self.last_line >= self.console.progress_every_s and done < self.steps_per_epoch:
            self.last_line = now
            self.console.print(f"Epoch {epoch}/{self.epochs} - step {done}/{self.steps_per_epoch}")

    def finish(self) -> None:
        if self.console.quiet:
            return
        self._read_meta(force=True)
        self._end_line()

    def _end_line(self) -> None:
        if self.line_open:
            print("\r\033[K", end="", file=self.console.stream, flush=True)
            self.line_open = False

    def _read_steps(self) -> None:
        try:
            with open(self.chief_dir / run_files.STEPS_CSV, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        self.newlines += data.count(b"\n")
        self.rows = max(0, self.newlines - 1)  # less the header

    def _read_meta(self, force: bool = False) -> None:
        from models.training import EpochResult

        path = self.chief_dir / run_files.RUN_JSON
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            return
        if mtime == self.meta_mtime and not force:
            return
        self.meta_mtime = mtime
        try:
            meta = run_files.read_run_json(path)
        except run_files.RunFileError:
            return
        self.steps_per_epoch = meta.get("steps_per_epoch") or self.steps_per_epoch
        epochs = meta.get("epochs") or []
        fields = set(EpochResult.__dataclass_fields__) - {"extra"}
        while self.epochs_shown < len(epochs):
            record = epochs[self.epochs_shown]
            self.epochs_shown += 1
            self._end_line()
            try:
                result = EpochResult(**{k: v for k, v in record.items() if k in fields})
                self.console.print(f"Epoch {result.epoch}/{self.epochs}")
                self.console.epoch_end(result)
                self.last_line = self.console.clock()
            except (TypeError, ValueError):
                continue
        test = meta.get("test")
        if test and not self.test_shown:
            self.test_shown = True
            self._end_line()
            self.console.print(f"test_loss: {test['loss']:.4f} - test_accuracy: {test['accuracy']:.4f}")


def _read_worker(job_dir: Path, worker: Worker) -> dict | None:
    try:
        return run_files.read_run_json(job_dir / worker.name / run_files.RUN_JSON)
    except run_files.RunFileError:
        return None


def _log_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []


def _last_error_line(path: Path) -> str | None:
    for line in reversed(_log_lines(path)):
        if line.startswith("error: "):
            return line[len("error: ") :]
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _die_with_parent() -> None:
    """In the child, before it runs: on Linux, get SIGTERM when the launcher dies, so that no
    worker trains on alone after a launcher killed with SIGKILL."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort
        pass
