"""Cloud TPU utilization through the TensorFlow profiler's on-demand monitor.

`tf.profiler.experimental.client.monitor(service_addr, duration_ms, level)` asks the
profiler server on the TPU worker for a short performance summary and returns it as text.
With level 2 the text looks like this (Cloud TPU documentation and tools that parse it)::

    Timestamp: 13:00:11
    TPU type: TPU v3
    Number of TPU cores: 1 (Replica count = 1, num cores per replica = 1)
    Per-core batch size: 32
    TPU idle time (lower is better): 17.9%
    Utilization of TPU Matrix Units (higher is better): 0.058%
    Step time: 70.6ms (avg), 70.6ms (min), 70.6ms (max)
    Infeed percentage: 0.000% (avg), 0.000% (min), 0.000% (max)

Level 1 has only the type and the matrix-unit line, and older releases wrote
"Utilization of TPU Matrix Units is (higher is better)". The parser therefore looks for
each line by its leading words and takes the first number followed by ``%`` or ``ms`` on
it, so wording changes inside the parentheses do not matter. The monitor call blocks for
`duration_ms`, and it fails while a profiler trace is being captured (one profiling
session at a time), so failures give NaN and only a run of consecutive failures turns it
off.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Callable

from analysis.read.run_files import TPU_COLUMNS
from profiler.samplers.base import NAN, Sampler

_MONITOR_COLUMNS = ("mxu_util_pct", "idle_pct", "step_time_ms", "infeed_pct")
_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
_PATTERNS = {
    "mxu_util_pct": re.compile(r"^\s*Utilization of TPU Matrix Units[^:]*:\s*" + _NUMBER + r"\s*%", re.I | re.M),
    "idle_pct": re.compile(r"^\s*TPU idle time[^:]*:\s*" + _NUMBER + r"\s*%", re.I | re.M),
    "step_time_ms": re.compile(r"^\s*Step time[^:]*:\s*" + _NUMBER + r"\s*ms", re.I | re.M),
    "infeed_pct": re.compile(r"^\s*Infeed percentage[^:]*:\s*" + _NUMBER + r"\s*%", re.I | re.M),
}


def parse_monitor_output(text: str) -> dict[str, float]:
    """The numbers in one monitor reply; a line that is absent gives NaN."""
    values = {}
    for column, pattern in _PATTERNS.items():
        match = pattern.search(text or "")
        values[column] = float(match.group(1)) if match else NAN
    return values


def tensorflow_monitor(service_addr: str, duration_ms: int, level: int) -> str:
    """TensorFlow's profiler client monitor, imported only when a TPU run asks for it."""
    import tensorflow as tf

    return tf.profiler.experimental.client.monitor(service_addr, duration_ms, level=level)


def tensorflow_tpu_devices() -> list[str]:
    """The TPU devices TensorFlow knows in this process (``["TPU:0", ...]``)."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return []
    return [f"TPU:{i}" for i, _ in enumerate(tf.config.list_logical_devices("TPU"))]


def tensorflow_memory_info(device: str) -> dict[str, int]:
    import tensorflow as tf

    return tf.config.experimental.get_memory_info(device)


class TpuSampler(Sampler):
    """TPU matrix-unit utilization, idle time, step time and infeed share, and TF memory.

    Columns: ``mxu_util_pct`` (share of peak matrix-unit throughput), ``idle_pct`` (TPU idle
    time), ``step_time_ms`` (average over the monitor window), ``infeed_pct`` (share of the
    step waiting for input), all from the monitor over the last `duration_ms`; and
    ``tf_mem_*_bytes``, TensorFlow's allocator view summed over `devices`.

    `monitor(service_addr, duration_ms, level) -> str` and `memory_info(device) -> dict`
    are injectable; `devices` defaults to TensorFlow's TPU devices, found on first use.
    With no `service_addr` only the memory columns are sampled.
    """

    name = "tpu"

    def __init__(
        self,
        service_addr: str | None = None,
        monitor: Callable[[str, int, int], str] | None = None,
        memory_info: Callable[[str], dict] | None = None,
        devices: list[str] | None = None,
        duration_ms: int = 100,
        level: int = 2,
        max_consecutive_failures: int = 10,
    ) -> None:
        super().__init__()
        self.service_addr = service_addr
        self.duration_ms = int(duration_ms)
        self.level = int(level)
        self.max_consecutive_failures = max_consecutive_failures
        self._monitor = monitor or tensorflow_monitor
        self._memory_info = memory_info or tensorflow_memory_info
        self._devices = devices
        self._monitor_on = True
        self._memory_on = True
        self._failures_in_a_row = 0
        self.monitor_failures = 0
        self.last_monitor_error: str | None = None
        if not service_addr:
            self._disable_monitor("no profiler service address for the TPU worker was given")

    @property
    def columns(self) -> list[str]:
        return list(TPU_COLUMNS)

    def _disable_monitor(self, reason: str) -> None:
        self._monitor_on = False
        for column in _MONITOR_COLUMNS:
            self.disable(column, reason)

    def _disable_memory(self, reason: str) -> None:
        self._memory_on = False
        self.disable("tf_mem_current_bytes", reason)
        self.disable("tf_mem_peak_bytes", reason)

    def prime(self) -> None:
        self.devices()

    def devices(self) -> list[str]:
        if self._devices is None:
            try:
                self._devices = tensorflow_tpu_devices()
            except Exception as exc:
                self._devices = []
                self._disable_memory(f"listing TPU devices failed: {type(exc).__name__}: {exc}")
        if not self._devices:
            self._disable_memory("TensorFlow lists no TPU devices in this process")
        return self._devices

    def sample(self) -> dict[str, float]:
        row = self.empty_row()
        if self._monitor_on:
            row.update(self._read_monitor())
        if self._memory_on:
            row.update(self._read_memory())
        return row

    def _read_monitor(self) -> dict[str, float]:
        assert self.service_addr is not None  # without one the monitor was turned off as it started
        try:
            text = self._monitor(self.service_addr, self.duration_ms, self.level)
            values = parse_monitor_output(text)
            if values["mxu_util_pct"] != values["mxu_util_pct"]:
                snippet = " ".join(str(text).split())[:120]
                raise ValueError(f"no 'Utilization of TPU Matrix Units' line in the monitor reply: {snippet!r}")
        except Exception as exc:
            self.monitor_failures += 1
            self._failures_in_a_row += 1
            error = f"{type(exc).__name__}: {exc}"
            if self.last_monitor_error is None:
                self.notes.append(f"TPU monitor failed (will retry): {error}")
            self.last_monitor_error = error
            if self._failures_in_a_row >= self.max_consecutive_failures:
                self._disable_monitor(
                    f"TPU monitor at {self.service_addr} failed {self._failures_in_a_row} times in a row; "
                    f"last error: {error}"
                )
            return dict.fromkeys(_MONITOR_COLUMNS, NAN)
        self._failures_in_a_row = 0
        return values

    def _read_memory(self) -> dict[str, float]:
        current = peak = 0.0
        try:
            for device in self.devices():
                info = self._memory_info(device)
                current += float(info["current"])
                peak += float(info["peak"])
        except Exception as exc:
            self._disable_memory(f"get_memory_info failed: {type(exc).__name__}: {exc}")
        if not self._memory_on:
            return {"tf_mem_current_bytes": NAN, "tf_mem_peak_bytes": NAN}
        return {"tf_mem_current_bytes": current, "tf_mem_peak_bytes": peak}

    def status(self) -> dict:
        status = super().status()
        status.update(
            service_addr=self.service_addr,
            devices=list(self._devices or []),
            monitor_failures=self.monitor_failures,
            last_monitor_error=self.last_monitor_error,
        )
        return status


def discover_tpu_sampler(
    service_addr: str | None = None,
    monitor: Callable[[str, int, int], str] | None = None,
    memory_info: Callable[[str], dict] | None = None,
    devices: list[str] | None = None,
    **options: Any,
) -> tuple[list[TpuSampler], str | None]:
    """A `TpuSampler` when this process has TPU devices, else none and the reason.

    Never raises. `devices` defaults to TensorFlow's TPU devices, so call this after the
    TPU system is initialised (after the TPU strategy is built).
    """
    try:
        found = list(devices) if devices is not None else tensorflow_tpu_devices()
    except Exception as exc:
        return [], f"TPU sampling unavailable: listing TPU devices failed: {type(exc).__name__}: {exc}"
    if not found:
        return [], "TPU sampling unavailable: TensorFlow lists no TPU devices in this process"
    sampler = TpuSampler(service_addr, monitor=monitor, memory_info=memory_info, devices=found, **options)
    reason = None
    if not service_addr:
        reason = "TPU monitor not sampled: no profiler service address given (TPU memory is still sampled)"
    return [sampler], reason
