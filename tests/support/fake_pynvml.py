"""A stand-in for the `pynvml` module with known per-GPU values, for the GPU sampler tests.

It raises the real nvidia-ml-py exception classes, so the sampler's `isinstance` checks
against `NVMLError_NotSupported` or `NVMLError_GpuIsLost` are the ones used on a GPU
machine. Every call is counted per function and GPU index.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

NVMLError = pynvml.NVMLError
NVMLError_NotSupported = pynvml.NVMLError_NotSupported
NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
NVMLError_DriverNotLoaded = pynvml.NVMLError_DriverNotLoaded
NVMLError_Uninitialized = pynvml.NVMLError_Uninitialized
NVMLError_ResetRequired = pynvml.NVMLError_ResetRequired
NVMLError_GpuNotFound = pynvml.NVMLError_GpuNotFound

NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
NVML_PCIE_UTIL_TX_BYTES = pynvml.NVML_PCIE_UTIL_TX_BYTES
NVML_PCIE_UTIL_RX_BYTES = pynvml.NVML_PCIE_UTIL_RX_BYTES


@dataclass
class FakeGpu:
    """What one fake GPU reports, in NVML's own units (mW, KB/s, bytes, MHz, C)."""

    name: str | bytes = "Fake GPU"  # bytes: what older pynvml returns
    util_gpu: int = 0
    util_memory: int = 0
    memory_used: int = 0
    memory_total: int = 0
    power_mw: int = 0
    temperature_c: int = 0
    sm_clock_mhz: int = 0
    pcie_tx_kb_per_s: int = 0
    pcie_rx_kb_per_s: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    not_supported: set[str] = field(default_factory=set)
    lost_after_samples: int | None = None
    samples_seen: int = 0


class FakeNvml:
    """Module-like object with the pynvml functions the GPU sampler uses."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_ResetRequired = NVMLError_ResetRequired
    NVMLError_GpuNotFound = NVMLError_GpuNotFound
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_PCIE_UTIL_TX_BYTES = NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = NVML_PCIE_UTIL_RX_BYTES

    def __init__(self, gpus: list[FakeGpu], init_error: Exception | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.calls: collections.Counter = collections.Counter()
        self.init_depth = 0
        self.init_calls = 0
        self.shutdown_calls = 0

    def calls_for(self, function: str, index: int) -> int:
        return self.calls[(function, index)]

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error
        self.init_depth += 1

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1
        if self.init_depth == 0:
            raise NVMLError_Uninitialized()
        self.init_depth -= 1

    def _require_init(self) -> None:
        if self.init_depth == 0:
            raise NVMLError_Uninitialized()

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._require_init()
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return index

    def _gpu(self, function: str, handle: int) -> FakeGpu:
        self._require_init()
        self.calls[(function, handle)] += 1
        gpu = self.gpus[handle]
        if gpu.lost_after_samples is not None and gpu.samples_seen > gpu.lost_after_samples:
            raise NVMLError_GpuIsLost()
        if function in gpu.not_supported:
            raise NVMLError_NotSupported()
        return gpu

    def nvmlDeviceGetName(self, handle: int) -> str | bytes:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUtilizationRates(self, handle: int):
        # The first call of each sample: it advances the fake GPU's sample count.
        gpu = self.gpus[handle]
        gpu.samples_seen += 1
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=gpu.util_gpu, memory=gpu.util_memory)

    def nvmlDeviceGetMemoryInfo(self, handle: int):
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(total=gpu.memory_total, used=gpu.memory_used, free=gpu.memory_total - gpu.memory_used)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        assert sensor == NVML_TEMPERATURE_GPU
        return self._gpu("nvmlDeviceGetTemperature", handle).temperature_c

    def nvmlDeviceGetClockInfo(self, handle: int, clock_type: int) -> int:
        assert clock_type == NVML_CLOCK_SM
        return self._gpu("nvmlDeviceGetClockInfo", handle).sm_clock_mhz

    def nvmlDeviceGetPcieThroughput(self, handle: int, counter: int) -> int:
        gpu = self._gpu("nvmlDeviceGetPcieThroughput", handle)
        if counter == NVML_PCIE_UTIL_TX_BYTES:
            return gpu.pcie_tx_kb_per_s
        if counter == NVML_PCIE_UTIL_RX_BYTES:
            return gpu.pcie_rx_kb_per_s
        raise pynvml.NVMLError_InvalidArgument()

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int):
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]


def two_gpus(pid: int) -> FakeNvml:
    """GPU 0 reports everything; GPU 1 has no power reading (NotSupported)."""
    return FakeNvml(
        [
            FakeGpu(
                name="Fake A100",
                util_gpu=87,
                util_memory=41,
                memory_used=12 * 2**30,
                memory_total=40 * 2**30,
                power_mw=251_500,
                temperature_c=63,
                sm_clock_mhz=1410,
                pcie_tx_kb_per_s=2_000,
                pcie_rx_kb_per_s=750_000,
                processes=[(pid, 3 * 2**30), (pid + 100_000, 5 * 2**30)],
            ),
            FakeGpu(
                name=b"Fake T4",
                util_gpu=5,
                util_memory=1,
                memory_used=300 * 2**20,
                memory_total=15 * 2**30,
                power_mw=70_000,
                temperature_c=41,
                sm_clock_mhz=585,
                pcie_tx_kb_per_s=10,
                pcie_rx_kb_per_s=20,
                processes=[(pid + 100_001, 2**20)],
                not_supported={"nvmlDeviceGetPowerUsage"},
            ),
        ]
    )
