"""A trace with allocator events whose memory figures are worked out by hand (no TensorFlow run).

`write_memory_trace` writes what TensorFlow's BFC allocators write on the host plane (one
`MemoryAllocation` / `MemoryDeallocation` event per allocation, each with `allocator_name`,
`bytes_allocated`, `bytes_available`, ...) for a few steps of a small conv step, with step markers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trace_fixtures import ABSOLUTE_BASE_NS, _Plane, _write_space, _xspace_class

MS = 1_000_000
MiB = 2**20
GPU = "GPU_0_bfc"
PINNED = "gpu_host_bfc"
PINNED_CAPACITY = 64 * 2**30


@dataclass
class MemoryTrace:
    """The trace written, and what the analysis must find in it."""

    path: Path
    batch: int
    peak_bytes: int  # GPU_0_bfc's peak in the window
    peak_step: int
    peak_time_ms: float  # from the window's first event
    peak_op: str
    before_bytes: int  # in use before the window
    live_at_peak: dict  # op -> bytes, the allocations of the window live at the peak
    capacity_bytes: int
    fragmentation: float
    batch_bytes: int  # live at the peak with the batch as first dimension
    fixed_bytes: int
    max_batch: int
    end_bytes: list = field(default_factory=list)  # per step, in use at its end
    pinned_peak_bytes: int = 0  # gpu_host_bfc's peak


class _Allocator:
    """Writes one allocator's events with its running bytes in use, as a BFC allocator states them."""

    def __init__(self, plane: _Plane, line, name: str, before: int, capacity: int, fragmentation: float,
                 lifetime_peak: int):
        self.plane, self.line, self.name = plane, line, name
        self.in_use, self.capacity, self.fragmentation = before, capacity, fragmentation
        self.lifetime_peak = lifetime_peak
        self.live: dict[int, tuple[int, int]] = {}  # address -> (requested, allocated)
        self.peak = before

    def _event(self, name: str, at: int, address: int, requested: int, allocated: int, **more) -> None:
        self.lifetime_peak = max(self.lifetime_peak, self.in_use)
        self.plane.event(self.line, name, at, at, allocator_name=self.name, bytes_reserved=0,
                         bytes_allocated=self.in_use, bytes_available=self.capacity - self.in_use,
                         fragmentation=float(self.fragmentation), peak_bytes_in_use=self.lifetime_peak,
                         requested_bytes=requested, allocation_bytes=allocated, addr=address, **more)

    def allocate(self, at: int, address: int, op: str, shape: str, dtype: int, requested: int, allocated: int,
                 region: str, step: int) -> None:
        self.in_use += allocated
        self.peak = max(self.peak, self.in_use)
        self.live[address] = (requested, allocated)
        self._event("MemoryAllocation", at, address, requested, allocated, tf_op=op, region_type=region,
                    data_type=dtype, shape=shape, group_id=step, id=address)

    def free(self, at: int, address: int, step: int) -> None:
        requested, allocated = self.live.pop(address)
        self.in_use -= allocated
        self._event("MemoryDeallocation", at, address, requested, allocated, data_type=0, group_id=step, id=0)


FLOAT, UINT8, INT32 = 1, 4, 3


def write_memory_trace(path: str | Path, *, steps: int = 3, batch: int = 8, capacity: int = 16 * MiB,
                       fragmentation: float = 0.25, extra_step: int | None = 1, extra_bytes: int = 3 * MiB,
                       leak_bytes: int = 0, base_ns: int = ABSOLUTE_BASE_NS) -> MemoryTrace:
    """`steps` steps of 10 ms (step markers `train`, step_num k) from base + 10 ms; the window starts at
    base + 1 ms (a `ProfilerSession::Start` event).

    GPU_0_bfc holds 4 MiB from before the window (weights). Step k, from its start T (ms):
    +1 `model/conv/Conv2D` output [batch,64,32,32] float; +2 its 1 MiB temp [1048576] uint8, freed at
    +3; +4 `model/dense/MatMul` [batch,10] float (320 bytes asked, 512 allocated); +5
    `gradient_tape/conv/Conv2DBackpropInput` [batch,64,32,32]: the step's peak; +6, +6.1, +6.2 the
    three freed. In `extra_step` an `extra/Fill` of `extra_bytes` ([n] float) is made at +0.5 and freed
    at +6.5: held across the step's peak. With `leak_bytes`, a `loss/Identity` scalar of that many
    bytes is made at +7 each step and never freed. Every event states `fragmentation`, bytes
    available = `capacity` - bytes in use, and a lifetime peak above the window's (13 MiB at least,
    which the window's peak is not read from). gpu_host_bfc: 1 KiB from before, one 256-byte
    `SameWorkerRecvDone` per step from +0.2 to +8.
    """
    assert batch * 64 * 32 * 32 * 4 == 2 * MiB * batch // 8
    space = _xspace_class()()
    space.hostnames.append("memory-host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", base_ns)
    worker = host.line(101, "tf_Compute/7", base_ns)
    gpu = _Allocator(host, worker, GPU, 4 * MiB, capacity, fragmentation, 13 * MiB)
    pinned = _Allocator(host, python, PINNED, 1024, PINNED_CAPACITY, 0.0, 1024)
    host.event(python, "ProfilerSession::Start", base_ns + MS, base_ns + 2 * MS)
    activation = batch * 64 * 32 * 32 * 4
    shape = f"[{batch},64,32,32]"
    peak, peak_step, peak_time, ends = 0, -1, 0.0, []
    live_at_peak: dict = {}
    for k in range(steps):
        t = base_ns + 10 * MS + k * 10 * MS
        at = lambda ms: t + int(round(ms * MS))  # noqa: E731 - the step's own clock
        host.event(python, "train", t, t + 10 * MS - 100_000, step_num=k, _r=1)
        pinned.allocate(at(0.2), 9000 + k, "SameWorkerRecvDone", "[]", INT32, 4, 256, "dynamic", k)
        extra = extra_step == k
        if extra:
            gpu.allocate(at(0.5), 5000, "extra/Fill", f"[{extra_bytes // 4}]", FLOAT, extra_bytes, extra_bytes,
                         "output", k)
        gpu.allocate(at(1), 1000, "model/conv/Conv2D", shape, FLOAT, activation, activation, "output", k)
        gpu.allocate(at(2), 2000, "model/conv/Conv2D", "[1048576]", UINT8, MiB, MiB, "temp", k)
        gpu.free(at(3), 2000, k)
        gpu.allocate(at(4), 3000, "model/dense/MatMul", f"[{batch},10]", FLOAT, batch * 40, 512, "output", k)
        gpu.allocate(at(5), 4000, "gradient_tape/conv/Conv2DBackpropInput", shape, FLOAT, activation, activation,
                     "output", k)
        if gpu.in_use > peak:
            peak, peak_step, peak_time = gpu.in_use, k, (t + 5 * MS - base_ns - MS) / MS
            live_at_peak = {"model/conv/Conv2D": activation, "model/dense/MatMul": 512,
                            "gradient_tape/conv/Conv2DBackpropInput": activation}
            if extra:
                live_at_peak["extra/Fill"] = extra_bytes
            leaked = leak_bytes * k
            if leaked:
                live_at_peak["loss/Identity"] = leaked
        gpu.free(at(6), 1000, k)
        gpu.free(at(6.1), 3000, k)
        gpu.free(at(6.2), 4000, k)
        if extra:
            gpu.free(at(6.5), 5000, k)
        if leak_bytes:
            gpu.allocate(at(7), 6000 + k, "loss/Identity", "[]", FLOAT, leak_bytes, leak_bytes, "output", k)
        pinned.free(at(8), 9000 + k, k)
        ends.append(gpu.in_use)
    host.finish()
    written = _write_space(space, path)
    scaled = 2 * activation + 512
    fixed = peak - scaled
    usable = peak + (capacity - peak) * (1 - fragmentation)
    return MemoryTrace(written, batch, peak, peak_step, peak_time, "gradient_tape/conv/Conv2DBackpropInput", 4 * MiB,
                       live_at_peak, capacity, fragmentation, scaled, fixed, int(batch * (usable - fixed) // scaled),
                       ends, pinned.peak)
