"""Background threads that run samplers on a fixed schedule and stream rows to CSV.

One daemon thread per sampler, so a slow reading (an NVML call stuck on a busy driver, a
TPU monitor call that blocks for its window) delays only its own CSV. Rows go straight to
the file and are flushed as written, so memory stays flat however long the run is and a
killed run loses at most the row being written.
"""

from __future__ import annotations

import _thread
import logging
import math
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from profiler.samplers.base import Sampler

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.5
MIN_INTERVAL_S = 0.05

RowCallback = Callable[[str, dict], None]


def validate_interval(interval_s: float) -> float:
    """The sampling interval as a float, or ValueError saying what is allowed."""
    try:
        value = float(interval_s)
    except (TypeError, ValueError):
        raise ValueError(f"sampling interval must be a number of seconds, got {interval_s!r}") from None
    if not math.isfinite(value):
        raise ValueError(
            f"sampling interval must be a finite number of seconds >= {MIN_INTERVAL_S}, got {interval_s!r}"
        )
    if value < MIN_INTERVAL_S:
        raise ValueError(
            f"sampling interval must be at least {MIN_INTERVAL_S} s, got {interval_s!r}: "
            "shorter intervals cost more than they show"
        )
    return value


def format_value(value: float | None) -> str:
    """A CSV cell: empty for NaN, exact for whole numbers (bytes), 10 digits otherwise."""
    if value is None:
        return ""
    value = float(value)
    if math.isnan(value):
        return ""
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return format(value, ".10g")


class SamplerThread:
    """Run one sampler every `interval_s` seconds and append its rows to `csv_path`.

    The CSV header is ``time_s`` (Unix time, the clock of steps.csv `start_time_s`) and
    then the sampler's columns. Ticks are scheduled at ``start + k * interval_s`` on
    `time.monotonic`, so the rate does not drift with the time a sample takes; ticks missed
    because a sample was slow are skipped, not caught up. An exception from the sampler is
    recorded in `error` and ends only this thread; so does a CSV that cannot be written, also
    recorded in `write_error` for the run to fail on. `on_row(name, row)` is called after each
    row; if it raises it is recorded and not called again, and sampling goes on.
    """

    def __init__(
        self,
        sampler: Sampler,
        csv_path: str | Path,
        interval_s: float = DEFAULT_INTERVAL_S,
        on_row: RowCallback | None = None,
    ) -> None:
        self.sampler = sampler
        self.csv_path = Path(csv_path)
        self.interval_s = validate_interval(interval_s)
        self.on_row = on_row
        self.rows_written = 0
        self.ticks_skipped = 0
        self.error: str | None = None
        self.write_error: str | None = None  # the CSV could not be written (the run must fail)
        self.callback_error: str | None = None
        self.cpu_s = 0.0  # CPU time of this thread: what sampling costs the machine
        self._stop_event = threading.Event()
        # Held until stop: waiting on it is one C call, where Event.wait runs threading.py's
        # Python code at every tick (a third of a sample's own CPU time at 10 Hz).
        self._wake = _thread.allocate_lock()
        self._wake.acquire()
        self._thread = threading.Thread(target=self._run, name=f"devprof-sampler-{sampler.name}", daemon=True)

    @property
    def name(self) -> str:
        return self.sampler.name

    def start(self) -> "SamplerThread":
        self._thread.start()
        return self

    def _signal_stop(self) -> None:
        self._stop_event.set()
        try:
            self._wake.release()
        except RuntimeError:  # released already
            pass

    def _wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True once stop was asked for."""
        if self._wake.acquire(True, max(0.0, seconds)):
            self._wake.release()  # stays released: every later wait returns at once
            return True
        return self._stop_event.is_set()

    def stop(self, timeout_s: float | None = 5.0) -> None:
        """Ask the thread to finish, wait for it (the file is closed by then), close the sampler."""
        self._signal_stop()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("sampler %s did not stop within %s s", self.name, timeout_s)
                return
        self.sampler.close()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def status(self) -> dict:
        """The sampler's own status plus what this thread did, for run.json."""
        status = self.sampler.status()
        status.update(
            # Relative to the run directory, like every other path in run.json: the run can be moved.
            csv=f"{self.csv_path.parent.name}/{self.csv_path.name}",
            ran=self.rows_written > 0,
            rows=self.rows_written,
            interval_s=self.interval_s,
            ticks_skipped=self.ticks_skipped,
            cpu_s=self.cpu_s,
            error=self.error,
            write_error=self.write_error,
            callback_error=self.callback_error,
        )
        return status

    def _run(self) -> None:
        try:
            self.csv_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.csv_path, "w", encoding="utf-8", newline="")
        except OSError as exc:
            self._fail("cannot write", exc, write=True)
            return
        try:
            with out:
                self._loop(out)
        except OSError as exc:  # a full disk or a lost mount: this CSV ends here, and the run is told
            if self.write_error is None:
                self._fail(f"cannot write {self.csv_path}", exc, write=True)

    def _loop(self, out) -> None:
        columns = list(self.sampler.columns)
        out.write(",".join(["time_s", *columns]) + "\n")
        out.flush()
        try:
            self.sampler.prime()
        except Exception as exc:
            self._fail("prime failed", exc)
            return
        # Rates and CPU % measure the time since the previous reading: a first sample
        # right after priming would cover almost no time and read as 0.
        if self._wait(self.interval_s):
            return
        start = time.monotonic()
        tick = 0
        while not self._stop_event.is_set():
            now_s = time.time()
            try:
                values = self.sampler.sample()
            except Exception as exc:
                self._fail("sample failed", exc)
                return
            cells = [format(now_s, ".6f")] + [format_value(values.get(c)) for c in columns]
            out.write(",".join(cells) + "\n")
            out.flush()
            self.rows_written += 1
            if self.on_row is not None:
                self._call_on_row(now_s, values)
            self.cpu_s = time.thread_time()
            if not self.sampler.active:
                return
            tick += 1
            now = time.monotonic()
            due = start + tick * self.interval_s
            if due <= now:
                late_ticks = math.floor((now - start) / self.interval_s) + 1
                self.ticks_skipped += late_ticks - tick
                tick = late_ticks
                due = start + tick * self.interval_s
            self._wait(due - now)

    def _call_on_row(self, now_s: float, values: dict) -> None:
        on_row = self.on_row
        if on_row is None:
            return
        try:
            on_row(self.name, {"time_s": now_s, **values})
        except Exception as exc:
            self.callback_error = f"{type(exc).__name__}: {exc}"
            self.on_row = None
            log.warning("sampler %s: on_row callback failed and was dropped: %s", self.name, self.callback_error)

    def _fail(self, what: str, exc: BaseException, write: bool = False) -> None:
        self.error = f"{what}: {type(exc).__name__}: {exc}"
        if write:
            self.write_error = self.error  # the run's record is incomplete: its owner fails the run
            return
        log.warning("sampler %s stopped: %s", self.name, self.error)


class SamplerGroup:
    """The samplers of one run: one thread and one `<out_dir>/<name>.csv` each.

    `unavailable` maps a sampler kind (``"gpu"``, ``"tpu"``) to the reason it is absent, so
    run.json can say why a CSV is missing. Usable as a context manager.
    """

    def __init__(
        self,
        samplers: Iterable[Sampler],
        out_dir: str | Path,
        interval_s: float = DEFAULT_INTERVAL_S,
        on_row: RowCallback | None = None,
        unavailable: dict[str, str] | None = None,
    ) -> None:
        self.interval_s = validate_interval(interval_s)
        self.out_dir = Path(out_dir)
        self.unavailable = dict(unavailable or {})
        self.threads = [SamplerThread(s, self.out_dir / f"{s.name}.csv", self.interval_s, on_row) for s in samplers]
        names = [t.name for t in self.threads]
        if len(set(names)) != len(names):
            raise ValueError(f"sampler names must be unique (they name the CSV files), got {names}")

    @property
    def csv_paths(self) -> dict[str, Path]:
        return {t.name: t.csv_path for t in self.threads}

    def start(self) -> "SamplerGroup":
        for thread in self.threads:
            thread.start()
        return self

    def stop(self, timeout_s: float | None = 5.0) -> None:
        for thread in self.threads:
            thread._signal_stop()
        for thread in self.threads:
            thread.stop(timeout_s)

    def write_errors(self) -> list[str]:
        """Why a sampler's CSV could not be written, for each that could not."""
        return [t.write_error for t in self.threads if t.write_error]

    def status(self) -> dict[str, dict]:
        """Per sampler: CSV, whether it ran, rows, disabled metrics and reasons; plus the absent kinds."""
        status = {t.name: t.status() for t in self.threads}
        for kind, reason in self.unavailable.items():
            status.setdefault(kind, {"name": kind, "ran": False, "reason": reason, "csv": None})
        return status

    def summaries(self, epochs: list[tuple] | None = None) -> dict[str, dict]:
        """`analysis.read.samples.summarize` of every CSV written (read back from disk, so call after `stop`)."""
        from analysis.read.run_csvs import read_sampler_csv
        from analysis.read.samples import summarize

        result = {}
        for thread in self.threads:
            if thread.csv_path.exists():
                result[thread.name] = summarize(read_sampler_csv(thread.csv_path), epochs)
        return result

    def __enter__(self) -> "SamplerGroup":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def build_samplers(
    device_kind: str = "cpu",
    tpu_service_addr: str | None = None,
    nvml=None,
    sample_gpus: bool = True,
) -> tuple[list[Sampler], dict[str, str]]:
    """The samplers for a run on `device_kind` (``cpu|gpu|tpu``) and why any are missing.

    The host is always sampled. GPUs are sampled whenever NVML finds some (a CPU run on a
    GPU machine then shows the GPU idle); the TPU only on a TPU run. Never raises.
    """
    from profiler.samplers.gpu import discover_gpu_samplers
    from profiler.samplers.host import HostSampler
    from profiler.samplers.tpu import discover_tpu_sampler

    samplers: list[Sampler] = []
    unavailable: dict[str, str] = {}
    try:
        samplers.append(HostSampler())
    except Exception as exc:
        unavailable["host"] = f"host sampling unavailable: {type(exc).__name__}: {exc}"
    if sample_gpus:
        gpus, reason = discover_gpu_samplers(nvml=nvml)
        samplers.extend(gpus)
        if reason:
            unavailable["gpu"] = reason
    if device_kind == "tpu":
        tpus, reason = discover_tpu_sampler(tpu_service_addr)
        samplers.extend(tpus)
        if reason:
            unavailable["tpu"] = reason
    return samplers, unavailable


def build_sampler_group(
    out_dir: str | Path,
    device_kind: str = "cpu",
    interval_s: float = DEFAULT_INTERVAL_S,
    on_row: RowCallback | None = None,
    tpu_service_addr: str | None = None,
    nvml=None,
) -> SamplerGroup:
    """`build_samplers` wrapped in a not-yet-started `SamplerGroup` writing to `out_dir`.

    Raises ValueError only for a bad `interval_s`, before any sampler is created.
    """
    validate_interval(interval_s)
    samplers, unavailable = build_samplers(device_kind, tpu_service_addr, nvml)
    return SamplerGroup(samplers, out_dir, interval_s, on_row, unavailable)
