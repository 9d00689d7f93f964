"""Where the host sampler's raw counters come from: Linux's /proc read directly, or psutil.

Both sources hand `HostSampler` the same raw counters (CPU times per core, a process's CPU
seconds and RSS, memory, load, disk and network byte counters), and the sampler turns them
into percentages and rates with one piece of code, so the two give values of the same
meaning and the psutil path is tested on Linux too.

`ProcSource` exists for cost: psutil builds objects and reopens files on every call (about
0.8 ms a sample here, 0.7 % of 2 cores at 10 Hz). It keeps the system files open and
re-reads them with `pread` (procfs regenerates a file read from offset 0), reads a process's
CPU times and RSS from one `/proc/<pid>/stat`, and finds child processes through
`/proc/<pid>/task/<tid>/children` (kept open too) instead of reading every process's stat. Its parsers are
plain functions of the file bytes, so a fake /proc tree checks them against psutil's.
"""

from __future__ import annotations

import os
import sys

import psutil

# The fields of a CPU line of /proc/stat, in psutil's `scputimes` order.
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors whatever the device's sector size
READ_SIZE = 1 << 16


class ProcessGone(Exception):
    """The process exited (or its pid now belongs to another process)."""


def cpu_percent(before: tuple, after: tuple, fields: tuple[str, ...]) -> float:
    """Busy share of one CPU (or all) between two readings of its times, psutil's formula.

    Each field's delta is clipped at 0; guest time is already inside user and nice, so it is
    taken out of the total; idle and iowait are not busy. Rounded to 0.1 as psutil does.
    """
    return cpu_percent_function(fields)(before, after)


def cpu_percent_function(fields: tuple[str, ...]):
    """`cpu_percent` for one field layout, with the field positions looked up once."""
    guests = [fields.index(name) for name in ("guest", "guest_nice") if name in fields]
    idles = [fields.index(name) for name in ("idle", "iowait") if name in fields]

    def percent(before: tuple, after: tuple) -> float:
        deltas = [b - a if b > a else 0.0 for a, b in zip(before, after)]
        total = sum(deltas)
        for i in guests:
            total -= deltas[i]
        busy = total
        for i in idles:
            busy -= deltas[i]
        if total <= 0:
            return 0.0
        return round(busy / total * 100, 1)

    return percent


# ---------------------------------------------------------------- /proc parsers (bytes -> values)


def parse_stat_cpus(data: bytes, ticks: float, lines: int = -1) -> list[tuple[float, ...]]:
    """/proc/stat: the times of all CPUs together, then of each CPU, in seconds.

    `lines`: how many lines to split off (the cpu lines come first; the interrupt line after
    them can be long), -1 for all.
    """
    rows: list[tuple[float, ...]] = []
    width = len(CPU_FIELDS) + 1
    for line in data.split(b"\n", lines):
        if not line.startswith(b"cpu"):
            if rows:
                break  # the cpu lines come first
            continue
        rows.append(tuple([float(value) / ticks for value in line.split(None, width)[1:width]]))
    return rows


def parse_meminfo(data: bytes) -> dict[bytes, int]:
    """/proc/meminfo: bytes by field name (b"MemTotal", ...), for the fields the sampler reads."""
    wanted = (b"MemTotal", b"MemFree", b"MemAvailable")
    found = {}
    head = data.split(b"\n", 3)  # the three come first on every kernel that has MemAvailable
    for line in head if all(line.startswith(key) for line, key in zip(head, wanted)) else data.split(b"\n"):
        key, _, rest = line.partition(b":")
        if key in wanted:
            found[key] = int(rest.split()[0]) * 1024
            if len(found) == len(wanted):
                break
    return found


def parse_pid_stat(data: bytes) -> tuple[bytes, int, int, int, int]:
    """/proc/<pid>/stat: (state, ppid, utime + stime in clock ticks, start time in ticks, RSS in pages)."""
    # The command name is in parentheses and may itself hold spaces and parentheses.
    fields = data[data.rfind(b")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[19]), int(fields[21])


def parse_diskstats(data: bytes) -> list[tuple[bytes, int, int]]:
    """/proc/diskstats: (device name, sectors read, sectors written) per line."""
    rows = []
    for line in data.split(b"\n"):
        fields = line.split(None, 10)
        if len(fields) == 11:  # a disk: major minor name reads merged sectors ms writes merged sectors ...
            rows.append((fields[2], int(fields[5]), int(fields[9])))
        elif len(fields) == 7:  # a partition on old kernels: name reads sectors writes sectors
            rows.append((fields[2], int(fields[4]), int(fields[6])))
    return rows


def parse_net_dev(data: bytes) -> tuple[int, int]:
    """/proc/net/dev: (bytes sent, bytes received) summed over every interface, as psutil sums them."""
    sent = received = 0
    for line in data.split(b"\n")[2:]:
        name, colon, rest = line.rpartition(b":")
        if not colon:
            continue
        fields = rest.split(None, 9)
        received += int(fields[0])
        sent += int(fields[8])
    return sent, received


# ---------------------------------------------------------------- sources


class ProcSource:
    """The counters read straight from Linux's procfs (`root`, normally /proc)."""

    def __init__(self, root: str = "/proc", sys_block: str = "/sys/block") -> None:
        self.root = root.rstrip("/")
        self.sys_block = sys_block.rstrip("/")
        self.ticks = float(os.sysconf("SC_CLK_TCK"))
        self.page_bytes = os.sysconf("SC_PAGE_SIZE")
        self._fds: dict[str, int] = {}
        self._children_fds: dict[int, dict[str, int]] = {}  # pid -> thread id -> its open children file
        self._storage: dict[bytes, bool] = {}  # device name -> a whole disk (not a partition)
        self._last_disk: tuple[bytes, tuple] = (b"", (0.0, 0.0))  # the file last parsed and its sums
        self._last_net: tuple[bytes, tuple] = (b"", (0.0, 0.0))
        stat = self._read(f"{self.root}/stat")
        self.cpu_fields = CPU_FIELDS[: len(stat.split(b"\n", 1)[0].split()) - 1]
        # The cpu lines and one more: the rest of /proc/stat is never split.
        self._stat_lines = sum(1 for line in stat.split(b"\n") if line.startswith(b"cpu")) + 1

    # Files stay open; a read from offset 0 makes procfs produce them again.
    def _read(self, path: str) -> bytes:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        data = os.pread(fd, READ_SIZE, 0)
        if len(data) == READ_SIZE:  # a large file (/proc/stat on a machine with many CPUs)
            chunks, offset = [data], READ_SIZE
            while chunk := os.pread(fd, READ_SIZE, offset):
                chunks.append(chunk)
                offset += len(chunk)
            data = b"".join(chunks)
        return data

    def _forget(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def cpu_times(self) -> list[tuple[float, ...]]:
        return parse_stat_cpus(self._read(f"{self.root}/stat"), self.ticks, self._stat_lines)

    def process(self, pid: int) -> tuple[float, float, float]:
        """(start time, CPU seconds (user + system), RSS bytes) of one process; ProcessGone once it exited."""
        path = f"{self.root}/{pid}/stat"
        try:
            data = self._read(path)
        except (FileNotFoundError, ProcessLookupError) as exc:
            self._forget(path)
            raise ProcessGone(pid) from exc
        state, _, cpu_ticks, start, rss_pages = parse_pid_stat(data) if data else (b"X", 0, 0, 0, 0)
        if state in (b"Z", b"X"):  # exited, not yet reaped: no longer part of the tree
            self._forget(path)
            raise ProcessGone(pid)
        return float(start), cpu_ticks / self.ticks, float(rss_pages * self.page_bytes)

    def forget(self, pid: int) -> None:
        self._forget(f"{self.root}/{pid}/stat")

    def children(self, pid: int) -> list[int]:
        """Direct children of a process: every one of its threads lists the children it forked."""
        found: list[int] = []
        fds = self._children_fds.setdefault(pid, {})
        try:
            tids = set(os.listdir(f"{self.root}/{pid}/task"))
        except OSError:
            tids = set()
        for tid in set(fds) - tids:  # threads that ended
            os.close(fds.pop(tid))
        for tid in tids:
            try:
                fd = fds.get(tid)
                if fd is None:
                    fd = fds[tid] = os.open(f"{self.root}/{pid}/task/{tid}/children", os.O_RDONLY)
                data = os.pread(fd, READ_SIZE, 0)
            except (FileNotFoundError, ProcessLookupError):  # the thread ended just now
                if tid in fds:
                    os.close(fds.pop(tid))
                continue
            found.extend(int(child) for child in data.split())
        return found

    def descendants(self, pid: int) -> dict[int, float]:
        """Every descendant of `pid`: {pid: start time}. A child that started before its parent is a reused pid."""
        result: dict[int, float] = {}
        try:
            parents = [(pid, self.process(pid)[0])]
        except ProcessGone:
            parents = []
        walked = {pid}
        while parents:
            parent, parent_start = parents.pop()
            for child in self.children(parent):
                try:
                    start = self.process(child)[0]
                except ProcessGone:
                    continue
                if start >= parent_start and child not in result:
                    result[child] = start
                    walked.add(child)
                    parents.append((child, start))
        for gone in set(self._children_fds) - walked:
            self._close_children(gone)
        return result

    def _close_children(self, pid: int) -> None:
        for fd in self._children_fds.pop(pid, {}).values():
            os.close(fd)

    def memory(self) -> tuple[float, float]:
        """(used, available) bytes: psutil's `used` is total - available."""
        fields = parse_meminfo(self._read(f"{self.root}/meminfo"))
        available = fields.get(b"MemAvailable", 0)
        if not available:  # old kernels (or a kernel bug): psutil's own estimate
            memory = psutil.virtual_memory()
            return float(memory.used), float(memory.available)
        total = fields[b"MemTotal"]
        if available > total:  # a container's odd numbers: psutil falls back to free memory
            available = fields[b"MemFree"]
        return float(total - available), float(available)

    def load1(self) -> float:
        return os.getloadavg()[0]

    def _is_storage(self, name: bytes) -> bool:
        known = self._storage.get(name)
        if known is None:  # a whole disk has /sys/block/<name>; a partition does not
            known = self._storage[name] = os.path.exists(f"{self.sys_block}/{name.decode().replace('/', '!')}")
        return known

    def disk_bytes(self) -> tuple[float, float] | None:
        try:
            data = self._read(f"{self.root}/diskstats")
        except FileNotFoundError:
            return None
        if data == self._last_disk[0]:  # no I/O since the last reading (the usual case): nothing to parse
            return self._last_disk[1]
        read = written = 0
        for name, sectors_read, sectors_written in parse_diskstats(data):
            if self._is_storage(name):  # partitions are inside their disk's counts
                read += sectors_read
                written += sectors_written
        self._last_disk = (data, (float(read * SECTOR_BYTES), float(written * SECTOR_BYTES)))
        return self._last_disk[1]

    def net_bytes(self) -> tuple[float, float] | None:
        try:
            data = self._read(f"{self.root}/net/dev")
        except FileNotFoundError:
            return None
        if data != self._last_net[0]:
            sent, received = parse_net_dev(data)
            self._last_net = (data, (float(sent), float(received)))
        return self._last_net[1]

    def close(self) -> None:
        for path in list(self._fds):
            self._forget(path)
        for pid in list(self._children_fds):
            self._close_children(pid)


class PsutilSource:
    """The same counters through psutil, for every platform psutil supports."""

    def __init__(self) -> None:
        self.cpu_fields = tuple(psutil.cpu_times()._fields)
        self._procs: dict[int, psutil.Process] = {}

    def cpu_times(self) -> list[tuple[float, ...]]:
        return [tuple(psutil.cpu_times()), *(tuple(times) for times in psutil.cpu_times(percpu=True))]

    def _proc(self, pid: int) -> psutil.Process:
        proc = self._procs.get(pid)
        if proc is None:
            try:
                proc = self._procs[pid] = psutil.Process(pid)
            except psutil.NoSuchProcess as exc:
                raise ProcessGone(pid) from exc
        return proc

    def process(self, pid: int) -> tuple[float, float, float]:
        proc = self._proc(pid)
        try:
            with proc.oneshot():
                if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):  # exited, as ProcSource sees it
                    raise psutil.ZombieProcess(pid)
                times = proc.cpu_times()
                rss = proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.ZombieProcess) as exc:
            self._procs.pop(pid, None)
            raise ProcessGone(pid) from exc
        except psutil.AccessDenied as exc:
            raise PermissionError(pid) from exc
        return proc.create_time(), times.user + times.system, float(rss)

    def forget(self, pid: int) -> None:
        self._procs.pop(pid, None)

    def descendants(self, pid: int) -> dict[int, float]:
        try:
            children = self._proc(pid).children(recursive=True)
        except (ProcessGone, psutil.NoSuchProcess, psutil.AccessDenied):
            return {}
        found = {}
        for child in children:
            try:
                found[child.pid] = child.create_time()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def memory(self) -> tuple[float, float]:
        memory = psutil.virtual_memory()
        return float(memory.used), float(memory.available)

    def load1(self) -> float:
        return float(psutil.getloadavg()[0])

    def disk_bytes(self) -> tuple[float, float] | None:
        disk = psutil.disk_io_counters() if hasattr(psutil, "disk_io_counters") else None
        return None if disk is None else (float(disk.read_bytes), float(disk.write_bytes))

    def net_bytes(self) -> tuple[float, float] | None:
        net = psutil.net_io_counters() if hasattr(psutil, "net_io_counters") else None
        return None if net is None else (float(net.bytes_sent), float(net.bytes_recv))

    def close(self) -> None:
        self._procs = {}


def default_source():
    """/proc where it is Linux's (with per-thread children files), psutil elsewhere."""
    if sys.platform.startswith("linux") and os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"):
        try:
            return ProcSource()
        except (OSError, ValueError, IndexError):
            pass
    return PsutilSource()
