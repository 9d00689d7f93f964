"""A fake TensorFlow device backend: GPUs and TPUs this machine does not have."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

from profiler.device.devices import TFBackend
from profiler.record.console import Console
from profiler.train.config import RunConfig


class FakeOneDeviceStrategy:
    def __init__(self, device):
        self.device = device
        self.num_replicas_in_sync = 1


class FakeMirroredStrategy:
    def __init__(self, devices):
        self.devices = list(devices)
        self.num_replicas_in_sync = len(self.devices)


class FakeTPUStrategy:
    num_replicas_in_sync = 8


class FakeBackend(TFBackend):
    """The methods of `TFBackend`, answering from a list of fake devices and recording calls (never
    TensorFlow's: `TFBackend.__init__`, which imports it, is not called)."""

    def __init__(self, gpus: int = 0, tpu_error: Exception | None = None, tpu_cores: int = 8):
        self.cpus = [SimpleNamespace(name="/physical_device:CPU:0", device_type="CPU")]
        self.gpus = [SimpleNamespace(name=f"/physical_device:GPU:{i}", device_type="GPU") for i in range(gpus)]
        self.tpu_error = tpu_error
        self.tpu_cores = tpu_cores
        self.calls: list[tuple] = []

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def physical_devices(self, kind):
        self.calls.append(("physical_devices", kind))
        return {"GPU": list(self.gpus), "CPU": list(self.cpus), None: self.cpus + self.gpus}[kind]

    def hide_gpus(self):
        self.calls.append(("hide_gpus",))

    def set_inter_op_threads(self, threads):
        self.calls.append(("set_inter_op_threads", threads))
        return True

    def enable_memory_growth(self, gpus):
        self.calls.append(("enable_memory_growth", [g.name for g in gpus]))

    def gpu_details(self, gpu):
        self.calls.append(("gpu_details", gpu.name))
        index = int(gpu.name.rsplit(":", 1)[1])
        return {"device_name": f"Fake GPU {index}", "compute_capability": (8, index)}

    def one_device_strategy(self, device):
        self.calls.append(("one_device_strategy", device))
        return FakeOneDeviceStrategy(device)

    def mirrored_strategy(self, devices):
        self.calls.append(("mirrored_strategy", list(devices)))
        return FakeMirroredStrategy(devices)

    def tpu_strategy(self, address):
        self.calls.append(("tpu_strategy", address))
        if self.tpu_error is not None:
            raise self.tpu_error
        return FakeTPUStrategy(), {"tpu": address or "local", "cores": self.tpu_cores}


def _fake_cpu_run(tmp_path, monkeypatch, **config):
    """A `Run` that resolves a fake CPU and synthetic data: `prepare()` needs no TensorFlow."""
    from profiler.train.run import Run

    settings: dict[str, Any] = dict(
        device="cpu",
        data="synthetic",
        limit_images=100,
        limit_test_images=50,
        out=str(tmp_path),
        run_name="r",
        sample=False,
        profile=False,
    )
    settings.update(config)
    return Run(RunConfig(**settings), console=Console(False, stream=io.StringIO()), backend=FakeBackend())
