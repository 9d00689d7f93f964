"""The GPU sampler driven by a fake pynvml with known values and real NVML exception classes."""

from __future__ import annotations

import math
import os
import sys

import pynvml
import pytest

from analysis.read.run_csvs import read_sampler_csv
from fake_pynvml import FakeGpu, FakeNvml, two_gpus
from profiler.samplers import GpuSampler, SamplerThread, discover_gpu_samplers
from profiler.samplers.gpu import GPU_COLUMNS, TensorFlowNotReady, tensorflow_memory_info

PID = os.getpid()
GIB = 2**30


def fake_tf_memory(device: str) -> dict:
    known = {"GPU:0": {"current": 11 * GIB, "peak": 13 * GIB}, "GPU:1": {"current": 0, "peak": 2**20}}
    if device not in known:
        raise ValueError(f"No matching devices found for '{device}'")
    return known[device]


def discover(nvml: FakeNvml, **kwargs):
    kwargs.setdefault("cuda_visible_devices", None)
    return discover_gpu_samplers(nvml=nvml, tf_memory_info=fake_tf_memory, pid=PID, **kwargs)


def test_every_metric_has_its_value_and_unit():
    nvml = two_gpus(PID)
    samplers, reason = discover(nvml)
    assert reason is None
    assert [s.name for s in samplers] == ["gpu0", "gpu1"]
    gpu0, gpu1 = samplers
    assert gpu0.device_name == "Fake A100" and gpu1.device_name == "Fake T4"

    row = gpu0.sample()
    assert list(row) == GPU_COLUMNS == gpu0.columns
    assert row == {
        "gpu_util_pct": 87.0,
        "mem_util_pct": 41.0,
        "mem_used_bytes": 12.0 * GIB,
        "mem_total_bytes": 40.0 * GIB,
        "power_w": 251.5,  # NVML reports milliwatts
        "temp_c": 63.0,
        "sm_clock_mhz": 1410.0,
        "pcie_tx_bytes_per_s": 2_000 * 1024.0,  # NVML reports KB/s
        "pcie_rx_bytes_per_s": 750_000 * 1024.0,
        "proc_mem_bytes": 3.0 * GIB,  # only this pid's entry, not the other process
        "tf_mem_current_bytes": 11.0 * GIB,
        "tf_mem_peak_bytes": 13.0 * GIB,
    }
    assert gpu0.status()["disabled"] == {} and gpu0.active

    row1 = gpu1.sample()
    assert row1["gpu_util_pct"] == 5.0 and row1["temp_c"] == 41.0 and row1["sm_clock_mhz"] == 585.0
    assert row1["proc_mem_bytes"] == 0.0  # this process does not use GPU 1
    assert row1["tf_mem_peak_bytes"] == float(2**20)
    for sampler in samplers:
        sampler.close()
    assert nvml.init_depth == 0, "every nvmlInit must be matched by nvmlShutdown"


def test_unsupported_power_is_nan_disabled_after_first_call_and_explained():
    nvml = two_gpus(PID)
    (gpu0, gpu1), _ = discover(nvml)
    rows = [gpu1.sample() for _ in range(5)]
    assert all(math.isnan(r["power_w"]) for r in rows)
    assert nvml.calls_for("nvmlDeviceGetPowerUsage", 1) == 1
    assert nvml.calls_for("nvmlDeviceGetTemperature", 1) == 5
    status = gpu1.status()
    assert list(status["disabled"]) == ["power_w"]
    assert "not supported" in status["disabled"]["power_w"]
    assert "nvmlDeviceGetPowerUsage" in status["disabled"]["power_w"]
    assert any("power_w disabled" in note for note in status["notes"])
    assert status["active"] and status["reason"] is None
    # The other GPU is not affected by GPU 1's missing sensor.
    assert gpu0.sample()["power_w"] == 251.5


def test_unsupported_power_is_an_empty_csv_cell(tmp_path):
    nvml = two_gpus(PID)
    (_, gpu1), _ = discover(nvml)
    thread = SamplerThread(gpu1, tmp_path / "gpu1.csv", interval_s=0.05).start()
    while thread.rows_written < 3:
        thread._stop_event.wait(0.01)
    thread.stop()
    header, first = (tmp_path / "gpu1.csv").read_text().splitlines()[:2]
    cells = dict(zip(header.split(","), first.split(",")))
    assert cells["power_w"] == ""
    assert cells["temp_c"] == "41"
    frame = read_sampler_csv(tmp_path / "gpu1.csv")
    assert frame["power_w"].isna().all() and (frame["temp_c"] == 41).all()
    assert nvml.calls_for("nvmlDeviceGetPowerUsage", 1) == 1
    assert nvml.init_depth == 1  # gpu0 is still open
    assert thread.status()["disabled"]["power_w"]


def test_gpu_lost_mid_run_stops_only_that_sampler(tmp_path):
    nvml = two_gpus(PID)
    nvml.gpus[1].lost_after_samples = 3
    (gpu0, gpu1), _ = discover(nvml)
    for _ in range(3):
        assert gpu1.sample()["gpu_util_pct"] == 5.0
    lost_row = gpu1.sample()
    assert all(math.isnan(v) for v in lost_row.values())
    assert not gpu1.active
    assert "GPU 1 lost" in gpu1.status()["reason"] and "GpuIsLost" in gpu1.status()["reason"]
    calls_when_lost = sum(n for (fn, i), n in nvml.calls.items() if i == 1)
    later = gpu1.sample()
    assert all(math.isnan(v) for v in later.values())
    assert sum(n for (fn, i), n in nvml.calls.items() if i == 1) == calls_when_lost, "no NVML calls after loss"
    # The loss is not mistaken for unsupported metrics.
    assert gpu1.status()["disabled"] == {"power_w": gpu1.disabled["power_w"]}
    assert gpu0.sample()["gpu_util_pct"] == 87.0


def test_lost_gpu_thread_ends_cleanly_and_others_go_on(tmp_path):
    nvml = two_gpus(PID)
    nvml.gpus[0].lost_after_samples = 2
    (gpu0, gpu1), _ = discover(nvml)
    t0 = SamplerThread(gpu0, tmp_path / "gpu0.csv", interval_s=0.05).start()
    t1 = SamplerThread(gpu1, tmp_path / "gpu1.csv", interval_s=0.05).start()
    t0._thread.join(5)
    assert not t0.is_alive()
    while t1.rows_written < 5:
        t1._stop_event.wait(0.01)
    assert t1.is_alive()
    t0.stop()
    t1.stop()
    status = t0.status()
    assert status["rows"] == 3 and status["ran"] and status["error"] is None
    assert not status["active"] and "lost" in status["reason"]
    frame = read_sampler_csv(tmp_path / "gpu0.csv")
    assert list(frame["gpu_util_pct"][:2]) == [87.0, 87.0] and math.isnan(frame["gpu_util_pct"][2])
    assert nvml.init_depth == 0


def test_any_nvml_error_disables_only_its_metric():
    nvml = two_gpus(PID)

    def broken_clock(handle, clock_type):
        nvml.calls[("nvmlDeviceGetClockInfo", handle)] += 1
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    setattr(nvml, "nvmlDeviceGetClockInfo", broken_clock)  # a method of this fake NVML replaced
    sampler = GpuSampler(0, nvml=nvml, tf_memory_info=fake_tf_memory, pid=PID)
    for _ in range(3):
        row = sampler.sample()
    assert math.isnan(row["sm_clock_mhz"]) and row["temp_c"] == 63.0
    assert nvml.calls_for("nvmlDeviceGetClockInfo", 0) == 1
    assert "NVMLError_Unknown" in sampler.disabled["sm_clock_mhz"]
    assert sampler.active
    sampler.close()


def test_process_memory_unknown_when_nvml_cannot_attribute_it():
    nvml = FakeNvml([FakeGpu(processes=[(PID, None)])])
    sampler = GpuSampler(0, nvml=nvml, tf_memory_info=fake_tf_memory, pid=PID)
    assert math.isnan(sampler.sample()["proc_mem_bytes"])
    sampler.close()


def test_tensorflow_memory_failures():
    nvml = two_gpus(PID)
    waits = []

    def not_ready(device):
        waits.append(device)
        raise TensorFlowNotReady("TensorFlow has not initialised its devices yet")

    sampler = GpuSampler(0, nvml=nvml, tf_memory_info=not_ready, pid=PID)
    for _ in range(3):
        row = sampler.sample()
    assert math.isnan(row["tf_mem_current_bytes"]) and len(waits) == 3, "not ready: retried each sample"
    assert "tf_mem_current_bytes" not in sampler.disabled
    assert sum("TensorFlow memory not read" in n for n in sampler.notes) == 1

    missing = GpuSampler(0, nvml=nvml, tf_memory_info=fake_tf_memory, tf_device="GPU:7", pid=PID)
    missing.sample()
    assert "No matching devices found for 'GPU:7'" in missing.disabled["tf_mem_peak_bytes"]

    hidden = GpuSampler(1, nvml=nvml, tf_memory_info=fake_tf_memory, tf_device=None, pid=PID)
    assert math.isnan(hidden.sample()["tf_mem_current_bytes"])
    assert "not visible to TensorFlow" in hidden.disabled["tf_mem_current_bytes"]
    for s in (sampler, missing, hidden):
        s.close()


def test_cuda_visible_devices_maps_nvml_index_to_tensorflow_device():
    nvml = two_gpus(PID)
    samplers, _ = discover(nvml, cuda_visible_devices="1")
    assert [s.tf_device for s in samplers] == [None, "GPU:0"]
    samplers, _ = discover(nvml, cuda_visible_devices="1,0")
    assert [s.tf_device for s in samplers] == ["GPU:1", "GPU:0"]
    samplers, _ = discover(nvml, cuda_visible_devices="")
    assert [s.tf_device for s in samplers] == [None, None]


def test_default_tensorflow_memory_info_never_starts_tensorflow(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    with pytest.raises(TensorFlowNotReady, match="not imported"):
        tensorflow_memory_info("GPU:0")
    assert "tensorflow" not in sys.modules


def test_nvml_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    samplers, reason = discover_gpu_samplers()
    assert samplers == [] and reason is not None
    assert reason.startswith("GPU sampling unavailable: pynvml (nvidia-ml-py) is not installed")


@pytest.mark.parametrize(
    "error, expected",
    [
        (pynvml.NVMLError_LibraryNotFound(), "NVML library not found (no NVIDIA driver on this machine)"),
        (pynvml.NVMLError_DriverNotLoaded(), "NVIDIA driver not loaded"),
        (pynvml.NVMLError_Unknown(), "nvmlInit failed: NVMLError_Unknown: Unknown Error"),
        (OSError("libnvidia-ml.so.1: cannot open"), "nvmlInit failed: OSError: libnvidia-ml.so.1"),
    ],
)
def test_no_driver_gives_no_samplers_and_a_reason(error, expected):
    nvml = two_gpus(PID)
    nvml.init_error = error
    samplers, reason = discover(nvml)
    assert samplers == []
    assert reason.startswith("GPU sampling unavailable: " + expected)
    assert nvml.shutdown_calls == 0


def test_no_gpus_and_a_gpu_that_fails_at_start():
    empty = FakeNvml([])
    assert discover(empty) == ([], "GPU sampling unavailable: NVML found no GPUs")
    assert empty.init_depth == 0

    nvml = two_gpus(PID)
    real_handle = nvml.nvmlDeviceGetHandleByIndex

    def handle(index):
        if index == 1:
            raise pynvml.NVMLError_GpuIsLost()
        return real_handle(index)

    setattr(nvml, "nvmlDeviceGetHandleByIndex", handle)  # a method of this fake NVML replaced
    samplers, reason = discover(nvml)
    assert [s.name for s in samplers] == ["gpu0"]
    assert reason == "some GPUs not sampled: GPU 1: NVMLError_GpuIsLost: GPU is lost"
    samplers[0].close()
    assert nvml.init_depth == 0


def test_real_pynvml_on_this_machine_never_raises():
    samplers, reason = discover_gpu_samplers()
    assert (samplers == []) == (reason is not None and reason.startswith("GPU sampling unavailable"))
    for sampler in samplers:
        assert set(sampler.sample()) == set(GPU_COLUMNS)
        sampler.close()
