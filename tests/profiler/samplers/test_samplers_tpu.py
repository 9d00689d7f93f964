"""The TPU sampler driven by a fake profiler client monitor and fake TensorFlow memory info."""

from __future__ import annotations

import math

from profiler.samplers import TpuSampler, discover_tpu_sampler, parse_monitor_output
from profiler.samplers.tpu import TPU_COLUMNS

LEVEL_2 = """
Timestamp: 13:00:11
TPU type: TPU v3
Number of TPU cores: 8 (Replica count = 8, num cores per replica = 1)
Per-core batch size: 32
TPU idle time (lower is better): 17.9%
Utilization of TPU Matrix Units (higher is better): 41.25%
Step time: 70.6ms (avg), 69.1ms (min), 72.0ms (max)
Infeed percentage: 3.500% (avg), 0.000% (min), 9.000% (max)
"""

LEVEL_1_OLD_WORDING = """
  TPU type: TPU v2
  Utilization of TPU Matrix Units is (higher is better): 10.7%
"""


class FakeProfilerClient:
    """`monitor(service_addr, duration_ms, level)` replies from a script, recording the calls."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.calls = []

    def monitor(self, service_addr, duration_ms, level=1):
        self.calls.append((service_addr, duration_ms, level))
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if isinstance(reply, Exception):
            raise reply
        return reply


def fake_memory(device):
    return {"TPU:0": {"current": 100, "peak": 300}, "TPU:1": {"current": 20, "peak": 40}}[device]


def test_parse_level_2_and_level_1():
    assert parse_monitor_output(LEVEL_2) == {
        "mxu_util_pct": 41.25,
        "idle_pct": 17.9,
        "step_time_ms": 70.6,
        "infeed_pct": 3.5,
    }
    values = parse_monitor_output(LEVEL_1_OLD_WORDING)
    assert values["mxu_util_pct"] == 10.7
    assert all(math.isnan(values[k]) for k in ("idle_pct", "step_time_ms", "infeed_pct"))
    assert all(math.isnan(v) for v in parse_monitor_output("").values())


def test_sampler_reads_monitor_and_sums_memory_over_devices():
    client = FakeProfilerClient([LEVEL_2])
    sampler = TpuSampler(
        "grpc://10.0.0.2:8466",
        monitor=client.monitor,
        memory_info=fake_memory,
        devices=["TPU:0", "TPU:1"],
        duration_ms=250,
        level=2,
    )
    sampler.prime()
    row = sampler.sample()
    assert list(row) == TPU_COLUMNS == sampler.columns
    assert row == {
        "mxu_util_pct": 41.25,
        "idle_pct": 17.9,
        "step_time_ms": 70.6,
        "infeed_pct": 3.5,
        "tf_mem_current_bytes": 120.0,
        "tf_mem_peak_bytes": 340.0,
    }
    assert client.calls == [("grpc://10.0.0.2:8466", 250, 2)]
    assert sampler.status()["disabled"] == {}


def test_transient_monitor_failure_is_nan_then_recovers():
    busy = RuntimeError("UNAVAILABLE: another profiling session is active")
    client = FakeProfilerClient([busy, busy, LEVEL_2])
    sampler = TpuSampler("10.0.0.2:8466", monitor=client.monitor, memory_info=fake_memory, devices=["TPU:0"])
    first = sampler.sample()
    assert math.isnan(first["mxu_util_pct"]) and first["tf_mem_current_bytes"] == 100.0
    sampler.sample()
    assert sampler.sample()["mxu_util_pct"] == 41.25
    status = sampler.status()
    assert status["monitor_failures"] == 2 and status["disabled"] == {}
    assert "another profiling session" in status["last_monitor_error"]
    assert sum("TPU monitor failed (will retry)" in n for n in status["notes"]) == 1


def test_persistent_monitor_failure_disables_monitor_with_reason():
    client = FakeProfilerClient([ConnectionError("failed to connect to all addresses")])
    sampler = TpuSampler(
        "10.0.0.9:8466",
        monitor=client.monitor,
        memory_info=fake_memory,
        devices=["TPU:0"],
        max_consecutive_failures=3,
    )
    for _ in range(6):
        row = sampler.sample()
    assert len(client.calls) == 3
    assert math.isnan(row["mxu_util_pct"]) and row["tf_mem_peak_bytes"] == 300.0
    reason = sampler.disabled["mxu_util_pct"]
    assert "10.0.0.9:8466 failed 3 times in a row" in reason and "failed to connect" in reason
    assert sampler.active


def test_unrecognised_monitor_text_counts_as_failure():
    client = FakeProfilerClient(["Profiler service is warming up"])
    sampler = TpuSampler(
        "x:1", monitor=client.monitor, memory_info=fake_memory, devices=["TPU:0"], max_consecutive_failures=1
    )
    assert math.isnan(sampler.sample()["mxu_util_pct"])
    assert "no 'Utilization of TPU Matrix Units' line" in sampler.disabled["idle_pct"]
    assert "warming up" in sampler.disabled["idle_pct"]


def test_memory_failure_and_missing_service_address():
    def broken_memory(device):
        raise ValueError(f"No matching devices found for '{device}'")

    client = FakeProfilerClient([LEVEL_2])
    sampler = TpuSampler(None, monitor=client.monitor, memory_info=broken_memory, devices=["TPU:0"])
    row = sampler.sample()
    assert all(math.isnan(v) for v in row.values())
    assert client.calls == []
    assert "no profiler service address" in sampler.disabled["mxu_util_pct"]
    assert "No matching devices found for 'TPU:0'" in sampler.disabled["tf_mem_current_bytes"]


def test_discover_without_tpu_devices_or_address():
    assert discover_tpu_sampler("x:1", devices=[]) == (
        [],
        "TPU sampling unavailable: TensorFlow lists no TPU devices in this process",
    )
    # Without TensorFlow TPU devices in this (CPU) process the default lookup finds none too.
    samplers, reason = discover_tpu_sampler("x:1")
    assert reason is not None
    assert samplers == [] and reason.startswith("TPU sampling unavailable")

    samplers, reason = discover_tpu_sampler(None, memory_info=fake_memory, devices=["TPU:0"])
    assert [s.name for s in samplers] == ["tpu"]
    assert reason is not None
    assert "no profiler service address" in reason
    assert samplers[0].sample()["tf_mem_current_bytes"] == 100.0
