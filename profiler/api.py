"""`profiler.profile()`: devprof's recording around any TensorFlow training loop.

    with profiler.profile("runs", run_name="my-job", profile_steps="10:20") as session:
        for epoch in range(epochs):
            with session.epoch():
                for x, y in session.iterate(dataset):      # times the wait for each batch
                    with session.step():                   # a step marker; times the call
                        loss = train_step(x, y)
                session.log(loss=float(loss))

It writes the run directory `devprof run` writes, through the same session layer
(`profiler.record.session`). TensorFlow is imported when the session starts, not before.
"""

from __future__ import annotations

import contextlib
import math
import operator
import os
import re
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from models.training import EpochResult, StepRecord
from profiler import samplers
from profiler.device import cluster as cluster_mod
from profiler.record import rundir, tracing
from profiler.record.console import Console
from profiler.record.session import Session, Terminated
from profiler.train.config import check_run_name


@dataclass
class ProfileOptions:
    """What `profile()` was asked for (run.json `config` holds these and the user's own `config`)."""

    out: str = "runs"
    run_name: str | None = None
    profile: bool = True
    profile_steps: str | None = None
    tracer: tracing.TracerOptions = field(default_factory=tracing.TracerOptions)
    profiler_port: int | None = None
    sample: bool = True
    sample_interval: float | None = None  # None: the samplers' default
    scalars_every: int = 100  # TensorBoard writes cost about a millisecond: not every 10 ms step
    quiet: bool = False
    cluster: cluster_mod.Cluster | None = None
    user_config: dict = field(default_factory=dict)

    def check(self) -> None:
        """Raise ValueError naming the first option that cannot work."""
        if self.run_name is not None:
            if not isinstance(self.run_name, str):
                raise TypeError(f"run_name must be a string (got {type(self.run_name).__name__} {self.run_name!r})")
            problem = check_run_name(self.run_name)
            if problem:
                raise ValueError(in_api_terms(problem))
        if self.profile and self.profile_steps is not None:
            try:
                tracing.parse_window(self.profile_steps)
            except ValueError as exc:
                raise ValueError(in_api_terms(str(exc))) from None
        if self.profile and self.tracer.problem():
            raise ValueError(self.tracer.problem())
        if not self.sample and self.sample_interval is not None:
            # one rule with `devprof run --no-sample --sample-interval`: an interval for no sampler is a mistake
            raise ValueError(
                f"sample_interval={self.sample_interval!r} sets how often the samplers sample and "
                "sample=False runs none: leave one of them out"
            )
        if self.sample:
            interval = self.sample_interval if self.sample_interval is not None else samplers.DEFAULT_INTERVAL_S
            if isinstance(interval, bool) or not isinstance(interval, (int, float)):
                # float('1') would take a string; the CLI parses text, the API takes numbers, as its other options
                raise TypeError(
                    f"sample_interval must be a number of seconds (got {type(interval).__name__} {interval!r})"
                )
            try:
                samplers.validate_interval(interval)
            except ValueError as exc:
                raise ValueError(f"sample_interval: {exc}") from None
        if isinstance(self.scalars_every, bool) or not isinstance(self.scalars_every, int) or self.scalars_every < 1:
            raise ValueError(f"scalars_every must be a whole number >= 1 (got {self.scalars_every!r})")
        port = self.profiler_port
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535):
            raise ValueError(f"profiler_port must be a port number from 1 to 65535 (got {port!r})")
        if self.cluster is not None and self.run_name is None:
            raise ValueError(
                "run_name is required in a multi-worker job (TF_CONFIG is set): every worker "
                "writes its worker-<i>/ folder into the same <out>/<run_name>/ job folder"
            )


# The command line's option names in messages shared with `devprof run`, and profile()'s own.
_API_NAMES = {
    "--run-name": "run_name",
    "--out": "out",
    "--profile-steps": "profile_steps",
    "--profiler-port": "profiler_port",
    "--sample-interval": "sample_interval",
}
_CLI_OPTION = re.compile("|".join(re.escape(option) + r"\b" for option in _API_NAMES))


def in_api_terms(message: str) -> str:
    """A message written for `devprof run`, naming profile()'s arguments instead of its options."""
    return _CLI_OPTION.sub(lambda found: _API_NAMES[found.group(0)], message)


def profile(
    out: str | Path = "runs",
    run_name: str | None = None,
    *,
    profile_steps: str | None = None,
    profile: bool = True,
    sample: bool = True,
    sample_interval: float | None = None,
    profiler_port: int | None = None,
    host_tracer_level: int = 2,
    device_tracer_level: int = 1,
    python_tracer_level: int = 0,
    scalars_every: int = 100,
    config: dict | None = None,
    quiet: bool = False,
) -> "ProfileSession":
    """A recording session for any training loop; use it as a context manager.

    `out`: the folder runs go into; `run_name`: the run's folder (default
    `<time>-<device>-<host>`; never overwritten). `profile_steps="START:STOP"`: the global
    steps to trace (default: 5:15), `profile=False` for no trace. `sample_interval` seconds
    between utilization samples (default 0.5), `sample=False` for none. `profiler_port`: a profiler server
    for `devprof capture`. `config`: anything worth keeping in run.json's `config`.
    """
    if isinstance(out, bytes) or not isinstance(out, (str, os.PathLike)):  # str(None) would make a folder 'None'
        raise TypeError(f"out must be a folder path, a str or os.PathLike (got {type(out).__name__} {out!r})")
    options = ProfileOptions(
        out=str(out),
        run_name=run_name,
        profile=profile,
        profile_steps=profile_steps,
        tracer=tracing.TracerOptions(
            host_tracer_level=host_tracer_level,
            device_tracer_level=device_tracer_level,
            python_tracer_level=python_tracer_level,
        ),
        profiler_port=profiler_port,
        sample=sample,
        sample_interval=sample_interval,
        scalars_every=scalars_every,
        quiet=quiet,
        user_config=_user_config(config),
    )
    return ProfileSession(options)


def _user_config(config) -> dict:
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict of values to keep in run.json (got {type(config).__name__})")
    return dict(config)


class ProfileSession(Session):
    """A run directory recorded around the user's own loop: `iterate`, `step`, `epoch`, `log`."""

    _window_option = "profile_steps"

    def __init__(self, options: ProfileOptions, console: Console | None = None):
        super().__init__(options, console or Console(options.quiet))
        self.global_step = 0
        self._exits = contextlib.ExitStack()
        self._entered = False
        self._ended = False
        self._to_wall = time.time() - time.perf_counter()
        # The step being run: when it began (the loop asked for its batch), its input wait.
        self._boundary: float | None = None
        self._fetch_start = self._fetched = 0.0
        self._batch = None  # the batch iterate() gave for the open step
        self._marker = None
        self._marker_steps = 1
        self._in_call = False  # inside `with session.step():`
        # The last finished step, written when the next one begins (its host time is known then).
        self._pending: StepRecord | None = None
        self._pending_end = 0.0
        # Epochs: the open one, and the run's own figures.
        self._epoch_number = 0
        self._epoch_open = False
        self._epoch_start = 0.0
        self._epoch_values: dict = {}
        self._run_values: dict = {}
        self._span = _Span()  # steps of the open epoch (or of the whole run without epochs)
        self._run_span = _Span()
        self._device_kind = "cpu"
        self._next_scalars = 0  # the step from which log() writes TensorBoard scalars again

    # ------------------------------------------------------------ the with block

    def __enter__(self) -> "ProfileSession":
        if self._entered:
            raise RuntimeError("a profile() session is used once; call profiler.profile() again for a new run")
        _claim_process(self)
        self._entered = True
        try:
            return self._start()
        except BaseException:
            _release_process(self)
            raise

    def _start(self) -> "ProfileSession":
        cfg = self.config
        try:
            if cfg.cluster is None:
                try:
                    cfg.cluster = cluster_mod.resolve(None, None)
                except cluster_mod.ClusterError as exc:
                    raise ValueError(str(exc)) from None
            cfg.check()
            if cfg.sample_interval is None:
                cfg.sample_interval = samplers.DEFAULT_INTERVAL_S
            self._check_paths()
        except (ValueError, rundir.OutputError, rundir.RunExistsError) as exc:
            raise type(exc)(in_api_terms(str(exc))) from None
        import tensorflow as tf  # the caller trains with it anyway; `import profiler` stays light

        resolved = _resolve_device(tf, cfg.cluster)
        self._device_kind = resolved.kind
        if self.path is None:
            from profiler.device import devices

            if cfg.run_name:
                self.path = Path(cfg.out) / cfg.run_name
            else:
                self.default_name = rundir.default_run_name(resolved.kind, devices.host_name())
                self.path = rundir.free_run_dir(Path(cfg.out), self.default_name)
        self._open(self._initial_meta(resolved))
        try:
            self._exits.enter_context(self._sigterm_stops_the_run(only_if_default=True))
            self._save()
            self._start_job_record()
            self._start_recording(resolved)
            if cfg.profile:
                start, stop = (
                    tracing.parse_window(cfg.profile_steps)
                    if cfg.profile_steps
                    else (tracing.DEFAULT_WARMUP_STEPS, tracing.DEFAULT_WARMUP_STEPS + tracing.DEFAULT_WINDOW_STEPS)
                )
                self._open_window(start, stop, resolved.kind).maybe_start(0)
            self._save()
        except BaseException as exc:
            self._mark_ended(exc)
            self._finish()
            self._exits.close()
            raise
        self._to_wall = time.time() - time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        self._ended = True
        try:
            self._end_open_step()
            if exc is None:
                try:
                    self._end_run()
                    self._close(strict=True)
                    self.meta["status"] = "complete"
                except BaseException as closing:
                    self._mark_ended(closing)
                    raise
            else:
                self._end_run()
                self._mark_ended(exc)
        finally:
            try:
                self._finish()
            finally:
                self._exits.close()
                _release_process(self)
            said = f"devprof: run directory {self.path} ({self.meta.get('status')})"
            if isinstance(exc, Terminated):
                said = f"devprof: terminated (SIGTERM); run directory {self.path} ({self.meta.get('status')})"
                _end_quietly_if_uncaught(None if self.config.quiet else said, said.removeprefix("devprof: "))
            if not self.config.quiet:
                print(said, file=sys.stderr)
        return False  # the exception, if any, goes on: the program decides

    def _check_recording(self, what: str) -> None:
        """RuntimeError unless the with block is running: outside it nothing would be recorded."""
        if self._ended:
            raise RuntimeError(
                f"{what} after the profile() session ended (run directory {self.path}): "
                "nothing after its with block is recorded"
            )
        if not self._entered:
            raise RuntimeError(
                f"{what} outside the profile() session's with block: "
                "use it inside 'with profiler.profile(...) as session:'"
            )

    def _check_paths(self) -> None:
        cfg = self.config
        rundir.check_output_folder(Path(cfg.out))  # OutputError: a usage error, before anything is written
        self._check_destinations()
        if cfg.cluster is not None:
            self.path = self.job_dir / cfg.cluster.name
        if cfg.profiler_port is not None:
            try:
                tracing.check_port_free(cfg.profiler_port)
            except OSError as exc:
                raise ValueError(f"profiler_port {cfg.profiler_port} is not free ({exc.strerror or exc})") from None

    def _initial_meta(self, resolved) -> dict:
        from profiler.record.session import starting_meta

        cfg = self.config
        options = asdict(cfg)
        options.pop("cluster")
        user = options.pop("user_config")
        meta = starting_meta(resolved, {**user, **options}, cfg.profile, recorded_by="profile")
        if cfg.cluster is not None:
            meta["worker"] = self._worker_meta()
        return meta

    def current_step(self) -> int:
        return self.global_step

    # ------------------------------------------------------------ steps

    def iterate(self, dataset):
        """Yield the batches of `dataset`, timing how long the loop waits for each (steps.csv
        `input_ms`); the step's marker starts before the wait, so the trace holds it too."""
        self._check_recording("session.iterate()")
        iterator = iter(dataset)
        clock = time.perf_counter
        try:
            while True:
                began = clock()
                self._begin_step(began)
                try:
                    batch = next(iterator)
                except StopIteration:
                    self._abandon_step()  # training for this pass ended where this step began
                    return
                self._fetch_start, self._fetched = began, clock()
                self._batch = batch  # its size is read only if step() is not told `images`
                yield batch
        finally:
            if self._boundary is not None and self._fetched:
                self._abandon_step()  # the loop left without running the step for this batch

    def step(self, images: int | None = None, steps: int = 1) -> "_Step":
        """`with session.step(images=N, steps=S):` around one call of the training function:
        a step marker (inside the trace window), the call timed into steps.csv. `steps`: the
        training steps the call runs; `images`: the examples it trains on (default: the batch
        `iterate()` gave, when its size can be read)."""
        return _Step(self, images, steps)

    def _begin_step(self, now: float, steps: int | None = None) -> None:
        if self._boundary is not None and self._fetched:
            self._abandon_step()
        if self._pending is not None:
            self._flush_pending(now)
        self._boundary = now
        self._fetch_start = self._fetched = 0.0
        self._batch = None
        marker = self.step_scope(self.global_step, steps or self._marker_steps)
        marker.__enter__()
        self._marker = marker

    def _abandon_step(self) -> None:
        """A step that did not run (the data ended, the loop broke out, the call raised): its
        marker closes as no step's (`steps=0`) and its time goes to no step."""
        self._close_marker(completed=False)
        self._boundary = None
        self._fetch_start = self._fetched = 0.0

    def _close_marker(self, completed: bool = True, steps: int | None = None) -> None:
        marker, self._marker = self._marker, None
        if marker is not None:
            try:
                marker.close(completed, steps)
            except Exception:  # noqa: BLE001 - a marker never stops training
                pass

    def _step_ran(self, images: int | None, steps: int, call_start: float, done: float) -> None:
        boundary = self._boundary
        assert boundary is not None, "a step ran that never began"
        fetched = self._fetched or boundary
        fetch_start = self._fetch_start or boundary
        if images is None:
            images = _batch_size(self._batch) or 0 if self._batch is not None else 0
        record = StepRecord(
            epoch=max(self._epoch_number, 1),
            step=self.global_step,
            steps=steps,
            start_time_s=boundary + self._to_wall,
            input_ms=(fetched - fetch_start) * 1e3,
            call_ms=(done - call_start) * 1e3,
            other_host_ms=((fetch_start - boundary) + (call_start - fetched)) * 1e3,
            images=int(images),
        )
        self._close_marker(steps=steps)
        self._boundary = self._batch = None
        self._fetch_start = self._fetched = 0.0
        self._pending, self._pending_end = record, done
        self._marker_steps = steps
        self.global_step += steps
        for span in (self._span, self._run_span):
            span.add(record, boundary, done)
        self.step_done(self.global_step, steps)

    def _before_exit(self) -> None:
        self._end_open_step()

    def _flush_pending(self, now: float) -> None:
        """Write the last finished step, with the host time it had until `now`."""
        record, self._pending = self._pending, None
        if record is None:
            return
        record.other_host_ms += (now - self._pending_end) * 1e3
        if now > self._span.train_end:
            self._span.train_end = now
        if now > self._run_span.train_end:
            self._run_span.train_end = now
        self.record_step(record)

    def _end_open_step(self) -> None:
        """At an epoch's or the run's end: the step left open closes; the last finished one is
        written, ending where its call ended (or where the data ran out)."""
        if self._boundary is not None:
            self._abandon_step()
        if self._pending is not None:
            end = self._span.train_end if self._span.train_end > self._pending_end else self._pending_end
            self._flush_pending(end)

    # ------------------------------------------------------------ epochs and scalars

    @contextlib.contextmanager
    def epoch(self):
        """`with session.epoch():` around one epoch (its training and validation): run.json
        `epochs` gets its time, images and the last `loss`, `accuracy`, `val_loss`,
        `val_accuracy` (and other values) given to `log()` during it."""
        self.begin_epoch()
        try:
            yield self
        except BaseException:
            self._epoch_open = False  # an epoch that did not finish is not recorded
            raise
        self.end_epoch()

    def begin_epoch(self) -> None:
        self._check_recording("session.epoch()")
        if self._epoch_open:
            raise RuntimeError("session.epoch() is already open; epochs do not nest")
        self._end_open_step()
        self._epoch_number += 1
        self._epoch_open = True
        self._epoch_values = {}
        self._span = _Span()
        self._epoch_start = time.perf_counter()
        self._to_wall = time.time() - self._epoch_start  # re-anchored per epoch, as devprof run does

    def end_epoch(self, values: dict | None = None, extra: dict | None = None) -> None:
        """Record the open epoch: its time, its steps' images, the values logged during it
        (`values` added last)."""
        self._end_open_step()
        self._epoch_open = False
        end = time.perf_counter()
        self._epoch_values.update(values or {})
        self.record_epoch(
            self._epoch_result(self._epoch_number, self._epoch_start, end, self._span, self._epoch_values, extra)
        )

    def log(self, **values) -> None:
        """Scalars for TensorBoard (`step/<name>`, every `scalars_every` steps) and for the
        epoch's entry in run.json (the last value of each)."""
        self._check_recording("session.log()")
        numbers = {}
        for name, value in values.items():
            try:
                numbers[name] = float(value)
            except (TypeError, ValueError):
                raise TypeError(f"log({name}=...) wants a number, got {type(value).__name__}") from None
        self._epoch_values.update(numbers)
        self._run_values.update(numbers)
        if self.scalars is not None and self.global_step >= self._next_scalars:
            scalars, step = self.scalars, self.global_step
            self._write_scalars(lambda: scalars.step(step, **numbers))
            every = self.config.scalars_every
            self._next_scalars = (self.global_step // every + 1) * every

    def _epoch_result(
        self, number: int, start: float, end: float, span: "_Span", values: dict, extra: dict | None = None
    ) -> EpochResult:
        train_end = span.train_end if span.steps else start
        train_seconds = max(train_end - start, 0.0)
        known = ("loss", "accuracy", "val_loss", "val_accuracy")
        others = {k: v for k, v in values.items() if k not in known}
        result = EpochResult(
            epoch=number,
            seconds=max(end - start, 1e-9),
            train_seconds=train_seconds,
            images=span.images,
            images_per_second=span.images / train_seconds if train_seconds > 0 and span.images else math.nan,
            loss=values.get("loss", math.nan),
            accuracy=values.get("accuracy", math.nan),
            val_loss=values.get("val_loss", math.nan),
            val_accuracy=values.get("val_accuracy", math.nan),
            steps=span.steps,
            start_time_s=start + self._to_wall,
            extra=dict(extra or {}),
        )
        if others:
            result.extra["metrics"] = others
        if not span.images:  # no step said its images: unknown, not 0 images
            result.extra.update(images=None, epoch_images_per_second=None)
        return result

    def _end_run(self) -> None:
        """Without `epoch()`, the run is one epoch: its steps, from the first to the last."""
        self._end_open_step()
        span = self._run_span
        if self.meta.get("epochs") or not span.steps:
            return
        self.meta["epochs"].append(
            self._epoch_result(
                1, span.first_start, span.train_end, span, self._run_values, extra={"whole_run": True}
            ).as_dict()
        )


# TensorFlow's profiler and the step markers belong to the whole process: two sessions at once
# would put each other's steps in their traces, so one records at a time.
_recording: ProfileSession | None = None
_recording_lock = threading.Lock()


def _claim_process(session: ProfileSession) -> None:
    global _recording
    with _recording_lock:
        other = _recording
        if other is not None:
            where = f" into {other.path}" if other.path is not None else ""
            raise RuntimeError(
                f"another profile() session is recording{where} in this process; one session "
                "records at a time (TensorFlow's profiler and the step markers are the whole "
                "process's): end it before starting another"
            )
        _recording = session


def _release_process(session: ProfileSession) -> None:
    global _recording
    with _recording_lock:
        if _recording is session:
            _recording = None


_EXIT_TERMINATED = 143  # as a shell reports SIGTERM, and as `devprof run` exits on it
_terminated_line: list = []  # what an uncaught `Terminated` prints: [line] or [] when already said
_terminated_hook_installed = False


def _end_quietly_if_uncaught(already_said: str | None, line: str) -> None:
    """A `Terminated` that no code catches ends the program with exit code 143 and one line on
    stderr (`already_said`, or `line` if nothing was said), not a traceback and exit code 1. A
    program that catches it decides itself."""
    global _terminated_hook_installed
    _terminated_line[:] = [] if already_said is not None else [line]
    if _terminated_hook_installed:
        return
    _terminated_hook_installed = True
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not isinstance(value, Terminated):
            return previous(kind, value, tb)
        for text in _terminated_line:
            print(text, file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(_EXIT_TERMINATED)  # the run directory is finished; SIGTERM's default would not flush even this

    sys.excepthook = hook


class _Span:
    """The steps of an epoch: how many, their images, when the first began and the last ended."""

    __slots__ = ("steps", "images", "first_start", "train_end")

    def __init__(self):
        self.steps = self.images = 0
        self.first_start = self.train_end = 0.0

    def add(self, record: StepRecord, began: float, ended: float) -> None:
        if not self.steps:
            self.first_start = began
        self.steps += record.steps
        self.images += record.images
        self.train_end = max(self.train_end, ended)


def whole_number(value, name: str, minimum: int) -> int:
    """`value` as an int when it is a whole number >= `minimum` (an int, a NumPy integer, a scalar
    integer tensor, 32.0), else ValueError: 1.9 images are not 1, and -1 images are not a count."""
    if not isinstance(value, (bool, str, bytes)):
        number: int | None
        try:
            number = operator.index(value)
        except TypeError:
            try:
                number = int(value) if float(value).is_integer() else None
            except (TypeError, ValueError, OverflowError):
                number = None
        if number is not None and number >= minimum:
            return number
    raise ValueError(f"{name} must be a whole number >= {minimum} (got {value!r})")


class _Step:
    """The context manager `session.step()` returns (a class: cheaper than a generator)."""

    __slots__ = ("session", "images", "steps", "call_start")

    def __init__(self, session: ProfileSession, images: int | None, steps: int):
        steps = whole_number(steps, "steps", 1)
        if images is not None:
            images = whole_number(images, "images", 0)
        self.session, self.images, self.steps = session, images, steps

    def __enter__(self):
        session = self.session
        session._check_recording("session.step()")
        if session._in_call:
            raise RuntimeError("session.step() is already open; steps do not nest")
        if session._boundary is None or not session._fetched:
            # no iterate(): the step begins here, without input wait
            session._begin_step(time.perf_counter(), self.steps)
        session._in_call = True
        self.call_start = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        done = time.perf_counter()
        session = self.session
        session._in_call = False
        if exc_type is None:
            session._step_ran(self.images, self.steps, self.call_start, done)
        else:
            session._abandon_step()  # the call did not finish: not a completed step
        return False


def _batch_size(batch) -> int | None:
    """The leading dimension of a batch's first tensor, where it is known."""
    item = batch
    for _ in range(4):
        if isinstance(item, (tuple, list)) and item:
            item = item[0]
        elif isinstance(item, dict) and item:
            item = next(iter(item.values()))
        else:
            break
    shape = getattr(item, "shape", None)
    try:
        return int(shape[0]) if shape is not None and len(shape) and shape[0] is not None else None
    except (TypeError, ValueError):
        return None


def _resolve_device(tf, cluster):
    """The device the program trains on, as far as TensorFlow says (the program made its own
    strategy): run.json `device`."""
    from profiler.device import devices

    strategy = type(tf.distribute.get_strategy()).__name__ if tf.distribute.has_strategy() else None
    tpus = tf.config.list_logical_devices("TPU")
    gpus = tf.config.list_physical_devices("GPU")
    if tpus:
        kind, info = "tpu", {"name": "TPU", "count": len(tpus), "cores": len(tpus)}
    elif gpus:
        details = []
        for gpu in gpus:
            try:
                details.append(dict(tf.config.experimental.get_device_details(gpu)))
            except Exception:  # noqa: BLE001
                details.append({})
        kind = "gpu"
        info = {
            "name": details[0].get("device_name", "GPU"),
            "count": len(gpus),
            "gpus": [
                {"name": d.get("device_name"), "compute_capability": devices._cc(d.get("compute_capability"))}
                for d in details
            ],
        }
        info.update(devices._gpu_memory(len(gpus)))
    else:
        kind, info = "cpu", devices.cpu_info()
    info["strategy"] = strategy or ("MultiWorkerMirroredStrategy" if cluster is not None else "default")
    if cluster is not None:
        info["workers"] = cluster.num_workers
    return devices.Resolved(kind, None, info)


__all__ = ["ProfileSession", "Terminated", "profile"]
