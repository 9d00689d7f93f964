"""The sampler thread (rate, schema, flushing, failures), the group, and the summaries."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest

from analysis.read.run_csvs import read_sampler_csv
from analysis.read.samples import summarize, weighted_stats
from fake_pynvml import two_gpus
from profiler.samplers import (
    MIN_INTERVAL_S,
    HostSampler,
    Sampler,
    SamplerGroup,
    SamplerThread,
    build_sampler_group,
    validate_interval,
)
from repo_paths import REPO


class CountingSampler(Sampler):
    """Returns the sample number; can be slow, fail, or lose its device after some samples."""

    def __init__(self, name="counter", sleep_s=0.0, fail_after=None, prime_error=None):
        super().__init__()
        self.name = name
        self.sleep_s = sleep_s
        self.fail_after = fail_after
        self.prime_error = prime_error
        self.count = 0
        self.primed_in = None
        self.sampled_in = set()
        self.closed = False

    @property
    def columns(self):
        return ["count", "half_pct", "missing_w"]

    def prime(self):
        if self.prime_error:
            raise self.prime_error
        self.primed_in = threading.get_ident()

    def sample(self):
        self.sampled_in.add(threading.get_ident())
        if self.fail_after is not None and self.count >= self.fail_after:
            raise RuntimeError("sensor exploded")
        self.count += 1
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return {"count": float(self.count), "half_pct": self.count / 2, "missing_w": float("nan")}

    def close(self):
        self.closed = True


def wait_for(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# --- SamplerThread -------------------------------------------------------------------------


def test_rate_spacing_and_schema(tmp_path):
    sampler = CountingSampler()
    path = tmp_path / "utilization" / "counter.csv"
    thread = SamplerThread(sampler, path, interval_s=0.1).start()
    time.sleep(1.5)
    thread.stop()
    assert not thread.is_alive() and sampler.closed

    lines = path.read_text().splitlines()
    assert lines[0] == "time_s,count,half_pct,missing_w"
    assert all(len(line.split(",")) == 4 for line in lines)
    frame = read_sampler_csv(path)
    assert 0.8 * 15 <= len(frame) <= 1.2 * 16
    assert list(frame["count"]) == list(range(1, len(frame) + 1))
    assert frame["half_pct"].iloc[2] == 1.5 and lines[3].split(",")[2] == "1.5"
    assert frame["missing_w"].isna().all() and lines[1].endswith(",")

    gaps = np.diff(frame["time_s"])
    assert (gaps > 0).all()
    assert abs(np.median(gaps) - 0.1) < 0.02
    assert abs(frame["time_s"].iloc[0] - (time.time() - 1.5)) < 1.0, "time_s is Unix time"
    assert sampler.primed_in is not None and sampler.sampled_in == {sampler.primed_in}
    assert thread.status()["rows"] == len(frame) and thread.status()["ran"]


def test_rows_are_on_disk_while_the_thread_runs(tmp_path):
    sampler = CountingSampler()
    path = tmp_path / "counter.csv"
    thread = SamplerThread(sampler, path, interval_s=0.2).start()
    try:
        wait_for(lambda: thread.rows_written >= 3)
        rows_now = thread.rows_written
        on_disk = read_sampler_csv(path)
        assert thread.is_alive()
        assert len(on_disk) >= rows_now - 1
        assert len(on_disk) >= 2
    finally:
        thread.stop()


@pytest.mark.slow
def test_kill_9_loses_at_most_about_a_second(tmp_path):
    path = tmp_path / "counter.csv"
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from profiler.samplers.host import HostSampler
        from profiler.samplers.runner import SamplerThread
        SamplerThread(HostSampler(), {str(path)!r}, interval_s=0.05).start()
        time.sleep(60)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_for(lambda: path.exists() and path.read_text().count("\n") >= 2, timeout_s=30)
        first_row_seen = time.monotonic()
        time.sleep(1.5)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        elapsed = time.monotonic() - first_row_seen
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    frame = read_sampler_csv(path)
    expected = elapsed / 0.05
    assert len(frame) >= expected - 1.0 / 0.05, (len(frame), expected)
    assert frame["cpu_pct"].notna().all()


def test_slow_samples_skip_missed_ticks_instead_of_bursting(tmp_path):
    sampler = CountingSampler(sleep_s=0.25)
    thread = SamplerThread(sampler, tmp_path / "slow.csv", interval_s=0.1).start()
    wait_for(lambda: thread.rows_written >= 5)
    thread.stop()
    frame = read_sampler_csv(tmp_path / "slow.csv")
    gaps = np.diff(frame["time_s"])
    # Each sample takes 0.25 s, so the ticks at +0.1 and +0.2 are skipped and the next
    # sample starts on the grid at +0.3, not immediately.
    assert (gaps > 0.27).all() and (gaps < 0.4).all(), gaps
    assert thread.ticks_skipped >= 2 * (len(frame) - 1) - 1


def test_failing_sampler_is_recorded_and_stops_cleanly(tmp_path):
    sampler = CountingSampler(fail_after=3)
    thread = SamplerThread(sampler, tmp_path / "bad.csv", interval_s=0.05).start()
    wait_for(lambda: not thread.is_alive())
    thread.stop()
    status = thread.status()
    assert status["error"] == "sample failed: RuntimeError: sensor exploded"
    assert status["rows"] == 3 and sampler.closed
    assert len(read_sampler_csv(tmp_path / "bad.csv")) == 3

    broken = CountingSampler(prime_error=OSError("no /proc"))
    thread = SamplerThread(broken, tmp_path / "broken.csv", interval_s=0.05).start()
    wait_for(lambda: not thread.is_alive())
    thread.stop()
    assert thread.status()["error"] == "prime failed: OSError: no /proc"
    assert not thread.status()["ran"]
    assert (tmp_path / "broken.csv").read_text() == "time_s,count,half_pct,missing_w\n"


def test_on_row_receives_rows_and_a_failing_callback_is_dropped(tmp_path):
    seen = []
    thread = SamplerThread(
        CountingSampler(), tmp_path / "a.csv", interval_s=0.05, on_row=lambda name, row: seen.append((name, row))
    ).start()
    wait_for(lambda: len(seen) >= 2)
    thread.stop()
    name, row = seen[0]
    assert name == "counter" and row["count"] == 1.0 and set(row) == {"time_s", "count", "half_pct", "missing_w"}

    def broken(name, row):
        raise KeyError("tensorboard writer closed")

    thread = SamplerThread(CountingSampler(), tmp_path / "b.csv", interval_s=0.05, on_row=broken).start()
    wait_for(lambda: thread.rows_written >= 4)
    thread.stop()
    assert thread.error is None
    assert "KeyError" in thread.status()["callback_error"]


@pytest.mark.parametrize("bad", [0.01, 0.0, -1, float("nan"), float("inf"), "fast", None])
def test_interval_validation(bad, tmp_path):
    with pytest.raises(ValueError, match="sampling interval must"):
        validate_interval(bad)
    with pytest.raises(ValueError, match="sampling interval must"):
        SamplerThread(CountingSampler(), tmp_path / "x.csv", interval_s=bad)
    with pytest.raises(ValueError, match="sampling interval must"):
        SamplerGroup([CountingSampler()], tmp_path, interval_s=bad)


def test_interval_limits_and_default(tmp_path):
    assert validate_interval(MIN_INTERVAL_S) == 0.05
    assert validate_interval(cast(Any, "0.25")) == 0.25  # text, as a caller may give it
    with pytest.raises(ValueError, match=r"at least 0\.05 s, got 0\.049"):
        validate_interval(0.049)
    assert SamplerGroup([CountingSampler()], tmp_path).interval_s == 0.5


# --- SamplerGroup ----------------------------------------------------------------------------


def test_group_runs_host_and_fake_gpus_and_reports_status_and_summaries(tmp_path):
    rows = []
    nvml = two_gpus(os.getpid())
    group = build_sampler_group(
        tmp_path / "utilization", "gpu", interval_s=0.05, on_row=lambda n, r: rows.append(n), nvml=nvml
    )
    with group:
        wait_for(lambda: all(t.rows_written >= 4 for t in group.threads))
    assert set(group.csv_paths) == {"host", "gpu0", "gpu1"}
    assert {p.name for p in (tmp_path / "utilization").iterdir()} == {"host.csv", "gpu0.csv", "gpu1.csv"}
    assert {"host", "gpu0", "gpu1"} <= set(rows)
    assert nvml.init_depth == 0

    status = group.status()
    assert status["gpu1"]["ran"] and "power_w" in status["gpu1"]["disabled"]
    assert status["gpu0"]["device_name"] == "Fake A100"

    epoch_end = time.time()
    summaries = group.summaries(epochs=[(1, 0.0, epoch_end)])
    assert summaries["gpu0"]["metrics"]["power_w"] == {"mean": 251.5, "p50": 251.5, "p95": 251.5, "max": 251.5}
    assert summaries["gpu1"]["metrics"]["power_w"]["mean"] is None
    assert summaries["host"]["metrics"]["proc_rss_bytes"]["max"] > 0
    assert summaries["gpu0"]["epochs"][0]["samples"] == status["gpu0"]["rows"]


def test_group_records_unavailable_kinds_and_isolates_failures(tmp_path):
    import pynvml

    nvml = two_gpus(os.getpid())
    nvml.init_error = pynvml.NVMLError_LibraryNotFound()
    group = build_sampler_group(tmp_path, "cpu", interval_s=0.05, nvml=nvml)
    assert [t.name for t in group.threads] == ["host"]
    status = group.status()
    assert status["gpu"] == {
        "name": "gpu",
        "ran": False,
        "reason": "GPU sampling unavailable: NVML library not found (no NVIDIA driver on this machine)",
        "csv": None,
    }

    good, bad = CountingSampler("good"), CountingSampler("bad", fail_after=1)
    group = SamplerGroup([good, bad], tmp_path / "u", interval_s=0.05).start()
    wait_for(lambda: good.count >= 5 and not group.threads[1].is_alive())
    assert group.threads[0].is_alive()
    group.stop()
    assert group.status()["bad"]["error"].endswith("sensor exploded")
    assert group.status()["good"]["error"] is None and good.closed and bad.closed

    with pytest.raises(ValueError, match="unique"):
        SamplerGroup([CountingSampler("x"), CountingSampler("x")], tmp_path)


def test_tpu_run_without_tpu_says_why(tmp_path):
    group = build_sampler_group(tmp_path, "tpu", interval_s=0.5, nvml=two_gpus(os.getpid()))
    assert group.status()["tpu"]["reason"].startswith("TPU sampling unavailable")
    group.stop()


# --- read_sampler_csv --------------------------------------------------------------------------


def test_read_sampler_csv_survives_a_truncated_last_line(tmp_path):
    path = tmp_path / "host.csv"
    path.write_text(
        "time_s,cpu_pct,power_w\n"
        "1700000000.0,10,\n"
        "1700000000.5,20,1.5\n"
        "1700000001.0,30\n"  # a malformed complete line is skipped
        "1700000001.5,40,2.5\n"
        "1700000002.0,5"  # cut off by kill -9: no newline
    )
    frame = read_sampler_csv(path)
    assert list(frame.columns) == ["time_s", "cpu_pct", "power_w"]
    assert list(frame["cpu_pct"]) == [10, 20, 40]
    assert math.isnan(frame["power_w"][0]) and frame["power_w"][2] == 2.5

    (tmp_path / "empty.csv").write_text("")
    assert read_sampler_csv(tmp_path / "empty.csv").empty
    (tmp_path / "cut_header.csv").write_text("time_s,cpu_p")
    assert read_sampler_csv(tmp_path / "cut_header.csv").empty
    (tmp_path / "header.csv").write_text("time_s,cpu_pct\n")
    header_only = read_sampler_csv(tmp_path / "header.csv")
    assert list(header_only.columns) == ["time_s", "cpu_pct"] and len(header_only) == 0
    assert summarize(header_only)["metrics"]["cpu_pct"]["mean"] is None
    assert summarize(read_sampler_csv(tmp_path / "empty.csv"))["samples"] == 0


# --- summarize -------------------------------------------------------------------------------------


def frame_of(times, **columns):
    return pd.DataFrame({"time_s": times, **columns})


def test_time_weighted_mean_known_answer():
    # Each sample covers the interval before it: 0 % for 1 s, then 100 % for 3 s.
    frame = frame_of([0.0, 1.0, 2.0, 3.0, 4.0], gpu_util_pct=[0.0, 0.0, 100.0, 100.0, 100.0])
    summary = summarize(frame)
    assert summary["metrics"]["gpu_util_pct"] == {"mean": 75.0, "p50": 100.0, "p95": 100.0, "max": 100.0}
    assert summary["samples"] == 5 and summary["seconds"] == 4.0

    # Irregular spacing: 50 over 0.1 s, then 0 over 0.9 s -> 5, not the sample mean 25.
    uneven = frame_of([10.0, 10.1, 11.0], cpu_pct=[0.0, 50.0, 0.0])
    assert summarize(uneven)["metrics"]["cpu_pct"]["mean"] == pytest.approx(5.0)
    assert summarize(uneven)["metrics"]["cpu_pct"]["max"] == 50.0


def test_percentiles_match_numpy_for_even_spacing_and_skip_nan():
    values = np.arange(100.0)
    frame = frame_of(np.arange(101.0), x_pct=np.insert(values, 0, 1000.0))
    stats = summarize(frame)["metrics"]["x_pct"]
    assert stats["p50"] == np.percentile(values, 50, method="inverted_cdf") == 49.0
    assert stats["p95"] == np.percentile(values, 95, method="inverted_cdf") == 94.0
    assert stats["mean"] == 49.5
    assert stats["max"] == 1000.0, "the first sample counts for max although it covers no time"

    gappy = frame_of([0.0, 1.0, 2.0, 3.0], y_w=[0.0, 10.0, np.nan, 30.0], never_w=[np.nan] * 4)
    stats = summarize(gappy)["metrics"]
    assert stats["y_w"]["mean"] == 20.0
    assert stats["never_w"] == {"mean": None, "p50": None, "p95": None, "max": None}
    assert weighted_stats([7.0], [0.0]) == {"mean": 7.0, "p50": 7.0, "p95": 7.0, "max": 7.0}


def test_per_epoch_windows():
    # 0 % over [0, 1), 100 % from 1 s on.
    frame = frame_of([0.0, 1.0, 2.0, 3.0, 4.0], util_pct=[0.0, 0.0, 100.0, 100.0, 100.0])
    summary = summarize(frame, epochs=[(1, 0.0, 2.0), (2, 2.0, 4.0), (3, 0.5, 1.5), (4, 10.0, 20.0)])
    by_epoch = {e["epoch"]: e for e in summary["epochs"]}
    assert by_epoch[1]["metrics"]["util_pct"]["mean"] == 50.0
    assert by_epoch[1]["samples"] == 2 and by_epoch[1]["seconds"] == 2.0
    assert by_epoch[2]["metrics"]["util_pct"] == {"mean": 100.0, "p50": 100.0, "p95": 100.0, "max": 100.0}
    # A window that ends inside an interval counts the sample after it for its share.
    assert by_epoch[3]["metrics"]["util_pct"]["mean"] == 50.0 and by_epoch[3]["samples"] == 1
    assert by_epoch[4]["samples"] == 0 and by_epoch[4]["metrics"]["util_pct"]["mean"] is None
    assert (by_epoch[3]["start_s"], by_epoch[3]["end_s"]) == (0.5, 1.5)
    with pytest.raises(ValueError, match="ends before it starts"):
        summarize(frame, epochs=[(1, 5.0, 1.0)])
    with pytest.raises(ValueError, match="time_s"):
        summarize(pd.DataFrame({"x": [1.0]}))


@pytest.mark.slow
@pytest.mark.hogs
def test_first_row_covers_a_whole_interval(tmp_path):
    # CPU % is measured since the previous reading; a first row taken right after priming
    # would cover no time and read 0 on a busy machine.
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # keeps a core busy
    try:
        time.sleep(0.2)
        thread = SamplerThread(HostSampler(), tmp_path / "host.csv", interval_s=0.1).start()
        time.sleep(0.5)
        thread.stop()
    finally:
        spinner.kill()
        spinner.wait()
    rows = pd.read_csv(tmp_path / "host.csv")
    assert len(rows) >= 2
    assert rows["cpu_pct"].iloc[0] > 20.0


def test_status_names_the_csv_relative_to_the_run_directory(tmp_path):
    run_dir = tmp_path / "outside" / "run"
    group = build_sampler_group(run_dir / "utilization", "cpu", 0.05)
    group.start()
    time.sleep(0.2)
    group.stop()
    status = group.status()["host"]
    assert status["csv"] == "utilization/host.csv"
    assert (run_dir / status["csv"]).is_file()
