"""`devprof peak`: FLOP and byte accounting with a fake clock, the per-device cache, and one real CPU measurement."""

from __future__ import annotations

import json

import pytest

from profiler import cli, peak


class FakeDevice:
    """A clock and runners where one n x n matmul takes n^3 ns (2 GFLOP/s) and moving a byte 0.1 ns (20 GB/s)."""

    def __init__(self, fail_dtypes=()):
        self.now = 0.0
        self.calls = []
        self.fail_dtypes = fail_dtypes

    def clock(self):
        return self.now

    def matmul_runner(self, device, dtype):
        if dtype in self.fail_dtypes:
            raise TypeError(f"no {dtype} MatMul kernel on {device}\ndetails")

        def make(n):
            def run(iters):
                self.calls.append(("matmul", dtype, n, iters))
                self.now += iters * n**3 * 1e-9

            return run

        return make

    def copy_runner(self, device):
        def make(nbytes):
            def run(iters):
                self.calls.append(("copy", nbytes, iters))
                self.now += iters * 2 * nbytes * 1e-10 / 2  # each update reads and writes nbytes

            return run

        return make


def test_flop_accounting_is_2n3_per_matmul_over_best_time():
    assert peak.matmul_flops(1024) == 2 * 1024**3
    assert peak.matmul_flops(100, iters=3) == 6_000_000
    assert peak.copy_bytes(1000, iters=2) == 4000
    fake = FakeDevice()
    result = peak.measure_rate(fake.matmul_runner("cpu", "float32"), (64, 256), peak.matmul_flops,
                               clock=fake.clock, min_time_s=0.001, max_time_s=10.0)
    assert result["per_second"] == pytest.approx(2e9)
    for row in result["sizes"]:
        assert row["per_second"] == pytest.approx(2 * row["size"] ** 3 * row["iters"] / row["seconds"])
        assert row["seconds"] >= 0.001  # iterations doubled until one timed call took min_time_s
    # 64^3 ns = 0.26 ms per matmul: 4 chained matmuls reach 1 ms
    assert result["sizes"][0]["iters"] == 4


def test_best_of_repeats_after_warm_up_is_kept():
    times = iter([0.0, 0.5, 0.5, 0.8, 0.8, 1.0])  # three timed calls: 0.5, 0.3, 0.2 s
    calls = []
    iters, best = peak.best_time(lambda n: calls.append(n), repeats=3, min_time_s=0.1, clock=lambda: next(times))
    assert (iters, best) == (1, pytest.approx(0.2)) and calls == [1, 1, 1]


def test_sizes_stop_growing_once_one_operation_is_slow():
    fake = FakeDevice()
    result = peak.measure_rate(fake.matmul_runner("cpu", "float32"), (512, 1024, 2048), peak.matmul_flops,
                               clock=fake.clock, min_time_s=0.001, max_time_s=0.5)
    # 1024^3 ns = 1.07 s per matmul >= 0.5 s: 2048 is never tried
    assert [row["size"] for row in result["sizes"]] == [512, 1024]
    assert ("matmul", "float32", 2048, 1) not in fake.calls
    assert ("matmul", "float32", 512, 1) in fake.calls  # the warm-up call


def test_measure_peak_with_stubbed_runners_records_rates_and_unsupported_dtypes():
    fake = FakeDevice(fail_dtypes=("float16",))
    result = peak.measure_peak("gpu", ("float32", "bfloat16", "float16"), sizes=(128, 256), bandwidth_bytes=2**20,
                               matmul_runner=fake.matmul_runner, copy_runner=fake.copy_runner, clock=fake.clock,
                               name="Fake GPU")
    assert result["device"] == "gpu" and result["device_name"] == "Fake GPU"
    assert result["matmul_flops_per_second"] == {"float32": pytest.approx(2e9), "bfloat16": pytest.approx(2e9)}
    assert result["unsupported"] == {"float16": "TypeError: no float16 MatMul kernel on gpu"}
    assert result["memory_bytes_per_second"] == pytest.approx(2e10)
    assert result["memory"]["bytes"] == 2**20


def test_measure_peak_rejects_other_devices_and_failing_float32():
    with pytest.raises(peak.PeakError):
        peak.measure_peak("tpu")
    fake = FakeDevice(fail_dtypes=("float32",))
    with pytest.raises(peak.PeakError, match="float32"):
        peak.measure_peak("cpu", ("float32",), matmul_runner=fake.matmul_runner, copy_runner=fake.copy_runner,
                          clock=fake.clock, name="x")


@pytest.mark.slow
def test_real_cpu_measurement_is_positive():
    result = peak.measure_peak("cpu", ("float32",), sizes=(128, 256), bandwidth_bytes=8 * 2**20, repeats=2)
    assert result["matmul_flops_per_second"]["float32"] > 0
    assert result["memory_bytes_per_second"] > 0
    assert result["device_name"]
    json.dumps(result)  # JSON-ready for run.json and the cache


def test_device_id_and_cache_path(tmp_path, monkeypatch):
    assert peak.device_id("Intel(R) Core(TM) i5-8250U CPU @ 1.60GHz") == "intel-r-core-tm-i5-8250u-cpu-1-60ghz"
    assert peak.device_id("NVIDIA GeForce GTX 1080 Ti") == "nvidia-geforce-gtx-1080-ti"
    monkeypatch.setenv("DEVPROF_CACHE_DIR", str(tmp_path))
    assert peak.cache_path("GTX 1060") == tmp_path / "peak-gtx-1060.json"
    monkeypatch.delenv("DEVPROF_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert peak.cache_path("GTX 1060") == tmp_path / "home" / ".cache" / "devprof" / "peak-gtx-1060.json"


def _fake_result(name="Fake CPU", flops=1e11):
    return {"format": peak.PEAK_FORMAT_VERSION, "device": "cpu", "device_name": name,
            "matmul_flops_per_second": {"float32": flops}, "memory_bytes_per_second": 1e10}


def test_cache_measures_once_per_device(tmp_path, monkeypatch):
    monkeypatch.setenv("DEVPROF_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def measure():
        calls.append(1)
        return _fake_result(flops=1e11 * len(calls))

    first = peak.cached_peak("Fake CPU", measure)
    second = peak.cached_peak("Fake CPU", measure)
    assert len(calls) == 1
    assert first["cached"] is False and second["cached"] is True
    assert second["matmul_flops_per_second"] == {"float32": 1e11}
    stored = json.loads((tmp_path / "cache" / "peak-fake-cpu.json").read_text())
    assert stored["matmul_flops_per_second"]["float32"] == 1e11
    peak.cached_peak("Other CPU", measure)  # another device has its own entry
    assert len(calls) == 2
    refreshed = peak.cached_peak("Fake CPU", measure, refresh=True)
    assert len(calls) == 3 and refreshed["matmul_flops_per_second"]["float32"] == 3e11


def test_corrupt_cache_is_measured_over_and_unwritable_cache_is_not_fatal(tmp_path, monkeypatch):
    monkeypatch.setenv("DEVPROF_CACHE_DIR", str(tmp_path))
    (tmp_path / "peak-fake-cpu.json").write_text("{not json")
    calls = []
    result = peak.cached_peak("Fake CPU", lambda: calls.append(1) or _fake_result())
    assert calls == [1] and result["cached"] is False
    assert json.loads((tmp_path / "peak-fake-cpu.json").read_text())["device_name"] == "Fake CPU"
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("DEVPROF_CACHE_DIR", str(blocker / "sub"))  # a folder under a file cannot be made
    result = peak.cached_peak("Fake CPU", _fake_result)
    assert "cache_error" in result and result["matmul_flops_per_second"]["float32"] == 1e11


@pytest.mark.slow
def test_peak_cli_prints_the_cached_result(tmp_path, monkeypatch, capsys):
    from profiler import devices

    monkeypatch.setenv("DEVPROF_CACHE_DIR", str(tmp_path))
    name = devices.cpu_model()
    peak.cache_path(name).write_text(json.dumps(_fake_result(name, 2.5e11)))
    assert cli.main(["peak", "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["cached"] is True and shown["matmul_flops_per_second"]["float32"] == 2.5e11
    assert cli.main(["peak"]) == 0
    out = capsys.readouterr().out
    assert "matmul float32: 250.0 GFLOP/s" in out and "(cached)" in out
    assert cli.main(["peak", "--device", "tpu"]) == 2
