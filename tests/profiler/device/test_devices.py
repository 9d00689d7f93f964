"""Device resolution through a fake TensorFlow backend (GPUs and TPUs we do not have), and the
CLI's usage errors on this machine: one `error:` line, exit code 2, no traceback, no run folder."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path, PosixPath
from typing import cast

import numpy as np
import pytest

from cli_checks import one_usage_error
from fake_backend import FakeBackend, FakeMirroredStrategy, FakeOneDeviceStrategy, FakeTPUStrategy, _fake_cpu_run
from fake_pynvml import FakeGpu, FakeNvml
from profiler import cli
from profiler.device import devices
from profiler.device.devices import DeviceError, resolve
from repo_paths import REPO

GIB = 2**30


# ---------------------------------------------------------------- the fake backend


class FakeNvmlWithDriver(FakeNvml):
    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"


class _NoAcceleratorFiles(PosixPath):
    """Path that says /dev/accel0 and /dev/vfio/0 are not there, whatever this machine has."""

    def exists(self, *args, **kwargs):
        return False if str(self).startswith("/dev/") else super().exists(*args, **kwargs)


@pytest.fixture(autouse=True)
def no_tpu_hints(monkeypatch):
    for name in devices.TPU_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(devices, "Path", _NoAcceleratorFiles)


@pytest.fixture
def nvml(monkeypatch):
    fake = FakeNvmlWithDriver(
        [FakeGpu(name="Fake GPU 0", memory_total=40 * GIB), FakeGpu(name="Fake GPU 1", memory_total=16 * GIB)]
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


# ---------------------------------------------------------------- resolve()


def test_cpu_hides_gpus_and_pins_the_cpu():
    backend = FakeBackend(gpus=2)
    resolved = resolve("cpu", backend=backend)
    assert resolved.kind == "cpu"
    assert isinstance(resolved.strategy, FakeOneDeviceStrategy) and resolved.strategy.device == "/cpu:0"
    assert "hide_gpus" in backend.names()
    assert backend.names().index("hide_gpus") < backend.names().index("one_device_strategy")
    assert "enable_memory_growth" not in backend.names() and "tpu_strategy" not in backend.names()
    assert resolved.info["cores"] >= 1 and resolved.info["name"]
    assert resolved.info["strategy"] == "OneDeviceStrategy"


def test_cpu_runs_one_op_at_a_time_per_socket_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv(devices.INTEROP_VAR, raising=False)
    backend = FakeBackend()
    resolved = resolve("cpu", backend=backend)
    sockets = devices.cpu_sockets()
    assert ("set_inter_op_threads", sockets) in backend.calls
    assert backend.names().index("set_inter_op_threads") < backend.names().index("one_device_strategy")
    assert resolved.info["inter_op_threads"] == sockets

    monkeypatch.setenv(devices.INTEROP_VAR, "4")  # the user's choice, which TensorFlow reads itself
    backend = FakeBackend()
    resolved = resolve("cpu", backend=backend)
    assert "set_inter_op_threads" not in backend.names() and "inter_op_threads" not in resolved.info
    assert devices.cpu_inter_op_threads({}, sockets=2) == 2


def test_gpu_runs_keep_tensorflows_inter_op_threads(monkeypatch):
    monkeypatch.delenv(devices.INTEROP_VAR, raising=False)
    backend = FakeBackend(gpus=1)
    resolve("auto", backend=backend)
    assert "set_inter_op_threads" not in backend.names()


def test_gpu_uses_the_first_gpu_with_memory_growth(nvml):
    backend = FakeBackend(gpus=2)
    resolved = resolve("gpu", backend=backend)
    assert resolved.kind == "gpu"
    assert isinstance(resolved.strategy, FakeOneDeviceStrategy) and resolved.strategy.device == "/gpu:0"
    assert ("enable_memory_growth", ["/physical_device:GPU:0", "/physical_device:GPU:1"]) in backend.calls
    assert backend.names().index("enable_memory_growth") < backend.names().index("one_device_strategy")
    assert "hide_gpus" not in backend.names()
    info = resolved.info
    assert info["name"] == "Fake GPU 0" and info["count"] == 1
    assert info["gpus"] == [{"name": "Fake GPU 0", "compute_capability": "8.0"}]
    assert info["strategy"] == "FakeOneDeviceStrategy"
    assert info["memory_bytes"] == 40 * GIB and info["driver"] == "550.54.15"


def test_two_gpus_mirror_over_both(nvml):
    backend = FakeBackend(gpus=2)
    resolved = resolve("gpu", gpus=2, backend=backend)
    assert isinstance(resolved.strategy, FakeMirroredStrategy)
    assert resolved.strategy.devices == ["/gpu:0", "/gpu:1"]
    assert "one_device_strategy" not in backend.names()
    assert resolved.info["count"] == 2
    assert [g["name"] for g in resolved.info["gpus"]] == ["Fake GPU 0", "Fake GPU 1"]
    assert resolved.info["memory_bytes_per_gpu"] == [40 * GIB, 16 * GIB]


def test_more_gpus_than_found_names_what_was_found():
    backend = FakeBackend(gpus=2)
    with pytest.raises(DeviceError) as info:
        resolve("gpu", gpus=3, backend=backend)
    message = str(info.value)
    assert "--gpus 3" in message and "only 2 GPU(s)" in message
    assert "GPU:0" in message and "GPU:1" in message and "physical_device" not in message
    assert "mirrored_strategy" not in backend.names() and "one_device_strategy" not in backend.names()


def test_gpu_without_gpus_says_what_tensorflow_sees():
    with pytest.raises(DeviceError) as info:
        resolve("gpu", backend=FakeBackend(gpus=0))
    message = str(info.value)
    assert "no GPU found" in message and "CPU:0" in message and "--device cpu" in message


@pytest.mark.parametrize("gpus", [0, -1])
def test_gpu_count_must_be_positive(gpus):
    with pytest.raises(DeviceError, match="at least 1"):
        resolve("gpu", gpus=gpus, backend=FakeBackend(gpus=2))


def test_gpus_option_without_a_gpu_is_an_error():
    with pytest.raises(DeviceError, match="--gpus needs --device gpu"):
        resolve("cpu", gpus=2, backend=FakeBackend(gpus=2))
    with pytest.raises(DeviceError, match="--gpus needs --device gpu"):
        resolve("auto", gpus=1, backend=FakeBackend(gpus=0))


def test_tpu_success_gives_tpu_kind_and_facts():
    backend = FakeBackend(gpus=1)
    resolved = resolve("tpu", tpu="grpc://10.0.0.2:8470", backend=backend)
    assert resolved.kind == "tpu" and isinstance(resolved.strategy, FakeTPUStrategy)
    assert backend.calls[0] == ("tpu_strategy", "grpc://10.0.0.2:8470")
    assert resolved.info["tpu"] == "grpc://10.0.0.2:8470" and resolved.info["count"] == 8
    assert resolved.info["cores"] == 8 and resolved.info["strategy"] == "FakeTPUStrategy"
    assert "physical_devices" not in backend.names()  # no GPU look-up once the TPU is there


def test_tpu_failure_is_a_device_error_with_the_reason():
    backend = FakeBackend(gpus=2, tpu_error=RuntimeError("Failed to connect to all addresses\nmore detail"))
    with pytest.raises(DeviceError) as info:
        resolve("tpu", tpu="my-tpu", backend=backend)
    message = str(info.value)
    assert "no TPU reachable at my-tpu" in message
    assert "RuntimeError: Failed to connect to all addresses" in message and "more detail" not in message
    assert "one_device_strategy" not in backend.names()  # no silent fall-back to GPU or CPU


def test_auto_without_a_hint_never_probes_the_tpu(nvml):
    backend = FakeBackend(gpus=1)
    assert resolve("auto", backend=backend).kind == "gpu"
    assert "tpu_strategy" not in backend.names()
    backend = FakeBackend(gpus=0)
    resolved = resolve("auto", backend=backend)
    assert resolved.kind == "cpu" and cast(FakeOneDeviceStrategy, resolved.strategy).device == "/cpu:0"
    assert "tpu_strategy" not in backend.names() and "hide_gpus" in backend.names()


@pytest.mark.parametrize("hint", ["address", "TPU_NAME", "COLAB_TPU_ADDR"])
def test_auto_prefers_a_hinted_tpu(monkeypatch, hint):
    if hint != "address":
        monkeypatch.setenv(hint, "my-tpu")
    backend = FakeBackend(gpus=2)
    resolved = resolve("auto", tpu="grpc://t:8470" if hint == "address" else None, backend=backend)
    assert resolved.kind == "tpu"
    assert backend.calls[0] == ("tpu_strategy", "grpc://t:8470" if hint == "address" else None)


def test_auto_falls_back_from_an_unreachable_tpu_to_gpu_then_cpu(monkeypatch, nvml):
    monkeypatch.setenv("TPU_NAME", "gone")
    backend = FakeBackend(gpus=2, tpu_error=ValueError("no such TPU"))
    resolved = resolve("auto", backend=backend)
    assert resolved.kind == "gpu" and cast(FakeOneDeviceStrategy, resolved.strategy).device == "/gpu:0"
    assert backend.names()[0] == "tpu_strategy"
    backend = FakeBackend(gpus=0, tpu_error=ValueError("no such TPU"))
    resolved = resolve("auto", backend=backend)
    assert resolved.kind == "cpu" and backend.names()[0] == "tpu_strategy" and "hide_gpus" in backend.names()


def test_unknown_device_is_a_device_error():
    backend = FakeBackend(gpus=1)
    with pytest.raises(DeviceError, match="unknown device 'quantum'.*auto, cpu, gpu, tpu"):
        resolve("quantum", backend=backend)
    assert backend.calls == []


def test_describe_devices_lists_cpu_and_each_gpu(nvml):
    rows = devices.describe_devices(backend=FakeBackend(gpus=2))
    assert [r["kind"] for r in rows] == ["cpu", "gpu", "gpu"]
    assert rows[0]["cores"] >= 1 and rows[0]["name"]
    assert [(r["index"], r["name"], r["compute_capability"], r["memory_bytes"]) for r in rows[1:]] == [
        (0, "Fake GPU 0", "8.0", 40 * GIB),
        (1, "Fake GPU 1", "8.1", 16 * GIB),
    ]


def test_gpu_memory_goes_through_the_guarded_nvml_calls(monkeypatch):
    # No driver version in this pynvml, and GPU 1 does not report memory: the facts NVML
    # cannot give are left out, nothing raises, and every nvmlInit is matched by a shutdown.
    fake = FakeNvml(
        [
            FakeGpu(name="Fake GPU 0", memory_total=40 * GIB),
            FakeGpu(name="Fake GPU 1", memory_total=16 * GIB, not_supported={"nvmlDeviceGetMemoryInfo"}),
        ]
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    info = resolve("gpu", backend=FakeBackend(gpus=2)).info
    assert info["memory_bytes"] == 40 * GIB and "driver" not in info
    assert "memory_bytes" not in resolve("gpu", gpus=2, backend=FakeBackend(gpus=2)).info
    assert fake.init_depth == 0
    broken = FakeNvml([], init_error=fake.NVMLError_DriverNotLoaded())
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    rows = devices.describe_devices(backend=FakeBackend(gpus=1))
    assert rows[1]["name"] == "Fake GPU 0" and "memory_bytes" not in rows[1]


def test_describe_devices_reports_a_hinted_tpu_or_why_not(monkeypatch):
    rows = devices.describe_devices(backend=FakeBackend(gpus=0))
    assert [r["kind"] for r in rows] == ["cpu"]
    rows = devices.describe_devices(backend=FakeBackend(gpus=0), tpu="t1")
    assert rows[-1]["kind"] == "tpu" and rows[-1]["count"] == 8
    monkeypatch.setenv("TPU_NAME", "t2")
    rows = devices.describe_devices(backend=FakeBackend(gpus=0, tpu_error=RuntimeError("down")))
    assert rows[-1]["kind"] == "tpu" and rows[-1]["name"] == "unavailable" and "down" in rows[-1]["error"]


# ---------------------------------------------------------------- the CLI on this machine


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _run_cli(capsys, out: Path, *args: str) -> str:
    code = cli.main(
        ["run", "--out", str(out), "--quiet", "--no-profile", "--no-sample", "--limit-images", "100", *args]
    )
    return one_usage_error(code, capsys)


def _cifar_folder(root: Path) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (10, 3072), dtype=np.uint8), b"labels": [1] * 10}
        (folder / name).write_bytes(pickle.dumps(batch))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, expect",
    [
        (["--device", "gpu"], "no GPU found"),
        (["--device", "tpu"], "no TPU reachable"),
        (["--device", "quantum"], "unknown device 'quantum'"),
        (["--device", "cpu", "--gpus", "2"], "--gpus needs --device gpu"),
        (["--epochs", "0"], "--epochs must be at least 1"),
        (["--batch-size", "-5"], "--batch-size must be at least 1"),
        (["--device", "cpu", "--data-dir", "/nonexistent"], "/nonexistent does not exist"),
        # a batch beyond the data (TensorFlow crashed on 99,999,999,999): one usage error, no run folder
        # (a batch beyond the images that could be allocated is one short batch: test_run_user_batches.py)
        (
            ["--device", "cpu", "--batch-size", "99999999999"],
            "--batch-size 99,999,999,999 is more than the 100 training images, and a full batch of that size needs ",
        ),
    ],
    ids=["gpu", "tpu", "quantum", "gpus-on-cpu", "epochs", "batch-size", "data-dir", "huge-batch"],
)
def test_cli_usage_errors(tmp_path, capsys, args, expect):
    out = tmp_path / "runs"
    line = _run_cli(capsys, out, *args)
    assert expect in line
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.slow
def test_cli_crafted_pickle_is_refused_without_running_it(tmp_path, capsys):
    folder = _cifar_folder(tmp_path / "data")
    marker = tmp_path / "MARKER"
    (folder / "data_batch_1").write_bytes(pickle.dumps(_Evil(marker)))
    out = tmp_path / "runs"
    line = _run_cli(capsys, out, "--device", "cpu", "--data-dir", str(tmp_path / "data"))
    assert "data_batch_1" in line and "unsafe" in line
    assert not marker.exists()
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["py", "bin"])
def test_cli_truncated_batch_file(tmp_path, capsys, fmt):
    if fmt == "py":
        folder = _cifar_folder(tmp_path / "data")
        victim = folder / "data_batch_3"
    else:
        folder = tmp_path / "data" / "cifar-10-batches-bin"
        folder.mkdir(parents=True)
        for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
            (folder / name).write_bytes(bytes(3 * 3073))
        victim = folder / "data_batch_3.bin"
    raw = victim.read_bytes()
    victim.write_bytes(raw[: len(raw) - 1000])
    out = tmp_path / "runs"
    line = _run_cli(capsys, out, "--device", "cpu", "--data-dir", str(tmp_path / "data"))
    assert victim.name in line and "truncated" in line
    assert not out.exists() or list(out.iterdir()) == []


def test_cli_existing_run_name_is_left_untouched(tmp_path, capsys):
    out = tmp_path / "runs"
    existing = out / "mine"
    existing.mkdir(parents=True)
    (existing / "run.json").write_text('{"status": "complete"}')
    (existing / "notes.txt").write_text("keep me")
    before = {p.name: p.read_bytes() for p in existing.iterdir()}
    line = _run_cli(capsys, out, "--device", "cpu", "--data", "synthetic", "--run-name", "mine")
    assert "already exists" in line and "mine" in line
    assert {p.name: p.read_bytes() for p in existing.iterdir()} == before
    assert [p.name for p in out.iterdir()] == ["mine"]


@pytest.mark.parametrize(
    "address, monitor",
    [
        ("grpc://10.0.0.2:8470", "10.0.0.2:8466"),
        ("grpc://10.0.0.2:9999", None),
        ("my-tpu", None),
        (None, None),
    ],
)
def test_tpu_monitor_address_follows_cloud_tpu_ports(address, monitor):
    from profiler.train.run import tpu_monitor_address

    assert tpu_monitor_address(address) == monitor


# ---------------------------------------------------------------- a TPU that never answers


class SilentTPUBackend(FakeBackend):
    """A TPU address where nothing answers: TensorFlow's connect waits forever."""

    def __init__(self):
        super().__init__(gpus=0)
        import threading

        self.release = threading.Event()

    def tpu_strategy(self, address):
        self.calls.append(("tpu_strategy", address))
        self.release.wait(60)
        raise RuntimeError("gave up")


def test_unanswered_tpu_lookup_times_out(monkeypatch):
    import time

    monkeypatch.setenv(devices.TPU_TIMEOUT_ENV, "0.5")
    backend = SilentTPUBackend()
    began = time.monotonic()
    try:
        with pytest.raises(DeviceError) as caught:
            resolve("tpu", tpu="grpc://127.0.0.1:1", backend=backend)
    finally:
        backend.release.set()
    assert time.monotonic() - began < 5
    message = str(caught.value)
    assert message == (
        "no TPU reachable at grpc://127.0.0.1:1 (no answer within 0.5 s; DEVPROF_TPU_TIMEOUT_S sets the wait)"
    )
    assert "\n" not in message


def test_tpu_timeout_defaults_to_30_s_and_must_be_a_positive_number(monkeypatch):
    monkeypatch.delenv(devices.TPU_TIMEOUT_ENV, raising=False)
    assert devices.tpu_timeout_s() == 30.0
    for bad in ("0", "-1", "nan", "inf", "soon"):
        monkeypatch.setenv(devices.TPU_TIMEOUT_ENV, bad)
        with pytest.raises(DeviceError, match="DEVPROF_TPU_TIMEOUT_S must be a finite number"):
            devices.tpu_timeout_s()


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv, code",
    [
        (["devices", "--tpu", "grpc://127.0.0.1:1"], 0),
        (["run", "--device", "tpu", "--tpu", "grpc://127.0.0.1:1", "--quiet", "--out", "{out}"], 2),
    ],
    ids=["devices", "run"],
)
def test_unreachable_tpu_address_answers_within_the_timeout(tmp_path, argv, code):
    """With real TensorFlow (in a subprocess: the abandoned lookup must not outlive the test)."""
    import subprocess
    import time

    repo = REPO
    out = tmp_path / "runs"
    env = {**os.environ, devices.TPU_TIMEOUT_ENV: "2"}
    # A control in the same conditions: importing TensorFlow alone (tens of seconds on a loaded machine).
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", "import tensorflow"], cwd=repo, capture_output=True, timeout=600)
    import_s = time.monotonic() - began
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "profiler", *(a.format(out=out) for a in argv)],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == code, done.stderr
    assert time.monotonic() - began < 1.5 * import_s + 20, import_s  # the import, the 2 s wait, the setup
    expect = "no TPU reachable at grpc://127.0.0.1:1 (no answer within 2 s; DEVPROF_TPU_TIMEOUT_S sets the wait)"
    if argv[0] == "devices":
        assert f"tpu: {expect}" in done.stdout.splitlines(), done.stdout
    else:
        assert done.stderr.strip().splitlines() == [f"error: {expect}"], done.stderr
        assert not out.exists()


# ---------------------------------------------------------------- a TPU's native log lines


def test_an_unreachable_tpu_is_one_error_without_native_log_lines(capfd, monkeypatch):
    """TensorFlow logs the failed connection itself (an `E0000` line and gRPC's details) before
    the exception that the `error:` line is made from."""
    monkeypatch.delenv("DEVPROF_DEBUG", raising=False)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv(devices.TPU_TIMEOUT_ENV, "5")

    class UnreachableTPU:
        def tpu_strategy(self, address):
            os.write(
                2,
                b"E0000 00:00:1795469901.865310    4453 context_distributed_manager.cc:784] Received http2 "
                b"header with status: 404\nAdditional GRPC error information from remote target "
                b"/job:worker/replica:0/task:0 while calling /tensorflow.WorkerService/GetStatus:\n"
                b":UNKNOWN:Error received from peer  {grpc_status:12}\n",
            )
            raise RuntimeError("Received http2 header with status: 404")

    with pytest.raises(devices.DeviceError, match="no TPU reachable at grpc://10.0.0.1:8470"):
        devices.resolve("tpu", tpu="grpc://10.0.0.1:8470", backend=cast(devices.TFBackend, UnreachableTPU()))
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


def test_a_reachable_tpu_still_shows_what_else_it_printed(capfd, monkeypatch):
    monkeypatch.delenv("DEVPROF_DEBUG", raising=False)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")

    class TPU:
        def tpu_strategy(self, address):
            os.write(2, b"I0000 00:00:1.0    1 tpu.cc:1] chatter\nsomething the user should see\n")
            return type("S", (), {"num_replicas_in_sync": 8})(), {"tpu": address, "cores": 8}

    assert devices.resolve("tpu", tpu="grpc://t:8470", backend=cast(devices.TFBackend, TPU())).kind == "tpu"
    assert capfd.readouterr().err == "something the user should see\n"


def test_with_debug_the_native_lines_show(capfd, monkeypatch):
    monkeypatch.setenv("DEVPROF_DEBUG", "1")

    class UnreachableTPU:
        def tpu_strategy(self, address):
            os.write(2, b"E0000 00:00:1.0    1 x.cc:1] refused\n")
            raise RuntimeError("refused")

    with pytest.raises(devices.DeviceError):
        devices.resolve("tpu", tpu="grpc://t:8470", backend=cast(devices.TFBackend, UnreachableTPU()))
    assert "E0000" in capfd.readouterr().err


X86_NO_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512f avx512bw\n"
X86_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
X86_AMX = "flags\t\t: fpu sse2 amx_bf16 amx_tile\n"
ARM_NO_BF16 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32\n"
ARM_BF16 = "Features\t: fp asimd bf16 i8mm\n"


# ---------------------------------------------------------------- bfloat16 without bfloat16 units


def test_cpu_flags_are_read_from_cpuinfo():
    x86, arm = devices.cpu_flags(X86_BF16), devices.cpu_flags(ARM_NO_BF16)
    assert x86 is not None and arm is not None
    assert x86 >= {"avx512_bf16", "sse2"}
    assert "asimd" in arm
    assert devices.cpu_flags("model name: x\n") is None
    assert devices.cpu_flags() is None or isinstance(devices.cpu_flags(), set)


@pytest.mark.parametrize(
    "cpuinfo, warned",
    [
        (X86_NO_BF16, "avx512_bf16 or amx_bf16"),
        (X86_BF16, None),
        (X86_AMX, None),
        (ARM_NO_BF16, "the bf16 feature"),
        (ARM_BF16, None),
    ],
)
def test_bfloat16_on_a_cpu_without_bfloat16_units_is_warned(cpuinfo, warned):
    text = devices.precision_warning("mixed_bfloat16", "cpu", devices.cpu_flags(cpuinfo))
    if warned is None:
        assert text is None
    else:
        assert text is not None
        assert "no bfloat16 units" in text and warned in text and "float32" in text, text


def test_run_json_records_the_cpus_bfloat16_units(monkeypatch):
    """analyze reads files only: run.json's device says whether bfloat16 has units to run on."""
    assert devices.bfloat16_units(devices.cpu_flags(X86_NO_BF16)) == []
    assert devices.bfloat16_units(devices.cpu_flags(X86_BF16)) == ["avx512_bf16"]
    assert devices.bfloat16_units(devices.cpu_flags(ARM_BF16)) == ["bf16"]
    assert devices.bfloat16_units(None) is None
    read = devices.cpu_flags
    monkeypatch.setattr(devices, "cpu_flags", lambda text=None: read(X86_AMX))
    assert devices.cpu_info()["bfloat16_units"] == ["amx_bf16"]


def test_other_precisions_and_devices():
    flags = devices.cpu_flags(X86_NO_BF16)
    assert devices.precision_warning("float32", "cpu", flags) is None
    assert devices.precision_warning("mixed_bfloat16", "gpu", flags) is None
    assert devices.precision_warning("mixed_bfloat16", "cpu", None) is None  # flags unknown: say nothing
    text = devices.precision_warning("mixed_float16", "cpu", flags)
    assert text is not None
    assert "float16 has no fast kernels on CPUs" in text


@pytest.mark.parametrize(
    "precision, cpuinfo, expect",
    [
        ("mixed_bfloat16", X86_NO_BF16, "warning: this CPU has no bfloat16 units (avx512_bf16 or amx_bf16 not in"),
        ("mixed_bfloat16", X86_BF16, None),
        ("mixed_float16", X86_BF16, "warning: float16 has no fast kernels on CPUs"),
    ],
)
def test_a_run_warns_before_it_trains(tmp_path, capsys, monkeypatch, precision, cpuinfo, expect):
    read = devices.cpu_flags
    monkeypatch.setattr(devices, "cpu_flags", lambda text=None: read(cpuinfo))
    run = _fake_cpu_run(tmp_path, monkeypatch)
    run.config.train.precision = precision
    run.prepare()
    err = capsys.readouterr().err
    if expect is None:
        assert err == ""
    else:
        assert err.startswith(expect) and len(err.strip().splitlines()) == 1, err


class _TPUBackend:
    """A backend whose TPU lookup is recorded: it stands for TensorFlow's resolver, which waits."""

    def __init__(self):
        self.looked_up = []

    def tpu_strategy(self, address):
        self.looked_up.append(address)
        raise RuntimeError("no answer")

    def physical_devices(self, kind):
        return []


@pytest.fixture
def no_tpu_here(monkeypatch, tmp_path):
    from profiler.device import devices

    for name in devices.TPU_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(devices, "TPU_DEVICE_FILES", (str(tmp_path / "accel0"), str(tmp_path / "vfio0")), raising=False)
    monkeypatch.setenv(devices.TPU_TIMEOUT_ENV, "1")  # an old lookup gives up soon, and the test says why
    return devices


# ---------------------------------------------------------------- --device tpu where there is none


def test_device_tpu_without_any_tpu_says_so_without_looking_it_up(no_tpu_here):
    devices = no_tpu_here
    backend = _TPUBackend()
    with pytest.raises(devices.DeviceError, match=r"no TPU reachable: this machine has no TPU device \(.*accel0"):
        devices.resolve("tpu", backend=backend)
    assert backend.looked_up == []  # TensorFlow's resolver, which waits for an absent TPU, was never asked


@pytest.mark.parametrize("hint", ["address", "TPU_NAME", "device file"])
def test_device_tpu_with_a_hint_still_looks_it_up(no_tpu_here, monkeypatch, tmp_path, hint):
    devices = no_tpu_here
    if hint == "TPU_NAME":
        monkeypatch.setenv("TPU_NAME", "my-tpu")
    if hint == "device file":
        (tmp_path / "vfio0").write_text("")
    backend = _TPUBackend()
    with pytest.raises(devices.DeviceError, match="no TPU reachable"):
        devices.resolve("tpu", tpu="grpc://10.0.0.9:8470" if hint == "address" else None, backend=backend)
    assert len(backend.looked_up) == 1


def test_devprof_run_device_tpu_without_a_tpu_is_a_usage_error_before_tensorflow_starts(no_tpu_here, tmp_path, capsys):
    """Unmarked on purpose: the test suite fails a fast test that loads TensorFlow."""
    from cli_checks import one_usage_error
    from profiler import cli

    code = cli.main(["run", "--device", "tpu", "--out", str(tmp_path / "runs")])
    assert "no TPU reachable: this machine has no TPU device" in one_usage_error(code, capsys)
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- CUDA_VISIBLE_DEVICES


def test_no_gpu_under_cuda_visible_devices_names_the_variable(monkeypatch):
    from fake_backend import FakeBackend
    from profiler.device.devices import DeviceError, resolve

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(DeviceError) as info:
        resolve("gpu", backend=FakeBackend(gpus=0))
    assert "CUDA_VISIBLE_DEVICES='' is set and hides every GPU it does not name" in str(info.value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(DeviceError) as info:
        resolve("gpu", backend=FakeBackend(gpus=0))
    assert "CUDA_VISIBLE_DEVICES" not in str(info.value) and "NVIDIA driver" in str(info.value)
