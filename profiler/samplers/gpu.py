"""NVIDIA GPU utilization through NVML (the `pynvml` module of nvidia-ml-py), one sampler per GPU.

NVML differs between GPUs, drivers and virtualised setups: a laptop GPU may not report
power, a vGPU no PCIe throughput, a GPU can fall off the bus mid-run. So every NVML call
goes through one guarded helper, `GpuSampler._nvml_call`: an error gives NaN, the metric is
switched off after its first failure with the reason in `notes`, and a lost GPU stops only
its own sampler. Nothing here raises into the training run.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from analysis.read.run_files import GPU_COLUMNS
from profiler.samplers.base import NAN, Sampler, is_nan

# One NVML query can fill several columns; a failing query empties all of them.
_QUERY_COLUMNS = {
    "utilization": ("gpu_util_pct", "mem_util_pct"),
    "memory": ("mem_used_bytes", "mem_total_bytes"),
    "power": ("power_w",),
    "temperature": ("temp_c",),
    "sm_clock": ("sm_clock_mhz",),
    "pcie_tx": ("pcie_tx_bytes_per_s",),
    "pcie_rx": ("pcie_rx_bytes_per_s",),
    "processes": ("proc_mem_bytes",),
    "tf_memory": ("tf_mem_current_bytes", "tf_mem_peak_bytes"),
}

# Errors after which the device handle is useless: stop the whole sampler, not one metric.
_DEVICE_LOST_ERRORS = (
    "NVMLError_GpuIsLost",
    "NVMLError_ResetRequired",
    "NVMLError_Uninitialized",
    "NVMLError_GpuNotFound",
)

_KIB = 1024
_AUTO = "auto"


class TensorFlowNotReady(Exception):
    """TensorFlow has not set up its devices yet: skip this reading, try again later."""


def tensorflow_memory_info(device: str) -> dict[str, int]:
    """`tf.config.experimental.get_memory_info(device)`, without importing or starting TensorFlow.

    Asking for memory info initialises TensorFlow's runtime; doing that from the sampler
    thread before the training code has configured its GPUs (memory growth, visible
    devices) would break that configuration, so this waits until the program has done it.
    """
    tf = sys.modules.get("tensorflow")
    if tf is None:
        raise TensorFlowNotReady("TensorFlow is not imported by this process")
    try:
        from tensorflow.python.eager import context

        ready = getattr(context.context(), "_initialized", True)
    except Exception:
        ready = True
    if not ready:
        raise TensorFlowNotReady("TensorFlow has not initialised its devices yet")
    return tf.config.experimental.get_memory_info(device)


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = ""
    kind = type(exc).__name__
    return f"{kind}: {text}" if text and text != kind else kind


class GpuSampler(Sampler):
    """Utilization, memory, power, temperature, clock and PCIe traffic of one NVIDIA GPU.

    Columns (see `GPU_COLUMNS`): ``gpu_util_pct`` is NVML's "GPU utilization", the share of
    the last sample period in which any kernel ran (what nvidia-smi shows as GPU-Util, not
    SM occupancy); ``mem_util_pct`` the share in which device memory was read or written;
    ``mem_used_bytes``/``mem_total_bytes`` device memory; ``power_w`` board power;
    ``temp_c`` GPU temperature; ``sm_clock_mhz`` SM clock; ``pcie_*_bytes_per_s`` PCIe
    traffic over NVML's 20 ms window; ``proc_mem_bytes`` the memory NVML attributes to this
    process (0 until it uses the GPU; in a container NVML may report host pids, so it can
    stay 0); ``tf_mem_*_bytes`` TensorFlow's allocator view of the device.

    `nvml` is the pynvml module or a fake with the same functions (imported lazily when
    None); `tf_memory_info(device) -> {"current", "peak"}` defaults to TensorFlow's;
    `tf_device` is the TensorFlow name of this GPU (``"auto"``: ``"GPU:<index>"``), None
    when TensorFlow cannot see it.
    """

    def __init__(
        self,
        index: int,
        nvml: Any = None,
        tf_memory_info: Callable[[str], dict] | None = None,
        tf_device: str | None = _AUTO,
        pid: int | None = None,
    ) -> None:
        super().__init__()
        if nvml is None:
            import pynvml

            nvml = pynvml
        self.index = index
        self.name = f"gpu{index}"
        self.tf_device = f"GPU:{index}" if tf_device == _AUTO else tf_device
        self.pid = os.getpid() if pid is None else pid
        self._nvml = nvml
        self._tf_memory_info = tf_memory_info or tensorflow_memory_info
        self._off_queries: set[str] = set()
        self._tf_waiting_noted = False
        self._lost_errors = tuple(
            cls for cls in (getattr(nvml, n, None) for n in _DEVICE_LOST_ERRORS) if isinstance(cls, type)
        )
        nvml.nvmlInit()
        self._initialised = True
        try:
            self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except BaseException:
            self.close()
            raise
        raw_name = self._nvml_call("name", "nvmlDeviceGetName", self._handle)
        self.device_name = raw_name.decode(errors="replace") if isinstance(raw_name, bytes) else raw_name
        if is_nan(self.device_name):
            self.device_name = None
        if self.tf_device is None:
            self._disable_query("tf_memory", "this GPU is not visible to TensorFlow")

    @property
    def columns(self) -> list[str]:
        return list(GPU_COLUMNS)

    def _nvml_call(self, query: str, function: str, *args: Any) -> Any:
        """Call one NVML function; NaN instead of an error, and remember what failed.

        The first failure of a query switches it off for the run (so an unsupported
        metric costs one call, not one per sample); a lost GPU switches off the sampler.
        """
        if query in self._off_queries or not self.active:
            return NAN
        fn = getattr(self._nvml, function, None)
        if fn is None:
            self._disable_query(query, f"{function} is missing from this pynvml")
            return NAN
        try:
            return fn(*args)
        except Exception as exc:
            if self._lost_errors and isinstance(exc, self._lost_errors):
                self.deactivate(
                    f"GPU {self.index} lost ({function}: {_describe(exc)}); its sampling stopped, the run went on"
                )
            elif isinstance(exc, getattr(self._nvml, "NVMLError_NotSupported", ())):
                self._disable_query(query, f"not supported on this GPU ({function})")
            else:
                self._disable_query(query, f"{function} failed: {_describe(exc)}")
            return NAN

    def total_memory_bytes(self) -> float:
        """This GPU's device memory in bytes (NaN when NVML cannot say)."""
        mem = self._nvml_call("memory", "nvmlDeviceGetMemoryInfo", self._handle)
        return NAN if is_nan(mem) else float(mem.total)

    def driver_version(self) -> str | None:
        """The NVIDIA driver version (None when NVML cannot say)."""
        version = self._nvml_call("driver", "nvmlSystemGetDriverVersion")
        if is_nan(version):
            return None
        return version.decode(errors="replace") if isinstance(version, bytes) else str(version)

    def _disable_query(self, query: str, reason: str) -> None:
        if query in self._off_queries:
            return
        self._off_queries.add(query)
        for column in _QUERY_COLUMNS.get(query, ()):
            self.disable(column, reason)
        if query not in _QUERY_COLUMNS:
            self.notes.append(f"{query} disabled: {reason}")

    def sample(self) -> dict[str, float]:
        row = self.empty_row()
        if not self.active:
            return row
        nvml, handle = self._nvml, self._handle

        util = self._nvml_call("utilization", "nvmlDeviceGetUtilizationRates", handle)
        if not is_nan(util):
            row["gpu_util_pct"] = float(util.gpu)
            row["mem_util_pct"] = float(util.memory)

        mem = self._nvml_call("memory", "nvmlDeviceGetMemoryInfo", handle)
        if not is_nan(mem):
            row["mem_used_bytes"] = float(mem.used)
            row["mem_total_bytes"] = float(mem.total)

        milliwatts = self._nvml_call("power", "nvmlDeviceGetPowerUsage", handle)
        if not is_nan(milliwatts):
            row["power_w"] = milliwatts / 1000.0

        temp = self._nvml_call(
            "temperature", "nvmlDeviceGetTemperature", handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        )
        if not is_nan(temp):
            row["temp_c"] = float(temp)

        clock = self._nvml_call("sm_clock", "nvmlDeviceGetClockInfo", handle, getattr(nvml, "NVML_CLOCK_SM", 1))
        if not is_nan(clock):
            row["sm_clock_mhz"] = float(clock)

        for query, counter in (
            ("pcie_tx", getattr(nvml, "NVML_PCIE_UTIL_TX_BYTES", 0)),
            ("pcie_rx", getattr(nvml, "NVML_PCIE_UTIL_RX_BYTES", 1)),
        ):
            kib_per_s = self._nvml_call(query, "nvmlDeviceGetPcieThroughput", handle, counter)
            if not is_nan(kib_per_s):
                row[f"{query}_bytes_per_s"] = float(kib_per_s) * _KIB

        procs = self._nvml_call("processes", "nvmlDeviceGetComputeRunningProcesses", handle)
        if not is_nan(procs):
            mine = [p for p in procs if getattr(p, "pid", None) == self.pid]
            used = [getattr(p, "usedGpuMemory", None) for p in mine]
            known = [u for u in used if u is not None]
            row["proc_mem_bytes"] = NAN if len(known) < len(used) else float(sum(known))

        if not self.active:
            return row
        row.update(self._tf_memory())
        return row

    def _tf_memory(self) -> dict[str, float]:
        values = {"tf_mem_current_bytes": NAN, "tf_mem_peak_bytes": NAN}
        if "tf_memory" in self._off_queries or self.tf_device is None:  # None: turned off as it started
            return values
        try:
            info = self._tf_memory_info(self.tf_device)
        except TensorFlowNotReady as exc:
            if not self._tf_waiting_noted:
                self._tf_waiting_noted = True
                self.notes.append(f"TensorFlow memory not read until TensorFlow is ready: {exc}")
            return values
        except Exception as exc:
            self._disable_query("tf_memory", f"get_memory_info({self.tf_device!r}) failed: {_describe(exc)}")
            return values
        values["tf_mem_current_bytes"] = float(info.get("current", NAN))
        values["tf_mem_peak_bytes"] = float(info.get("peak", NAN))
        return values

    def status(self) -> dict:
        status = super().status()
        status.update(index=self.index, device_name=self.device_name, tf_device=self.tf_device)
        return status

    def close(self) -> None:
        if getattr(self, "_initialised", False):
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass


def _tf_devices_by_nvml_index(count: int, visible: str | None) -> dict[int, str | None]:
    """TensorFlow's name for each NVML GPU, from CUDA_VISIBLE_DEVICES.

    NVML sees every GPU; TensorFlow only those in CUDA_VISIBLE_DEVICES, renumbered from 0.
    With unset or non-numeric (UUID) values the NVML index is assumed to match.
    """
    identity: dict[int, str | None] = {i: f"GPU:{i}" for i in range(count)}
    if visible is None or visible.strip() == "":
        return identity if visible is None else dict.fromkeys(range(count))
    try:
        order = [int(part) for part in visible.split(",") if part.strip()]
    except ValueError:
        return identity
    mapping: dict[int, str | None] = dict.fromkeys(range(count))
    for tf_index, nvml_index in enumerate(order):
        if nvml_index < 0:
            break
        if nvml_index < count:
            mapping[nvml_index] = f"GPU:{tf_index}"
    return mapping


_INIT_FAILURE_TEXT = {
    "NVMLError_LibraryNotFound": "NVML library not found (no NVIDIA driver on this machine)",
    "NVMLError_DriverNotLoaded": "NVIDIA driver not loaded",
    "NVMLError_NoPermission": "no permission to use NVML",
    "NVMLError_LibRmVersionMismatch": "NVML library and kernel driver versions differ (reboot or reinstall the driver)",
}


def discover_gpu_samplers(
    nvml: Any = None,
    tf_memory_info: Callable[[str], dict] | None = None,
    pid: int | None = None,
    cuda_visible_devices: str | None = _AUTO,
) -> tuple[list[GpuSampler], str | None]:
    """One `GpuSampler` per GPU NVML can see, and why some or all are missing.

    Returns ``(samplers, reason)``: `reason` is None when every GPU got a sampler, else a
    sentence for run.json such as "GPU sampling unavailable: NVML library not found (no
    NVIDIA driver on this machine)". Never raises. `cuda_visible_devices` (``"auto"``: the
    environment variable) maps NVML indices to TensorFlow device names.
    """
    if nvml is None:
        try:
            import pynvml
        except ImportError as exc:
            return [], f"GPU sampling unavailable: pynvml (nvidia-ml-py) is not installed ({exc})"
        nvml = pynvml
    if cuda_visible_devices == _AUTO:
        cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        nvml.nvmlInit()
    except Exception as exc:
        known = _INIT_FAILURE_TEXT.get(type(exc).__name__)
        detail = known or f"nvmlInit failed: {_describe(exc)}"
        return [], f"GPU sampling unavailable: {detail}"
    try:
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            return [], f"GPU sampling unavailable: nvmlDeviceGetCount failed: {_describe(exc)}"
        if count == 0:
            return [], "GPU sampling unavailable: NVML found no GPUs"
        tf_devices = _tf_devices_by_nvml_index(count, cuda_visible_devices)
        samplers: list[GpuSampler] = []
        skipped: list[str] = []
        for index in range(count):
            try:
                samplers.append(
                    GpuSampler(
                        index,
                        nvml=nvml,
                        tf_memory_info=tf_memory_info,
                        tf_device=tf_devices.get(index),
                        pid=pid,
                    )
                )
            except Exception as exc:
                skipped.append(f"GPU {index}: {_describe(exc)}")
        if not samplers:
            return [], "GPU sampling unavailable: " + "; ".join(skipped)
        return samplers, ("some GPUs not sampled: " + "; ".join(skipped)) if skipped else None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
