"""The host sampler against psutil's own readings and a child process with a known CPU load."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from profiler.samplers import HostSampler, host

SPIN_CHILD = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


def _filesystem_type(path: Path) -> str:
    best = ("", "")
    for part in psutil.disk_partitions(all=True):
        if str(path).startswith(part.mountpoint) and len(part.mountpoint) > len(best[0]):
            best = (part.mountpoint, part.fstype)
    return best[1]


def test_columns_are_fixed_with_units_and_one_per_core():
    sampler = HostSampler()
    cores = psutil.cpu_count(logical=True)
    assert sampler.name == "host"
    assert sampler.columns[: cores + 1] == ["cpu_pct"] + [f"cpu{i}_pct" for i in range(cores)]
    sampler.prime()
    assert list(sampler.sample()) == sampler.columns


def test_values_are_in_range_and_agree_with_psutil():
    sampler = HostSampler()
    sampler.prime()
    time.sleep(0.2)
    row = sampler.sample()
    for column in [c for c in sampler.columns if c.startswith("cpu")]:
        assert 0.0 <= row[column] <= 100.0, column

    own_rss = psutil.Process().memory_info().rss
    assert row["proc_rss_bytes"] > 0
    assert abs(row["proc_rss_bytes"] - own_rss) < 0.2 * own_rss
    assert row["proc_count"] >= 1

    total = psutil.virtual_memory().total
    assert 0 < row["mem_used_bytes"] < total and 0 < row["mem_available_bytes"] <= total
    assert row["mem_used_bytes"] + row["mem_available_bytes"] <= 1.05 * total
    assert row["load1"] >= 0.0
    for column in ("disk_read_bytes_per_s", "disk_write_bytes_per_s", "net_sent_bytes_per_s", "net_recv_bytes_per_s"):
        assert math.isnan(row[column]) or row[column] >= 0.0, column


def test_rates_are_nan_before_a_baseline_then_follow_written_bytes(tmp_path):
    sampler = HostSampler()
    first = sampler.sample()
    assert math.isnan(first["disk_write_bytes_per_s"]) and math.isnan(first["net_recv_bytes_per_s"])
    if psutil.disk_io_counters() is None:
        assert "disk_write_bytes_per_s" in sampler.disabled
        return
    # Write to a disk-backed folder: on a tmpfs /tmp an fsync never reaches a disk.
    folder = tmp_path if _filesystem_type(tmp_path) != "tmpfs" else Path.cwd()
    with tempfile.TemporaryFile(dir=folder) as f:
        f.write(os.urandom(8 * 2**20))
        f.flush()
        os.fsync(f.fileno())
        second = sampler.sample()
    # fsync'ed 8 MiB within well under a second: the write rate must show it.
    assert second["disk_write_bytes_per_s"] > 1 * 2**20


def _cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


@pytest.mark.slow
def test_process_tree_cpu_sees_a_busy_child():
    sampler = HostSampler()
    sampler.prime()
    time.sleep(0.5)
    idle = sampler.sample()

    child = subprocess.Popen([sys.executable, "-c", SPIN_CHILD.format(seconds=3.0)])
    try:
        child_proc = psutil.Process(child.pid)
        deadline = time.time() + 5
        while child.pid not in [c.pid for c in psutil.Process().children(recursive=True)]:
            assert time.time() < deadline
            time.sleep(0.01)
        time.sleep(host.TREE_REFRESH_S)  # new children are looked for at most this often
        added = sampler.sample()  # the child joins the tree here, with a fresh CPU baseline
        child_cpu_start, wall_start = _cpu_seconds(child_proc), time.monotonic()
        assert added["proc_count"] == idle["proc_count"] + 1
        time.sleep(1.0)
        busy = sampler.sample()
        child_pct = 100.0 * (_cpu_seconds(child_proc) - child_cpu_start) / (time.monotonic() - wall_start)
    finally:
        child.kill()
        child.wait()

    # Ground truth is the CPU time the child actually got (about one core on an idle
    # machine, less on a loaded one): the tree reading must contain it on top of idle.
    assert child_pct > 10.0, "the spinning child hardly ran; the machine is overloaded"
    assert idle["proc_cpu_pct"] < 30.0
    assert busy["proc_cpu_pct"] >= 0.75 * child_pct
    assert busy["proc_cpu_pct"] - idle["proc_cpu_pct"] >= 0.6 * child_pct
    assert busy["proc_rss_bytes"] > idle["proc_rss_bytes"]

    time.sleep(0.2)
    after = sampler.sample()
    assert after["proc_count"] == idle["proc_count"], "a finished child leaves the tree"


def test_prime_in_the_sampling_thread_gives_real_system_cpu():
    import threading

    sampler = HostSampler()
    measured: dict[str, Any] = {}

    def run():
        sampler.prime()
        wall_start, cpu_start = time.monotonic(), time.thread_time()
        while time.monotonic() - wall_start < 0.4:
            pass
        measured["row"] = sampler.sample()
        measured["pct"] = 100.0 * (time.thread_time() - cpu_start) / (time.monotonic() - wall_start)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    # Without a baseline taken in this thread psutil would report about 0 for system CPU.
    row, thread_pct = measured["row"], measured["pct"]
    cores = psutil.cpu_count(logical=True)
    assert thread_pct > 10.0, "the spinning thread hardly ran; the machine is overloaded"
    assert row["cpu_pct"] >= 0.75 * thread_pct / cores
    assert row["proc_cpu_pct"] >= 0.75 * thread_pct
