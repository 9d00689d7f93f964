"""A small adapter over `tf.profiler.experimental`: the profiled window, step markers, the
on-demand profiler server and capture. A profiler failure is a warning, never fatal to training."""

from __future__ import annotations

import errno
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

DEFAULT_WARMUP_STEPS = 5
DEFAULT_WINDOW_STEPS = 10
# A verdict needs 3 steady calls (analysis.rules.table.MIN_STEADY_STEPS); two spare for a call cut
# by the window's end or traced again.
MIN_WINDOW_CALLS = 5
VIEWER_EVENT_LIMIT = 1_000_000  # XProf's trace viewer shows at most this many events per device
# Events one traced training step of the seed CNN (batch 100) adds, per tracer. Measured with
# TF 2.21 on 2-core CPUs: host tracer (level 2) about 500 per step on one device, where Adam is
# one fused op per variable (1,000-2,600 with Keras's ~430 Adam ops, as several replicas still
# run), not counting the thread-pool regions some builds add (`threadpool_events`); Python tracer
# about 2,050 more per step (remote capture, python_tracer_level=1; includes the synthetic data
# generator's Python). Device (GPU/TPU): not measured here (no accelerator); a guess. Event
# counts grow with the model's op count, not batch.
EVENTS_PER_STEP = {"host": 700, "python": 2_000, "device": 1_500}


@dataclass
class TracerOptions:
    host_tracer_level: int = 2
    device_tracer_level: int = 1
    python_tracer_level: int = 0

    LEVELS = {"host_tracer_level": (0, 1, 2, 3), "device_tracer_level": (0, 1), "python_tracer_level": (0, 1)}

    def problem(self) -> str | None:
        """Why TensorFlow's profiler would not take these levels (it ignores what it does not know), or None."""
        for name, allowed in self.LEVELS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or value not in allowed:
                return f"{name} must be one of {', '.join(map(str, allowed))} (got {value!r})"
        return None


def parse_window(text: str) -> tuple[int, int]:
    """`START:STOP` in global steps, STOP exclusive."""
    if not isinstance(text, str):
        raise ValueError(f"--profile-steps wants START:STOP (e.g. 5:15), got {type(text).__name__} {text!r}")
    try:
        start_text, stop_text = text.split(":")
        start, stop = int(start_text), int(stop_text)
    except ValueError:
        raise ValueError(f"--profile-steps wants START:STOP (e.g. 5:15), got {text!r}") from None
    if start < 0 or stop <= start:
        raise ValueError(f"--profile-steps {text}: need 0 <= START < STOP")
    return start, stop


def window_calls(steps_per_call: int = 1) -> int:
    """Calls the default window traces: ten steps' worth, and never fewer than `MIN_WINDOW_CALLS`,
    so that a run of several steps per call still has the steady calls a verdict needs."""
    return max(MIN_WINDOW_CALLS, -(-DEFAULT_WINDOW_STEPS // max(1, steps_per_call)))


def default_window(steps_per_epoch: int, steps_per_call: int = 1, total_steps: int | None = None) -> tuple[int, int]:
    """The default window, in whole calls: `window_calls` calls after warm-up (five steps, fewer in a
    short first epoch), clipped to the run. When one call runs several steps, the window starts at
    the second call: the first one compiles, and a window inside it would trace nothing else.
    A call never crosses an epoch: an epoch ends with a shorter call where N does not divide it."""
    total = total_steps or steps_per_epoch
    per_call = max(1, min(steps_per_call, steps_per_epoch))
    if per_call > 1 and per_call < total:
        wanted = 2 + window_calls(per_call)
        starts: list[int] = []
        for epoch_start in range(0, total, max(1, steps_per_epoch)):
            starts += range(epoch_start, min(epoch_start + steps_per_epoch, total), per_call)
            if len(starts) >= wanted:
                break
        return starts[1], starts[wanted - 1] if len(starts) >= wanted else total
    warmup = min(DEFAULT_WARMUP_STEPS, max(steps_per_epoch // 4, 1 if steps_per_epoch > 1 else 0))
    return warmup, min(warmup + window_calls(1), steps_per_epoch)


def compile_only_window(start: int, stop: int, steps_per_call: int = 1, option: str = "--profile-steps") -> str | None:
    """Why a window that traces nothing but the first call misleads, or None. The first call
    traces and compiles the training function, so its time is no steady step's, and the
    analysis would have only it to average."""
    if start >= steps_per_call or stop > steps_per_call:
        return None
    first = "step 0" if steps_per_call == 1 else f"the first call (steps 0-{steps_per_call - 1})"
    suggested = f"{steps_per_call}:{steps_per_call * (1 + window_calls(steps_per_call))}"
    example = f"{option} {suggested}" if option.startswith("--") else f'{option}="{suggested}"'
    return (
        f"profile window {start}:{stop} traces only {first}, which traces and compiles the training "
        f"function: its time is not a steady step's; trace the steps after it (e.g. {example})"
    )


def estimate_events(steps: int, options: TracerOptions, device_kind: str) -> int:
    per_step = EVENTS_PER_STEP["host"] if options.host_tracer_level else 0
    if options.python_tracer_level:
        per_step += EVENTS_PER_STEP["python"]
    if device_kind != "cpu" and options.device_tracer_level:
        per_step += EVENTS_PER_STEP["device"]
    return steps * per_step


@dataclass
class ProfileWindow:
    """Starts the profiler before the window's first call and stops it after its last one.

    Start happens at the end of the step before the window (whose marker began before the
    profiler ran, so it is not in the trace) and stop just after the window's last step is
    recorded: the traced steps are not stretched by the profiler's own start-up and flush.
    """

    logdir: Path
    start: int
    stop: int
    options: TracerOptions = field(default_factory=TracerOptions)
    warn: Callable[[str], object] = print
    steps_per_call: int = 1
    active: bool = False
    done: bool = False
    written: bool = False
    started_at_s: float = 0.0  # wall clock when the profiler started
    notes: dict = field(default_factory=dict)
    reached: int = 0  # steps training has run

    def maybe_start(self, next_step: int) -> None:
        # A call of several steps that reaches into the window starts it: the window is
        # widened to whole calls rather than skipped.
        self.reached = max(self.reached, next_step)
        if self.active or self.done or next_step + self.steps_per_call <= self.start:
            return
        if next_step >= self.stop:
            self.done = True
            self._warn(f"profile window {self.start}:{self.stop} was never reached (next step was {next_step})")
            return
        import tensorflow as tf

        began = time.perf_counter()
        try:
            tf.profiler.experimental.start(
                str(self.logdir),
                options=tf.profiler.experimental.ProfilerOptions(
                    host_tracer_level=self.options.host_tracer_level,
                    python_tracer_level=self.options.python_tracer_level,
                    device_tracer_level=self.options.device_tracer_level,
                ),
            )
        except Exception as exc:
            self.done = True
            self._warn(f"profiler did not start ({_reason(exc)}); training goes on without a trace")
            return
        self.active = True
        self.started_at_s = time.time()
        self.notes["start_ms"] = (time.perf_counter() - began) * 1e3
        self.notes["first_step"] = next_step

    def maybe_stop(self, next_step: int, force: bool = False) -> None:
        """Stop after the window's last call; `force` (end of training) stops a window cut short
        and records a window that never started."""
        if force and not self.active and not self.done:
            self.done = True
            # Training stopped before the window: it failed, was stopped, or had fewer steps.
            steps = f"{self.reached} step{'' if self.reached == 1 else 's'}"
            self._warn(
                f"profile window {self.start}:{self.stop} was never reached: training stopped after "
                f"{steps}; no trace was written"
            )
            return
        if not self.active or (next_step < self.stop and not force):
            return
        import tensorflow as tf

        self.active, self.done = False, True
        began = time.perf_counter()
        try:
            tf.profiler.experimental.stop()
        except Exception as exc:
            self._trace_failed(exc)
            return
        self.notes["stop_ms"] = (time.perf_counter() - began) * 1e3
        if next_step >= self.stop:
            self.notes["last_step"] = next_step - 1
        else:  # stopped early: training ended or failed inside the window
            self.notes["cut_short"] = True
        self.written = True

    def _trace_failed(self, exc: Exception) -> None:
        """The trace could not be written: a warning, never the run's failure; run.json says the
        trace is incomplete and why (`trace_error`).

        A part-written file is renamed `*.xplane.pb.partial`, so that readers of the run (which
        look for `*.xplane.pb`) do not trip over it. On a full disk it is deleted instead: no
        reader can use half a trace, and steps.csv and run.json need the space it took.
        """
        from profiler.record import rundir

        self.notes["trace_complete"] = False
        self.notes["trace_error"] = _reason(exc)
        if rundir.is_disk_full(exc):
            freed = self._remove_partial_trace()
            kept = f"; the part written ({freed:,} bytes) is deleted to leave the space to training" if freed else ""
        else:
            partial = self._set_aside_partial_trace()
            if partial:
                self.notes["partial_trace"] = partial
            kept = f"; the part written is kept as {partial}" if partial else ""
        self._warn(f"profiler failed to write its trace ({_reason(exc)}){kept}; training goes on without a trace")

    def _partial_traces(self):
        """This session's `*.xplane.pb` files (older sessions' traces are whole)."""
        for path in Path(self.logdir).glob("plugins/profile/*/*.xplane.pb"):
            try:
                if path.stat().st_mtime + 1.0 >= self.started_at_s:
                    yield path
            except OSError:
                continue

    def _set_aside_partial_trace(self) -> str | None:
        for path in self._partial_traces():
            try:
                target = path.with_name(path.name + ".partial")
                path.rename(target)
                return str(target.relative_to(self.logdir))
            except OSError:
                continue
        return None

    def _remove_partial_trace(self) -> int:
        """Delete this session's part-written trace; the bytes freed."""
        freed = 0
        for path in list(self._partial_traces()):
            try:
                size = path.stat().st_size
                path.unlink()
                freed += size
            except OSError:
                continue
        return freed

    def describe(self) -> None:
        """Record the trace's path, size and event count. Reading the trace takes tens of
        milliseconds, so the run calls this after training, not between steps."""
        if not self.written or "trace" in self.notes:
            return
        facts = describe_trace(self.logdir)
        self.notes.update(facts)
        self.notes["trace_complete"] = facts.get("trace") is not None and "trace_events_error" not in facts
        if facts.get("trace") is None:
            self._warn(f"the profiler stopped but no trace was found under {self.logdir}/plugins/profile")
        elif "trace_events_error" in facts:
            self._warn(f"the trace {facts['trace']} cannot be read ({facts['trace_events_error']}); it is incomplete")
        elif self.options.python_tracer_level and facts.get("python_events") == 0:
            # TensorFlow 2.16-2.21 drop the options of an in-process session ("... expects an i
            # value" in its log): the Python tracer stays off. A remote capture honours them.
            self._warn(
                "the Python tracer was requested but the trace has no Python events (this TensorFlow "
                "ignores tracer options in-process); for Python events run with --profiler-port PORT "
                "and use 'devprof capture grpc://localhost:PORT --python-tracer'"
            )

    def _warn(self, message: str) -> None:
        self.notes.setdefault("warnings", []).append(message)
        self.warn(f"warning: {message}")


def _reason(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class StepMarker:
    """A step's `train` marker, opened when the step begins (before its batch is fetched).

    Only a step that completes is marked as one: on `close(completed=True)` (or leaving the
    `with` block normally) the marker gets `_r=1` (XProf's root of a step) and, for a call of
    several steps, `steps=N`. A step that did not run (the data ran out, the loop broke out,
    the call raised) cannot take its marker back, since TensorFlow records it when it ends: it
    ends with `steps=0` and no `_r`, so XProf groups no step by it and `devprof analyze`
    leaves it out, while its start still ends the step before it.
    """

    __slots__ = ("_trace", "_steps")

    def __init__(self, trace, steps: int):
        self._trace, self._steps = trace, steps

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        self.close(exc_type is None)
        return False

    def close(self, completed: bool = True, steps: int | None = None) -> None:
        """End the marker; `steps`: the training steps the call ran, when known only now."""
        trace, self._trace = self._trace, None
        if trace is None:
            return
        steps = steps or self._steps
        try:
            if completed:
                trace.set_metadata(**({"_r": 1, "steps": steps} if steps > 1 else {"_r": 1}))
            else:
                trace.set_metadata(steps=0)
            trace.__exit__(None, None, None)
        except Exception:  # noqa: BLE001 - markers are a nicety, never a reason to stop training
            pass


class _NoMarker:
    """The shared marker while no trace is recorded."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        return False

    def close(self, completed: bool = True, steps: int | None = None) -> None:
        pass


_NO_MARKER = _NoMarker()
_tracing_enabled = None  # TensorFlow's "is a trace being recorded" check, loaded on first use


def step_marker(step: int, steps: int = 1):
    """The marker XProf groups steps by: a `train` TraceMe with the global step number
    (`StepMarker`: `_r=1` and `steps` are added when the step completes).

    While no trace is recorded this is a shared no-op (a marker is made every step).
    """
    global _tracing_enabled
    try:
        if _tracing_enabled is None:
            from tensorflow.python.profiler import trace

            _tracing_enabled = trace.enabled
        if not _tracing_enabled():
            return _NO_MARKER
        import tensorflow as tf

        return StepMarker(tf.profiler.experimental.Trace("train", step_num=step), steps)
    except Exception:  # noqa: BLE001 - markers are a nicety, never a reason to stop training
        return _NO_MARKER


def newest_xplane(logdir: Path) -> Path | None:
    found = sorted(Path(logdir).glob("plugins/profile/*/*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def describe_trace(logdir: Path) -> dict:
    """Path, size and event count of the newest trace, for run.json."""
    path = newest_xplane(logdir)
    if path is None:
        return {"trace": None}
    facts = {"trace": str(path.relative_to(logdir)), "trace_bytes": path.stat().st_size}
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2

        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        facts["trace_events"] = sum(len(line.events) for plane in space.planes for line in plane.lines)
        # The Python tracer names its events "$file:line function" / "$module function".
        python_events = 0
        for plane in space.planes:
            ids = {key for key, meta in plane.event_metadata.items() if meta.name.startswith("$")}
            if ids:
                python_events += sum(event.metadata_id in ids for line in plane.lines for event in line.events)
        facts["python_events"] = python_events
        # Some TensorFlow builds record every region of the Eigen thread pools too (about 20,000 per
        # step of the seed CNN on a 2-core CPU, against 2,500 for everything else): counted apart,
        # because whether they appear depends on the build and the CPU, not on the window.
        facts["threadpool_events"] = _count_named(space, "ThreadpoolListener::")
    except Exception as exc:  # noqa: BLE001
        facts["trace_events_error"] = _reason(exc)
    return facts


def _count_named(space, prefix: str) -> int:
    count = 0
    for plane in space.planes:
        ids = {key for key, meta in plane.event_metadata.items() if meta.name.startswith(prefix)}
        if ids:
            count += sum(event.metadata_id in ids for line in plane.lines for event in line.events)
    return count


def check_port_free(port: int) -> None:
    """Raise OSError unless a server can listen on `port` on every interface, as TensorFlow's
    profiler server does. TensorFlow only logs a failure to bind, so this is asked first."""
    import socket

    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this machine
        with sock:
            # A port that only has connections waiting out TIME_WAIT is free for gRPC, which
            # sets SO_REUSEADDR too; a port something listens on is not.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                try:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                except OSError:
                    pass
            try:
                sock.bind((host, port))
            except OSError as exc:
                if family == socket.AF_INET6 and exc.errno == errno.EADDRNOTAVAIL:
                    continue  # IPv6 present but without an address to bind
                raise


def start_server(port: int) -> None:
    """TensorFlow's profiler gRPC server (it listens on every interface; TensorFlow has no option)."""
    import tensorflow as tf

    tf.profiler.experimental.server.start(port)


# A name or IPv4 address, or an IPv6 one in brackets (gRPC reads "::1:9012" some other way).
_HOST = re.compile(r"^(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?\])$")


def parse_service_addresses(text: str) -> list[str]:
    """`grpc://HOST:PORT[,grpc://HOST:PORT...]` -> ["grpc://HOST:PORT", ...]; raises ValueError."""
    parts = [part.strip() for part in text.split(",")]
    for part in parts:
        host, sep, port = part.removeprefix("grpc://").rpartition(":")
        if not part.startswith("grpc://") or not sep or not _HOST.match(host) or not port.isdigit():
            raise ValueError(
                f"capture wants grpc://HOST:PORT (several: grpc://HOST1:PORT1,grpc://HOST2:PORT2), got {part!r}"
                if part
                else f"capture wants grpc://HOST:PORT, got {text!r}"
            )
        if not 1 <= int(port) <= 65535:
            raise ValueError(f"capture: port {port} of {part!r} is not a port number (1 to 65535)")
    if len(set(parts)) != len(parts):
        raise ValueError(f"capture: {text!r} names a worker twice")
    return parts


def capture(
    service_addr: str,
    logdir: str,
    duration_ms: int,
    host_tracer_level: int = 2,
    device_tracer_level: int = 1,
    python_tracer_level: int = 0,
    attempts: int = 3,
) -> None:
    """Trace a job's profiler server for `duration_ms`; the trace lands in `logdir/plugins/profile/`.

    Uses XProf's capture client: it sends the tracer levels typed, as the server expects them
    (`tf.profiler.experimental.client.trace` in TensorFlow 2.21 sends them in a form the server
    ignores, so `--python-tracer` had no effect), it fails at once when nothing listens, and it
    does not import TensorFlow. Falls back to TensorFlow's client when XProf is missing.
    """
    # Several workers: one comma-separated list, without the scheme (the client takes HOST:PORT,...).
    address = ",".join(part.strip().removeprefix("grpc://") for part in service_addr.split(","))
    options = {
        "host_tracer_level": host_tracer_level,
        "device_tracer_level": device_tracer_level,
        "python_tracer_level": python_tracer_level,
    }
    try:
        from xprof.convert import _pywrap_profiler_plugin as xprof_client
    except ImportError:
        xprof_client = None
    from profiler.device import quiet

    if xprof_client is not None:

        def call():
            xprof_client.trace(address, str(logdir), "", True, int(duration_ms), int(attempts), options)
    else:
        tf = quiet.import_tensorflow()

        def call():
            tf.profiler.experimental.client.trace(
                "grpc://" + address,
                str(logdir),
                duration_ms,
                num_tracing_attempts=attempts,
                options=tf.profiler.experimental.ProfilerOptions(**options),
            )

    if quiet.verbose():
        call()
        return
    # The client prints its progress ("Remaining attempt(s)") on stdout and gRPC's failures
    # (with source locations) on stderr: keep both for a one-line reason if it fails.
    error = None
    with quiet.native_output((1, 2)) as captured:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - reported below with what the client logged
            error = exc
    if error is not None:
        logged = quiet.one_line_reason("".join(captured))
        raise CaptureError(logged or _reason(error).split(": ", 1)[-1]) from error


class CaptureError(Exception):
    """A capture failed; the message is the client's reason, one line."""
