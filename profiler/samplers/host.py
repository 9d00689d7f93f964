"""Host CPU, memory, disk and network utilization through psutil.

The process-tree numbers answer "is the training program (and its tf.data workers or
child processes) what keeps the CPU busy?", the system numbers "is something else?".
"""

from __future__ import annotations

import os
import time

import psutil

from analysis.run_files import host_columns
from profiler.samplers.base import NAN, Sampler

# Finding new child processes scans all of /proc: the costliest part of a sample, and
# children come and go far more slowly than samples are taken.
TREE_REFRESH_S = 1.0


class HostSampler(Sampler):
    """System and process-tree CPU %, memory, load, disk and network rates.

    Columns:

    - ``cpu_pct``: all cores, 0-100; ``cpu{i}_pct``: each core, 0-100.
    - ``proc_cpu_pct``: this process and its descendants, 100 = one full core (like `top`),
      so it can exceed 100 on a multi-core machine; ``proc_rss_bytes``: their summed RSS
      (shared pages are counted once per process); ``proc_count``: processes in the tree.
    - ``mem_used_bytes``, ``mem_available_bytes``: system memory (psutil's `used`/`available`).
    - ``load1``: 1-minute load average.
    - ``disk_read_bytes_per_s`` ... ``net_recv_bytes_per_s``: rates from counter deltas
      since the previous sample, NaN on the first sample or where the counters are absent.
    """

    name = "host"

    def __init__(self, pid: int | None = None, name: str = "host") -> None:
        super().__init__()
        self.name = name
        self.cpu_count = psutil.cpu_count(logical=True) or 1
        self._columns = host_columns(self.cpu_count)
        self._root = psutil.Process(pid if pid is not None else os.getpid())
        self._procs: dict[int, psutil.Process] = {self._root.pid: self._root}
        self._next_tree_refresh = 0.0
        self._last_counters: dict[str, float] = {}
        self._last_counters_time: float | None = None

    @property
    def columns(self) -> list[str]:
        return self._columns

    def prime(self) -> None:
        """Baseline system and per-process CPU times in the calling (sampler) thread."""
        psutil.cpu_percent(percpu=False)
        psutil.cpu_percent(percpu=True)
        self._refresh_tree()
        for proc in list(self._procs.values()):
            self._proc_cpu(proc)
        self._rates()

    def sample(self) -> dict[str, float]:
        row = self.empty_row()
        row["cpu_pct"] = float(psutil.cpu_percent(percpu=False))
        for i, pct in enumerate(psutil.cpu_percent(percpu=True)[: self.cpu_count]):
            row[f"cpu{i}_pct"] = float(pct)

        new_pids = self._refresh_tree() if time.monotonic() >= self._next_tree_refresh else set()
        cpu_total = 0.0
        rss_total = 0
        alive = 0
        for pid, proc in list(self._procs.items()):
            try:
                with proc.oneshot():
                    cpu = self._proc_cpu(proc)
                    rss = proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                del self._procs[pid]
                continue
            except psutil.AccessDenied:
                continue
            # A child seen for the first time has no CPU baseline yet: count its memory
            # now and its CPU from the next sample on.
            if pid not in new_pids:
                cpu_total += cpu
            rss_total += rss
            alive += 1
        if alive:
            row["proc_cpu_pct"] = cpu_total
            row["proc_rss_bytes"] = float(rss_total)
            row["proc_count"] = float(alive)

        mem = psutil.virtual_memory()
        row["mem_used_bytes"] = float(mem.used)
        row["mem_available_bytes"] = float(mem.available)
        try:
            row["load1"] = float(psutil.getloadavg()[0])
        except (AttributeError, OSError) as exc:
            self.disable("load1", f"load average unavailable: {exc}")

        row.update(self._rates())
        return row

    def close(self) -> None:
        self._procs = {}

    def _refresh_tree(self) -> set[int]:
        """Add descendants that appeared since the last call; return the new pids."""
        new: set[int] = set()
        self._next_tree_refresh = time.monotonic() + TREE_REFRESH_S
        try:
            children = self._root.children(recursive=True)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return new
        for child in children:
            cached = self._procs.get(child.pid)
            # psutil.Process equality includes the creation time, so a reused pid is new.
            if cached is None or cached != child:
                self._procs[child.pid] = child
                self._proc_cpu(child)
                new.add(child.pid)
        return new

    @staticmethod
    def _proc_cpu(proc: psutil.Process) -> float:
        try:
            return float(proc.cpu_percent(interval=None))
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            return 0.0

    def _read_counters(self) -> dict[str, float]:
        counters: dict[str, float] = {}
        disk = psutil.disk_io_counters() if hasattr(psutil, "disk_io_counters") else None
        if disk is not None:
            counters["disk_read_bytes_per_s"] = float(disk.read_bytes)
            counters["disk_write_bytes_per_s"] = float(disk.write_bytes)
        else:
            self.disable("disk_read_bytes_per_s", "no disk I/O counters on this system")
            self.disable("disk_write_bytes_per_s", "no disk I/O counters on this system")
        net = psutil.net_io_counters() if hasattr(psutil, "net_io_counters") else None
        if net is not None:
            counters["net_sent_bytes_per_s"] = float(net.bytes_sent)
            counters["net_recv_bytes_per_s"] = float(net.bytes_recv)
        else:
            self.disable("net_sent_bytes_per_s", "no network I/O counters on this system")
            self.disable("net_recv_bytes_per_s", "no network I/O counters on this system")
        return counters

    def _rates(self) -> dict[str, float]:
        now = time.monotonic()
        counters = self._read_counters()
        rates = dict.fromkeys(
            (
                "disk_read_bytes_per_s",
                "disk_write_bytes_per_s",
                "net_sent_bytes_per_s",
                "net_recv_bytes_per_s",
            ),
            NAN,
        )
        last, last_time = self._last_counters, self._last_counters_time
        if last_time is not None and now > last_time:
            for key, value in counters.items():
                delta = value - last.get(key, NAN)
                # A negative delta means a counter reset (e.g. a disk went away): no rate.
                if delta >= 0:
                    rates[key] = delta / (now - last_time)
        self._last_counters, self._last_counters_time = counters, now
        return rates
