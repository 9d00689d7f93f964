"""Host CPU, memory, disk and network utilization (/proc on Linux, psutil elsewhere).

The process-tree numbers answer "is the training program (and its tf.data workers or
child processes) what keeps the CPU busy?", the system numbers "is something else?".
"""

from __future__ import annotations

import os
import time

import psutil

from analysis.read.run_files import host_columns
from profiler.samplers.base import NAN, Sampler
from profiler.samplers.host_sources import ProcessGone, cpu_percent_function, default_source

# Finding new child processes scans all of /proc: the costliest part of a sample, and
# children come and go far more slowly than samples are taken.
TREE_REFRESH_S = 1.0
RATE_COLUMNS = ("disk_read_bytes_per_s", "disk_write_bytes_per_s", "net_sent_bytes_per_s", "net_recv_bytes_per_s")


class _Tracked:
    """A process of the tree: its identity (start time) and CPU baseline."""

    __slots__ = ("start", "cpu_s", "wall_s")

    def __init__(self, start: float | None) -> None:
        self.start = start
        self.cpu_s: float | None = None
        self.wall_s: float | None = None


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

    Percentages follow psutil's formulas (`psutil.cpu_percent`, `Process.cpu_percent`) on
    counters from `source` (`host_sources.default_source()`: /proc on Linux, psutil
    elsewhere). Baselines live in this object, taken by `prime()` in the sampling thread.
    """

    name = "host"

    def __init__(self, pid: int | None = None, name: str = "host", source=None) -> None:
        super().__init__()
        self.name = name
        self.cpu_count = psutil.cpu_count(logical=True) or 1
        self._columns = host_columns(self.cpu_count)
        self.source = source if source is not None else default_source()
        self._root = pid if pid is not None else os.getpid()
        start = self.source.process(self._root)[0]  # raises ProcessGone for a pid that does not exist
        self._procs: dict[int, _Tracked] = {self._root: _Tracked(start)}
        self._cpu_before: list[tuple] | None = None
        self._cpu_percent = cpu_percent_function(tuple(self.source.cpu_fields))
        self._cpu_columns = [f"cpu{i}_pct" for i in range(self.cpu_count)]
        self._next_tree_refresh = 0.0
        self._last_counters: tuple[float, ...] = ()
        self._last_counters_time: float | None = None

    @property
    def columns(self) -> list[str]:
        return self._columns

    def prime(self) -> None:
        """Baseline system and per-process CPU times and the byte counters, in the sampling thread."""
        self._cpu_before = self.source.cpu_times()
        self._refresh_tree()
        self._processes()
        self._rates()

    def sample(self) -> dict[str, float]:
        row = self.empty_row()
        times = self.source.cpu_times()
        before = self._cpu_before or times  # no baseline yet: 0 %, as psutil's first call
        percent = self._cpu_percent
        row["cpu_pct"] = percent(before[0], times[0])
        for column, then, now in zip(self._cpu_columns, before[1:], times[1:]):
            row[column] = percent(then, now)
        self._cpu_before = times

        if time.monotonic() >= self._next_tree_refresh:
            self._refresh_tree()
        cpu_total, rss_total, alive = self._processes()
        if alive:
            row["proc_cpu_pct"] = cpu_total
            row["proc_rss_bytes"] = float(rss_total)
            row["proc_count"] = float(alive)

        row["mem_used_bytes"], row["mem_available_bytes"] = self.source.memory()
        try:
            row["load1"] = float(self.source.load1())
        except (AttributeError, OSError) as exc:
            self.disable("load1", f"load average unavailable: {exc}")

        row.update(self._rates())
        return row

    def close(self) -> None:
        self._procs = {}
        self.source.close()

    def _processes(self) -> tuple[float, float, int]:
        """(CPU %, RSS bytes, count) of the tree; each process's CPU % since its last reading.

        A process seen for the first time has no CPU baseline yet: its memory counts now and
        its CPU from the next sample on.
        """
        cpu_total, rss_total, alive = 0.0, 0.0, 0
        for pid, tracked in list(self._procs.items()):
            try:
                start, cpu_s, rss = self.source.process(pid)
            except ProcessGone:
                self._drop(pid)
                continue
            except PermissionError:
                continue
            if tracked.start is not None and start != tracked.start:  # the pid now names another process
                self._drop(pid)
                continue
            now = time.monotonic()
            if tracked.cpu_s is not None and tracked.wall_s is not None and now > tracked.wall_s:
                cpu_total += round((cpu_s - tracked.cpu_s) / (now - tracked.wall_s) * 100, 1)
            tracked.start, tracked.cpu_s, tracked.wall_s = start, cpu_s, now
            rss_total += rss
            alive += 1
        return cpu_total, rss_total, alive

    def _drop(self, pid: int) -> None:
        del self._procs[pid]
        self.source.forget(pid)

    def _refresh_tree(self) -> set[int]:
        """Add descendants that appeared since the last call (a reused pid is new); return the new pids."""
        self._next_tree_refresh = time.monotonic() + TREE_REFRESH_S
        new: set[int] = set()
        for pid, start in self.source.descendants(self._root).items():
            tracked = self._procs.get(pid)
            if tracked is None or tracked.start != start:
                if tracked is not None:
                    self.source.forget(pid)
                self._procs[pid] = _Tracked(start)
                new.add(pid)
        return new

    def _rates(self) -> dict[str, float]:
        """Disk and network bytes per second since the previous call; NaN on the first call, where the
        counters are absent, or where one went backwards (a counter reset, e.g. a disk went away)."""
        now = time.monotonic()
        disk, net = self.source.disk_bytes(), self.source.net_bytes()
        if disk is None:
            disk = (NAN, NAN)
            self.disable("disk_read_bytes_per_s", "no disk I/O counters on this system")
            self.disable("disk_write_bytes_per_s", "no disk I/O counters on this system")
        if net is None:
            net = (NAN, NAN)
            self.disable("net_sent_bytes_per_s", "no network I/O counters on this system")
            self.disable("net_recv_bytes_per_s", "no network I/O counters on this system")
        counters = (*disk, *net)  # in RATE_COLUMNS order
        last, last_time = self._last_counters, self._last_counters_time
        self._last_counters, self._last_counters_time = counters, now
        if last_time is None or now <= last_time:
            return dict.fromkeys(RATE_COLUMNS, NAN)
        span = now - last_time
        return {
            column: (value - before) / span if value - before >= 0 else NAN
            for column, value, before in zip(RATE_COLUMNS, counters, last)
        }
