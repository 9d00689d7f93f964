"""The host sampler's /proc reader against psutil reading the same fake /proc tree, and both
sources through the same sampler on this machine."""

from __future__ import annotations

import math
import os
import time

import psutil
import pytest

from profiler.samplers import HostSampler
from profiler.samplers.host_sources import (
    CPU_FIELDS,
    ProcessGone,
    ProcSource,
    PsutilSource,
    cpu_percent,
    default_source,
    parse_pid_stat,
)

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's procfs")

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
BOOT = 1_700_000_000  # btime, seconds since the epoch


def _stat(cpus: list[list[int]]) -> str:
    """/proc/stat with the all-CPU line (the sum) and one line per CPU."""
    total = [sum(column) for column in zip(*cpus)]
    lines = ["cpu  " + " ".join(map(str, total))]
    lines += [f"cpu{i} " + " ".join(map(str, times)) for i, times in enumerate(cpus)]
    lines += ["intr 12345 0 0", "ctxt 999", f"btime {BOOT}", "processes 4000", "procs_running 2"]
    return "\n".join(lines) + "\n"


def _pid_stat(pid: int, ppid: int, utime: int, stime: int, start: int, rss_pages: int, state="S", name="python") -> str:
    fields = [
        state,
        ppid,
        pid,
        pid,
        0,
        -1,
        4194560,
        100,
        0,
        0,
        0,
        utime,
        stime,
        0,
        0,
        20,
        0,
        8,
        0,
        start,
        10**9,
        rss_pages,
    ] + [0] * 30
    return f"{pid} ({name}) " + " ".join(map(str, fields)) + "\n"


@pytest.fixture
def fake_proc(tmp_path, monkeypatch):
    """A fake /proc (and /sys/block) that psutil reads too (psutil.PROCFS_PATH)."""
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    sys_block = tmp_path / "sys" / "block"
    for disk in ("sda", "nvme0n1"):
        (sys_block / disk).mkdir(parents=True)
    (proc / "stat").write_text(_stat([[100, 2, 50, 800, 10, 1, 3, 0, 0, 0], [300, 0, 70, 600, 5, 2, 1, 4, 20, 0]]))
    (proc / "meminfo").write_text(
        "MemTotal:       16000000 kB\nMemFree:         2000000 kB\nMemAvailable:    9000000 kB\n"
        "Buffers:          100000 kB\nCached:          5000000 kB\nSwapCached:            0 kB\n"
        "Active:          4000000 kB\nInactive:        3000000 kB\nShmem:             50000 kB\n"
        "Slab:             400000 kB\nSReclaimable:     300000 kB\n"
    )
    (proc / "diskstats").write_text(
        "   8       0 sda 1000 10 20000 500 2000 20 40000 900 0 1200 1400 0 0 0 0 0 0\n"
        "   8       1 sda1 900 10 18000 450 1900 20 39000 880 0 1100 1330 0 0 0 0 0 0\n"
        " 259       0 nvme0n1 50 0 800 10 60 0 1600 20 0 30 30 0 0 0 0 0 0\n"
        "   7       0 loop0 3 0 24 0 0 0 0 0 0 4 0 0 0 0 0 0 0\n"
    )
    (proc / "net" / "dev").write_text(
        "Inter-|   Receive                                                |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls "
        "carrier compressed\n"
        "    lo:  123456     100    0    0    0     0          0         0   123456     100    0    0    0     0 "
        "      0          0\n"
        "  eth0: 9876543    5000    0    0    0     0          0         0  2222222    3000    0    0    0     0 "
        "      0          0\n"
    )
    # A tree: 100 (threads 100, 101) -> 200 (forked by thread 101) -> 300; 400 is listed as a child of
    # 200 but started before it (a reused pid); 500 is an exited, unreaped child of 100.
    processes = {
        100: (1, 500, 120, 1000, 2500),
        200: (100, 80, 20, 2000, 1500),
        300: (200, 5, 1, 3000, 700),
        400: (200, 1, 1, 1500, 100),
        500: (100, 0, 0, 2100, 0),
    }
    children = {(100, 100): [500], (100, 101): [200], (200, 200): [300, 400], (300, 300): [], (400, 400): []}
    for pid, (ppid, utime, stime, start, rss) in processes.items():
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "stat").write_text(
            _pid_stat(
                pid,
                ppid,
                utime,
                stime,
                start,
                rss,
                state="Z" if pid == 500 else "S",
                name="odd ) (name" if pid == 300 else "python",
            )
        )
        (proc / str(pid) / "statm").write_text(f"9000 {rss} 300 10 0 800 0\n")
    for (pid, tid), kids in children.items():
        (proc / str(pid) / "task" / str(tid)).mkdir(parents=True)
        (proc / str(pid) / "task" / str(tid) / "children").write_text("".join(f"{k} " for k in kids))
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(proc))
    monkeypatch.setattr(psutil._pslinux, "is_storage_device", lambda name: (sys_block / name).exists())
    source = ProcSource(str(proc), str(sys_block))
    yield proc, source
    source.close()


def test_cpu_times_and_percent_match_psutil_on_the_same_files(fake_proc):
    proc, source = fake_proc
    before = source.cpu_times()
    assert source.cpu_fields == CPU_FIELDS
    assert before == [tuple(psutil.cpu_times()), *(tuple(t) for t in psutil.cpu_times(percpu=True))]
    psutil.cpu_percent(), psutil.cpu_percent(percpu=True)  # psutil's baselines (this thread's)
    # One second later: cpu0 busy 60 of 100 ticks; cpu1 has guest time (inside user), a
    # decreasing field (clipped to 0) and iowait (not busy).
    (proc / "stat").write_text(_stat([[140, 2, 70, 840, 10, 1, 3, 0, 0, 0], [350, 0, 75, 610, 25, 2, 1, 3, 40, 0]]))
    after = source.cpu_times()
    fields = source.cpu_fields
    assert cpu_percent(before[0], after[0], fields) == psutil.cpu_percent()
    assert [cpu_percent(b, a, fields) for b, a in zip(before[1:], after[1:])] == psutil.cpu_percent(percpu=True)
    assert cpu_percent(before[1], after[1], fields) == 60.0
    assert cpu_percent(before[0], before[0], fields) == 0.0  # no time passed: 0, as psutil


def test_memory_disk_and_network_match_psutil(fake_proc):
    _, source = fake_proc
    memory = psutil.virtual_memory()
    assert source.memory() == (memory.used, memory.available) == ((16_000_000 - 9_000_000) * 1024, 9_000_000 * 1024)
    disk = psutil.disk_io_counters()
    # Whole disks only (sda, nvme0n1; not the partition sda1 nor loop0, absent from the fake /sys/block).
    assert source.disk_bytes() == (disk.read_bytes, disk.write_bytes) == ((20000 + 800) * 512, (40000 + 1600) * 512)
    net = psutil.net_io_counters()
    assert source.net_bytes() == (net.bytes_sent, net.bytes_recv) == (123456 + 2222222, 123456 + 9876543)


def test_memory_without_memavailable_falls_back_to_psutil(fake_proc):
    proc, source = fake_proc
    text = (proc / "meminfo").read_text().replace("MemAvailable:    9000000 kB\n", "")
    (proc / "meminfo").write_text(text)
    memory = psutil.virtual_memory()  # psutil's own estimate from the other fields
    assert source.memory() == (memory.used, memory.available)


def test_process_times_rss_and_tree_match_psutil(fake_proc):
    _, source = fake_proc
    start, cpu_s, rss = source.process(100)
    proc = psutil.Process(100)
    times = proc.cpu_times()
    assert cpu_s == pytest.approx(times.user + times.system) and cpu_s == pytest.approx(620 / TICKS)
    assert rss == proc.memory_info().rss == 2500 * PAGE
    assert start == 1000
    assert source.process(300)[1:] == (pytest.approx(6 / TICKS), 700 * PAGE)  # the odd name is skipped whole
    with pytest.raises(ProcessGone):
        source.process(500)  # a zombie has exited
    with pytest.raises(ProcessGone):
        source.process(999)  # no such process
    assert source.children(100) == [500, 200] or sorted(source.children(100)) == [200, 500]
    assert source.descendants(100) == {200: 2000.0, 300: 3000.0}  # not the zombie, not the reused pid
    assert source.descendants(999) == {}


def test_parse_pid_stat_reads_fields_after_the_last_parenthesis():
    line = _pid_stat(7, 3, 11, 22, 33, 44, name="a) (b c)").encode()
    assert parse_pid_stat(line) == (b"S", 3, 33, 33, 44)


def test_sampler_on_the_fake_proc_gives_psutil_meanings(fake_proc, monkeypatch):
    proc, source = fake_proc
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 2)
    sampler = HostSampler(pid=100, source=source)
    sampler.prime()
    (proc / "stat").write_text(_stat([[140, 2, 70, 840, 10, 1, 3, 0, 0, 0], [350, 0, 75, 610, 25, 2, 1, 3, 40, 0]]))
    (proc / "100" / "stat").write_text(_pid_stat(100, 1, 580, 140, 1000, 2600))  # 100 more ticks
    time.sleep(0.05)
    row = sampler.sample()
    assert row["cpu0_pct"] == 60.0 and 0 <= row["cpu_pct"] <= 100
    assert row["proc_count"] == 3  # 100, 200, 300
    assert row["proc_rss_bytes"] == (2600 + 1500 + 700) * PAGE
    # 100 ticks of process 100 over the time between the two samples (200 and 300 did not move)
    assert 0 < row["proc_cpu_pct"] <= 100 / TICKS / 0.05 * 100
    assert row["mem_used_bytes"] == 7_000_000 * 1024 and row["mem_available_bytes"] == 9_000_000 * 1024
    assert row["disk_read_bytes_per_s"] == 0.0 and row["net_sent_bytes_per_s"] == 0.0  # the counters did not move


@pytest.mark.parametrize("make_source", [ProcSource, PsutilSource], ids=["proc", "psutil"])
def test_both_sources_through_the_same_sampler_on_this_machine(make_source):
    sampler = HostSampler(source=make_source())
    sampler.prime()
    began, cpu_began = time.monotonic(), time.thread_time()
    while time.monotonic() - began < 0.3:  # keep one core busy
        pass
    row = sampler.sample()
    spun_pct = 100 * (time.thread_time() - cpu_began) / (time.monotonic() - began)
    assert list(row) == sampler.columns
    for column in [c for c in sampler.columns if c.startswith("cpu")]:
        assert 0.0 <= row[column] <= 100.0, column
    assert spun_pct > 10.0, "the spinning thread hardly ran; the machine is overloaded"
    assert row["proc_cpu_pct"] >= 0.75 * spun_pct
    own = psutil.Process().memory_info().rss
    assert abs(row["proc_rss_bytes"] - own) < 0.2 * own and row["proc_count"] >= 1
    memory = psutil.virtual_memory()
    assert abs(row["mem_available_bytes"] - memory.available) < 0.1 * memory.total
    assert row["load1"] >= 0
    for column in ("disk_read_bytes_per_s", "net_recv_bytes_per_s"):
        assert math.isnan(row[column]) or row[column] >= 0
    sampler.close()


def test_the_two_sources_read_the_same_counters_here():
    proc, ps = ProcSource(), PsutilSource()
    try:
        assert proc.cpu_fields == ps.cpu_fields
        a, b = proc.cpu_times(), ps.cpu_times()
        assert len(a) == len(b) == psutil.cpu_count(logical=True) + 1
        assert all(x <= y + 0.05 for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b))  # read just after
        pid = os.getpid()
        assert proc.process(pid)[2] == pytest.approx(ps.process(pid)[2], rel=0.05)
        assert proc.process(pid)[1] == pytest.approx(ps.process(pid)[1], abs=0.1)
        disks, nets = (proc.disk_bytes(), ps.disk_bytes()), (proc.net_bytes(), ps.net_bytes())
        assert disks[0] is not None and disks[1] is not None and nets[0] is not None and nets[1] is not None
        assert disks[0][0] <= disks[1][0] and nets[0][1] <= nets[1][1]
        assert proc.descendants(pid).keys() == ps.descendants(pid).keys()
    finally:
        proc.close()


def test_default_source_here_is_proc():
    assert isinstance(default_source(), ProcSource)


@pytest.mark.slow
@pytest.mark.parametrize("make_source", [ProcSource, PsutilSource], ids=["proc", "psutil"])
def test_an_exited_child_not_yet_reaped_leaves_the_tree(make_source, monkeypatch):
    import subprocess
    import sys

    from profiler.samplers import host

    monkeypatch.setattr(host, "TREE_REFRESH_S", 0.0)  # look for children at every sample
    sampler = HostSampler(source=make_source())
    sampler.prime()
    alone = sampler.sample()["proc_count"]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.time() + 10
        while sampler.sample()["proc_count"] != alone + 1:
            assert time.time() < deadline, "the child never joined the tree"
            time.sleep(0.05)
        child.kill()
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:  # not waited for: a zombie
            assert time.time() < deadline
            time.sleep(0.01)
        assert sampler.sample()["proc_count"] == alone
        assert sampler.sample()["proc_count"] == alone  # and it is not found again
    finally:
        child.kill()
        child.wait()
        sampler.close()
